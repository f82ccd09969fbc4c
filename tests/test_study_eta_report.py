"""scripts/study_eta_report.py's fits on synthetic rows whose answer is known.

Losses made as y = level(seed) + b * log2(eta) (+ a small deterministic wiggle): the seed-as-fixed-
effect slope must recover b whatever the seed levels, while the pooled fit is biased when a seed
with a high level has runs only at large eta; the per-seed slopes are b each; and the printed
table carries the numbers.
"""
import csv
import io
import math
import os
import subprocess
import sys
import tempfile
from contextlib import redirect_stdout

sys.path.insert(0, os.path.join(os.environ.get("JTOK_ROOT", os.path.join(os.path.dirname(__file__), "..")), "scripts"))
import study_eta_report as rep  # noqa: E402

B = -0.02
LEVEL = {"1": 6.0, "2": 6.3, "3": 5.9}


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)


# Exact data: the fixed-effect slope is b with zero standard error.
groups = {s: [(x, lv + B * x) for x in (5.0, 6.0, 7.0)] for s, lv in LEVEL.items()}
b, se, df = rep.fixed_effect_slope(groups)
check(abs(b - B) < 1e-12 and se < 1e-9 and df == 9 - 3 - 1, f"exact data: b {b}, se {se}, df {df}")

# Seed 2 (the highest level) sampled only at the largest etas: pooled OLS is pulled upwards, the
# fixed-effect fit is not.
groups["2"] = [(x, LEVEL["2"] + B * x) for x in (7.0, 8.0)]
pooled = rep.ols([p for pts in groups.values() for p in pts])[1]
b, se, _ = rep.fixed_effect_slope(groups)
check(pooled > 0 and abs(b - B) < 1e-12, f"confounded design: pooled {pooled}, fixed effect {b}")

# No residual degrees of freedom, or one eta per seed: no fit.
check(rep.fixed_effect_slope({"1": [(1.0, 1.0), (2.0, 2.0)]}) is None, "2 points, 1 seed: df 0")
check(rep.fixed_effect_slope({"1": [(1.0, 1.0)], "2": [(1.0, 2.0)], "3": [(1.0, 3.0)]}) is None, "no x spread")

# The whole report on a CSV: per-seed slopes b, a wiggle gives a positive standard error.
fields = "study,config,variant,seed,steps,tokens,n_c,n_n,eta,rho,flops_6nd,val_loss,val_tokens,blimp,wall_s,commit".split(",")
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "eta.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for s, lv in LEVEL.items():
            for i, ne in enumerate((4, 8, 16)):
                eta = 35.5 * ne / 4
                wiggle = 0.001 * (-1) ** (i + int(s))
                w.writerow({"study": "eta", "config": "c", "variant": f"jtokm_ne{ne}", "seed": s, "steps": "250",
                            "eta": eta, "rho": 0.25, "val_loss": lv + B * math.log2(eta) + wiggle, "n_n": 1})
            w.writerow({"study": "eta", "config": "c", "variant": "moe", "seed": s, "steps": "250", "eta": 0,
                        "rho": 0, "val_loss": lv + 0.1, "n_n": 0})
    out = io.StringIO()
    sys.argv = ["study_eta_report.py", path]
    with redirect_stdout(out):
        rep.main()
    text = out.getvalue()
    fe = [l for l in text.splitlines() if l.startswith("| 250 | 1,2,3 |")]
    check(len(fe) == 1, "one fixed-effect row for 250 steps:\n" + text)
    cells = [c.strip() for c in fe[0].strip("|").split("|")]
    slope = float(cells[2].strip("*"))
    check(abs(slope - B) < 2e-3 and float(cells[3]) > 0 and cells[5] == "5", f"fixed-effect row {cells}")
    per = [float(x) for x in cells[6].split()]
    check(len(per) == 3 and all(abs(p - B) < 3e-3 for p in per), f"per-seed slopes {per}")
    # The script runs standalone too.
    r = subprocess.run([sys.executable, rep.__file__, path], capture_output=True, text=True)
    check(r.returncode == 0 and "seed as fixed effect" in r.stdout, r.stderr)
print("ok: fixed-effect slope, per-seed slopes, report table")
