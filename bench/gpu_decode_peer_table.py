#!/usr/bin/env python3
"""The table of bench/gpu_decode_peer.sh: reads OUT/ours_dense.json, OUT/ours_int8.json (dense, its
matrices int8: "dense int8", its ratio to dense in the "/ dense" column), OUT/ours_pdl.json (dense with
programmatic dependent launch, "dense pdl", likewise; the GPU's only: a .skipped file elsewhere),
OUT/ours_tc.json (dense with its decode steps' products on the tensor cores, "dense tc", likewise),
OUT/ours_int8only.json (where `--runs int8only` made it: dense int8 with --int8-decode only, "dense int8 only"),
OUT/ours_jtokm.json,
OUT/ours_beyond.json and OUT/ours_disk.json (where `--runs beyond` / `disk` made them; disk: JTok-M
n_e 5 from a table store on disk, a row "disk store, staged" beside n_e 5's placements), OUT/peer.json (one JSON line a run: `jtok bench-decode`, bench/hf_decode_peer.py) and prints
markdown: per batch, prefill and decode tok/s, TPOT, ours / the peer, JTok-M / dense and JTok-M's
overhead against its tables in HBM (1 - tok/s / hbm's), beside issue 40's goals (on a GPU: decode
>= 1,000 tok/s at batch 1 and >= 10,000 at batch 16; host tables within 2 % of hbm in decode, 1 %
in prefill), and the backbone's weight bytes a step reads over its TPOT (ours: "weight_gbs", against
the GPU's HBM bandwidth); then the long prompt's prefill; then, for beyond, its tables' GB beside the GPU's
memory (OUT/plan.json) and the peak GPU memory the decoder held, its decode against dense and
against n_e 5's in the same place; then the checks (the same prompt ids in both engines,
the same tokens from every table placement). A run that made no line gets a row saying why (its
.skipped file, or the last line of its log). Also writes OUT/table.json (the rows, for tests).

    python3 bench/gpu_decode_peer_table.py OUT
"""
import json
import os
import sys

RUNS = (("ours_dense", "ours", "dense"), ("ours_int8", "ours", "dense int8"), ("ours_pdl", "ours", "dense pdl"),
        ("ours_tc", "ours", "dense tc"),
        ("ours_int8only", "ours", "dense int8 only"), ("ours_jtokm", "ours", "jtokm"), ("ours_beyond", "ours", "jtokm"),
        ("ours_disk", "ours", "jtokm"), ("peer", "peer", "dense"))
ASKED_ONLY = ("ours_pdl", "ours_tc", "ours_int8only", "ours_beyond", "ours_disk")  # runs "not run" unless --runs asks for them
GOAL_TOK_S = {1: 1000, 16: 10000}
GOAL_OVERHEAD = {"decode": 0.02, "prefill": 0.01}


def read_run(out, name):
    """(lines, why not): the run's JSON lines, or why there are none."""
    lines = []
    path = os.path.join(out, f"{name}.json")
    if os.path.exists(path):
        for raw in open(path):
            raw = raw.strip()
            if raw.startswith("{"):
                lines.append(json.loads(raw))
    if lines:
        return lines, ""
    for suffix in ("skipped", "log"):
        p = os.path.join(out, f"{name}.{suffix}")
        if os.path.exists(p):
            tail = [x.strip() for x in open(p, errors="replace") if x.strip()]
            if tail:
                return [], ("" if suffix == "skipped" else "failed: ") + tail[-1][:160]
    return [], "not run"


def fmt(x, spec=",.1f"):
    return "-" if x is None else format(x, spec)


def pct(x):
    return "-" if x is None else f"{100 * x:+.2f} %"


