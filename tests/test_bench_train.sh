#!/usr/bin/env bash
# `jtok bench-train` (the engine side of bench/train_throughput.sh): one JSON line with the timing
# fields; with --variant, one line per model (base first), the variant's config really applied (its
# parameter count includes the JTok-M tables), steps interleaved (as many timed steps for each), a
# cost per round (charged its share of the final table sync) and its median; the same tokens give the base the same loss as a plain run; a
# malformed --variant or an unknown field in it gives an error naming it.
set -euo pipefail
JTOK=${JTOK_BIN:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
cat > "$T/cfg.json" <<JSON
{ "model_type": "jtok_dense", "vocab_size": 500, "hidden_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 32,
  "jtokm_n_e": 4, "jtokm_top_k": 2, "seq_len": 16, "micro_batch_size": 2, "max_steps": 10 }
JSON
export OMP_NUM_THREADS=2
"$JTOK" bench-train --config "$T/cfg.json" --steps 3 > "$T/plain.out"
"$JTOK" bench-train --config "$T/cfg.json" --steps 3 --variant "jm:jtokm=true,table_optimizer=sparse" \
  --variant "jt:jtok=true" > "$T/paired.out"
/usr/bin/python3 - "$T/plain.out" "$T/paired.out" <<'PY'
import json, sys
plain = [json.loads(l) for l in open(sys.argv[1])]
paired = [json.loads(l) for l in open(sys.argv[2])]
assert len(plain) == 1 and "variant" not in plain[0], plain
p = plain[0]
for k in ("tokens_per_s", "step_ms", "step_ms_min", "sync_ms", "gflops", "cpu_s_per_step", "params", "peak_rss_mb", "loss"):
    assert k in p, k
assert len(p["step_ms_each"]) == 3 and min(p["step_ms_each"]) == p["step_ms_min"] > 0
assert [j["variant"] for j in paired] == ["base", "jm", "jt"], paired
base, jm, jt = paired
assert base["params"] == p["params"] and base["loss"] == p["loss"], (base, p)
# JTok-M adds 2 layers x (4 tables of 512 x 32 + router 4 x 32 + scale 32); JTok 2 x (512 x 32 + 32)
assert jm["params"] - base["params"] == 2 * (4 * 512 * 32 + 4 * 32 + 32), jm["params"] - base["params"]
assert jt["params"] - base["params"] == 2 * (512 * 32 + 32), jt["params"] - base["params"]
for v in (jm, jt):
    assert len(v["step_ms_each"]) == 3 and len(v["cost_each"]) == 3
    R = len(v["step_ms_each"])
    want = [1 - (b + base["sync_ms"] / R) / (x + v["sync_ms"] / R) for b, x in zip(base["step_ms_each"], v["step_ms_each"])]
    assert all(abs(a - w) < 1e-9 for a, w in zip(v["cost_each"], want)), (v["cost_each"], want)
    assert sorted(v["cost_each"])[1] == v["cost_median"]
assert "cost_median" not in base
print("bench-train OK")
PY
for bad in "nolabel" ":jtok=true" "x:no_such_field=1"; do
  if "$JTOK" bench-train --config "$T/cfg.json" --steps 1 --variant "$bad" > "$T/bad.out" 2>&1; then
    echo "FAIL: --variant $bad was accepted"; exit 1
  fi
  grep -qE "variant|no_such_field" "$T/bad.out" || { echo "FAIL: unclear error for --variant $bad"; cat "$T/bad.out"; exit 1; }
done
echo OK
