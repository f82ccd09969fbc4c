#!/usr/bin/env bash
# The study scripts' rows (scripts/study_lib.sh): a finished run appends one row with its key,
# tokens, FLOPs and full-validation loss; a run whose key is in the CSV is skipped (also when its
# run directory is gone, as on another machine that has only the committed CSV); another seed adds
# a row; a CSV with another header is refused; the seeds report reads the CSV alone.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
cd "$T"
source "$ROOT/tests/lib/tiny_run.sh"
prepare_heldout_corpus data
cat > cfg.json <<JSON
{ "vocab_size": 50257, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": 32, "max_position_embeddings": 32,
  "seq_len": 32, "micro_batch_size": 2, "max_steps": 100, "learning_rate": 3e-3,
  "eval_interval": 100, "eval_batches": 1, "checkpoint_interval": 2, "keep_checkpoints": 1, "sample_interval": 0,
  "train_data": "data/train", "val_data": "data/val" }
JSON
export OMP_NUM_THREADS=1 JTOK_BIN="$JTOK"
. "$ROOT/scripts/study_lib.sh"
study_setup
CSV=out/rows.csv
fail() { echo "FAIL: $*"; cat "$CSV" 2>/dev/null; exit 1; }

study_run "$CSV" t cfg.json base 1 3 0 runs/t/base_s1 --jtok false > log1
study_run "$CSV" t cfg.json jtok 1 3 0 runs/t/jtok_s1 --jtok true > log2
[ "$(head -n 1 "$CSV")" = "$STUDY_COLUMNS" ] || fail "header"
[ "$(wc -l < "$CSV")" = 3 ] || fail "expected header + 2 rows"
for f in out/*; do case "$f" in *tmp*) fail "a temp file was left next to the CSV: $f" ;; esac; done
# The row: key, tokens = 3 steps x 2 x 32, flops = 6 N_c tokens, the eval's loss, a wall time.
/usr/bin/python3 - "$CSV" runs/t/base_s1.eval.json <<'PY' || exit 1
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
r = rows[0]
e = json.load(open(sys.argv[2]))
assert (r["study"], r["config"], r["variant"], r["seed"], r["steps"]) == ("t", "cfg.json", "base", "1", "3"), r
assert int(r["tokens"]) == 3 * 2 * 32, r
assert abs(float(r["flops_6nd"]) - 6 * int(r["n_c"]) * int(r["tokens"])) <= 1e-5 * float(r["flops_6nd"]), r
assert abs(float(r["val_loss"]) - e["val_loss"]) < 1e-6 and int(r["val_tokens"]) == e["val_tokens"] > 0, (r, e)
assert int(r["n_n"]) == 0 and int(rows[1]["n_n"]) > 0 and rows[1]["variant"] == "jtok", rows
assert r["blimp"] == "" and int(r["wall_s"]) >= 0, r
PY

# Rerun: skipped, nothing trained, even with the run directories gone (another machine).
rm -rf runs/t
study_run "$CSV" t cfg.json base 1 3 0 runs/t/base_s1 --jtok false > log3
grep -q skipping log3 || fail "existing row not skipped"
[ ! -e runs/t/base_s1 ] || fail "a skipped run trained"
[ "$(wc -l < "$CSV")" = 3 ] || fail "a skipped run added a row"
# Another seed or another step count is another key.
study_run "$CSV" t cfg.json base 2 3 0 runs/t/base_s2 --jtok false > log4
study_run "$CSV" t cfg.json base 1 4 0 runs/t/base_s1_n4 --jtok false > log5
[ "$(wc -l < "$CSV")" = 5 ] || fail "expected 4 rows"
[ "$(cut -d, -f1-5 "$CSV" | sort | uniq -d)" = "" ] || fail "duplicate keys"
# Seeds 1 and 2 differ in init and data: different losses.
l1=$(awk -F, '$3=="base" && $4==1 && $5==3 {print $12}' "$CSV"); l2=$(awk -F, '$3=="base" && $4==2 {print $12}' "$CSV")
[ "$l1" != "$l2" ] || fail "seed 1 and seed 2 gave the same loss $l1"
# A run stopped after a checkpoint continues from it (train --resume) and then appends its row.
"$JTOK" train --config cfg.json --seed 3 --max-steps 6 --out runs/t/base_s3 --peak-gflops 1 --jtok false > stopped.out 2>&1 &
pid=$!
while [ ! -f runs/t/base_s3/checkpoints/step_00000002/COMPLETE ] && kill -0 $pid 2>/dev/null; do sleep 0.05; done
kill -TERM $pid 2>/dev/null || true
wait $pid 2>/dev/null || true
study_run "$CSV" t cfg.json base 3 6 0 runs/t/base_s3 --jtok false > log6
grep -q "resume: from" runs/t/base_s3.train.out || fail "the stopped run was not resumed: $(cat runs/t/base_s3.train.out)"
/usr/bin/python3 -c "
import json, sys
steps = [json.loads(l)['step'] for l in open('runs/t/base_s3/log.jsonl') if json.loads(l).get('type') == 'step']
assert steps == list(range(1, 7)), steps"
[ "$(wc -l < "$CSV")" = 6 ] || fail "resumed run added no row"

# Another header: refused, the CSV unchanged.
printf 'a,b\n1,2\n' > other.csv
if study_run other.csv t cfg.json base 9 2 0 runs/t/x --jtok false > log7 2>&1; then fail "other header accepted"; fi
grep -q "header" log7 || fail "no header error: $(cat log7)"
[ "$(cat other.csv)" = "$(printf 'a,b\n1,2')" ] || fail "other.csv changed"

# The report and the picture come from the CSV alone.
/usr/bin/python3 "$ROOT/scripts/study_seeds_report.py" "$CSV" --pairs base:jtok > report.md
grep -q "| cfg.json | 3 | jtok - base | 1 |" report.md || fail "report: $(cat report.md)"
"$JTOK" plot-csv --csv "$CSV" --x seed --y val_loss --group variant --where steps=3 --out fig.svg > /dev/null
grep -q "<svg" fig.svg && grep -q ">base<" fig.svg && grep -q ">jtok<" fig.svg || fail "plot-csv picture"
"$JTOK" plot-csv --csv "$CSV" --x seed --y val_loss --group variant --where variant!=base --out fig2.svg > /dev/null
grep -q ">jtok<" fig2.svg && ! grep -q ">base<" fig2.svg || fail "plot-csv --where column!=value"
if "$JTOK" plot-csv --csv "$CSV" --x seed --y nosuch --out bad.svg 2> err.txt; then fail "plot-csv accepted a missing column"; fi
grep -q "nosuch" err.txt || fail "plot-csv error does not name the column: $(cat err.txt)"
echo "PASS: study rows appended, skipped, resumed, refused, reported"
