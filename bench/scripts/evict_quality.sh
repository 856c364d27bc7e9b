#!/usr/bin/env bash
# Eviction on the reference model: perplexity, KL against an fp16 cache run
# in lockstep, top-1 agreement and the bytes the cache really holds, in
# decode mode (one token at a time, so every policy evicts while it reads),
# at budgets of 1/2, 1/4 and 1/8 of the context, for every policy alone
# (fp16+POLICY) and on KIVI-2 keys and values (kivi:bits=2+POLICY), Ada-KV
# budget sharing on top of some scoring policies, and the two baselines
# without eviction.
#
#   bench/scripts/evict_quality.sh TEXT_FILE OUT.jsonl [CTX] [MAX_TOKENS]
#
# TEXT_FILE is held-out text (the validation documents joined by <|doc|>).
# One JSON line per spec is appended to OUT.jsonl, in the order budgets x
# bases x policies, so that a run cut short still covers every policy at the
# first budget. A spec already in OUT.jsonl is skipped (a rerun resumes); a
# spec that fails is listed in OUT.jsonl.failed with its error and the run
# goes on. Environment overrides (space-separated lists; set but empty = none):
#   BUDGETS   default "512 256 1024"
#   POLICIES  default "streaming h2o tova keyformer snapkv pyramidkv knorm qfilters"
#   BASES     default "fp16 kivi:bits=2"
#   ADAKV     scoring policies also run with adakv=1 (fp16 base), default "h2o snapkv qfilters"
#   FILTERS   the Q-Filters file, default models/velox-ref/qfilters.bin
#   VQ        the veloxquant binary, default ./build/veloxquant; THREADS default 2
set -uo pipefail
text=$1
out=$2
ctx=${3:-2048}
max=${4:-2048}
vq=${VQ:-./build/veloxquant}
filters=${FILTERS:-models/velox-ref/qfilters.bin}
read -ra budgets <<< "${BUDGETS-512 256 1024}"
read -ra policies <<< "${POLICIES-streaming h2o tova keyformer snapkv pyramidkv knorm qfilters}"
read -ra bases <<< "${BASES-fp16 kivi:bits=2}"
read -ra adakv <<< "${ADAKV-h2o snapkv qfilters}"

policy_opts() { # POLICY BUDGET -> the option list
  local o="budget=$2"
  if [ "$1" = qfilters ]; then o="$o,filters=$filters"; fi
  echo "$o"
}

specs=("${bases[@]}")
for b in "${budgets[@]}"; do
  for base in "${bases[@]}"; do
    for p in "${policies[@]}"; do specs+=("$base+$p:$(policy_opts "$p" "$b")"); done
  done
  for p in "${adakv[@]}"; do specs+=("fp16+$p:$(policy_opts "$p" "$b"),adakv=1"); done
done

touch "$out"
for s in "${specs[@]}"; do
  # each line records the spec it was asked for, so reruns can skip it
  if grep -qF "\"asked\":\"$s\"" "$out"; then echo "skip (done): $s" >&2; continue; fi
  err=$(mktemp)
  line=$("$vq" ppl -m models/velox-ref -f "$text" --ctx "$ctx" --max-tokens "$max" --kv "$s" --mode decode \
    --ref fp16 --threads "${THREADS:-2}" --json 2>"$err" | tail -n 1)
  if [ "${line:0:1}" = "{" ]; then
    echo "{\"asked\":\"$s\",${line:1}" >> "$out"
    echo "done: $s" >&2
  else
    printf '%s\t%s\n' "$s" "$(tr '\r' '\n' < "$err" | grep -v '^ppl \[' | tail -n 1)" >> "$out.failed"
    echo "FAILED: $s ($(tr '\r' '\n' < "$err" | tail -n 1))" >&2
  fi
  rm -f "$err"
done
