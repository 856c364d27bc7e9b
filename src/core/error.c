/* Error reporting: a per-thread message naming the bad value. */
#include "vq_internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[512];

vq_status vq_fail(vq_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

const char *vq_last_error(void) { return last_error; }

const char *vq_status_name(vq_status s) {
    switch (s) {
    case VQ_OK: return "ok";
    case VQ_ERR_ARG: return "invalid argument";
    case VQ_ERR_NOMEM: return "out of memory";
    case VQ_ERR_IO: return "i/o error";
    case VQ_ERR_FORMAT: return "malformed input";
    case VQ_ERR_UNSUPPORTED: return "unsupported";
    case VQ_ERR_STATE: return "invalid state";
    }
    return "unknown status";
}

#define VQ_STR2(x) #x
#define VQ_STR(x) VQ_STR2(x)
const char *vq_version(void) {
    return VQ_STR(VQ_VERSION_MAJOR) "." VQ_STR(VQ_VERSION_MINOR) "." VQ_STR(VQ_VERSION_PATCH);
}
