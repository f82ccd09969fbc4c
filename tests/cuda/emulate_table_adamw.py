# Emulation of the GPU tables' deferred AdamW bookkeeping (no GPU needed): the kept constants and
# the row steps as src/cuda/model_optimizer.cu keeps them (step_tables: "sparse" keeps the step's
# constants alone; sync_tables: every row replayed, the kept ones dropped), the replay of
# table_adamw.cu's replay_row (a cold row by p *= decay a step, a warm one by the update without a
# gradient; a row asked outside the kept steps counted, as the device's fourth counter) and the
# trainer's upload of a host state (src/cuda/training.cu's upload_moments: every row at step S, the
# kept base S, nothing kept). Against torch-style AdamW over the whole table every step ("dense":
# a row without a gradient has a zero one) or over the rows with a gradient ("sparse"), the host
# state S steps in: over steps with an evaluation's row syncs, refused steps (nothing moves, nothing
# kept), dense-eager syncs and syncs for a checkpoint, every row's p, m, v must agree bit for bit
# once brought current, and no row is ever asked outside the kept steps.
#   /usr/bin/python3 tests/cuda/emulate_table_adamw.py     (a second; one line per run)
import numpy as np

F = np.float32
B1, B2, EPS, WD = F(0.9), F(0.95), F(1e-8), F(0.1)

def consts(step):  # adamw_consts of one step at a varying lr: step size, 1/sqrt(bc2), decay
    lr = F(1e-2 * (0.5 + 0.5 * np.cos(step / 7.0)))
    return F(lr / (1 - B1 ** step)), F(1 / np.sqrt(1 - B2 ** step)), F(1) - lr * WD

def adamw(p, m, v, g, c):  # adamw_element.cuh's order; g None: a zero gradient
    step_size, inv_bc2, decay = c
    if g is None:
        m[:], v[:] = B1 * m + F(0), B2 * v + F(0)
    else:
        m[:] = B1 * m + (F(1) - B1) * g
        v[:] = B2 * v + ((F(1) - B2) * g) * g
    p[:] = p * decay - (step_size * m) / (np.sqrt(v) * inv_bc2 + EPS)

class Device:  # the GPU's state: values, moments, row steps, kept constants
    def __init__(self, p, m, v, step, dense):  # upload_moments
        self.p, self.m, self.v = p.copy(), m.copy(), v.copy()
        self.row_step = np.full(len(p), step, np.int64)
        self.step, self.base, self.kept, self.dense, self.outside = step, step, [], dense, 0

    def replay(self, r, to):  # replay_row
        have, current = self.row_step[r], self.base + len(self.kept)
        if have >= to or current == self.base:
            return
        if have < self.base or to > current:
            self.outside += 1
            return
        cold = not np.any(self.m[r]) and not np.any(self.v[r])
        for s in range(have + 1, to + 1):
            c = self.kept[s - self.base - 1]
            if cold:
                self.p[r] *= c[2]
            else:
                adamw(self.p[r], self.m[r], self.v[r], None, c)
        self.row_step[r] = to

    def row_sync(self, rows):  # a forward's gather (table_row_sync; none under sparse)
        if self.dense:
            for r in rows:
                self.replay(r, self.base + len(self.kept))

    def optimizer_step(self, rows, g):  # optimizer_step's table part (step_tables, table_adamw_step)
        self.step += 1
        if not self.dense:
            self.kept, self.base = [], self.step - 1
        self.kept.append(consts(self.step))
        for i, r in enumerate(rows):
            if self.dense:
                self.replay(r, self.step - 1)
            adamw(self.p[r], self.m[r], self.v[r], g[i], self.kept[self.step - self.base - 1])
            self.row_step[r] = self.step

    def sync(self):  # sync_tables
        if self.dense:
            for r in range(len(self.p)):
                self.replay(r, self.base + len(self.kept))
            self.base += len(self.kept)
            self.kept = []

def reference_step(p, m, v, rows, g, step, dense):  # eager over the table, or the rows with a gradient
    slot = {r: i for i, r in enumerate(rows)}
    for r in range(len(p)) if dense else rows:
        adamw(p[r], m[r], v[r], g[slot[r]] if r in slot else None, consts(step))

def run(seed, mode, R=60, d=4, S=5, steps=25):
    rng = np.random.default_rng(seed)
    dense = mode != "sparse"
    p = rng.standard_normal((R, d)).astype(F)
    m, v = np.zeros((R, d), F), np.zeros((R, d), F)
    batch = lambda: np.unique(rng.integers(0, R // 2 if rng.random() < 0.5 else R, rng.integers(1, R // 4)))
    for step in range(1, S + 1):  # the host's S steps (rows R/2.. mostly cold)
        rows = batch()
        reference_step(p, m, v, rows, rng.standard_normal((len(rows), d)).astype(F), step, dense)
    dev, step = Device(p, m, v, S, dense), S
    for _ in range(steps):
        rows = batch()
        dev.row_sync(rows)
        g = rng.standard_normal((len(rows), d)).astype(F)
        if rng.random() < 0.15:  # refused (a non-finite norm): the step throws before anything is kept
            continue
        step += 1
        dev.optimizer_step(rows, g)
        reference_step(p, m, v, rows, g, step, dense)
        if mode == "dense-eager" or rng.random() < 0.2:
            dev.sync()  # dense-eager every step; else a checkpoint's download now and then
        dev.row_sync(np.unique(rng.integers(0, R, 8)))  # an evaluation's gathers
    assert dev.step == step
    dev.sync()
    for name, got, want in (("p", dev.p, p), ("m", dev.m, m), ("v", dev.v, v)):
        bad = np.flatnonzero(np.any(got != want, axis=1))
        assert len(bad) == 0, f"{mode} seed {seed}: {name} differs at rows {bad}"
    assert dev.outside == 0, f"{mode} seed {seed}: {dev.outside} rows asked outside the kept steps"
    assert np.all(dev.row_step == dev.step) or not dense, f"{mode} seed {seed}: rows behind after sync"
    print(f"emulate_table_adamw {mode} seed {seed}: host {S} steps, device {steps}, R {R}, d {d}: ok")

if __name__ == "__main__":
    for mode in ("dense", "sparse", "dense-eager"):
        for seed in range(3):
            run(seed, mode)
