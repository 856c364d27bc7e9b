#!/usr/bin/env python3
"""Render cuda_bench.py's JSON lines as the markdown table of the
bench/results/*-h200-cuda-vs-torch.md files.

  python3 bench/scripts/cuda_table.py RESULTS.jsonl [--was EARLIER.jsonl]

--was adds a column with the earlier run's time for the same spec and shape."""
import argparse
import json


def load(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    return {(r["spec"], r["batch"], r["seq"]): r for r in rows}, rows


def short(spec):
    """k=X;v=X -> X without the defaults the benchmark always spells out."""
    k = spec.split(";")[0].removeprefix("k=")
    for default in (",group=32", ",residual=128", ",seed=0", ",residual=0"):
        k = k.replace(default, "")
    return k


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--was")
    a = ap.parse_args()
    _, rows = load(a.results)
    was = load(a.was)[0] if a.was else {}
    head = ["spec", "batch", "seq", "ours us [min, max]"] + (["was us"] if a.was else []) + [
        "torch us", "speedup", "GB/s", "% copy", "floor us", "enc GB/s", "fill GB/s", "err"]
    print("| " + " | ".join(head) + " |")
    print("| --- | " + " | ".join("---:" for _ in head[1:]) + " |")
    order = {}
    for r in rows:
        order.setdefault(short(r["spec"]), len(order))
    for r in sorted(rows, key=lambda r: (order[short(r["spec"])], r["batch"], r["seq"])):
        cells = [short(r["spec"]), str(r["batch"]), str(r["seq"]),
                 f"{r['us']:.1f} [{r['us_min']:.1f}, {r['us_max']:.1f}]"]
        if a.was:
            w = was.get((r["spec"], r["batch"], r["seq"]))
            cells.append(f"{w['us']:.1f}" if w else "")
        torch_us = r.get("torch_us")
        cells += [f"{torch_us:.1f}" if torch_us else "", f"{r['speedup_vs_torch']:.2f}x" if torch_us else "",
                  f"{r['gbps']:.0f}", f"{r['pct_of_copy']:.1f}", f"{r['floor_us']:.1f}",
                  f"{r['encode_gbps']:.0f}", f"{r['first_fill_gbps']:.0f}", f"{r['rel_err_vs_bf16_sdpa']:.4f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
