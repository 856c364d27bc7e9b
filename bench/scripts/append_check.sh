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
  python3 - "$rep.raw.csv" "$rep.src.csv" <<'EOF'
import csv, re, sys
from collections import Counter
rows = list(csv.reader(open(sys.argv[1])))
head, vals = rows[0], rows[-1]
m = dict(zip(head, vals))
def num(v):
    try: return float(v.replace(',', ''))
    except ValueError: return None
keys = ['gpu__time_duration.sum', 'launch__registers_per_thread', 'smsp__inst_executed.sum',
        'smsp__issue_active.avg.pct_of_peak_sustained_active', 'sm__warps_active.avg.pct_of_peak_sustained_active',
        'smsp__inst_executed_op_local_ld.sum', 'smsp__inst_executed_op_shared_ld.sum',
        'smsp__inst_executed_op_global_st.sum', 'dram__bytes_read.sum', 'dram__bytes_write.sum']
for k in keys:
    if k in m: print(f'{k:60s} {m[k]}')
st = [(num(v), k) for k, v in m.items() if re.search(r'average_warps_issue_stalled_.*_per_issue_active\.ratio$', k)]
st = sorted([s for s in st if s[0] is not None and s[0] >= 0.05], reverse=True)
print('stalls per issue:', ', '.join(f"{k.split('stalled_')[1].split('_per_issue')[0]} {v:.2f}" for v, k in st))
try:
    src = list(csv.reader(open(sys.argv[2])))
except OSError:
    sys.exit(0)
hi = next((i for i, r in enumerate(src) if any('Stall Sampling (All' in c for c in r)), None)
if hi is None:
    print('no source page'); sys.exit(0)
h = src[hi]
cs = next(i for i, c in enumerate(h) if 'Stall Sampling (All' in c)
ce = next((i for i, c in enumerate(h) if c.startswith('Instructions Executed')), None)
cx = next(i for i, c in enumerate(h) if c == 'Source')
body = [r for r in src[hi + 1:] if len(r) > cs and num(r[cs]) is not None]
tot = sum(num(r[cs]) for r in body) or 1
ops = Counter(); ins = Counter()
for r in body:
    op = r[cx].strip().split()[0] if r[cx].strip() else '?'
    if op.startswith('@'): op = r[cx].strip().split()[1]
    op = op.split('.')[0]
    ops[op] += num(r[cs]); ins[op] += num(r[ce]) if ce is not None and num(r[ce]) else 0
print('stall samples by opcode (% samples / % instructions):')
ti = sum(ins.values()) or 1
print('  ' + ', '.join(f'{o} {100*s/tot:.1f}/{100*ins[o]/ti:.1f}' for o, s in ops.most_common(16)))
print('top instructions by stall samples:')
for r in sorted(body, key=lambda r: -num(r[cs]))[:20]:
    print(f'  {100*num(r[cs])/tot:5.1f}%  {r[0]:>6s}  {r[cx].strip()[:90]}')
EOF
done
