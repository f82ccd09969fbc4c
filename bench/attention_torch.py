"""One causal attention layer's forward and backward in PyTorch (the peer of bench/attention_op.cpp).

Torch 1.13 (Debian's) has no scaled_dot_product_attention; this is its standard causal attention,
as the reference model computes it: scores = q k^T / sqrt(hd), masked, softmax, @ v, with autograd
(which keeps the (B, H, T, T) probabilities). Prints one JSON line: the minimum over reps (after a
warm-up) of forward and backward wall seconds.
  python3 bench/attention_torch.py B T H KV hd [reps] [--threads N]
"""
import argparse
import json
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("B", "T", "H", "KV", "hd"):
        ap.add_argument(name, type=int)
    ap.add_argument("reps", type=int, nargs="?", default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    B, T, H, KV, hd, reps, threads = a.B, a.T, a.H, a.KV, a.hd, a.reps, a.threads
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, T, hd, generator=g, requires_grad=True)
    k = torch.randn(B, KV, T, hd, generator=g, requires_grad=True)
    v = torch.randn(B, KV, T, hd, generator=g, requires_grad=True)
    dy = torch.randn(B, H, T, hd, generator=g)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    fwd = bwd = float("inf")
    for r in range(reps + 1):
        t0 = time.perf_counter()
        kk = k.repeat_interleave(H // KV, dim=1)
        vv = v.repeat_interleave(H // KV, dim=1)
        s = (q @ kk.transpose(-1, -2)) / hd ** 0.5
        p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
        y = p @ vv
        t1 = time.perf_counter()
        y.backward(dy)
        t2 = time.perf_counter()
        q.grad = k.grad = v.grad = None
        del s, p, y, kk, vv
        if r > 0:
            fwd, bwd = min(fwd, t1 - t0), min(bwd, t2 - t1)
    print(json.dumps({"engine": "pytorch", "B": B, "T": T, "H": H, "KV": KV, "hd": hd, "threads": threads,
                      "fwd_s": fwd, "bwd_s": bwd, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
