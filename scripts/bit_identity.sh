#!/usr/bin/env bash
# Bit identity of training and decoding: 20 steps of a tiny MoE + JTok + JTok-M model at P = 1
# (one and two OpenMP threads) and P = 2 (one a rank), with the tables replicated (--embp off) and
# sharded (naive, premix, premix-dedup), under the exact (dense) and the lazy (sparse) table
# optimizer, then 5 greedy decodes (f32 from RAM and memory-mapped, a P = 2 checkpoint, bf16 weights,
# two threads).
# The sha256 of each checkpoint's weights, optimizer state and trainer state (its run id left out)
# and of each decode's token ids and top-2 logit margins are compared with the ones recorded in
# tests/data/bit_identity/hashes.txt for this host (a refactoring must leave them all unchanged).
#
#   bash scripts/bit_identity.sh            # compare (the ctest test sh_test_bit_identity runs this)
#   bash scripts/bit_identity.sh --record   # replace this host's recorded hashes with this build's
#
# Float results depend on the code that runs: -march=native code generation and our AVX-512 / AVX2
# kernels (src/ops), oneDNN's ISA dispatch, the compiler and oneDNN versions. The record is keyed by
# a host signature made of those. On every host the script also checks the relations that hold
# anywhere (check_relations: a repeated run, blocking exchanges, --embp premix on one process,
# memory-mapped tables give the same bits); on a host without a record it checks only those and
# prints a NOTE naming the signature and the record command.
# The vocabulary is a 512-token BPE (tests/data/bit_identity/, trained once on tests/data/corpus by
# `jtok tokenizer train`) so that a run costs ~0.2 s: the whole script took 15-19 s on 2 shared
# cores at load 6, 32-87 s with builds running beside it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
JTOK=${JTOK_BIN:-$ROOT/build/jtok}
DATA=$ROOT/tests/data/bit_identity
RECORD=$DATA/hashes.txt
S=20
mode=compare
case "${1:-}" in
  "") ;;
  --record) mode=record ;;
  *) echo "usage: bash scripts/bit_identity.sh [--record]" >&2; exit 2 ;;
esac
[ -x "$JTOK" ] || { echo "FAIL: no jtok binary at $JTOK (build first, or set JTOK_BIN)"; exit 1; }
source "$ROOT/tests/mpi_env.sh"  # also OMP_NUM_THREADS=1: the same thread count on every host
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

# host_signature: one word naming what decides the float results of this build on this CPU.
host_signature() {
  local flags cxx march cxx_ver dnnl isa build cache
  cache=$(dirname "$JTOK")/CMakeCache.txt
  flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
    grep -xE 'fma|avx2|avx512f|avx512bw|avx512dq|avx512vl|avx512_bf16|avx512_vnni|avx512_fp16|avx_vnni|amx_tile|amx_bf16|amx_int8' |
    sort | paste -sd+)
  cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:FILEPATH=//p' "$cache" 2>/dev/null || true)
  cxx=${cxx:-c++}
  march=$("$cxx" -march=native -Q --help=target 2>/dev/null | awk '$1 == "-march=" {print $2}')
  cxx_ver=$("$cxx" -dumpfullversion)
  dnnl=$(readlink -f "$(ldd "$JTOK" | awk '/libdnnl/ {print $3}')" | sed 's/.*libdnnl\.so\.//')
  # The kernels' ISA as src/core/peak_flops.cpp's simd_isa() picks it: avx512 when the
  # -march=native build has __AVX512F__, i.e. when the CPU has avx512f. Read from the flags, not
  # from a line the trainer prints, so that a change to that line cannot move the signature.
  isa=avx2
  case "+$flags+" in *+avx512f+*) isa=avx512 ;; esac
  build=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$cache" 2>/dev/null || true)
  grep -q '^JTOK_SANITIZE:BOOL=ON' "$cache" 2>/dev/null && build=asan
  echo "isa=$isa/march=${march:-unknown}/$flags/gcc-$cxx_ver/dnnl-$dnnl/${build:-unknown}"
}

