# Emulation of the tables' per-step gradient bookkeeping on the GPU (no GPU needed): dense gradient
# rows with touched flags, the list of flagged rows (table_rows.cu's compaction), the norm's
# partials a listed row with their grid-stride blocks (global_norm.cu's sumsq_rows_kernel), the
# table step and zero_grads clearing only the listed rows (table_adamw.cu, table_rows.cu's
# clear_rows). Against the CPU trainer's bookkeeping, which zeroes every gradient at each step's
# start: over steps of several micro-batches, some refused (a NaN in a touched row), the norm's
# table part and every gradient row must agree bit for bit, and no row is ever non-zero unflagged.
#   /usr/bin/python3 tests/cuda/emulate_table_rows.py     (a second; one line per run)
import numpy as np

def listed(flags):  # cub::DeviceSelect::Flagged over a counting iterator: flagged indices, ascending
    return np.flatnonzero(flags).astype(np.int32)

def row_partials(g, rows, grid):  # block b: rows[b], rows[b + grid], ...: one partial a row
    partials = np.full(len(rows), np.nan, np.float32)
    for b in range(grid):
        for i in range(b, len(rows), grid):
            r = g[rows[i]]
            partials[i] = np.sum(r * r, dtype=np.float32)
    return partials

def backward(g, flags, rows, grads):  # the backward's row writes: += and the flag set
    g[rows] += grads
    flags[rows] = 1

def run(seed, R=400, d=8, steps=12, grid=7):
    rng = np.random.default_rng(seed)
    g, flags = np.zeros((R, d), np.float32), np.zeros(R, np.uint8)  # the GPU's, zeroed once
    for step in range(steps):
        rows = listed(flags)  # zero_grads: the flagged rows cleared (the refused step's too)
        g[rows], flags[rows] = 0, 0
        ref = np.zeros((R, d), np.float32)  # the CPU's, zeroed every step
        for _ in range(rng.integers(1, 4)):  # micro-batches: rows touched by some of them only
            ids = np.unique(rng.integers(0, R, rng.integers(1, R // 4)))
            grads = rng.standard_normal((len(ids), d)).astype(np.float32)
            backward(g, flags, ids, grads)
            ref[ids] += grads
        refused = rng.random() < 0.3
        if refused:
            bad = listed(flags)[0]
            g[bad, 0] = ref[bad, 0] = np.nan
        assert np.array_equal(g, ref, equal_nan=True), f"step {step}: a row leaked from an earlier step"
        assert not np.any(g[flags == 0]), f"step {step}: a non-zero row without its flag"
        rows = listed(flags)  # optimizer_step: list, norm over the listed rows
        got = np.sum(row_partials(g, rows, grid).astype(np.float64))
        want = np.sum(np.sum(ref * ref, axis=1, dtype=np.float32).astype(np.float64))
        assert (np.isnan(got) and np.isnan(want)) or got == want, f"step {step}: norm {got} != {want}"
        if not refused:  # the table step clears the listed rows; a refused one leaves them to zero_grads
            g[rows], flags[rows] = 0, 0
    print(f"emulate_table_rows seed {seed}: {steps} steps, R {R}, d {d}, grid {grid}: ok")

if __name__ == "__main__":
    for seed in range(4):
        run(seed)
