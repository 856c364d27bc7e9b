#!/usr/bin/env bash
# Append (encode) kernel comparisons on the GPU machine, after cuda_check.sh
# has built $BUILD: bench_cuda's appends (--shape=1,1) for each variant in
# interleaved rounds (order reversed every other round, so that drift does
# not favour one), then ncu of one 8192-token append per variant: its key
# metrics and the SASS instructions with the most stall samples. Only a
# summary is printed; the ncu reports stay in /tmp.
#   BUILD=DIR [LEFT=SECONDS] bench/scripts/append_check.sh [--rounds=N] [--test=NAME] [--ncu=SPEC]
#       [--ncu-only=NAME] VARIANT...
# A variant is NAME or NAME:VAR=VALUE, an environment setting that the
# build reads (an experiment's switch). --test runs test_cuda for that
# variant after the rounds. No step starts after LEFT seconds (default 3600).
set -u
LEFT=${LEFT:-3600}
late() { ((SECONDS > LEFT)) && { echo "(out of time: $1 skipped)"; return 0; }; return 1; }
BUILD=${BUILD:-build-cuda}
rounds=2
ncu_spec=""
ncu_only=""
test_v=""
variants=()
for a in "$@"; do
  case $a in
    --rounds=*) rounds=${a#--rounds=} ;;
    --ncu=*) ncu_spec=${a#--ncu=} ;;
    --ncu-only=*) ncu_only=${a#--ncu-only=} ;;
    --test=*) test_v=${a#--test=} ;;
    *) variants+=("$a") ;;
  esac
done
run_variant() { # variant, command...
  local v=$1; shift
  if [[ $v == *:* ]]; then env "${v#*:}" "$@"; else "$@"; fi
}
for ((r = 1; r <= rounds; r++)); do
  order=("${variants[@]}")
  if ((r % 2 == 0)); then
    order=()
    for ((i = ${#variants[@]} - 1; i >= 0; i--)); do order+=("${variants[i]}"); done
  fi
  for v in "${order[@]}"; do
    late "round $r ${v%%:*}" && continue
    # one line per spec: us and % of copy per append (tokens, dtype, calls)
    run_variant "$v" "$BUILD/bench_cuda" --shape=1,1 |
      awk -v tag="r$r ${v%%:*}" '/copy:/ { copy = $3 }
        / append +[0-9]+ tokens/ { s = $1; if (!(s in line)) { order[++n] = s; line[s] = "" }
          line[s] = line[s] sprintf("  %d %s %s %s us %s", $3, $5, $6, $8, $14) }
        END { for (i = 1; i <= n; i++) printf "%-10s %-14s%s  (copy %s)\n", tag, order[i], line[order[i]], copy }'
  done
done
for v in "${variants[@]}"; do
  [ "${v%%:*}" = "$test_v" ] || continue
  late "test_cuda $test_v" && continue
  echo "== test_cuda ($test_v): $(run_variant "$v" "$BUILD/tests/test_cuda" 2>&1 | tail -1)"
done
[ -z "$ncu_spec" ] && exit 0
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -z "$NCU" ] && { echo "no ncu"; exit 0; }
for v in "${variants[@]}"; do
  name=${v%%:*}
  [ -n "$ncu_only" ] && [ "$name" != "$ncu_only" ] && continue
  late "ncu $name" && continue
  rep=/tmp/append_$name
  echo "== ncu $name ($ncu_spec, the first append: 8192 tokens)"
  run_variant "$v" "$NCU" --set full --import-source yes -k regex:append_kernel -c 1 -f -o "$rep" \
    "$BUILD/bench_cuda" --shape=1,1 "$ncu_spec" >/tmp/ncu_$name.log 2>&1 || { tail -5 /tmp/ncu_$name.log; continue; }
  "$NCU" -i "$rep.ncu-rep" --page raw --csv >"$rep.raw.csv"
  "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.src.csv" 2>/dev/null
  python3 "$(dirname "$0")/ncu_summary.py" "$rep.raw.csv" "$rep.src.csv" --lines 20
done
