#!/usr/bin/env bash
# The same measurements as quality.sh with the same fp16 window for every
# method (KIVI's default residual of 128 tokens given to the rotation methods,
# and KIVI without a window), so methods compare at equal memory.
#
#   bench/scripts/quality_window.sh TEXT_FILE OUT.jsonl [CTX] [MAX_TOKENS]
set -euo pipefail
text=$1
out=$2
ctx=${3:-2048}
max=${4:-2048}
vq=${VQ:-./build/veloxquant}
specs=(
  "kivi:bits=2,residual=0" "kivi:bits=3,residual=0" "kivi:bits=4,residual=0"
  "tq-mse:bits=2,residual=128" "tq-mse:bits=2.5,residual=128" "tq-mse:bits=3,residual=128"
  "tq-mse:bits=3.5,residual=128" "tq-mse:bits=4,residual=128"
  "tq-prod:bits=3,residual=128" "tq-prod:bits=4,residual=128"
  "rvq:bits=1,residual=128" "rvq:bits=2,residual=128"
  "polar:residual=128"
)
for s in "${specs[@]}"; do
  "$vq" ppl -m models/velox-ref -f "$text" --ctx "$ctx" --max-tokens "$max" --kv "$s" --mode decode \
    --ref fp16 --threads "${THREADS:-2}" --json 2>/dev/null | tail -n 1 >> "$out"
  echo "done: $s" >&2
done
