#!/usr/bin/env python3
"""Decode attention on the GPU: veloxquant's CUDA caches against torch's best
bf16 scaled_dot_product_attention, in one process, on the same shapes.

Our library is called through ctypes (libveloxquant.so built with VQ_CUDA=ON).
For every shape (batch x seq, 32 q heads / 8 kv heads, head dim 128, one query
token) it reports our decode time, torch's best time over the flash and cuDNN
backends (bf16, enable_gqa=True), the speedup, our bandwidth on the packed
bytes the cache holds, and a device-to-device copy bandwidth measured in the
same run. It also times append (encode) of new tokens and checks our output
against torch's on the unquantized bf16 K/V (the gap is the quantization
error, printed so a broken kernel cannot hide). Append: encode_gbps is one
sequence appended again into a reset cache, GPU time as below, bytes = bf16
input read + packed bytes written; first_fill_gbps is the first fill of new
caches timed from an idle GPU, which includes allocating their blocks.

Timing: CUDA events around back-to-back calls issued while the GPU is held
busy by a sleep kernel, so the numbers are GPU time, not Python's issue rate;
median over repetitions, with min and max. Several copies of the inputs are
rotated when one copy would fit in L2.

    python3 bench/scripts/cuda_bench.py --lib build/libveloxquant.so \
        --out results.jsonl [--specs kivi:bits=2,fp16] [--quick]
"""
import argparse
import ctypes as C
import datetime
import json
import math
import os
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

VQ_F32, VQ_F16, VQ_BF16 = 0, 1, 2
VQ_DEVICE_CUDA = 1
L2_BYTES = 60 << 20


class CacheConfig(C.Structure):
    _fields_ = [("n_layers", C.c_int), ("n_heads_q", C.c_int), ("n_heads_kv", C.c_int),
                ("head_dim", C.c_int), ("kv_spec", C.c_char_p), ("capacity", C.c_int64),
                ("block_tokens", C.c_int), ("device", C.c_int), ("device_index", C.c_int)]


class AttendArgs(C.Structure):
    _fields_ = [("n_q", C.c_int), ("q", C.c_void_p), ("q_pos", C.c_void_p), ("scale", C.c_float),
                ("out", C.c_void_p), ("out_dtype", C.c_int), ("pool", C.c_void_p)]


def load_lib(path):
    lib = C.CDLL(path)
    lib.vq_last_error.restype = C.c_char_p
    lib.vq_cuda_device_count.restype = C.c_int
    lib.vq_cache_create.argtypes = [C.POINTER(CacheConfig), C.POINTER(C.c_void_p)]
    lib.vq_cache_free.argtypes = [C.c_void_p]
    lib.vq_cache_append.argtypes = [C.c_void_p, C.c_int, C.c_int, C.c_void_p, C.c_void_p, C.c_int,
                                    C.c_void_p]
    lib.vq_cache_bytes.argtypes = [C.c_void_p]
    lib.vq_cache_bytes.restype = C.c_size_t
    lib.vq_cache_bytes_fp16_equiv.argtypes = [C.c_void_p]
    lib.vq_cache_bytes_fp16_equiv.restype = C.c_size_t
    lib.vq_cache_spec.argtypes = [C.c_void_p]
    lib.vq_cache_spec.restype = C.c_char_p
    lib.vq_attend_batch.argtypes = [C.POINTER(C.c_void_p), C.c_int, C.c_int, C.POINTER(AttendArgs)]
    lib.vq_cuda_synchronize.restype = C.c_int
    lib.vq_cache_to_host.argtypes = [C.c_void_p, C.POINTER(C.c_void_p)]
    lib.vq_cache_reset.argtypes = [C.c_void_p]
    return lib


def check(lib, st, what):
    if st != 0:
        raise RuntimeError(f"{what}: {lib.vq_last_error().decode()}")


def gpu_time(fn, n_sets, iters=20, reps=7):
    """Median, min, max microseconds per call of fn(i), GPU time only."""
    for i in range(3):
        fn(i % n_sets)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(20_000_000)  # keeps the GPU busy while Python issues the calls
        start.record()
        for i in range(iters):
            fn(i % n_sets)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / iters)
    return statistics.median(times), min(times), max(times)


def copy_bandwidth():
    n = 1 << 30  # 2 GiB of bf16 each way
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    us, _, _ = gpu_time(lambda i: dst.copy_(src), 1, iters=10, reps=5)
    return 2 * src.numel() * 2 / (us * 1e-6) / 1e9


def sets_for(bytes_per_set, cap):
    """Copies of the inputs so that together they are at least 4x the L2."""
    return max(1, min(cap, math.ceil(4 * L2_BYTES / max(1, bytes_per_set))))


