"""Causal attention forward and backward in PyTorch: the peer of bench/cuda_attention_op.cpp.

  python3 bench/attention_peer.py [B T H KV hd [reps]] [--device cuda|cpu] [--dtype bf16|fp32]
                                  [--ours FILE]
Default: config b's layer on the GPU in bf16 (16 1024 12 12 64, 10 reps), as bench_cuda_attention.
One JSON line per backend: scaled_dot_product_attention under each of flash, efficient and cudnn
(torch.nn.attention.sdpa_kernel) and PyTorch's own pick ("default"); a backend that refuses the
shape or the GPU prints its error instead of times. Without scaled_dot_product_attention (torch
before 2.0, Debian's) the standard causal attention ("manual", autograd keeping the probabilities).
Timed by CUDA events on cuda (the wall clock on cpu): the median of reps after two warm-up calls,
the forward with autograd recording (as in training) and the backward alone. TFLOP/s by
bench_cuda_attention's count (forward 2 B H T^2 hd, backward 2.5 times that).
--ours FILE (bench_cuda_attention's JSON line): a last line with ours' ratio to each backend's
rate (above 1: ours faster).
"""
import argparse
import json
import math
import statistics
import time

import torch


def manual_attention(q, k, v):
    """(B,H,T,hd) x (B,KV,T,hd) causal attention, GQA by repeating each kv head over its group."""
    H, KV, T = q.shape[1], k.shape[1], q.shape[2]
    if KV != H:
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v


def sdpa(q, k, v):
    f = torch.nn.functional.scaled_dot_product_attention
    if k.shape[1] == q.shape[1]:
        return f(q, k, v, is_causal=True)
    try:
        return f(q, k, v, is_causal=True, enable_gqa=True)
    except TypeError:  # torch before 2.5: no enable_gqa, the kv heads repeated as a user would
        g = q.shape[1] // k.shape[1]
        return f(q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1), is_causal=True)


def timer(device):
    """ms of fn() by CUDA events on cuda, by the wall clock on cpu."""
    def cuda_ms(fn):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def cpu_ms(fn):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return cuda_ms if device == "cuda" else cpu_ms


def time_backend(attn, inputs, dy, reps, device):
    """(forward ms, backward ms): medians over reps after two warm-ups."""
    q, k, v = inputs
    ms = timer(device)
    fwd, bwd = [], []
    for i in range(reps + 2):
        for t in inputs:
            t.grad = None
        out = [None]

        def forward():
            out[0] = attn(q, k, v)
        f = ms(forward)
        b = ms(lambda: out[0].backward(dy))
        if i >= 2:
            fwd.append(f)
            bwd.append(b)
    return statistics.median(fwd), statistics.median(bwd)


def backends():
    """(name, context manager factory or None) for each backend to try."""
    if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        return [("manual", None)]
    out = [("default", None)]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        for name, b in (("flash", "FLASH_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION"),
                        ("cudnn", "CUDNN_ATTENTION")):
            if hasattr(SDPBackend, b):
                out.append((name, lambda b=b: sdpa_kernel(getattr(SDPBackend, b))))
    except ImportError:
        pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", type=int, nargs="*", help="B T H KV hd [reps]")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--ours", help="bench_cuda_attention's JSON line, for the ratios")
    a = ap.parse_args()
    if len(a.shape) not in (0, 5, 6):
        ap.error("the shape is B T H KV hd [reps]")
    B, T, H, KV, hd, reps = (a.shape + [10])[:6] if a.shape else (16, 1024, 12, 12, 64, 10)
    if H % KV:
        ap.error(f"H {H} is not a multiple of KV {KV}")
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    g = torch.Generator(device=a.device).manual_seed(1)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=a.device, dtype=dtype).requires_grad_(True)
    inputs = (randn(B, H, T, hd), randn(B, KV, T, hd), randn(B, KV, T, hd))
    dy = torch.randn(B, H, T, hd, generator=g, device=a.device, dtype=dtype)
    tflop = 2.0 * B * H * T * T * hd / 1e12
    device_name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    rates = {}
    for name, ctx in backends():
        row = {"backend": name, "B": B, "T": T, "H": H, "KV": KV, "hd": hd, "dtype": a.dtype,
               "torch": torch.__version__, "device": device_name}
        attn = manual_attention if name == "manual" else sdpa
        try:
            if ctx is None:
                f, b = time_backend(attn, inputs, dy, reps, a.device)
            else:
                with ctx():
                    f, b = time_backend(attn, inputs, dy, reps, a.device)
            row.update(fwd_ms=round(f, 4), fwd_tflops=round(tflop / (f / 1e3), 1), bwd_ms=round(b, 4),
                       bwd_tflops=round(2.5 * tflop / (b / 1e3), 1))
            rates[name] = (f, b)
        except RuntimeError as e:  # a backend that does not take this shape, dtype or GPU
            row["error"] = str(e).splitlines()[0][:300]
        print(json.dumps(row), flush=True)
    if a.ours:
        ours = json.loads(open(a.ours).readline())
        # fwd_wide, bwd_wide: ours with 32 query rows a warp (bench_cuda_attention's fwd_wide_ms,
        # bwd_wide_ms), where given.
        wide = {k: ours[f"{k}_wide_ms"] for k in ("fwd", "bwd") if f"{k}_wide_ms" in ours}
        ratio = {n: {"fwd": round(f / ours["fwd_ms"], 3), "bwd": round(b / ours["bwd_ms"], 3),
                     **{f"{k}_wide": round((f if k == "fwd" else b) / ms, 3) for k, ms in wide.items()}}
                 for n, (f, b) in rates.items()}
        print(json.dumps({"ours_vs": ratio, "ours_fwd_ms": ours["fwd_ms"], "ours_bwd_ms": ours["bwd_ms"],
                          **{f"ours_{k}_wide_ms": ms for k, ms in wide.items()}}))


if __name__ == "__main__":
    main()
