#!/usr/bin/env bash
# scripts/study_ablate.sh on tiny configs (a few steps): the norm and lambda ablations append their
# rows with the knob and, for JTok-M, the routing load columns (from the run's log.jsonl); a rerun
# skips them; the report puts them beside the baseline CSV's rows (base/jtok, moe/jtokm).
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
cd "$T"
source "$ROOT/tests/lib/tiny_run.sh"
prepare_heldout_corpus data
common='"vocab_size": 50257, "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1,
  "intermediate_size": 32, "max_position_embeddings": 32, "seq_len": 32, "micro_batch_size": 2, "max_steps": 100,
  "learning_rate": 3e-3, "eval_interval": 100, "eval_batches": 1, "checkpoint_interval": 100, "keep_checkpoints": 1,
  "sample_interval": 0, "log_interval": 2, "train_data": "data/train", "val_data": "data/val"'
echo "{ $common, \"num_hidden_layers\": 1 }" > dense.json
echo "{ $common, \"num_hidden_layers\": 2, \"model_type\": \"jtok_moe\", \"first_k_dense_replace\": 1, \"n_routed_experts\": 4,
  \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16, \"jtokm_n_e\": 3, \"jtokm_top_k\": 1 }" > moe.json
export OMP_NUM_THREADS=1 JTOK_BIN="$JTOK"
fail() { echo "FAIL: $*"; cat out/abl.csv 2>/dev/null; exit 1; }

# The baseline rows, as the seeds study writes them (study_lib.sh, its own columns).
. "$ROOT/scripts/study_lib.sh"
study_setup
for s in 1 2; do
  study_run out/seeds.csv seeds dense.json base $s 4 0 runs/s/base_s$s --jtok false > /dev/null
  study_run out/seeds.csv seeds dense.json jtok $s 4 0 runs/s/jtok_s$s --jtok true > /dev/null
done
study_run out/seeds.csv seeds moe.json moe 1 4 0 runs/s/moe_s1 --jtok false --jtokm false > /dev/null
study_run out/seeds.csv seeds moe.json jtokm 1 4 0 runs/s/jtokm_s1 --jtok false --jtokm true > /dev/null

A=(bash "$ROOT/scripts/study_ablate.sh" --workdir "$T" --csv out/abl.csv --baseline-csv out/seeds.csv --out runs/a
   --norm-config dense.json --lambda-config moe.json --norm-steps 4 --lambda-steps 4)
"${A[@]}" --only norm --seeds 1,2 > log1
"${A[@]}" --only lambda --lambdas 1e-3,1 > log2
[ "$(head -n 1 out/abl.csv)" = "$STUDY_COLUMNS,knob,knob_value,jtokm_aux,load,load_min" ] || fail "header"
[ "$(wc -l < out/abl.csv)" = 5 ] || fail "expected header + 4 rows"
/usr/bin/python3 - out/abl.csv runs/a <<'PY' || exit 1
import csv, json, sys
rows = {(r["variant"], r["seed"]): r for r in csv.DictReader(open(sys.argv[1]))}
assert set(rows) == {("jtok_nonorm", "1"), ("jtok_nonorm", "2"), ("jtokm_lambda1e-3", "1"), ("jtokm_lambda1", "1")}, rows
n = rows[("jtok_nonorm", "1")]
assert (n["study"], n["config"], n["steps"], n["knob"], n["knob_value"]) == ("ablate", "dense.json", "4", "jtok_norm", "false"), n
assert int(n["n_n"]) > 0 and n["load"] == n["load_min"] == n["jtokm_aux"] == "", n
# The run really trained without the norm: its start record says so.
start = next(json.loads(l) for l in open(sys.argv[2] + "/norm/jtok_nonorm_s1_n4/log.jsonl") if '"start"' in l)
assert start["config"]["jtok_norm"] is False, start["config"]
for lam, v in (("1e-3", "jtokm_lambda1e-3"), ("1", "jtokm_lambda1")):
    r = rows[(v, "1")]
    assert (r["knob"], r["knob_value"]) == ("jtokm_aux_loss_coef", lam), r
    d = sys.argv[2] + f"/lambda/{v}_s1_n4/log.jsonl"
    log = [json.loads(l) for l in open(d)]
    assert next(j for j in log if j["type"] == "start")["config"]["jtokm_aux_loss_coef"] == float(lam)
    # load: per table, the mean over the window's routing records (all of them: 4 steps < 50) and
    # the layers; load_min: the smallest of a table's window mean in one layer.
    rec = [j["layers"] for j in log if j["type"] == "routing"]
    assert len(rec) == 2 and len(rec[0]) == 2, rec   # log_interval 2: steps 2 and 4; two JTok-M layers
    per = [[(rec[0][l]["load"][i] + rec[1][l]["load"][i]) / 2 for i in range(3)] for l in range(2)]
    want = [(per[0][i] + per[1][i]) / 2 for i in range(3)]
    got = [float(x) for x in r["load"].split(";")]
    assert len(got) == 3 and all(abs(g - w) < 1e-4 for g, w in zip(got, want)), (got, want)
    assert abs(float(r["load_min"]) - min(min(p) for p in per)) < 1e-4, (r, per)
    assert abs(sum(got) - 1) < 1e-3, r
    aux = [j["jtokm_aux_loss"] for j in log if j["type"] == "step"]
    assert len(aux) == 4 and abs(float(r["jtokm_aux"]) - sum(aux) / 4) <= 1e-5 * abs(sum(aux) / 4), (r, aux)
