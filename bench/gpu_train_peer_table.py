"""The table of bench/gpu_train_peer.sh: reads DIR/peer_<mode>_<model>.json (train_bench.py's JSON
line) and DIR/ours_<model>.json (`jtok bench-train --device cuda`, one process a model: dense,
jtok, jtokm, jtokm_streams, jtokm_eager, jtokm_naive) and prints a markdown table:
tokens/s, MFU, peak memory, the ratio to the same engine and mode's dense run, and ours over
torch.compile's for the same model; then ours as the paper's training table in kind: the backbone,
+JTok-M without dedup (jtokm_naive: a token-table row gathered and scattered a position at a time,
the table AdamW's naive pass over every row every step), +dedup (jtokm_eager), +the deferred table
optimizer (jtokm), +the table work on side streams (jtokm_streams), tokens/s and the ratio to the
backbone; then ours by phase where its runs were
profiled (JTOK_PROFILE=1: step_breakdown_ms, milliseconds a step). A missing or empty file is a row
of "-" (a run that failed or was killed: its log says why).

    python3 bench/gpu_train_peer_table.py bench-out/gpu_train_peer
"""
import json
import os
import sys

MODELS = ("dense", "jtok", "jtokm")
# Ours also runs JTok-M with the table AdamW's naive pass over every row every step
# (table_optimizer dense-eager: the same bits), the cost the deferred optimizer saves, and that
# without dedup as well (table_dedup false: a row a token position), the cost dedup saves; and with
# the table AdamW and row syncs on side streams (table_streams true: the same bits, overlapped).
OURS_ONLY = ("jtokm_streams", "jtokm_eager", "jtokm_naive")
LABEL = {"dense": "dense", "jtok": "+JTok", "jtokm": "+JTok-M (n_e 5, K 2)",
         "jtokm_streams": "+JTok-M, table work on side streams", "jtokm_eager": "+JTok-M, eager table AdamW", "jtokm_naive": "+JTok-M, no dedup, eager table AdamW"}
# The paper's training table in kind, ours: each row adds one optimisation to the one above.
PAPER = (("dense", "backbone"), ("jtokm_naive", "+JTok-M without dedup (naive gather, scatter, table AdamW)"),
         ("jtokm_eager", "+dedup"), ("jtokm", "+deferred table optimizer"),
         ("jtokm_streams", "+table work on side streams"))


def read_lines(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip().startswith("{")]
    except (OSError, ValueError):
        return []


def runs(directory):
    """{(engine, mode): {model: json}}: the peer per mode, ours as ("jtok", "cuda")."""
    out = {}
    for mode in ("eager", "compile"):
        for model in MODELS:
            path = os.path.join(directory, f"peer_{mode}_{model}.json")
            lines = read_lines(path)
            if os.path.exists(path):  # run (an empty line: it failed, a row of "-")
                out.setdefault(("pytorch", mode), {})
            if lines:
                out[("pytorch", mode)][model] = lines[-1]
    for model in MODELS + OURS_ONLY:  # ours: one bench-train process a model
        path = os.path.join(directory, f"ours_{model}.json")
        lines = read_lines(path)
        if os.path.exists(path):
            out.setdefault(("jtok", "cuda"), {})
        if lines:
            out[("jtok", "cuda")][model] = lines[-1]
    return out


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def rows(table):
    compiled = table.get(("pytorch", "compile"), {})
    for (engine, mode), by_model in table.items():
        dense = by_model.get("dense", {}).get("tokens_per_s")
        for model in MODELS + (OURS_ONLY if engine == "jtok" else ()):
            r = by_model.get(model)
            if r is None:
                yield [engine, mode, LABEL[model]] + ["-"] * 5
                continue
            tps = r.get("tokens_per_s")
            mem = r.get("peak_mem_mb")
            vs_dense = tps / dense if tps and dense else None
            ref = compiled.get(model, {}).get("tokens_per_s")
            vs_compile = tps / ref if engine == "jtok" and tps and ref else None
            yield [engine, mode, LABEL[model], fmt(tps, ",.0f"), fmt(r.get("mfu"), ".3f"),
                   fmt(mem / 1024 if mem else None, ".1f"), fmt(vs_dense, ".3f"), fmt(vs_compile, ".3f")]


