#!/usr/bin/env python3
"""Paired seed statistics of a study CSV (scripts/study_lib.sh columns), from the CSV alone.

For each pair (baseline variant, treated variant) of one config and step count, over the seeds
that have both rows: the gap treated - baseline in final validation loss, its mean, standard
deviation (n - 1), a paired two-sided Student t-test (H0: mean gap 0) with its 95 % interval, and
the exact sign-flip permutation p-value (all 2^n sign patterns; its smallest possible value is
2 / 2^n, so with 3 seeds it cannot go below 0.25). Prints markdown tables.
  study_seeds_report.py CSV [--pairs base:jtok,moe:jtokm]
"""
import argparse
import csv
import itertools
import math
import sys


def betacf(a, b, x):
    # Continued fraction of the regularized incomplete beta (Lentz's method).
    tiny, qab, qap, qam = 1e-300, a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1 + aa * d; d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + aa / c; c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1 + aa * d; d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + aa / c; c = c if abs(c) > tiny else tiny
        de = d * c
        h *= de
        if abs(de - 1) < 1e-15:
            break
    return h


def betai(a, b, x):
    if x <= 0: return 0.0
    if x >= 1: return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(lbt) * betacf(a, b, x) / a
    return 1 - math.exp(lbt) * betacf(b, a, 1 - x) / b


def t_two_sided_p(t, df):
    return betai(df / 2, 0.5, df / (df + t * t))


def t_quantile(p, df):
    # Upper quantile: the t with P(T > t) = 1 - p, by bisection on the two-sided p.
    lo, hi = 0.0, 1e6
    target = 2 * (1 - p)
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_two_sided_p(mid, df) > target: lo = mid
        else: hi = mid
    return (lo + hi) / 2


def signflip_p(gaps):
    n, obs = len(gaps), abs(sum(gaps))
    hits = sum(1 for s in itertools.product((1, -1), repeat=n)
               if abs(sum(g * x for g, x in zip(gaps, s))) >= obs - 1e-12)
    return hits / 2 ** n


def mean_sd(xs):
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else float("nan")
    return m, sd


def paired_t(gaps):
    """Paired differences: (mean, sd, se, t, p), p the two-sided Student-t p on n - 1 df; se, t and p
    are None unless there are at least 2 differences with sd > 0."""
    m, sd = mean_sd(gaps)
    n = len(gaps)
    if n < 2 or not sd > 0:
        return m, sd, None, None, None
    se = sd / math.sqrt(n)
    return m, sd, se, m / se, t_two_sided_p(m / se, n - 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--pairs", default="base:jtok,moe:jtokm")
    a = ap.parse_args()
    rows = list(csv.DictReader(open(a.csv)))
    if not rows:
        sys.exit(f"{a.csv}: no rows")
    by = {}
    for r in rows:
        by[(r["config"], r["steps"], r["variant"], r["seed"])] = r
    groups = sorted({(r["config"], r["steps"]) for r in rows})
    print("| config | steps | variant | seeds | val loss per seed | mean | sd |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for cfg, steps in groups:
        for v in sorted({r["variant"] for r in rows if (r["config"], r["steps"]) == (cfg, steps)}):
            rs = sorted((r for r in rows if (r["config"], r["steps"], r["variant"]) == (cfg, steps, v)), key=lambda r: int(r["seed"]))
            xs = [float(r["val_loss"]) for r in rs]
            m, sd = mean_sd(xs)
            sds = f"{sd:.4f}" if len(xs) > 1 else "-"
            print(f"| {cfg} | {steps} | {v} | {','.join(r['seed'] for r in rs)} | {' '.join(f'{x:.4f}' for x in xs)} | {m:.4f} | {sds} |")
    print()
    print("| config | steps | gap | seeds | gap per seed | mean gap | sd | 95 % CI (t) | t (df) | p, paired t | p, sign-flip (exact) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for cfg, steps in groups:
        for pair in a.pairs.split(","):
            b, v = pair.split(":")
            seeds = sorted({s for (c, st, var, s) in by if (c, st, var) == (cfg, steps, b) and (cfg, steps, v, s) in by}, key=int)
            if not seeds:
                continue
            gaps = [float(by[(cfg, steps, v, s)]["val_loss"]) - float(by[(cfg, steps, b, s)]["val_loss"]) for s in seeds]
            m, sd, se, t, p = paired_t(gaps)
            n = len(gaps)
            if t is not None:
                q = t_quantile(0.975, n - 1)
                ci = f"[{m - q * se:+.4f}, {m + q * se:+.4f}]"
                tt = f"{t:.2f} ({n - 1})"
                ps = f"{p:.2g}"
            else:
                ci, tt, ps = "-", "-", "-"
            tail = (f"{sd:.4f} | {ci} | {tt} | {ps} | {signflip_p(gaps):.3g} |" if n > 1 else "- | - | - | - | - |")
            print(f"| {cfg} | {steps} | {v} - {b} | {','.join(seeds)} | {' '.join(f'{g:+.4f}' for g in gaps)} | "
                  f"**{m:+.4f}** | " + tail)


if __name__ == "__main__":
    main()
