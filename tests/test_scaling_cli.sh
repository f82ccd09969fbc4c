#!/usr/bin/env bash
# CLI checks of `jtok flops` and `jtok scaling plan|run|fit`: the paper's table, an end-to-end
# isoFLOPs study with a fake trainer that follows a known Kaplan law, and bad input.
set -euo pipefail
JTOK=${JTOK_BIN:-build/jtok}
ROOT=${JTOK_ROOT:-.}
PY=/usr/bin/python3
T=$(mktemp -d)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$T"' EXIT
fails=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }

# --- the paper's Appendix C table: two frontiers, JSON layout and values ---
"$JTOK" scaling fit --frontier "$ROOT/docs/data/paper_isoflops_moe.csv" --frontier "$ROOT/docs/data/paper_isoflops_jtokm.csv" \
  --json --svg-dir "$T/svg" > "$T/paper.json"
if $PY - "$T/paper.json" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
b, o = j["frontiers"]
def near(a, b, tol): assert abs(a - b) <= tol, (a, b)
near(b["alpha"], -0.19776, 1e-4); near(b["beta"], 5.05815, 1e-4); near(b["r2"], 0.99937, 1e-4)
near(o["alpha"], -0.19795, 1e-4); near(o["beta"], 5.02940, 1e-4); near(o["r2"], 0.99909, 1e-4)
near(j["saving_separate"], 1 - 10 ** ((b["beta"] - o["beta"]) / b["alpha"]), 1e-12)
near(j["saving_separate"], 0.2845, 1e-3); near(j["saving_shared_slope"], 0.3145, 1e-3)
near(j["shared_slope"]["alpha"], -0.19786, 1e-4)
assert len(j["shared_slope"]["betas"]) == 2 and b["n"] == 5
PYEOF
then ok "paper table fit"; else bad "paper table fit"; fi
grep -q '<svg' "$T/svg/frontiers.svg" && grep -q 'polyline' "$T/svg/frontiers.svg" && ok "frontier svg" || bad "frontier svg"

# --- flops ---
cat > "$T/base.json" <<'JEOF'
{"vocab_size": 256, "vocab_pad_multiple": 64, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 4, "intermediate_size": 256, "seq_len": 64, "micro_batch_size": 4, "max_position_embeddings": 128}
JEOF
"$JTOK" flops --config "$T/base.json" --json > "$T/flops.json"
# N_c = 2 * (4*64*64 + 3*64*256) = 131072; exact = 6 N_c + 6*64*256 + 3*2*2*64*65
$PY -c "
import json,sys; j=json.load(open('$T/flops.json'))
assert j['n_c']==131072 and j['n_n']==0 and j['eta']==0 and j['rho']==0, j
assert j['flops_per_token']==6*131072+6*64*256+3*2*2*64*65, j
assert j['n_total']==131072+2*256*64+5*64, j" && ok "flops --json" || bad "flops --json"
"$JTOK" flops --config "$T/base.json" | grep -q 'N_c (attention qkvo + MLP)' && ok "flops text" || bad "flops text"

# --- plan -> run (fake trainer following a known Kaplan law) -> fit ---
cat > "$T/fake_train.py" <<'PYEOF'
#!/usr/bin/python3
# Fake `jtok train`: loss = [(A/N)^(a/b) + B/D]^b with N = N_c of the config, D = trained tokens.
import json, sys
args = sys.argv[1:]
assert args[0] == "train"
cfg = json.load(open(args[args.index("--config") + 1]))
out = args[args.index("--out") + 1]
steps = int(args[args.index("--max-steps") + 1])
d, L, ffn = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
hd = d // cfg["num_attention_heads"]
q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
n_c = L * (d * q + 2 * d * kv + q * d + 3 * d * ffn)
tokens = steps * cfg["seq_len"] * cfg["micro_batch_size"] * cfg.get("gradient_accumulation_steps", 1)
A, B, a, b = 6e5, 1e6, 0.3, 0.3
loss = ((A / n_c) ** (a / b) + B / tokens) ** b
with open(out + "/log.jsonl", "w") as f:
    f.write(json.dumps({"step": 0, "loss": 9.0}) + "\n")
    f.write(json.dumps({"step": steps, "val_loss": loss}) + "\n")
print("fake train", n_c, tokens, loss)
PYEOF
chmod +x "$T/fake_train.py"
"$JTOK" scaling plan --config "$T/base.json" --budgets 3e11,1e12,3e12 --hidden-sizes 32,64,96,128,192,256 --layers 2 \
  --out "$T/plan.json" --csv "$T/plan.csv"
[ "$($PY -c "import json; print(len(json.load(open('$T/plan.json'))['rows']))")" = 18 ] && ok "plan rows" || bad "plan rows"
head -1 "$T/plan.csv" | grep -q '^run_id,budget,shape,n_c' && ok "plan csv" || bad "plan csv"
"$JTOK" scaling run --plan "$T/plan.json" --out "$T/runs" --trainer "$T/fake_train.py" --dry-run 2> "$T/dry.err"
[ "$(grep -c 'would run: .*fake_train.py train --config .*/config.json --out .* --max-steps [0-9]*$' "$T/dry.err")" = 18 ] \
  && [ ! -e "$T/runs/C3e11_d32_L2/config.json" ] && ok "run --dry-run" || { cat "$T/dry.err"; bad "run --dry-run"; }
