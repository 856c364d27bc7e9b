#!/bin/bash
# ncu (Nsight Compute) of one kernel launch per library build, on a GPU machine:
# the key metrics, pipe use, stall reasons per issue, stall samples by opcode and
# the SASS lines that hold the most stall samples. Drives cuda_ab.py (one shape,
# one round) under ncu --set full --clock-control none; reports go to $OUT.
#   OUT=dir [KREGEX=kivi_decode] [KSKIP=3] bench/scripts/cuda_ncu.sh SHAPE LIB...
# SHAPE as cuda_ab.py's --shape (spec,batch,seq[,q heads]); KREGEX picks the
# kernel (e.g. append_kernel), KSKIP how many of its launches to skip first.
OUT=${OUT:-$PWD/cuda_ncu_out}
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -z "$NCU" ] && { echo "no ncu on this machine"; exit 1; }
shape=$1; shift
for lib in "$@"; do
  name=$(basename "$lib" .so)
  rep=$OUT/ncu_$name
  $NCU --clock-control none --set full --import-source yes -k regex:${KREGEX:-kivi_decode} -s ${KSKIP:-3} -c 1 -f -o $rep \
    python3 "$here/cuda_ab.py" --lib "x=$lib" --shape "$shape" --rounds 1 > "$rep.log" 2>&1 || { tail -5 "$rep.log"; continue; }
  $NCU -i $rep.ncu-rep --page raw --csv > $rep.raw.csv
  $NCU -i $rep.ncu-rep --page source --csv --print-source sass > $rep.src.csv 2>/dev/null
  echo "== $lib $shape"
  python3 - $rep.raw.csv $rep.src.csv <<'PY'
import csv, re, sys
rows = list(csv.reader(open(sys.argv[1])))
m = dict(zip(rows[0], rows[-1]))
def num(v):
    try: return float(v.replace(',', ''))
    except Exception: return None
for k in ['gpu__time_duration.sum', 'smsp__inst_executed.sum', 'smsp__issue_active.avg.pct_of_peak_sustained_active',
          'smsp__warps_active.avg.per_cycle_active', 'smsp__warps_eligible.avg.per_cycle_active',
          'dram__throughput.avg.pct_of_peak_sustained_elapsed', 'dram__bytes_read.sum', 'sm__cycles_elapsed.avg.per_second',
          'l1tex__data_pipe_lsu_wavefronts_mem_shared.sum', 'smsp__inst_executed_op_local_ld.sum']:
    if k in m: print(f'  {k:55s} {m[k]}')
pipes = sorted([(num(v), k) for k, v in m.items() if re.search(r'^sm__(inst_executed_)?pipe_\w+_cycles_active\.avg\.pct_of_peak_sustained_active$', k) and num(v)], reverse=True)
print('  pipes % active:', ', '.join(f"{k.replace('sm__','').replace('_cycles_active.avg.pct_of_peak_sustained_active','')} {v:.1f}" for v, k in pipes[:10]))
st = sorted([(num(v), k) for k, v in m.items() if re.search(r'average_warps_issue_stalled_.*_per_issue_active\.ratio$', k) and num(v) and num(v) >= 0.03], reverse=True)
print('  stalls per issue:', ', '.join(f"{k.split('stalled_')[1].split('_per_issue')[0]} {v:.2f}" for v, k in st))
try:
    src = list(csv.reader(open(sys.argv[2])))
except OSError:
    sys.exit(0)
hi = next((i for i, r in enumerate(src) if any('Stall Sampling (All' in c for c in r)), None)
if hi is None: print('  no source page'); sys.exit(0)
h = src[hi]
cs = next(i for i, c in enumerate(h) if 'Stall Sampling (All' in c)
cx = next(i for i, c in enumerate(h) if c == 'Source')
body = [r for r in src[hi + 1:] if len(r) > cs and num(r[cs]) is not None]
tot = sum(num(r[cs]) for r in body) or 1
from collections import Counter
ops = Counter()
for r in body:
    t = r[cx].strip().split()
    if not t: continue
    op = t[1] if t[0].startswith('@') and len(t) > 1 else t[0]
    ops[op.split('.')[0]] += num(r[cs])
print('  stall samples by opcode %:', ', '.join(f'{o} {100*s/tot:.1f}' for o, s in ops.most_common(14)))
print('  top lines:')
for r in sorted(body, key=lambda r: -num(r[cs]))[:24]:
    print(f"    {100*num(r[cs])/tot:5.2f}% {r[cx].strip()[:70]}")
PY
done
