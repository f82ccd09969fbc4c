#!/usr/bin/env bash
# `jtok serve`'s /v1/completions with logprobs, echo, n and best_of, driven by the official OpenAI
# SDK (tests/serve_logprobs_client.mjs) on 127.0.0.1: echo + logprobs + max_tokens 0 equals `jtok
# eval --token-logprobs` within 1e-5; BLiMP accuracy through the API equals `jtok eval --blimp-limit
# 3`'s on a fixed subset (tests/data/blimp_subset: 67 paradigms x 3 pairs), whose report has one
# syntax/semantics field; n = 4 choices each equal a single request with seed + i; bad input 400s;
# /metrics counts the forked choices and the scored prompt tokens. A tiny JTok + JTok-M model
# trained here. The server is killed by the trap.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
source "$ROOT/tests/lib/serve_start.sh"
serve_test_env  # T, PIDS (killed by the EXIT trap), fail, one OpenMP thread
[ -f "$ROOT/.cache/npm/openai-7.55.0/package.json" ] || fail "openai SDK missing: run scripts/setup.sh"

source "$ROOT/tests/lib/tiny_run.sh"
train_tiny_jtok_model "$T"

# jtok eval's side: per-token log-probs of a text, BLiMP on the subset's first 3 pairs per paradigm.
BLIMP="$ROOT/tests/data/blimp_subset"
printf 'Token tables modulate the MLP of every layer.' > "$T/text.txt"
"$JTOK" eval --checkpoint "$T/run" --val-batches 1 --no-blimp --token-logprobs "$T/text.txt" --json > "$T/tokens.json"
"$JTOK" eval --checkpoint "$T/run" --val-batches 1 --blimp "$BLIMP" --blimp-limit 3 --json > "$T/blimp.json"
# The text report of a BLiMP directory without the published models' summary: ours alone.
"$JTOK" eval --checkpoint "$T/run" --val-batches 1 --blimp "$BLIMP" --blimp-limit 1 > "$T/blimp.txt" 2>&1 ||
  fail "eval's text report without models_summary.jsonl: $(tail -3 "$T/blimp.txt")"
grep -q "overall (mean over paradigms)" "$T/blimp.txt" || fail "eval's text report has no BLiMP overall line: $(cat "$T/blimp.txt")"
# BLiMP's data spells one field "syntax_semantics" (13 paradigms) and "syntax/semantics" (one): one field.
python3 -c 'import json,sys; f=json.load(open(sys.argv[1]))["blimp"]["by_field"]; sys.exit(0 if "syntax/semantics" in f and "syntax_semantics" not in f else 1)' \
  "$T/blimp.json" || fail "eval --json by_field is not one syntax/semantics field: $(cat "$T/blimp.json")"
grep -q "field syntax/semantics" "$T/blimp.txt" || fail "eval's text report has no syntax/semantics field: $(cat "$T/blimp.txt")"
! grep -q "syntax_semantics" "$T/blimp.txt" || fail "eval's text report still has syntax_semantics: $(cat "$T/blimp.txt")"

# --prefill-chunk 4: BLiMP sentences are longer, so their echoed log-probs come from chunked prefills too.
start_serve main --checkpoint "$T/run" --max-batch 8 --prefill-chunk 4
timeout 300 node "$ROOT/tests/serve_logprobs_client.mjs" "$ROOT" "$PORT" "$T/tokens.json" "$T/blimp.json" "$BLIMP" 3 \
  || fail "serve_logprobs_client.mjs"
curl -s "http://127.0.0.1:$PORT/metrics" > "$T/metrics"
forked=$(sed -n 's/^jtok_choices_forked_total //p' "$T/metrics"); scored=$(sed -n 's/^jtok_prompt_logprob_tokens_total //p' "$T/metrics")
[ "$forked" -ge 3 ] || fail "jtok_choices_forked_total $forked (n = 4 requests forked no choice?)"
[ "$scored" -gt 402 ] || fail "jtok_prompt_logprob_tokens_total $scored (402 BLiMP sentences were scored)"
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200 ] || fail "server down"
echo "ok: metrics: $forked choices forked, $scored prompt tokens scored"
echo "PASS"