def torch_best(q, ks, vs):
    best = None
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, ks[0], vs[0], enable_gqa=True)
                t = gpu_time(lambda i: F.scaled_dot_product_attention(q, ks[i], vs[i], enable_gqa=True),
                             len(ks))
        except RuntimeError as e:
            print(f"  torch {name}: not available ({str(e).splitlines()[0][:80]})", file=sys.stderr)
            continue
        if best is None or t[0] < best[1][0]:
            best = (name, t)
    return best


def reference(q, k, v):
    """fp32 attention of one query token per sequence, one sequence at a time
    (a GQA expansion of the whole batch would not fit in memory)."""
    B, Hq, _, d = q.shape
    Hkv = k.shape[1]
    out = torch.empty(B, 1, Hq, d, device="cuda", dtype=torch.float32)
    for b in range(B):
        qg = q[b, :, 0].float().view(Hkv, Hq // Hkv, d)
        kf, vf = k[b].float(), v[b].float()
        p = torch.softmax(qg @ kf.transpose(1, 2) / math.sqrt(d), dim=-1)
        out[b, 0] = (p @ vf).reshape(Hq, d)
    return out


def host_bytes(lib, cache):
    """Bytes one sequence's attention reads: blocks in use, positions and the
    fp16 window, as the CPU copy of the cache allocates them (a CUDA cache's
    own count includes pool slack and its second window buffer)."""
    h = C.c_void_p()
    check(lib, lib.vq_cache_to_host(cache, C.byref(h)), "to_host")
    n = lib.vq_cache_bytes(h)
    lib.vq_cache_free(h)
    return n


def fill(lib, cache, k, v, chunk=32768):
    """Appends one sequence's K/V ([Hkv, S, d] bf16 on the GPU) into a new
    cache; returns the microseconds of the appends from an idle GPU (the
    cache's first appends: they also allocate its device blocks, on the
    host) and the bytes they read."""
    S = k.shape[1]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    total_us, read = 0.0, 0
    for t0 in range(0, S, chunk):
        kc = k[:, t0:t0 + chunk].transpose(0, 1).contiguous()  # [n][Hkv][d]
        vc = v[:, t0:t0 + chunk].transpose(0, 1).contiguous()
        torch.cuda.synchronize()
        start.record()
        check(lib, lib.vq_cache_append(cache, 0, kc.shape[0], kc.data_ptr(), vc.data_ptr(), VQ_BF16, None),
              "append")
        end.record()
        torch.cuda.synchronize()
        total_us += start.elapsed_time(end) * 1000.0
        read += 2 * kc.numel() * 2
    return total_us, read


def encode_time(lib, cache, k, v, chunk=32768):
    """GPU microseconds of appending one sequence's K/V again into `cache`
    after vq_cache_reset (its blocks stay assigned: no allocation), timed
    like the decode calls; and the bytes the appends read."""
    S = k.shape[1]
    parts = [(k[:, t0:t0 + chunk].transpose(0, 1).contiguous(), v[:, t0:t0 + chunk].transpose(0, 1).contiguous())
             for t0 in range(0, S, chunk)]

    def run(i):
        lib.vq_cache_reset(cache)
        for kc, vc in parts:
            check(lib, lib.vq_cache_append(cache, 0, kc.shape[0], kc.data_ptr(), vc.data_ptr(), VQ_BF16, None),
                  "append")

    us, _, _ = gpu_time(run, 1, iters=5, reps=5)
    return us, 2 * k.numel() * 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--specs", nargs="+", default=["kivi:bits=2", "fp16", "kivi:bits=4", "tq-mse:bits=4"])
    ap.add_argument("--quick", action="store_true", help="two small shapes only")
    ap.add_argument("--commit", default=os.environ.get("VQ_COMMIT", "unknown"))
    a = ap.parse_args()

    lib = load_lib(a.lib)
    if lib.vq_cuda_device_count() < 1:
        sys.exit("veloxquant sees no CUDA device (built without VQ_CUDA, or no GPU)")
    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    Hq, Hkv, d = 32, 8, 128
    specs = a.specs
    # the two target shapes first, then the grid
    shapes = [(8, 131072), (1, 32768), (1, 4096), (1, 16384), (1, 65536), (1, 131072), (8, 4096),
              (8, 16384), (8, 65536), (32, 4096), (32, 16384), (32, 65536), (32, 131072)]
    if a.quick:
        shapes = [(1, 32768), (8, 16384)]

    copy_gbps = copy_bandwidth()
    print(f"{gpu}: device-to-device copy {copy_gbps:.0f} GB/s (read + write)", file=sys.stderr)
    rows = []
    out = open(a.out, "a")
    for B, S in shapes:
        kv_bytes = B * Hkv * S * d * 2 * 2
        n_t = sets_for(kv_bytes, 8)
        q16 = torch.randn(B, Hq, 1, d, device="cuda", dtype=torch.bfloat16)
        ks = [torch.randn(B, Hkv, S, d, device="cuda", dtype=torch.bfloat16) for _ in range(n_t)]
        vs = [torch.randn(B, Hkv, S, d, device="cuda", dtype=torch.bfloat16) for _ in range(n_t)]
        tb = torch_best(q16, ks, vs)
        ref = reference(q16, ks[0], vs[0])  # [B][1][Hq][d] fp32
        qf = q16.float().transpose(1, 2).contiguous()  # [B][n_q=1][Hq][d] fp32
        for spec in specs:
            cfg = CacheConfig(1, Hq, Hkv, d, spec.encode(), S + 256, 0, VQ_DEVICE_CUDA, 0)
            sets, fill_us, fill_read, packed = [], 0.0, 0, 0
            try:
                n_sets = None
                while n_sets is None or len(sets) < n_sets:
                    caches = []
                    for b in range(B):
                        h = C.c_void_p()
                        check(lib, lib.vq_cache_create(C.byref(cfg), C.byref(h)), f"create {spec}")
                        caches.append(h)
                        us, rd = fill(lib, h, ks[0][b], vs[0][b])
                        fill_us += us
                        fill_read += rd
                    sets.append((C.c_void_p * B)(*[h.value for h in caches]))
                    if n_sets is None:
                        packed = B * host_bytes(lib, caches[0])
                        n_sets = sets_for(packed, 48)
                fp16_bytes = sum(lib.vq_cache_bytes_fp16_equiv(h) for h in sets[0])
                full_spec = lib.vq_cache_spec(sets[0][0]).decode()
                outs = torch.empty(B, 1, Hq, d, device="cuda", dtype=torch.float32)
                args = AttendArgs(1, qf.data_ptr(), None, 0.0, outs.data_ptr(), VQ_F32, None)

                def ours(i):
                    check(lib, lib.vq_attend_batch(sets[i], B, 0, C.byref(args)), "attend")

                outs.fill_(float("nan"))
                ours(0)
                check(lib, lib.vq_cuda_synchronize(), "synchronize")
                err = ((outs - ref).norm() / ref.norm()).item()
                us, us_min, us_max = gpu_time(ours, len(sets))
                enc_us, enc_read = encode_time(lib, C.c_void_p(sets[0][0]), ks[0][0], vs[0][0])
            except RuntimeError as e:
                print(f"  {spec} B={B} S={S}: {e}", file=sys.stderr)
                for s in sets:
                    for h in s:
                        lib.vq_cache_free(h)
                continue
            for s in sets:
                for h in s:
                    lib.vq_cache_free(h)
            fill_written = packed * len(sets)
            row = dict(gpu=gpu, date=date, commit=a.commit, spec=full_spec, batch=B, seq=S, heads_q=Hq,
                       heads_kv=Hkv, dim=d, us=round(us, 2), us_min=round(us_min, 2), us_max=round(us_max, 2),
                       torch_us=round(tb[1][0], 2) if tb else None, torch_backend=tb[0] if tb else None,
                       speedup_vs_torch=round(tb[1][0] / us, 3) if tb else None,
                       gbps=round(packed / (us * 1e-6) / 1e9, 1), copy_gbps=round(copy_gbps, 1),
                       pct_of_copy=round(100 * packed / (us * 1e-6) / 1e9 / copy_gbps, 1),
                       floor_us=round(packed / (copy_gbps * 1e9) * 1e6, 2), packed_bytes=packed,
                       fp16_bytes=fp16_bytes, rotated_sets=len(sets), torch_sets=n_t,
                       encode_gbps=round((enc_read + packed / B) / (enc_us * 1e-6) / 1e9, 1),
                       first_fill_gbps=round((fill_read + fill_written) / (fill_us * 1e-6) / 1e9, 1),
                       rel_err_vs_bf16_sdpa=round(err, 5))
            rows.append(row)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(f"  {full_spec[:40]:40s} B={B:2d} S={S:6d} {us:9.1f} us  torch {row['torch_us']} us "
                  f"x{row['speedup_vs_torch']}  {row['gbps']} GB/s", file=sys.stderr)
        del ks, vs
        torch.cuda.empty_cache()

    print(f"\n{gpu}, copy {copy_gbps:.0f} GB/s; decode, 32/8 heads, dim 128; times in us (GPU, median)")
    print(f"{'spec':26s} {'B':>3s} {'seq':>7s} {'ours':>9s} {'torch':>9s} {'x':>6s} {'GB/s':>6s} {'%copy':>6s} "
          f"{'enc GB/s':>8s} {'err':>7s}")
    for r in rows:
        print(f"{r['spec'][:26]:26s} {r['batch']:3d} {r['seq']:7d} {r['us']:9.1f} {r['torch_us'] or 0:9.1f} "
              f"{r['speedup_vs_torch'] or 0:6.2f} {r['gbps']:6.0f} {r['pct_of_copy']:6.1f} "
              f"{r['encode_gbps']:8.0f} {r['rel_err_vs_bf16_sdpa']:7.4f}")


if __name__ == "__main__":
    main()
