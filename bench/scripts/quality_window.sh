#!/usr/bin/env bash
# The measurements of quality.sh with the same fp16 window for every method
# (KIVI's default residual of 128 tokens given to the rotation methods, and
# KIVI without a window), so methods compare at equal memory.
#
#   bench/scripts/quality_window.sh TEXT_FILE OUT.jsonl [CTX] [MAX_TOKENS]
SPECS="kivi:bits=2,residual=0
kivi:bits=3,residual=0
kivi:bits=4,residual=0
tq-mse:bits=2,residual=128
tq-mse:bits=2.5,residual=128
tq-mse:bits=3,residual=128
tq-mse:bits=3.5,residual=128
tq-mse:bits=4,residual=128
tq-prod:bits=3,residual=128
tq-prod:bits=4,residual=128
rvq:bits=1,residual=128
rvq:bits=2,residual=128
polar:residual=128" exec "$(dirname "$0")/quality.sh" "$@"
