#!/usr/bin/env python3
"""Two or more builds of the library side by side: decode time per call of
each on the same caches' contents, in one process, the arms interleaved.

Each library (NAME=PATH, built with VQ_CUDA=ON) gets its own caches filled
from the same bf16 K/V; every round times each arm once (cuda_bench.py's
gpu_time: GPU time per call behind a sleep kernel, median of 7 x 20
calls), the order reversed every other round, so drift in clocks or
temperature falls on all arms alike. Printed per shape: each arm's median
over the rounds with its spread, its ratio to the first arm, and the
largest output difference to the first arm relative to the largest output.

    python3 bench/scripts/cuda_ab.py --lib base=a/libveloxquant.so \\
        --lib new=b/libveloxquant.so --shape kivi:bits=2,8,131072 \\
        --shape kivi:bits=4,1,32768,64 [--rounds 4] [--out ab.jsonl]

A shape is spec,batch,seq[,q heads] (8 kv heads, head dim 128; 32 q heads
unless given).

--append times the appends instead (cuda_bench.py's encode_time: one
sequence of seq bf16 tokens appended again into a reset cache, in calls of
32768 tokens; batch must be 1) and prints GB/s on the bf16 bytes read plus
the packed bytes written, and that as a share of a device-to-device copy
measured once; the output difference is then that of a decode of the
re-filled caches.
"""
import argparse
import ctypes as C
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_bench import (VQ_DEVICE_CUDA, VQ_F32, AttendArgs, CacheConfig, check, copy_bandwidth,  # noqa: E402
                        encode_time, fill, gpu_time, host_bytes, load_lib, sets_for)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", action="append", required=True, help="NAME=PATH, the first is the baseline")
    ap.add_argument("--shape", action="append", required=True, help="spec,batch,seq[,q heads]")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default=None)
    ap.add_argument("--append", action="store_true", help="time appends, not decodes (batch 1)")
    a = ap.parse_args()
    arms = []
    for s in a.lib:
        name, path = s.split("=", 1)
        lib = load_lib(os.path.abspath(path))
        if lib.vq_cuda_device_count() < 1:
            sys.exit(f"{name}: no CUDA device (built without VQ_CUDA?)")
        arms.append((name, lib))
    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name()
    Hkv, d = 8, 128
    out = open(a.out, "a") if a.out else None
    lines = []
    copy_gbps = copy_bandwidth() if a.append else None
    for shp in a.shape:
        parts = shp.split(",")
        spec, B, S = parts[0], int(parts[1]), int(parts[2])
        Hq = int(parts[3]) if len(parts) > 3 else 32
        if a.append and B != 1:
            sys.exit(f"{shp}: --append takes batch 1")
        q = torch.randn(B, 1, Hq, d, device="cuda", dtype=torch.float32)
        k = torch.randn(B, Hkv, S, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, Hkv, S, d, device="cuda", dtype=torch.bfloat16)
        cfg = CacheConfig(1, Hq, Hkv, d, spec.encode(), S + 256, 0, VQ_DEVICE_CUDA, 0)
        state = []
        for name, lib in arms:
            sets, n_sets = [], None
            while n_sets is None or len(sets) < n_sets:
                hs = []
                for b in range(B):
                    h = C.c_void_p()
                    check(lib, lib.vq_cache_create(C.byref(cfg), C.byref(h)), f"{name} create {spec}")
                    fill(lib, h, k[b], v[b])
                    hs.append(h)
                sets.append((C.c_void_p * B)(*[h.value for h in hs]))
                if n_sets is None:
                    packed = host_bytes(lib, hs[0])
                    n_sets = 1 if a.append else sets_for(B * packed, 48)
            o = torch.empty(B, 1, Hq, d, device="cuda", dtype=torch.float32)
            args = AttendArgs(1, q.data_ptr(), None, 0.0, o.data_ptr(), VQ_F32, None)
            o.fill_(float("nan"))
            if a.append:  # the output after appends timed like the rounds'
                encode_time(lib, C.c_void_p(sets[0][0]), k[0], v[0])
            check(lib, lib.vq_attend_batch(sets[0], B, 0, C.byref(args)), f"{name} attend")
            check(lib, lib.vq_cuda_synchronize(), "synchronize")
            state.append(dict(name=name, lib=lib, sets=sets, out=o.clone(), args=args, times=[], packed=packed))
        ref = state[0]["out"]
        for st in state:
            st["diff"] = ((st["out"] - ref).abs().max() / ref.abs().max()).item()
            st["nan"] = bool(torch.isnan(st["out"]).any().item())
        for r in range(a.rounds):
            order = state if r % 2 == 0 else state[::-1]
            for st in order:
                lib, sets, args = st["lib"], st["sets"], st["args"]

                def call(i, lib=lib, sets=sets, args=args):
                    check(lib, lib.vq_attend_batch(sets[i], B, 0, C.byref(args)), "attend")

                if a.append:
                    st["times"].append(encode_time(lib, C.c_void_p(sets[0][0]), k[0], v[0])[0])
                else:
                    st["times"].append(gpu_time(call, len(sets))[0])
        del k, v
        base = statistics.median(state[0]["times"])
        for st in state:
            t = st["times"]
            med = statistics.median(t)
            row = dict(gpu=gpu, spec=spec, batch=B, seq=S, heads_q=Hq, heads_kv=Hkv, dim=d, arm=st["name"],
                       us=round(med, 2), us_min=round(min(t), 2), us_max=round(max(t), 2),
                       rounds=[round(x, 2) for x in t], ratio=round(med / base, 4),
                       max_diff=st["diff"], nan=st["nan"])
            extra = ""
            if a.append:
                gbps = (2 * Hkv * S * d * 2 + st["packed"]) / (med * 1e-6) / 1e9
                row.update(append=True, encode_gbps=round(gbps, 1), pct_of_copy=round(100 * gbps / copy_gbps, 1),
                           copy_gbps=round(copy_gbps, 1))
                extra = f" {gbps:6.0f} GB/s {100 * gbps / copy_gbps:5.1f} %"
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
            lines.append(f"{spec[:14]:14s} {B:3d} x {S:6d} q{Hq:<3d} {st['name']:>8s} {med:9.1f} "
                         f"[{min(t):7.1f}, {max(t):7.1f}] {med / base:7.4f} {st['diff']:9.2e}"
                         f"{extra}{' NaN' if st['nan'] else ''}")
            print(lines[-1], file=sys.stderr)
        for st in state:
            for s in st["sets"]:
                for h in s:
                    st["lib"].vq_cache_free(h)
        torch.cuda.empty_cache()
    what = f"appends (copy {copy_gbps:.0f} GB/s)" if a.append else "decodes"
    print(f"\n{gpu}; {what}: GPU us per call, median of {a.rounds} rounds [min, max], ratio to the first arm, "
          f"max |out - first arm's| / max |out|")
    print(f"{'spec':14s} {'shape':>15s} {'q':>3s} {'arm':>8s} {'us':>9s} {'[min, max]':>18s} {'ratio':>7s} {'diff':>9s}")
    for ln in lines:
        print(ln)


if __name__ == "__main__":
    main()
