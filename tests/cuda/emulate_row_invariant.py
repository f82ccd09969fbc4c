# Lane-level emulation of src/cuda/row_invariant_linear.cu (no GPU needed), kept in step with it:
# - the element map (chunk k of 32 lanes x V elements summed by warp k mod 4, lane l's elements
#   k*32V + l*V + j) covers 0..C-1 exactly once, for C with and without a tail;
# - warp_sums' transposing steps give each of N = 4..64 values the tree warp_sum gives it (lanes l
#   and l ^ o for o = 16..1), bit for bit, and the lanes that write cover the N indices once;
# - the kernel's order of fp32 sums (fma per lane in element order, the lane tree, the 4 warps in
#   order, + bias, + out) against fp64 on the test's data (tests/cuda/test_cuda_row_invariant.cpp:
#   inp N(0,1), weight N(0, 0.1^2), bias and out N(0,1)) at Qwen3-0.6B's C: the normalised error the
#   fp32 tolerance (1e-6, against the CPU's own fp32 sums) has to cover, printed and bounded.
#   /usr/bin/python3 tests/cuda/emulate_row_invariant.py     (a few seconds)
import numpy as np

WARPS, LANES = 4, 32
lane = np.arange(LANES)


def element_map(C, V):
    chunks = -(-C // (LANES * V))
    seen = np.zeros(C, dtype=int)
    for w in range(WARPS):
        for k in range(w, chunks, WARPS):
            for ln in range(LANES):
                for j in range(V):
                    e = k * LANES * V + ln * V + j
                    if e < C:
                        seen[e] += 1
    return seen


def butterfly(v):  # v (..., 32): warp_sum, every lane's value
    for o in (16, 8, 4, 2, 1):
        v = (v + v[..., lane ^ o]).astype(np.float32)
    return v


def warp_sums(vals):  # vals (32, N) float32: the kernel's warp_sums, then the written partials (N)
    N = vals.shape[1]
    v, base, n = vals.copy(), np.zeros(LANES, dtype=int), N
    for o in (16, 8, 4, 2, 1):
        if n > 1:
            h, upper = n // 2, (lane & o) != 0
            send = np.where(upper[:, None], v[:, :h], v[:, h:n])
            keep = np.where(upper[:, None], v[:, h:n], v[:, :h])
            v = v.copy()
            v[:, :h] = (keep + send[lane ^ o]).astype(np.float32)
            base += np.where(upper, h, 0)
            n = h
        else:
            v[:, 0] = (v[:, 0] + v[lane ^ o, 0]).astype(np.float32)
    held, step = (N // 32, 1) if N >= 32 else (1, 32 // N)
    out, written = np.full(N, np.nan, dtype=np.float32), np.zeros(N, dtype=int)
    for ln in range(0, LANES, step):
        for i in range(held):
            out[base[ln] + i] = v[ln, i]
            written[base[ln] + i] += 1
    assert (written == 1).all(), written
    return out


def fma32(a, b, c):  # fp32 fma: the product exact in fp64, one rounding to fp32 (ties aside)
    return (a.astype(np.float64) * b + c).astype(np.float32)


def kernel_rows(x, W, bias, out0, V):  # x (M,C), W (OC,C) float32 -> (M,OC) in the kernel's order
    M, C = x.shape
    chunks = -(-C // (LANES * V))
    pad = chunks * LANES * V - C
    xp = np.pad(x, ((0, 0), (0, pad))).reshape(M, chunks, LANES, V)
    wp = np.pad(W, ((0, 0), (0, pad))).reshape(W.shape[0], chunks, LANES, V)
    y = np.zeros((M, W.shape[0]), dtype=np.float32)
    for w in range(WARPS):
        acc = np.zeros((M, W.shape[0], LANES), dtype=np.float32)
        for k in range(w, chunks, WARPS):
            for j in range(V):
                acc = fma32(wp[None, :, k, :, j], xp[:, None, k, :, j], acc)
        s = butterfly(acc)[..., 0]
        y = s if w == 0 else (y + s).astype(np.float32)
    y = (y + bias[None, :]).astype(np.float32)
    return (out0 + y).astype(np.float32)


def main():
    for V in (4, 8):
        for C in (1, 7, 333, 1024, 1031, 2048, 3072):
            assert (element_map(C, V) == 1).all(), (C, V)
    print("element map: every element once (V 4, 8; C 1 .. 3072 with and without tails)")
    rng = np.random.default_rng(3)
    for N in (4, 8, 16, 32, 64):
        for _ in range(4):
            vals = (rng.standard_normal((LANES, N)) * rng.choice([1e-3, 1.0, 1e3], (LANES, N))).astype(np.float32)
            got = warp_sums(vals)
            for i in range(N):
                want = butterfly(vals[:, i])
                assert (want == want[0]).all() and got[i].tobytes() == want[0].tobytes(), (N, i)
    print("warp_sums: each of N 4..64 values summed by warp_sum's tree, bit for bit; each written once")
    worst = 0.0
    for C in (1024, 2048, 3072, 333):
        M, OC = 4, 192
        x = rng.standard_normal((M, C)).astype(np.float32)
        W = (0.1 * rng.standard_normal((OC, C))).astype(np.float32)
        b, o = rng.standard_normal(OC).astype(np.float32), rng.standard_normal((M, OC)).astype(np.float32)
        exact = x.astype(np.float64) @ W.astype(np.float64).T + b + o
        for V in (4, 8):
            y = kernel_rows(x, W, b, o, V)
            err = np.linalg.norm(y - exact) / np.linalg.norm(exact)
            worst = max(worst, err)
            print(f"fp32 order C {C:5d} V {V}: normalised error against fp64 {err:.2e}")
    assert worst < 2.5e-7, worst
    print(f"worst {worst:.2e}: with the CPU's fp32 sums of similar error, within the test's 1e-6")


if __name__ == "__main__":
    main()