"$JTOK" scaling run --plan "$T/plan.json" --out "$T/runs" --trainer "$T/fake_train.py" 2> "$T/run1.err"
grep -q '18 ran' "$T/run1.err" && ok "run: all ran" || { cat "$T/run1.err"; bad "run: all ran"; }
rm "$T/runs/C1e12_d96_L2/result.json"
"$JTOK" scaling run --plan "$T/plan.json" --out "$T/runs" --trainer "$T/fake_train.py" 2> "$T/run2.err"
grep -q '17 done before, 1 ran' "$T/run2.err" && ok "run: resumable" || { cat "$T/run2.err"; bad "run: resumable"; }
"$JTOK" scaling fit --isoflops "$T/runs/results.csv" --json --svg-dir "$T/svg" > "$T/iso.json"
if $PY - "$T/iso.json" <<'PYEOF'
import json, math, sys
j = json.load(open(sys.argv[1]))
iso = j["isoflops"][0]
A, B, a, b = 6e5, 1e6, 0.3, 0.3
for m in iso["minima"]:
    # With a = b the optimum is N* = sqrt(A C / (6 B)).
    want = math.sqrt(A * m["budget"] / (6 * B))
    assert abs(math.log10(m["n_c_opt"] / want)) < 0.1, (m, want)
k = iso["kaplan"]
assert abs(k["alpha"] - a) < 1e-3 and abs(k["beta"] - b) < 1e-3, k
assert abs(math.log10(k["A"] / A)) < 0.01 and abs(math.log10(k["B"] / B)) < 0.01, k
assert len(j["frontiers"]) == 1 and j["frontiers"][0]["source"] == "isoflops"
PYEOF
then ok "isoflops minima and Kaplan fit of the run results"; else bad "isoflops minima and Kaplan fit"; fi
[ -s "$T/svg/isoflops_results.svg" ] && ok "isoflops svg" || bad "isoflops svg"

# --- MoE shapes: the plan's N_c is `jtok flops`'s (activated experts only) for every shape ---
"$JTOK" scaling plan --config "$ROOT/configs/cpu_moe.json" --budgets 1e13 --hidden-sizes 64,128 --layers 2,4 \
  --out "$T/moe_plan.json" 2> /dev/null
moe_ok=1
while IFS=' ' read -r n_c inactive sets; do
  # shellcheck disable=SC2086
  "$JTOK" flops --config "$ROOT/configs/cpu_moe.json" $sets --json > "$T/moe_flops.json"
  $PY -c "