def paper_rows(ours):
    backbone = ours.get("dense", {}).get("tokens_per_s")
    for model, label in PAPER:
        tps = ours.get(model, {}).get("tokens_per_s")
        yield [label, fmt(tps, ",.0f"), fmt(tps / backbone if tps and backbone else None, ".3f")]


def phase_rows(ours):
    """Ours' step by phase: a row a phase (in the first profiled run's order, then any others), a
    column a model, milliseconds a step and the share of the dense step."""
    models = [m for m in MODELS + OURS_ONLY if "step_breakdown_ms" in ours.get(m, {})]
    phases = []
    for m in models:  # the step's order (step_phases; the JSON object's keys are sorted), the gaps last
        for p in ours[m].get("step_phases", []) + sorted(ours[m]["step_breakdown_ms"]):
            if p != "host_gaps" and p not in phases:
                phases.append(p)
    phases.append("host_gaps")
    for p in phases:
        yield [p] + [fmt(ours[m]["step_breakdown_ms"].get(p), ".3f") for m in models]
    yield ["step (wall)"] + [fmt(ours[m].get("step_ms"), ".3f") for m in models]


def attention_rows(ours):
    """Ours' attention kernels a model timed at its first step and kept (attention_rows: 16 or 32 query
    rows a warp, the same bits), a row each for the forward and the backward, a column a model."""
    models = [m for m in MODELS + OURS_ONLY if "attention_rows" in ours.get(m, {})]
    for part in ("forward", "backward"):
        cells = []
        for m in models:
            a = ours[m]["attention_rows"]
            ms = a.get(f"{part}_ms", [0, 0])
            cells.append(f"{a[part]} ({fmt(ms[0], '.3f')} / {fmt(ms[1], '.3f')} ms)" if ms[0] else str(a[part]))
        yield models, [part] + cells


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: gpu_train_peer_table.py DIR [TITLE]")
    title = sys.argv[2] if len(sys.argv) == 3 else "config b, 16 x 1024 tokens a step"
    table = runs(sys.argv[1])
    if not table:
        sys.exit(f"gpu_train_peer_table.py: no results in {sys.argv[1]}")
    lines = [r for by_model in table.values() for r in by_model.values()]
    device = next((r["device_name"] for r in lines if r.get("device_name")), "?")
    print(f"{title}, {device}\n")
    print("| engine | mode | model | tokens/s | MFU | peak GiB | / dense | ours / compile |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows(table):
        print("| " + " | ".join(row) + " |")
    ours = table.get(("jtok", "cuda"))
    if ours is not None:
        print("\nOurs, the paper's training table in kind (JTok-M n_e 5, K 2):\n")
        print("| step | tokens/s | / backbone |")
        print("| --- | --- | --- |")
        for row in paper_rows(ours):
            print("| " + " | ".join(row) + " |")
        chosen = list(attention_rows(ours))
        if chosen and chosen[0][0]:
            models = chosen[0][0]
            print("\nOurs' attention, query rows a warp as timed at the first step and kept (16 / 32 rows, ms a call):\n")
            print("| kernel | " + " | ".join(LABEL[m] for m in models) + " |")
            print("| --- |" + " --- |" * len(models))
            for _, row in chosen:
                print("| " + " | ".join(row) + " |")
        profiled = [m for m in MODELS + OURS_ONLY if "step_breakdown_ms" in ours.get(m, {})]
        if profiled:
            print("\nOurs by phase (JTOK_PROFILE=1: device events between phases), ms a step:\n")
            print("| phase | " + " | ".join(LABEL[m] for m in profiled) + " |")
            print("| --- |" + " ---: |" * len(profiled))
            for row in phase_rows(ours):
                print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
