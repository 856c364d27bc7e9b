#!/usr/bin/env python3
"""Summary of one Nsight Compute report exported as CSV: the key metrics, the
pipes' use, the stall reasons per issue, the stall samples by opcode (with
the opcode's share of the executed instructions) and the SASS lines that hold
the most stall samples. Used by cuda_ncu.sh and append_check.sh.

    ncu -i r.ncu-rep --page raw --csv > r.raw.csv
    ncu -i r.ncu-rep --page source --csv --print-source sass > r.src.csv
    python3 bench/scripts/ncu_summary.py r.raw.csv [r.src.csv] [--lines N]
"""
import argparse
import csv
import re
from collections import Counter

KEYS = ['gpu__time_duration.sum', 'launch__registers_per_thread', 'smsp__inst_executed.sum',
        'smsp__issue_active.avg.pct_of_peak_sustained_active', 'smsp__warps_active.avg.per_cycle_active',
        'smsp__warps_eligible.avg.per_cycle_active', 'sm__cycles_elapsed.avg.per_second',
        'dram__throughput.avg.pct_of_peak_sustained_elapsed', 'dram__bytes_read.sum', 'dram__bytes_write.sum',
        'l1tex__data_pipe_lsu_wavefronts_mem_shared.sum', 'smsp__inst_executed_op_local_ld.sum',
        'smsp__inst_executed_op_shared_ld.sum', 'smsp__inst_executed_op_global_st.sum']
PIPE = re.compile(r'^sm__(inst_executed_)?pipe_\w+_cycles_active\.avg\.pct_of_peak_sustained_active$')
STALL = re.compile(r'average_warps_issue_stalled_.*_per_issue_active\.ratio$')


def num(v):
    try:
        return float(v.replace(',', ''))
    except (ValueError, AttributeError):
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('raw')
    ap.add_argument('src', nargs='?')
    ap.add_argument('--lines', type=int, default=24)
    a = ap.parse_args()
    rows = list(csv.reader(open(a.raw)))
    m = dict(zip(rows[0], rows[-1]))
    for k in KEYS:
        if k in m:
            print(f'  {k:55s} {m[k]}')
    pipes = sorted([(num(v), k) for k, v in m.items() if PIPE.search(k) and num(v)], reverse=True)
    print('  pipes % active:', ', '.join(
        f"{k.replace('sm__', '').replace('_cycles_active.avg.pct_of_peak_sustained_active', '')} {v:.1f}"
        for v, k in pipes[:10]))
    st = sorted([(num(v), k) for k, v in m.items() if STALL.search(k) and num(v) and num(v) >= 0.03], reverse=True)
    print('  stalls per issue:', ', '.join(f"{k.split('stalled_')[1].split('_per_issue')[0]} {v:.2f}" for v, k in st))
    if not a.src:
        return
    try:
        src = list(csv.reader(open(a.src)))
    except OSError:
        return
    hi = next((i for i, r in enumerate(src) if any('Stall Sampling (All' in c for c in r)), None)
    if hi is None:
        print('  no source page')
        return
    h = src[hi]
    cs = next(i for i, c in enumerate(h) if 'Stall Sampling (All' in c)
    ce = next((i for i, c in enumerate(h) if c.startswith('Instructions Executed')), None)
    cx = h.index('Source')
    body = [r for r in src[hi + 1:] if len(r) > cs and num(r[cs]) is not None]
    tot = sum(num(r[cs]) for r in body) or 1
    ops, ins = Counter(), Counter()
    for r in body:
        t = r[cx].strip().split()
        if not t:
            continue
        op = (t[1] if t[0].startswith('@') and len(t) > 1 else t[0]).split('.')[0]
        ops[op] += num(r[cs])
        ins[op] += (num(r[ce]) or 0) if ce is not None else 0
    ti = sum(ins.values()) or 1
    print('  stall samples by opcode (% samples / % instructions):',
          ', '.join(f'{o} {100 * s / tot:.1f}/{100 * ins[o] / ti:.1f}' for o, s in ops.most_common(14)))
    print('  top lines (% stall samples):')
    for r in sorted(body, key=lambda r: -num(r[cs]))[:a.lines]:
        print(f'    {100 * num(r[cs]) / tot:5.2f}% {r[cx].strip()[:90]}')


if __name__ == '__main__':
    main()
