"""Compares the step losses of two jtok runs (log.jsonl), for tests/test_dist_train.sh.

usage: dist_compare.py A/log.jsonl B/log.jsonl --rtol R [--rtol-after-flip F] [--bitwise]
- --bitwise: every step's loss must be the same float (and the routing digests equal).
- otherwise: |a - b| / |a| <= R at every step up to the first step whose routing digest differs
  (a top-k choice flipped on a near-tie; the digest covers every MoE and JTok-M choice, see
  dist::routing_digest); from that step on the bound is F (default R), and the flip is reported.
"""
import argparse, json, sys

ap = argparse.ArgumentParser()
ap.add_argument("a"); ap.add_argument("b")
ap.add_argument("--rtol", type=float, default=0.0)
ap.add_argument("--rtol-after-flip", type=float, default=None)
ap.add_argument("--bitwise", action="store_true")
ap.add_argument("--steps", type=int, required=True)
o = ap.parse_args()

def steps(path):
    out = {}
    for line in open(path):
        j = json.loads(line)
        if j.get("type") == "step":
            out[j["step"]] = (j["loss"], j.get("routing_digest"))
    return out

a, b = steps(o.a), steps(o.b)
if sorted(a) != list(range(1, o.steps + 1)) or sorted(b) != sorted(a):
    sys.exit(f"FAIL: steps logged: {sorted(a)} vs {sorted(b)}, expected 1..{o.steps}")
flip = None
worst = 0.0
for s in sorted(a):
    (la, da), (lb, db) = a[s], b[s]
    if o.bitwise:
        if la.hex() != lb.hex() or da != db:
            sys.exit(f"FAIL: step {s}: loss {la.hex()} vs {lb.hex()}, routing digest {da} vs {db} (expected bit for bit)")
        continue
    if flip is None and da != db:
        flip = s
        print(f"note: routing differs from step {s} on (a near-tie flipped); bound {o.rtol_after_flip} from there")
    tol = o.rtol if flip is None else (o.rtol_after_flip if o.rtol_after_flip is not None else o.rtol)
    rel = abs(la - lb) / abs(la)
    worst = max(worst, rel)
    if rel > tol:
        sys.exit(f"FAIL: step {s}: loss {la!r} vs {lb!r}, relative difference {rel:.3g} > {tol:g}")
print("ok: %d steps %s" % (len(a), "bit for bit" if o.bitwise else f"within relative {o.rtol:g} (worst {worst:.3g})"))
