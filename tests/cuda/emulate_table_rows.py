# Emulation of the tables' per-step gradient bookkeeping on the GPU (no GPU needed): dense gradient
# rows with touched flags, the list of flagged rows (table_rows.cu's compaction), the norm's
# partials a listed row with their grid-stride blocks (global_norm.cu's grad_norm_sumsq_rows_kernel), the
# table step clearing the listed flags (table_adamw.cu) and zero_grads clearing the listed rows and
# flags (table_rows.cu's RowFlags::clear; skipped while a table step has cleared every flag since
# the last backward: DeviceModel::table_flags.flagged). The backward writes a row's first gradient
# of a step over its stale values (its flag not set) and adds later ones (jtok.cu, jtokm.cu); without dedup it adds by
# atomics into rows that must be zero unflagged, so the table step zeroes the rows it used too
# (TableGrad::zero_rows). Against the CPU trainer's bookkeeping, which zeroes every gradient at each
# step's start: over steps of several micro-batches, some refused (a NaN in a touched row), the norm's
# table part and every flagged gradient row must agree bit for bit (and, with atomics, no row is ever
# non-zero unflagged).
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

def backward(g, flags, rows, grads, atomics):  # the backward's row writes and the flags set
    if atomics:  # the identity batch: added into the row, zero where not flagged
        g[rows] += grads
    else:  # from the row's values where flagged (an earlier micro-batch's), else from zero
        g[rows] = np.where(flags[rows, None] != 0, g[rows], np.float32(0)) + grads
    flags[rows] = 1

def run(seed, atomics, R=400, d=8, steps=12, grid=7):
    rng = np.random.default_rng(seed)
    g, flags = np.zeros((R, d), np.float32), np.zeros(R, np.uint8)  # the GPU's, zeroed once
    flagged = True  # DeviceModel::table_flags.flagged: a backward since the last table step
    for step in range(steps):
        if flagged:  # zero_grads: the flagged rows cleared (the refused step's too), else nothing to do
            rows = listed(flags)
            g[rows], flags[rows], flagged = 0, 0, False
        ref = np.zeros((R, d), np.float32)  # the CPU's, zeroed every step
        for _ in range(rng.integers(1, 4)):  # micro-batches: rows touched by some of them only
            ids = np.unique(rng.integers(0, R, rng.integers(1, R // 4)))
            grads = rng.standard_normal((len(ids), d)).astype(np.float32)
            backward(g, flags, ids, grads, atomics)
            flagged = True
            ref[ids] += grads
        refused = rng.random() < 0.3
        if refused:
            bad = listed(flags)[0]
            g[bad, 0] = ref[bad, 0] = np.nan
        on = flags != 0
        assert np.array_equal(g[on], ref[on], equal_nan=True), f"step {step}: a row leaked from an earlier step"
        assert not np.any(ref[~on]), f"step {step}: a row with a gradient but no flag"
        assert not atomics or not np.any(g[~on]), f"step {step}: a non-zero row without its flag (atomics)"
        rows = listed(flags)  # optimizer_step: list, norm over the listed rows
        got = np.sum(row_partials(g, rows, grid).astype(np.float64))
        want = np.sum(np.sum(ref * ref, axis=1, dtype=np.float32).astype(np.float64))
        assert (np.isnan(got) and np.isnan(want)) or got == want, f"step {step}: norm {got} != {want}"
        if not refused:  # the table step clears the listed flags (and rows, with atomics); a refused one
            flags[rows], flagged = 0, False  # leaves them to zero_grads
            if atomics:
                g[rows] = 0
    print(f"emulate_table_rows seed {seed}{' atomics' if atomics else ''}: {steps} steps, R {R}, d {d}, grid {grid}: ok")

if __name__ == "__main__":
    for seed in range(4):
        for atomics in (False, True):
            run(seed, atomics)
