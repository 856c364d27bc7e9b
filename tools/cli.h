/* Small helpers shared by the veloxquant subcommands. */
#ifndef VQ_CLI_H
#define VQ_CLI_H

#include "veloxquant.h"

/* Parses an integer / float option value in [lo, hi]; prints an error naming
 * the command, the option and the range and returns -1 when it is not. */
int cli_int(const char *cmd, const char *opt, const char *v, long lo, long hi, int *out);
int cli_float(const char *cmd, const char *opt, const char *v, double lo, double hi, float *out);
/* Threads to use: all online cores (at most 256). */
int cli_default_threads(void);
/* Loads DIR's model and tokenizer.json; prints the error and returns -1 on failure. */
int cli_load_model(const char *cmd, const char *dir, vq_model **m, vq_tokenizer **t);
/* Reads a whole text file; NULL (after printing why) on failure. */
char *cli_read_text(const char *cmd, const char *path, size_t *len);
/* "12.3 MiB" */
const char *cli_bytes(double bytes, char *buf, int size);
/* "3.84x smaller" or, when the compressed side is the bigger one (short
 * sequences: blocks and the fp16 window are allocated ahead), "2.46x larger". */
const char *cli_size_ratio(double fp16_bytes, double bytes, char *buf, int size);

#endif