def goal_cell(device, row, kind):
    """The goal that row answers to, and whether it is met."""
    if device != "cuda" or row["engine"] != "ours":
        return "-"
    if row.get("overhead") is not None:
        g = GOAL_OVERHEAD[kind]
        return f"within {100 * g:.0f} % of hbm: {'met' if row['overhead'] <= g else 'MISSED'}"
    if kind == "decode" and row["batch"] in GOAL_TOK_S and row["model"] in ("dense", "dense int8", "dense pdl", "dense tc", "dense int8 only"):
        g = GOAL_TOK_S[row["batch"]]
        return f">= {g:,} tok/s: {'met' if row['decode_tok_s'] >= g else 'MISSED'}"
    return "-"


def make_rows(out):
    """Every run's lines as rows, with the ratios; and the runs that made none."""
    rows, missing = [], {}
    for name, engine, model in RUNS:
        lines, why = read_run(out, name)
        if not lines and not (name in ASKED_ONLY and why == "not run"):
            missing[name] = why
        for j in lines:
            tables = j.get("table_rows", "-") if model == "jtokm" else "-"
            if name == "ours_disk":  # the store's rows, staged to the GPU (on the CPU read where they are)
                tables = "disk store" + (f", {tables}" if tables != "-" else "")
            # beyond is a model of its own (n_e tables of each id): its ratios are against its own hbm
            m = f"jtokm n_e {j['model']['jtokm_n_e']}" if name == "ours_beyond" else model
            label = engine if engine == "ours" else f"peer: {j.get('engine', '?')} {j.get('transformers', '')}".strip()
            rows.append(dict(run=name, engine=engine, label=label, model=m, tables=tables, kind=j["run"], batch=j["batch"],
                             prompt=j["prompt"], prefill_tok_s=j["prefill_tok_s"], decode_tok_s=j.get("decode_tok_s"),
                             tpot_ms=j.get("tpot_ms"), prompt_fnv1a=j.get("prompt_fnv1a"),
                             tokens_fnv1a=j.get("tokens_fnv1a"), device=j.get("device"), line=j))
    key = lambda r: "decode_tok_s" if r["kind"] == "decode" else "prefill_tok_s"  # noqa: E731
    find = lambda **k: next((r for r in rows if all(r[a] == b for a, b in k.items())), None)  # noqa: E731
    for r in rows:
        peer = find(engine="peer", kind=r["kind"], batch=r["batch"])
        dense = find(engine="ours", model="dense", kind=r["kind"], batch=r["batch"])
        hbm = find(engine="ours", model=r["model"], tables="hbm", kind=r["kind"], batch=r["batch"])
        jtokm = r["model"].startswith("jtokm")
        v = r[key(r)]
        r["vs_peer"] = v / peer[key(r)] if r["engine"] == "ours" and peer else None
        r["vs_dense"] = v / dense[key(r)] if (jtokm or r["model"] in ("dense int8", "dense pdl", "dense tc", "dense int8 only")) and dense else None
        r["overhead"] = 1 - v / hbm[key(r)] if jtokm and hbm and r is not hbm else None
    return rows, missing


