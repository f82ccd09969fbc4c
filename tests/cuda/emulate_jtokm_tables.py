# Thread-level emulation of jtokm.cu's jtokm_backward_tables_kernel (no GPU needed): each block (unique
# id) and each of its threads transcribed in float32, the tables in groups whose rows sit in the
# block's shared memory, against the plain loop per (table, id, column) it replaced (the CPU's
# order: positions in order, k in order within one). A row already flagged touched (every third:
# an earlier micro-batch's) is added to; one not flagged holds stale values and starts from zero (its
# flag read by every thread before the block's barrier, before thread 0 sets it). Every element of gE
# and every touched flag must agree bit for bit (both sides add without FMA here; the GPU contracts
# both alike). Without dedup (table_dedup false: cuda/dedup.h's identity batch, rb.distinct false) a
# block is a position whose sums start at 0 and are added into gE (atomicAdd; the rows not flagged
# zero, as the table step leaves them there), the blocks in a shuffled order: gE within 1e-5 of the
# reference (||got - want|| / ||the gradient added||: the sums' order is not fixed), the touched flags
# equal.
#   /usr/bin/python3 tests/cuda/emulate_jtokm_tables.py     (a few seconds; one line per shape)
import numpy as np

def dedup(ids):
    order = np.argsort(ids, kind="stable")
    unique, counts = np.unique(ids, return_counts=True)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return unique, offsets, order

def reference(gE, flags, sel, w, de, ids, ne, V, d, K):
    gE, touched = gE.copy(), flags.copy()
    for i in range(ne):
        for x in np.unique(ids):
            pos = [n for n in range(len(ids)) if ids[n] == x]
            if not any(sel[n * K + k] == i for n in pos for k in range(K)):
                continue
            for j in range(d):
                acc = gE[(i * V + x) * d + j] if flags[i * V + x] else np.float32(0)
                for n in pos:
                    for k in range(K):
                        if sel[n * K + k] == i:
                            acc = np.float32(acc + np.float32(w[n * K + k] * de[n * d + j]))
                gE[(i * V + x) * d + j] = acc
            touched[i * V + x] = 1
    return gE, touched

def identity(ids):
    return ids, np.arange(len(ids) + 1), np.arange(len(ids))

def kernel(gE, flags, sel, w, de, ids, ne, V, d, K, group, threads, distinct=True, seed=0):
    gE, touched = gE.copy(), flags.copy()
    unique, offsets, order = dedup(ids) if distinct else identity(ids)
    blocks = range(len(unique)) if distinct else np.random.default_rng(seed).permutation(len(unique))
    for u in blocks:  # block u
        x, lo, hi = unique[u], offsets[u], offsets[u + 1]
        used = 0
        for p in range(lo, hi):
            for k in range(K):
                used |= 1 << int(sel[order[p] * K + k])
        accumulate = 0  # read by every thread before the barrier
        for i in range(ne):
            if distinct and used >> i & 1 and touched[i * V + x]: accumulate |= 1 << i
        rows = np.full(group * d, np.nan, np.float32)  # shared memory, uninitialised
        for g0 in range(0, ne, group):
            g1 = min(ne, g0 + group)
            for t in range(threads):  # no barrier: thread t touches only its columns j = t (mod threads)
                cols = range(t, d, threads)
                for i in range(g0, g1):
                    if used >> i & 1:
                        for j in cols: rows[(i - g0) * d + j] = gE[(i * V + x) * d + j] if accumulate >> i & 1 else 0
                for p in range(lo, hi):
                    n = order[p]
                    for k in range(K):
                        i = sel[n * K + k]
                        if i < g0 or i >= g1: continue
                        for j in cols:
                            rows[(i - g0) * d + j] = np.float32(rows[(i - g0) * d + j] + np.float32(w[n * K + k] * de[n * d + j]))
                for i in range(g0, g1):
                    if not used >> i & 1: continue
                    for j in cols:
                        at = (i * V + x) * d + j
                        gE[at] = rows[(i - g0) * d + j] if distinct else np.float32(gE[at] + rows[(i - g0) * d + j])
                    if t == 0: touched[i * V + x] = 1
    return gE, touched

def check(N, V, d, ne, K, group, threads, seed):
    rng = np.random.default_rng(seed)
    ids = np.minimum(V - 1, np.floor(rng.random(N) ** 3 * V)).astype(np.int64)  # skewed: hot ids
    sel = np.concatenate([rng.permutation(ne)[:K] for _ in range(N)]).astype(np.int64)
    w = rng.random(N * K).astype(np.float32)
    de = rng.standard_normal(N * d).astype(np.float32)
    gE = (0.01 * rng.standard_normal(ne * V * d)).astype(np.float32)
    flags = (np.arange(ne * V) % 3 == 0).astype(np.uint8)
    want, want_t = reference(gE, flags, sel, w, de, ids, ne, V, d, K)
    got, got_t = kernel(gE, flags, sel, w, de, ids, ne, V, d, K, group, threads)
    same = np.array_equal(want.view(np.uint32), got.view(np.uint32)) and np.array_equal(want_t, got_t)
    print(f"N {N} V {V} d {d} n_e {ne} K {K} group {group} threads {threads}: "
          f"{'bitwise equal' if same else 'DIFFERENT'} ({int(want_t.sum())} rows touched)")
    gz = (gE.reshape(ne * V, d) * flags[:, None]).reshape(-1)  # the rows not flagged zero, as atomics need
    want, want_t = reference(gz, flags, sel, w, de, ids, ne, V, d, K)
    naive, naive_t = kernel(gz, flags, sel, w, de, ids, ne, V, d, K, group, threads, distinct=False, seed=seed)
    err = float(np.linalg.norm(naive - want) / np.linalg.norm(want - gz))  # against the gradient added
    close = err <= 1e-5 and np.array_equal(naive_t, want_t) and not np.array_equal(naive, gz)
    print(f"  without dedup (a block a position, shuffled, added): normalised error {err:.1e}, "
          f"touched {'equal' if np.array_equal(naive_t, want_t) else 'DIFFERENT'}: {'ok' if close else 'FAILED'}")
    return same and close

ok = True
ok &= check(60, 20, 12, 5, 2, 5, 8, 1)   # one group
ok &= check(60, 20, 12, 5, 2, 2, 8, 2)   # groups of 2, 2, 1
ok &= check(40, 10, 7, 3, 3, 1, 4, 3)    # K = n_e, a group a table, d not a multiple of the threads
ok &= check(50, 30, 5, 4, 1, 3, 8, 4)    # more threads than columns
raise SystemExit(0 if ok else 1)