import json; f = json.load(open('$T/moe_flops.json'))
assert f['n_c'] == $n_c and f['n_experts_inactive'] == $inactive > 0, (f['n_c'], $n_c, f['n_experts_inactive'], $inactive)" || moe_ok=0
done < <($PY -c "
import json
for r in json.load(open('$T/moe_plan.json'))['rows']:
    print(r['n_c'], r['n_experts_inactive'], ' '.join(f'--set {k}={v}' for k, v in r['overrides'].items()))")
[ "$($PY -c "import json; print(len(json.load(open('$T/moe_plan.json'))['rows']))")" = 4 ] || moe_ok=0
[ $moe_ok = 1 ] && ok "MoE plan: N_c = jtok flops N_c (activated) per shape" || bad "MoE plan: N_c = jtok flops N_c"

# --- loss against eta (paper Fig. 7b): loss = 2.40 - 0.0118 log2(eta) ---
$PY -c "
import math
print('eta,loss')
for e in (30, 50, 70, 90, 110, 130): print(f'{e},{2.40 - 0.0118 * math.log2(e):.6f}')" > "$T/eta.csv"
"$JTOK" scaling fit --eta "$T/eta.csv" --json > "$T/eta.json"
$PY -c "
import json; j=json.load(open('$T/eta.json'))['eta']
assert abs(j['slope_per_doubling'] + 0.0118) < 1e-5 and abs(j['intercept'] - 2.40) < 1e-4, j" && ok "eta fit" || bad "eta fit"

# --- bootstrap of the saving over runs: exact profiles give a zero-width interval at the truth ---
for v in base other; do
  $PY -c "
import math
b = 5.0 if '$v' == 'base' else 4.97
print('budget,n_c,loss')
for lc in (11.0, 11.5, 12.0):
    u0, l0 = 0.5 * lc - 1.2, 2 ** (-0.2 * lc + b)
    for i in range(5):
        du = 0.3 * (i - 2) + 0.1
        print(f'{10 ** lc:g},{10 ** (u0 + du):.9g},{l0 + 0.3 * du * du:.12g}')" > "$T/boot_$v.csv"
done
"$JTOK" scaling fit --isoflops "$T/boot_base.csv" --isoflops "$T/boot_other.csv" --bootstrap 100 --bootstrap-seed 3 --json > "$T/boot.json"
$PY -c "
import json; j = json.load(open('$T/boot.json')); b = j['bootstrap']; want = 1 - 10 ** (0.03 / -0.2)
assert b['method'] == 'cases' and b['replicates'] == 100 and b['seed'] == 3, b
s = b['frontiers'][1]['saving_shared_slope']
assert abs(s['lo'] - want) < 1e-6 and abs(s['hi'] - want) < 1e-6 and abs(j['saving_shared_slope'] - want) < 1e-6, (s, want)
assert all(not m['extrapolated'] and m['method'] == 'quadratic' for m in j['isoflops'][0]['minima'])" \
  && ok "bootstrap: zero-width interval at the true saving" || bad "bootstrap: zero-width interval"
"$JTOK" scaling fit --isoflops "$T/boot_base.csv" --isoflops "$T/boot_other.csv" --bootstrap 50 --bootstrap-method residuals \
  | grep -q "bootstrap over runs (residuals, 50 replicates" && ok "bootstrap: text report" || bad "bootstrap: text report"

# --- bad input: clear error naming file/line/column, exit status 1 ---
expect_error() {  # expect_error NAME PATTERN ARGS...
  local name=$1 pat=$2; shift 2
  set +e; "$JTOK" "$@" > "$T/out" 2> "$T/err"; local rc=$?; set -e
  if [ $rc -ne 0 ] && grep -q -- "$pat" "$T/err"; then ok "$name"; else echo "rc=$rc stderr: $(cat "$T/err")"; bad "$name"; fi
}
printf 'compute,loss\n1e18,2.5\n1e19,2.3\n1e20,2.1\n' > "$T/good.csv"
printf 'compute,los\n1e18,2.5\n1e19,2.3\n1e20,2.1\n' > "$T/nocol.csv"
printf 'compute,loss\n1e18,2.5\n1e19,abc\n1e20,2.1\n' > "$T/nan.csv"
printf 'compute,loss\n1e18,2.5\n1e19,2.3\n' > "$T/few.csv"
printf 'compute,loss\n1e18,2.5\n1e19\n1e20,2.1\n' > "$T/short.csv"
printf 'compute,loss\n1e18,2.5\n-1e19,2.3\n1e20,2.1\n' > "$T/neg.csv"
expect_error "missing file" "$T/none.csv: cannot open file" scaling fit --frontier "$T/none.csv"
expect_error "missing column" "$T/nocol.csv: missing column 'loss' (columns: compute, los)" scaling fit --frontier "$T/nocol.csv"
expect_error "non-numeric value" "$T/nan.csv:3: column 'loss': not a finite number: 'abc'" scaling fit --frontier "$T/nan.csv"
expect_error "too few points" "$T/few.csv: frontier fit needs at least 3 points, got 2" scaling fit --frontier "$T/few.csv"
expect_error "short row" "$T/short.csv:3: expected 2 fields" scaling fit --frontier "$T/short.csv"
expect_error "non-positive" "$T/neg.csv:3: column 'compute': must be positive" scaling fit --frontier "$T/neg.csv"
expect_error "bad base frontier in a pair" "$T/nan.csv:3" scaling fit --frontier "$T/good.csv" --frontier "$T/nan.csv"
expect_error "nothing to fit" "nothing to fit" scaling fit
expect_error "bootstrap needs isoflops files" "give at least 2 --isoflops files" scaling fit --frontier "$T/good.csv" --frontier "$T/good.csv" --bootstrap 10
expect_error "bootstrap bad method" "method must be 'cases' or 'residuals', got 'jack'" scaling fit --isoflops "$T/boot_base.csv" --isoflops "$T/boot_other.csv" --bootstrap 10 --bootstrap-method jack
expect_error "isoflops missing n_c" "$T/good.csv: missing column 'n_c'" scaling fit --isoflops "$T/good.csv"
printf 'eta,loss\n30,2.30\n50,2.29\n' > "$T/few_eta.csv"
expect_error "eta too few points" "$T/few_eta.csv: eta fit needs at least 3 points, got 2" scaling fit --eta "$T/few_eta.csv"
expect_error "plan bad budget" "--budgets: not a number: 'x'" scaling plan --config "$T/base.json" --budgets 1e12,x --hidden-sizes 64
expect_error "plan bad shape" "hidden size 40 is not a multiple" scaling plan --config "$T/base.json" --budgets 1e12 --hidden-sizes 40
expect_error "run missing plan" "cannot read $T/noplan.json" scaling run --plan "$T/noplan.json" --out "$T/r"
printf '#!/bin/sh\nexit 2\n' > "$T/failing_train.sh"; chmod +x "$T/failing_train.sh"
expect_error "run failing trainer" "18 run(s) failed" scaling run --plan "$T/plan.json" --out "$T/runs_fail" --trainer "$T/failing_train.sh"
grep -q "trainer exited with status 2" "$T/err" && ok "failure reason named" || bad "failure reason named"

if [ $fails -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all scaling CLI checks passed"
