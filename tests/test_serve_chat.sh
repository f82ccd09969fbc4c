#!/usr/bin/env bash
# `jtok serve`'s /v1/chat/completions, driven by the official OpenAI SDK (tests/serve_chat_client.mjs)
# on 127.0.0.1, against a tiny model trained here: served with --chat-template chatml, and without
# a template (a GPT-2-tokenized model has none). The reply to a conversation equals /v1/completions
# on what `jtok chat-template` renders for it; streaming, n with seeds, and the 400s. Then a random
# Qwen3-tokenizer model: the server finds Qwen3's template beside its tokenizer (tokenizer_config.json)
# and its prompt is exactly `jtok chat-template --ids`'s token count. Servers are killed by the trap.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done; rm -rf "$T"; }
trap cleanup EXIT
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; tail -5 "$T"/serve*.err 2>/dev/null; exit 1; }
[ -f "$ROOT/.cache/npm/openai-7.55.0/package.json" ] || fail "openai SDK missing: run scripts/setup.sh"

source "$ROOT/tests/lib/tiny_run.sh"
prepare_tiny_corpus "$T/data"
cat > "$T/cfg.json" <<JSON
{ "vocab_size": 50257, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 128,
  "seq_len": 32, "micro_batch_size": 4, "max_steps": 4, "learning_rate": 3e-3, "min_lr": 3e-4,
  "warmup_steps": 2, "eval_interval": 100, "eval_batches": 1, "checkpoint_interval": 4, "keep_checkpoints": 1,
  "sample_interval": 0, "train_data": "$T/data/train", "val_data": "$T/data/val" }
JSON
"$JTOK" train --config "$T/cfg.json" --out "$T/run" --peak-gflops 1 > "$T/train.out"

# start_serve NAME ARGS... (tests/lib/serve_start.sh): the server's port in PORT.
source "$ROOT/tests/lib/serve_start.sh"
start_serve chatml --max-batch 4 --checkpoint "$T/run" --chat-template chatml
P1=$PORT
grep -q "chat template chatml" "$T/serve_chatml.out" || fail "the server does not say its chat template"
start_serve none --max-batch 4 --checkpoint "$T/run"
P2=$PORT
grep -q "no chat template" "$T/serve_none.out" || fail "the template-less server does not say so"

cat > "$T/messages.json" <<'JSON'
[{"role": "system", "content": "You answer about token tables."},
 {"role": "user", "content": "What does a JTok table hold?"}]
JSON
mkdir -p "$T/empty"
"$JTOK" chat-template --tokenizer-dir "$T/empty" --chat-template chatml --messages "$T/messages.json" |
  /usr/bin/python3 -c 'import json, sys; sys.stdout.write(json.load(sys.stdin)["text"])' > "$T/rendered.txt"
timeout 300 node "$ROOT/tests/serve_chat_client.mjs" "$ROOT" "$P1" "$P2" "$T/messages.json" "$T/rendered.txt" ||
  fail "serve_chat_client.mjs"

# A Qwen3-tokenizer model (random weights): its template found and detected, the prompt its ids.
cat > "$T/qcfg.json" <<'JSON'
{ "vocab_size": 151669, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 128, "seq_len": 128, "qk_norm": true,
  "tokenizer": "qwen3" }
JSON
/usr/bin/python3 "$ROOT/bench/random_checkpoint.py" --config "$T/qcfg.json" --out "$T/qwen" > /dev/null
start_serve qwen --max-batch 4 --checkpoint "$T/qwen"
grep -q "chat template qwen3" "$T/serve_qwen.out" || fail "Qwen3's template not found: $(cat "$T/serve_qwen.out")"
want=$("$JTOK" chat-template --messages "$T/messages.json" --ids |
  /usr/bin/python3 -c 'import json, sys; print(len(json.load(sys.stdin)["ids"]))')
got=$(curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"messages\": $(cat "$T/messages.json"), \"max_tokens\": 2, \"temperature\": 0}" |
  /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["usage"]["prompt_tokens"])')
[ "$got" = "$want" ] || fail "qwen3 chat prompt has $got tokens, jtok chat-template --ids $want"
echo "ok: Qwen3 model: template qwen3 found beside its tokenizer, prompt of $got tokens as jtok chat-template --ids"
echo "PASS"
