#!/usr/bin/env bash
# Quality of every KV method on the reference model: perplexity, KL against
# an fp16 cache run in lockstep, top-1 agreement and bytes, in decode mode
# (one token at a time through the compressed cache, as generation sees it).
#
#   bench/scripts/quality.sh TEXT_FILE OUT.jsonl [CTX] [MAX_TOKENS]
#
# TEXT_FILE is held-out text (e.g. the validation documents joined by
# <|doc|>). One JSON line per spec is appended to OUT.jsonl. SPECS, when
# set, replaces the list below (one spec per line).
set -euo pipefail
text=$1
out=$2
ctx=${3:-2048}
max=${4:-2048}
vq=${VQ:-./build/veloxquant}
specs=(
  "kivi:bits=2" "kivi:bits=3" "kivi:bits=4"
  "tq-mse:bits=1" "tq-mse:bits=2" "tq-mse:bits=2.5" "tq-mse:bits=3" "tq-mse:bits=3.5" "tq-mse:bits=4"
  "tq-prod:bits=2" "tq-prod:bits=3" "tq-prod:bits=4"
  "rvq:bits=1" "rvq:bits=2"
  "k=qjl;v=tq-mse:bits=2" "k=qjl;v=fp16"
  "polar"
)
if [ -n "${SPECS:-}" ]; then mapfile -t specs <<< "$SPECS"; fi
for s in "${specs[@]}"; do
  "$vq" ppl -m models/velox-ref -f "$text" --ctx "$ctx" --max-tokens "$max" --kv "$s" --mode decode \
    --ref fp16 --threads "${THREADS:-2}" --json 2>/dev/null | tail -n 1 >> "$out"
  echo "done: $s" >&2
done
