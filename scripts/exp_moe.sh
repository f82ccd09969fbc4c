#!/usr/bin/env bash
# MoE vs +JTok vs +JTok-M on the training shards with identical settings, data order and tokens
# (same seed), plus JTok-M without the 1/sqrt(2 N_layers) factor (paper Appendix E.1) and JTok-M
# with the lazy table optimizer (table_optimizer sparse, the setting of its throughput goal). Reports
# validation loss, BLiMP, eta/rho and the final hidden-state std of each, and draws the loss curves
# and the hidden-state std curves (averaged over layers, tokens and dimensions). Resumable: a
# finished run is not redone.
#   scripts/exp_moe.sh [--steps N] [--config C] [--out DIR] [--blimp-limit N] [--extra "--field v ..."]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/exp_lib.sh
CONFIG=configs/exp_moe.json; OUT=runs/exp_moe
exp_parse_args "$@"
exp_setup
mkdir -p "$OUT"
VARIANTS=(moe jtok jtokm jtokm_noscale jtokm_sparse)
exp_train_eval "$OUT/moe" --jtok false --jtokm false
exp_train_eval "$OUT/jtok" --jtok true --jtokm false
exp_train_eval "$OUT/jtokm" --jtok false --jtokm true
exp_train_eval "$OUT/jtokm_noscale" --jtok false --jtokm true --jtokm_depth_scaling false
exp_train_eval "$OUT/jtokm_sparse" --jtok false --jtokm true --table_optimizer sparse
runs=(--run "$OUT/moe" --label MoE --run "$OUT/jtok" --label "+JTok" --run "$OUT/jtokm" --label "+JTok-M"
      --run "$OUT/jtokm_noscale" --label "+JTok-M w/o 1/sqrt(2N)" --run "$OUT/jtokm_sparse" --label "+JTok-M lazy tables")
"$JTOK" plot-curves "${runs[@]}" --title "MoE vs +JTok vs +JTok-M ($(basename "$CONFIG"))" --out "$OUT/curves.svg"
"$JTOK" plot-curves "${runs[@]}" --metric hidden_std --ema 0 \
  --title "hidden-state std, mean over layers ($(basename "$CONFIG"))" --out "$OUT/hidden_std.svg"
/usr/bin/python3 - "$OUT" "${VARIANTS[@]}" <<'PY'
import json, sys
out, variants = sys.argv[1], sys.argv[2:]
print(f"{'variant':14} {'val_loss':>9} {'val_ppl':>9} {'BLiMP':>7} {'N_c':>9} {'N_n':>11} {'eta':>7} {'rho':>5} {'hid.std':>8} {'tok/s':>7}")
rows = {}
for v in variants:
    e = json.load(open(f"{out}/{v}/eval.json"))
    lines = [json.loads(l) for l in open(f"{out}/{v}/log.jsonl")]
    f = lines[0].get("flops", {})
    steps = [l for l in lines if l["type"] == "step"]
    hstd = sum(s["hidden_std"] for s in steps[-10:]) / len(steps[-10:])
    tps = sorted(s["tokens_per_s"] for s in steps)[len(steps) // 2]
    rows[v] = e["val_loss"]
    print(f"{v:14} {e['val_loss']:9.4f} {e['val_ppl']:9.2f} {100*e['blimp']['accuracy']:6.2f}% {f.get('n_c', 0):9d} "
          f"{f.get('n_n', 0):11d} {f.get('eta', 0):7.2f} {f.get('rho', 0):5.2f} {hstd:8.4f} {tps:7.0f}")
    routing = [l for l in lines if l["type"] == "routing"]
    if routing:
        last = routing[-1]
        for l in last["layers"]:
            print(f"    layer {l['layer']}: load " + " ".join(f"{x:.3f}" for x in l["load"]) +
                  " | mean weight " + " ".join(f"{x:.3f}" for x in l["mean_weight"]))
for v in variants[1:]:
    print(f"delta val_loss ({v} - moe): {rows[v] - rows['moe']:+.4f}")
PY
