#!/usr/bin/env bash
# `jtok embp-plan` on real ids (the repository's docs as a corpus): one rank exchanges nothing;
# on 4 ranks deduplication never costs more than what it deduplicates, premix + dedup costs no
# more than premix or naive, id mod P is better balanced than contiguous ranges; bad shapes are
# refused with a message naming the option. (That its formulas equal the bytes the exchanges
# measure is tests/test_dist_embp.cpp's PlannerFormulasEqualMeasured.)
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
"$JTOK" prepare --tokenizer gpt2 --out "$T/train" "$ROOT"/tests/data/corpus/*.md > /dev/null
cat > "$T/cfg.json" <<JSON
{ "vocab_size": 50257, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
  "intermediate_size": 128, "jtok": true, "jtok_layers": "0", "jtokm": true, "jtokm_n_e": 4, "jtokm_top_k": 2 }
JSON
plan() { "$JTOK" embp-plan --data "$T/train" --config "$T/cfg.json" --seq 256 --batch 8 --json "$@"; }
plan --ranks 1 > "$T/p1.json"
plan --ranks 4 --micro-batch 2 --steps 2 > "$T/p4.json"
plan --ranks 4 --micro-batch 2 --steps 2 --routing per-id > "$T/p4id.json"
/usr/bin/python3 - "$T/p1.json" "$T/p4.json" "$T/p4id.json" <<'PY'
import json, sys
p1, p4, pid = (json.load(open(f)) for f in sys.argv[1:4])
b1 = p1["bytes_per_rank_per_step"]
assert all(v["max"] == 0 for v in b1.values()), b1
for p in (p4, pid):
    b = {k: v["mean"] for k, v in p["bytes_per_rank_per_step"].items()}
    assert 0 < b["naive"] <= b["naive_nodedup"], b
    assert 0 < b["jtok"] <= b["jtok_nodedup"], b
    assert b["premix_dedup"] <= min(b["premix"], b["naive"]), b
    assert b["replicated_dense"] > b["premix"], b
    assert p["dedup_positions_per_unique_id"] > 1, p
    li = p["load_imbalance"]
    assert 1 <= li["mod"]["unique_ids"] <= li["contiguous"]["unique_ids"], li
# The same id always choosing the same tables can only help (id, table) deduplication.
assert pid["dedup_pair_ratio"] >= p4["dedup_pair_ratio"], (pid["dedup_pair_ratio"], p4["dedup_pair_ratio"])
print("ok: embp-plan", {k: round(v["mean"]) for k, v in p4["bytes_per_rank_per_step"].items()},
      "dedup", round(p4["dedup_positions_per_unique_id"], 2), "imbalance", p4["load_imbalance"])
PY
if "$JTOK" embp-plan --data "$T/train" --config "$T/cfg.json" --seq 256 --batch 6 --ranks 4 > "$T/err.out" 2>&1; then
  echo "FAIL: 4 ranks accepted a batch of 6 rows"; exit 1
fi
grep -q "\-\-ranks 4 must divide --batch 6" "$T/err.out" || { echo "FAIL: unclear error:"; cat "$T/err.out"; exit 1; }
echo "ok: $(cat "$T/err.out")"