# lambda scales the logged aux loss: 1 vs 1e-3 differ by orders of magnitude.
assert float(rows[("jtokm_lambda1", "1")]["jtokm_aux"]) > 100 * float(rows[("jtokm_lambda1e-3", "1")]["jtokm_aux"]), rows
PY

# Rerun: every row skipped, nothing trained, also with the run directories gone.
rm -rf runs/a
"${A[@]}" --only norm --seeds 1,2 > log3
"${A[@]}" --only lambda --lambdas 1e-3,1 >> log3
[ "$(grep -c skipping log3)" = 4 ] || fail "expected 4 skipped runs: $(cat log3)"
[ ! -e runs/a ] || fail "a skipped run trained"
[ "$(wc -l < out/abl.csv)" = 5 ] || fail "a skipped run added a row"

# The report, from the CSVs alone: norm beside base/jtok of the same seed, gap mean +- sd over 2
# seeds; lambda lines with their loads, and lambda 1e-4 from the baseline's jtokm row.
/usr/bin/python3 "$ROOT/scripts/study_ablate_report.py" out/abl.csv --baseline out/seeds.csv > report.md
/usr/bin/python3 - out/abl.csv out/seeds.csv report.md <<'PY' || { cat report.md; exit 1; }
import csv, sys
a = {(r["variant"], r["seed"]): float(r["val_loss"]) for r in csv.DictReader(open(sys.argv[1]))}
s = {(r["variant"], r["seed"]): float(r["val_loss"]) for r in csv.DictReader(open(sys.argv[2]))}
rep = open(sys.argv[3]).read()
for seed in ("1", "2"):
    line = f"| dense.json | 4 | {seed} | {s[('base', seed)]:.4f} | {s[('jtok', seed)]:.4f} | {a[('jtok_nonorm', seed)]:.4f} | " \
           f"{a[('jtok_nonorm', seed)] - s[('jtok', seed)]:+.4f} |"
    assert line in rep, line
g = [a[("jtok_nonorm", k)] - s[("jtok", k)] for k in ("1", "2")]
m, sd = sum(g) / 2, abs(g[0] - g[1]) / 2 ** 0.5
assert f"**{m:+.4f} +- {sd:.4f}**" in rep, (m, sd)
assert f"| moe.json | 4 | 0.0001 (seeds row) | 1 | {s[('jtokm', '1')]:.4f} | {s[('jtokm', '1')] - s[('moe', '1')]:+.4f} | - (not recorded) |" in rep
assert f"| moe.json | 4 | 0.001 | 1 | {a[('jtokm_lambda1e-3', '1')]:.4f} |" in rep
assert f"| moe.json | 4 | 1 | 1 | {a[('jtokm_lambda1', '1')]:.4f} |" in rep
# Paired against lambda 1e-4 (the seeds row) at the same seed: one seed, so the gap alone.
for v, l in (("jtokm_lambda1e-3", "0.001"), ("jtokm_lambda1", "1")):
    line = f"| moe.json | 4 | {l} | 1 | {a[(v, '1')] - s[('jtokm', '1')]:+.4f} | **{a[(v, '1')] - s[('jtokm', '1')]:+.4f}** | - | - |"
    assert line in rep, line
PY
grep -q "| dense.json | 4 | 1 |" log1 || fail "the study does not print its report: $(cat log1)"

# --only depth: JTok-M without the 1/sqrt(2N) factor, one row, beside the jtokm row of its seed.
"${A[@]}" --only depth --seeds 1 > log4
[ "$(wc -l < out/abl.csv)" = 6 ] || fail "expected one depth row"
/usr/bin/python3 - out/abl.csv out/seeds.csv log4 runs/a <<'PY' || { cat log4; exit 1; }
import csv, json, sys
r = [r for r in csv.DictReader(open(sys.argv[1])) if r["variant"] == "jtokm_noscale"]
assert len(r) == 1 and (r[0]["knob"], r[0]["knob_value"], r[0]["seed"]) == ("jtokm_depth_scaling", "false", "1"), r
start = next(json.loads(l) for l in open(sys.argv[4] + "/depth/jtokm_noscale_s1_n4/log.jsonl") if '"start"' in l)
assert start["config"]["jtokm_depth_scaling"] is False and start["config"]["jtokm"] is True, start["config"]
s = {(x["variant"], x["seed"]): float(x["val_loss"]) for x in csv.DictReader(open(sys.argv[2]))}
x = float(r[0]["val_loss"])
line = f"| moe.json | 4 | 1 | {s[('moe', '1')]:.4f} | {s[('jtokm', '1')]:.4f} | {x:.4f} | {x - s[('jtokm', '1')]:+.4f} | {x - s[('moe', '1')]:+.4f} |"
assert line in open(sys.argv[3]).read(), line
PY
echo "PASS: ablation rows appended with knob and loads, skipped on rerun, reported beside the baselines"
