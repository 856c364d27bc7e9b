#!/usr/bin/env bash
# Decode attention over 32768 cached tokens (32 query / 8 kv heads, dim 128,
# one query token, 2 threads) for every method against fp16, each in its
# own interleaved run. One JSON line per spec is appended to OUT.jsonl.
#   bench/scripts/attn_cpu.sh OUT.jsonl [SEQ] [RUNS]
set -euo pipefail
out=$1
seq=${2:-32768}
runs=${3:-9}
vq=${VQ:-./build/veloxquant}
specs=(
  "kivi:bits=2" "kivi:bits=4"
  "tq-mse:bits=2" "tq-mse:bits=3" "tq-mse:bits=4"
  "rvq:bits=1" "rvq:bits=2"
  "tq-prod:bits=3" "k=qjl;v=tq-mse:bits=2" "polar"
)
for s in "${specs[@]}"; do
  "$vq" bench attn --kv "$s" --seq "$seq" --heads 32/8 --dim 128 --threads "${THREADS:-2}" --runs "$runs" --json \
    2>/dev/null | tail -n 1 >> "$out"
  echo "done: $s" >&2
done
