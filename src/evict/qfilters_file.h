/* The Q-Filters file: one calibrated direction per (layer, kv head), written
 * by `veloxquant calibrate qfilters` and read by the `qfilters` eviction
 * policy (`qfilters:filters=FILE`). Internal to the library; not installed.
 *
 * Each direction f is a unit vector in the coordinates of the cached keys
 * (after RoPE), signed so that the queries of the calibration text project
 * positively on it on average (Q-Filters, arXiv 2503.02812). The expected
 * logit a key k receives is then roughly proportional to <k, f>: keys with
 * the lowest <k, f> are the ones to evict.
 *
 * Layout (all integers and floats little-endian):
 *   offset  0  8 bytes   magic "VQQFILT\0"
 *           8  u32       version (1)
 *          12  u32       n_layers     [1, 1024]
 *          16  u32       n_heads_kv   [1, 1024]
 *          20  u32       head_dim     [2, 4096]
 *          24  f32[...]  dirs [n_layers][n_heads_kv][head_dim]
 *           .  u32       CRC-32 (IEEE, as zlib's crc32) of every byte before it
 * Nothing follows the checksum. */
#ifndef VQ_QFILTERS_FILE_H
#define VQ_QFILTERS_FILE_H

#include "veloxquant.h"

typedef struct { int n_layers, n_heads_kv, head_dim; float *dirs; /* [n_layers][n_heads_kv][head_dim], unit norm */ } vq_qfilters;

/* Reads and validates a file: size, magic, version, dims, checksum, finite
 * values and unit norms. On failure *out is left empty (dirs NULL) and the
 * error names the file and what is wrong. */
vq_status vq_qfilters_load(const char *path, vq_qfilters *out); /* validates everything, clear errors */
/* Validates f as load does, then writes it to a temporary file next to path
 * and renames it over path, so a reader never sees a partial file. */
vq_status vq_qfilters_save(const char *path, const vq_qfilters *f); /* atomic: temp file + rename */
void vq_qfilters_free(vq_qfilters *f);

/* The limits load and save enforce. */
#define VQ_QFILTERS_VERSION 1
#define VQ_QFILTERS_MAX_LAYERS 1024
#define VQ_QFILTERS_MAX_HEADS 1024
#define VQ_QFILTERS_MAX_DIM 4096
/* How far |f| may be from 1: fp32 rounding of a normalized fp64 vector is
 * ~1e-7; anything past 1e-3 is not a direction that was normalized. */
#define VQ_QFILTERS_NORM_TOL 1e-3

#endif