def print_tables(rows, missing, device, gpu_bytes):
    decode = [r for r in rows if r["kind"] == "decode"]
    prefill = [r for r in rows if r["kind"] == "prefill"]
    if decode:
        d = decode[0]
        print(f"Decode ({device}): prompt {d['prompt']}, {d['line']['new_tokens']} greedy steps per sequence\n")
        print("| engine | model | tables | batch | prefill tok/s | decode tok/s | TPOT ms | ours / peer | / dense | vs hbm | goal "
              "| weights GB/s |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
        for r in decode:
            print(f"| {r['label']} | {r['model']} | {r['tables']} | {r['batch']} | {fmt(r['prefill_tok_s'])} | "
                  f"{fmt(r['decode_tok_s'])} | {fmt(r['tpot_ms'], '.3f')} | {fmt(r['vs_peer'], '.2f')} | "
                  f"{fmt(r['vs_dense'], '.3f')} | {pct(r['overhead'])} | {goal_cell(device, r, 'decode')} | "
                  f"{fmt(r['line'].get('weight_gbs'), ',.0f')} |")
    if prefill:
        print(f"\nPrefill of one {prefill[0]['prompt']}-token prompt ({device})\n")
        print("| engine | model | tables | prefill tok/s | ms | ours / peer | / dense | vs hbm | goal |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
        for r in prefill:
            print(f"| {r['label']} | {r['model']} | {r['tables']} | {fmt(r['prefill_tok_s'])} | "
                  f"{fmt(1e3 * r['prompt'] / r['prefill_tok_s'], '.2f')} | {fmt(r['vs_peer'], '.2f')} | "
                  f"{fmt(r['vs_dense'], '.3f')} | {pct(r['overhead'])} | {goal_cell(device, r, 'prefill')} |")
    print_beyond(rows, gpu_bytes)
    for name, why in missing.items():
        print(f"\n{name}: no figures ({why})")


def print_beyond(rows, gpu_bytes):
    """The tables past the GPU's memory: their bytes beside the GPU's and what the decoder held."""
    beyond = [r for r in rows if r["model"].startswith("jtokm n_e") and r["kind"] == "decode"]
    if not beyond:
        return
    gpu = f"{gpu_bytes / 1e9:.1f} GB" if gpu_bytes else "not seen"
    print(f"\nTables beyond the GPU's memory ({gpu}): JTok-M n_e {beyond[0]['line']['model']['jtokm_n_e']}, K 2, "
          "every layer\n")
    print("| tables | table GB | peak GPU GB | batch | decode tok/s | JTok-M / dense | vs hbm | n_e 5 in the same place / dense |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in beyond:
        ne5 = next((x for x in rows if x["model"] == "jtokm" and x["tables"] == r["tables"] and x["kind"] == "decode"
                    and x["batch"] == r["batch"]), None)
        peak = r["line"].get("peak_gpu_mb")
        print(f"| {r['tables']} | {fmt(r['line']['model'].get('table_gb'), '.1f')} | "
              f"{fmt(None if peak is None else peak * 1048576 / 1e9, '.2f')} | {r['batch']} | {fmt(r['decode_tok_s'])} | "
              f"{fmt(r['vs_dense'], '.3f')} | {pct(r['overhead'])} | {fmt(ne5 and ne5['vs_dense'], '.3f')} |")


def checks(rows):
    """Whether both engines read the same prompts, and JTok-M's placements gave the same tokens."""
    c = {}
    for (kind, batch) in sorted({(r["kind"], r["batch"]) for r in rows}):
        hashes = {r["prompt_fnv1a"] for r in rows if r["kind"] == kind and r["batch"] == batch}
        c[f"same prompts, {kind} batch {batch}"] = len(hashes) == 1
        for model in sorted({r["model"] for r in rows if r["model"].startswith("jtokm")}):
            same = [r for r in rows if r["model"] == model and r["kind"] == kind and r["batch"] == batch]
            if len(same) > 1:
                name = "JTok-M" if model == "jtokm" else f"JTok-M {model[6:]}"
                c[f"{name} same tokens from every table placement, {kind} batch {batch}"] = \
                    len({r["tokens_fnv1a"] for r in same}) == 1
    return c


def main():
    out = sys.argv[1]
    rows, missing = make_rows(out)
    plan = os.path.join(out, "plan.json")
    gpu_bytes = json.load(open(plan)).get("gpu_bytes") if os.path.exists(plan) else None
    device = next((r["device"] for r in rows if r["engine"] == "ours"), next((r["device"] for r in rows), "?"))
    print_tables(rows, missing, device, gpu_bytes)
    c = checks(rows)
    if c:
        print()
        for k, ok in c.items():
            print(f"check: {k}: {'yes' if ok else 'NO'}")
    for r in rows:
        del r["line"]
    json.dump({"device": device, "rows": rows, "missing": missing, "checks": c}, open(os.path.join(out, "table.json"), "w"),
              indent=1)


if __name__ == "__main__":
    main()