prepare_data() {
  mkdir -p "$T/data"
  "$JTOK" prepare --tokenizer gpt2 --tokenizer-dir "$DATA" --out "$T/data/train" "$ROOT"/tests/data/corpus/*.md > /dev/null
  "$JTOK" prepare --tokenizer gpt2 --tokenizer-dir "$DATA" --out "$T/data/val" "$ROOT"/tests/data/corpus/model.md > /dev/null
  cat > "$T/moe.json" <<JSON
{ "vocab_size": 512, "tokenizer_dir": "$DATA", "hidden_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 64,
  "model_type": "jtok_moe", "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
  "first_k_dense_replace": 1, "jtok": true, "jtok_layers": "1", "jtokm": true, "jtokm_layers": "all",
  "jtokm_n_e": 3, "jtokm_top_k": 2, "seq_len": 32, "micro_batch_size": 4, "gradient_accumulation_steps": 2,
  "max_steps": $S, "learning_rate": 3e-3, "min_lr": 3e-4, "warmup_steps": 4, "eval_interval": $S,
  "eval_batches": 2, "checkpoint_interval": $S, "keep_checkpoints": 1,
  "train_data": "$T/data/train", "val_data": "$T/data/val" }
JSON
}

# train_run NAME P EMBP TABLE_OPTIMIZER [ARGS...]: 20 steps into $T/runs/NAME.
train_run() {
  local name=$1 p=$2 embp=$3 opt=$4 launch=()
  shift 4
  [ "$p" = 1 ] || launch=("${MPIRUN[@]}" -np "$p")
  "${launch[@]}" "$JTOK" train --peak-gflops 1 --config "$T/moe.json" --out "$T/runs/$name" \
    --embp "$embp" --table_optimizer "$opt" "$@" > "$T/runs/$name.out" 2>&1 ||
    { echo "FAIL: training run $name"; cat "$T/runs/$name.out"; exit 1; }
  [ "$p" = 1 ] || grep -q "ranks: $p" "$T/runs/$name.out" || { echo "FAIL: $name did not run on $p ranks"; exit 1; }
}

# hash_run NAME: "NAME FILE SHA256" lines for the step-S checkpoint of run NAME.
hash_run() {
  local name=$1 ck f
  ck=$T/runs/$name/checkpoints/$(printf 'step_%08d' $S)
  [ -f "$ck/COMPLETE" ] || { echo "FAIL: $name wrote no complete step-$S checkpoint"; exit 1; }
  for f in model.safetensors optimizer.safetensors; do
    echo "$name $f $(sha256sum < "$ck/$f" | cut -d' ' -f1)"
  done
  # trainer_state.json without its run id (random per run): step, lr, data position, RNG state.
  echo "$name trainer_state $(/usr/bin/python3 -c '
import json, sys
j = json.load(open(sys.argv[1])); j.pop("run_id")
print(json.dumps(j, sort_keys=True))' "$ck/trainer_state.json" | sha256sum | cut -d' ' -f1)"
}

# decode NAME CHECKPOINT_RUN ARGS...: a greedy decode; "NAME ids SHA256" of its token ids and margins.
decode() {
  local name=$1 ck=$2; shift 2
  "$JTOK" generate --checkpoint "$ck" --prompt "The model reads token ids" --temperature 0 \
    --max-new-tokens 24 --no-stop --ids-out "$T/runs/$name.json" "$@" > "$T/runs/$name.out" 2>&1 ||
    { echo "FAIL: decode $name"; cat "$T/runs/$name.out"; exit 1; }
  echo "$name ids $(/usr/bin/python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print(json.dumps([j["prompt_ids"], j["generated_ids"], j["top2_margins"]]))' "$T/runs/$name.json" | sha256sum | cut -d' ' -f1)"
}

run_all() {
  local p embp opt
  mkdir -p "$T/runs"
  for p in 1 2; do
    for embp in off naive premix premix-dedup; do
      for opt in dense sparse; do
        train_run "p$p.$embp.$opt" "$p" "$embp" "$opt"
        hash_run "p$p.$embp.$opt" >> "$T/hashes"
      done
    done
  done
  # Two OpenMP threads split some loops' sums differently from one: their own bits.
  for opt in dense sparse; do
    OMP_NUM_THREADS=2 train_run "p1t2.off.$opt" 1 off "$opt"
    hash_run "p1t2.off.$opt" >> "$T/hashes"
  done
  decode decode.ram "$T/runs/p1.off.dense" --tables ram >> "$T/hashes"
  decode decode.mmap "$T/runs/p1.off.dense" --tables mmap >> "$T/hashes"
  decode decode.p2.premix-dedup "$T/runs/p2.premix-dedup.dense" >> "$T/hashes"
  "$JTOK" export --checkpoint "$T/runs/p1.off.dense" --out "$T/runs/bf16" --weight-dtype bf16 > /dev/null
  decode decode.bf16 "$T/runs/bf16" >> "$T/hashes"
  OMP_NUM_THREADS=2 decode decode.t2 "$T/runs/p1t2.off.dense" >> "$T/hashes"
}

# same_hashes A B: runs (or decodes) A and B have the same hashes, file for file.
same_hashes() {
  local a b
  a=$(awk -v n="$1" '$1 == n {print $2, $3}' "$T/hashes")
  b=$(awk -v n="$2" '$1 == n {print $2, $3}' "$T/hashes")
  if [ -z "$a" ] || [ "$a" != "$b" ]; then
    echo "FAIL: $1 and $2 differ:"; grep -E "^($1|$2) " "$T/hashes"; exit 1
  fi
}

# The relations that hold on any host (docs/distributed.md): one process through the sharded-table
# path is the local path bit for bit with --embp premix (naive and premix-dedup sum their fetched
# rows' gradients at the requester first: within rounding only); exchanges overlapped with the
# layers give the bits of blocking ones; a run repeated gives the same bits; decoding with the
# tables memory-mapped gives the decode from RAM.
check_relations() {
  local opt
  for opt in dense sparse; do same_hashes "p1.off.$opt" "p1.premix.$opt"; done
  echo "ok: at P=1, --embp premix gives the checkpoint of --embp off bit for bit (dense and sparse)"
  train_run again.p2.premix-dedup.dense 2 premix-dedup dense
  hash_run again.p2.premix-dedup.dense >> "$T/hashes"
  same_hashes p2.premix-dedup.dense again.p2.premix-dedup.dense
  echo "ok: the P=2 premix-dedup run repeated gives the same checkpoint bit for bit"
  train_run again.p2.premix-dedup.dense.blocking 2 premix-dedup dense --embp-overlap off
  hash_run again.p2.premix-dedup.dense.blocking >> "$T/hashes"
  same_hashes p2.premix-dedup.dense again.p2.premix-dedup.dense.blocking
  echo "ok: the P=2 premix-dedup run with blocking exchanges (--embp-overlap off) gives the same checkpoint bit for bit"
  same_hashes decode.ram decode.mmap
  echo "ok: greedy decode with the tables memory-mapped is the decode from RAM bit for bit"
}

# record SIG: this host's lines in $RECORD replaced by this build's hashes.
record() {
  local sig=$1 keep
  keep=$(grep -v "^$sig " "$RECORD" 2>/dev/null || true)
  { [ -n "$keep" ] && echo "$keep"; grep -v '^again\.' "$T/hashes" | sed "s|^|$sig |"; } > "$T/record"
  mv "$T/record" "$RECORD"
  echo "recorded $(grep -c "^$sig " "$RECORD") hashes for host $sig in $RECORD"
}

# compare SIG: this build's hashes against the ones recorded for SIG, if any.
compare() {
  local sig=$1
  grep "^$sig " "$RECORD" 2>/dev/null | cut -d' ' -f2- | sort > "$T/expected" || true
  if [ ! -s "$T/expected" ]; then
    echo "NOTE: no hashes recorded for this host ($sig) in $RECORD: only the relations above were checked."
    echo "NOTE: to record them (on a build whose behaviour is the reference): bash scripts/bit_identity.sh --record"
    return 0
  fi
  grep -v '^again\.' "$T/hashes" | sort > "$T/got"
  if ! diff "$T/expected" "$T/got" > "$T/diff"; then
    echo "FAIL: hashes differ from the ones recorded for host $sig (< recorded, > this build):"
    cat "$T/diff"
    exit 1
  fi
  echo "ok: $(wc -l < "$T/got") hashes (18 checkpoints, 5 greedy decodes) equal the ones recorded for host $sig"
}

main() {
  local sig
  prepare_data
  run_all
  sig=$(host_signature)
  echo "host signature: $sig"
  check_relations
  if [ "$mode" = record ]; then record "$sig"; else compare "$sig"; fi
}
main
