#!/usr/bin/env bash
# The one script a GPU session runs (issue 39; docs/cuda.md, "Running on a GPU host"). Prepared
# here by scripts/gpu_prepare.sh (the CUDA bundle + a few token shards in build/gpu-session, which
# the device run carries); there, in the repository root:
#   bash scripts/gpu_session.sh [--dir build/gpu-session] [--steps "tests attention products peer"] [--budget 570]
#                               [--study-steps 600] [--dry-run]
# Steps, each killed after its time box so one hang does not eat the session:
#   tests      scripts/test_cuda.sh on the bundle: test_cuda_ops, --device cuda's check, train
#              --device cuda (tests/cuda/train_cuda.sh), generate / serve --device cuda
#              (tests/cuda/infer_cuda.sh, ~45 s), compute-sanitizer memcheck + racecheck (box 300 s)
#   peer       bench/gpu_train_peer.sh: ours (jtok bench-train --device cuda, where built) and the
#              PyTorch peer, config b, dense / +JTok / +JTok-M, eager and compile (box 300 s; the
#              script itself starts no run after 280 s and cuts each run to what is left, so its
#              table comes out)
#   attention  the bundle's bench_cuda_attention, config b's shape, then its PyTorch peer
#              (bench/attention_peer.py: scaled_dot_product_attention's flash, efficient and cudnn
#              backends, ours' ratio to each; box 75 s)
#   products   the bundle's bench_cuda_row_invariant: the decode steps' batch-invariant
#              products against cuBLASLt, Qwen3-0.6B's shapes, M 1, 4, 16 (issue 40); then
#              bench_cuda_grouped: MoE's grouped expert products against cuBLASLt per expert, the MoE
#              bench config's layer and a Qwen3-30B-A3B-sized one (issue 39; products.json, box 60 s)
#   kernels    (not default: a second device run, first) bench/gpu_train_peer.sh --kernel-trace: ours
#              (dense, +JTok-M) and the peer (torch.compile) on config b, 3 timed steps each traced
#              kernel by kernel (CUPTI: JTOK_KERNEL_TRACE; torch.profiler), then where each step's
#              device time goes, by kind of op and kernel, side by side (kernels/kernels.md; box 240 s)
#   moe        (not in the default steps: a second device run) bench/gpu_train_peer.sh on
#              configs/bench_moe.json, ours and the peer, base / +JTok / +JTok-M (box 240 s)
#   rows       (not default; issue 40) the bundle's bench_cuda_host_rows on a carried shard:
#              a step's table rows from HBM, in place from pinned host memory, staged (box 90 s)
#   decode     (not default: its own device run, `--steps decode`; issue 40) bench/gpu_decode_peer.sh:
#              `jtok bench-decode --device cuda` on the Qwen3-0.6B shape, dense (and dense int8, pdl,
#              tensor-core products) and JTok-M (n_e 5, K 2, every layer; tables hbm / in place from
#              RAM / staged), and the HF transformers
#              peer, batch 1 and 16, prompt 512, 128 steps, a 4,096-token prefill (decode/: one JSON
#              file a run, plan.txt, table.md; box 420 s, the script's --budget 390); dense and JTok-M
#              each run every shape once more traced kernel by kernel (--kernel-trace, CUPTI: decode/
#              kernels.md, where a decode step's and the prefill's device time goes)
#   beyond     (not default: its own device run, `--steps beyond`; issue 40) bench/gpu_decode_peer.sh
#              --runs "dense beyond": JTok-M with n_e 10 on every layer of the Qwen3-0.6B shape (87.1 GB
#              of bf16 tables, past an H100's memory) read from the host's RAM in place and staged
#              (from HBM too where a copy fits), beside dense; peak GPU memory beside the tables'
#              bytes (beyond/: plan.txt, plan.json, table.md; box 420 s, the script's --budget 390)
#   store      (not default: its own device run, `--steps store`; issue 40) bench/gpu_decode_peer.sh
#              --runs "dense disk": JTok-M n_e 5 on the Qwen3-0.6B shape with its tables in a
#              token-major store on the host's disk (43.6 GB of bf16 written first from the random
#              rows, deleted after; skipped, saying so, where the disk lacks the room), its rows staged
#              to the GPU through a 4 GB DRAM cache, beside dense (store/: plan.txt, table.md; box
#              300 s, the script's --budget 270)
#   evalref    (not default; issue 40) bench/gpu_eval_reference.sh: config b + JTok + JTok-M trained 200
#              steps on the GPU, then `jtok eval --device cuda` in bf16 and fp32 against the same
#              checkpoint on the CPU's fp32 forward (--reference): top-1 agreement and KL, the bf16
#              bound 99 % (evalref/: summary.txt, eval_*.json; box 300 s)
#   curve      (not default: a session's second run, `--steps curve`) bench/gpu_loss_curve.sh: 300
#              steps (the carried shards' whole stream, 296.6 steps, then its start again, as
#              jtok's loader reads it) of config b + JTok-M, ours on the GPU in
#              bf16 beside the PyTorch reference in bf16 autocast and the CPU engine's first 5 steps
#              in fp32, same weights and batches (curve/: curve.csv, curve.svg, summary.txt; box
#              510 s, the script's --budget 480)
#   study      (not default: its own device run, `--steps study`; issue 39's "Beyond")
#              bench/gpu_study.sh: config b dense, +JTok and +JTok-M trained --study-steps steps
#              (default 600, 9.8M tokens: the carried corpus about twice) in bf16 at seeds 1 and 2,
#              each scored on the whole carried validation split; rows already in
#              docs/data/gpu_study.csv are skipped (study/: study.csv, study.md, study.svg, runs/; box 570 s, the
#              script's --budget 540)
# --budget S (default 570, under the 600 s a device command runs at most; 0: none): the steps run in
# the order given while they fit. A step starts only if its box fits in what is left of S; a step
# whose bench has a budget of its own (peer, moe, decode, beyond, store, curve, study) starts in what
# is left down to half its box, its bench cutting its last runs; the others are "not started" (not a
# failure). So one device run takes as many steps as their real times allow, not their boxes' sum.
# Every log goes under $OUT (the device run brings back what is there; default
# bench-out/gpu-session here): session.log (all of this output), nvidia-smi.txt, peak.json (`jtok
# bench-peak --device cuda`, before the steps), tests/,
# peer/ (one JSON line and one log per run, table.md), attention.json, attention_peer.json, decode/,
# beyond/, store/, curve/, study/, summary.txt.
# --dry-run checks the inputs, unpacks the bundle and prints each step's command (the peer's and the
# curve's runs too, through their own --dry-run) without running anything.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
DIR=build/gpu-session; STEPS="tests attention products peer"; STUDY_STEPS=600; BUDGET=570; DRY=0
usage="usage: $0 [--dir DIR] [--steps \"tests attention products peer\"] [--budget S] [--study-steps N] [--dry-run]"
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) DIR=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --study-steps) STUDY_STEPS=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
# Each step's time box (seconds); the steps whose bench has a --budget of its own (20-30 s under the
# box) can run in less.
declare -A BOX=([tests]=300 [peer]=300 [attention]=75 [products]=60 [kernels]=240 [moe]=240 [rows]=90 [decode]=420
                [beyond]=420 [store]=300 [evalref]=300 [curve]=510 [study]=570)
SHRINKS=" peer kernels moe decode beyond store curve study "
for s in $STEPS; do
  [ -n "${BOX[$s]:-}" ] || { echo "gpu_session.sh: unknown step $s (${!BOX[*]})" >&2; exit 2; }
done
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "gpu_session.sh: --budget $BUDGET is not a number of seconds (0: none)" >&2; exit 2; }
OUT=${OUT:-bench-out/gpu-session}
BUNDLE=$DIR/cuda-bundle.tar.gz
[ -f "$BUNDLE" ] || { echo "gpu_session.sh: no $BUNDLE (bash scripts/gpu_prepare.sh makes it; carry $DIR)" >&2; exit 2; }
[ -d "$DIR/shards" ] || { echo "gpu_session.sh: no $DIR/shards (bash scripts/gpu_prepare.sh makes them)" >&2; exit 2; }
[ -f "$DIR/tokenizer/encoder.json" ] || { echo "gpu_session.sh: no $DIR/tokenizer (bash scripts/gpu_prepare.sh copies it)" >&2; exit 2; }
mkdir -p "$OUT"
exec > >(tee "$OUT/session.log") 2>&1
START=$SECONDS

# The CPU features the bundle's build may use (scripts/cuda_bundle.sh's isa file) that this CPU
# lacks: said and refused before any of its binaries dies on an illegal instruction.
check_bundle_isa() {
  local march needs missing="" f
  [ -f "$1" ] || { echo "gpu_session.sh: the bundle records no -march (packed before cuda_bundle.sh wrote it)"; return 0; }
  march=$(sed -n 's/^march //p' "$1"); needs=$(sed -n 's/^needs //p' "$1")
  for f in $needs; do grep -qw -- "$f" /proc/cpuinfo || missing+=" $f"; done
  echo "gpu_session.sh: CPU $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); the bundle: -march=$march"
  [ -z "$missing" ] && return 0
  echo "gpu_session.sh: this CPU lacks${missing}, which the bundle's build (-march=$march) may use: rebuild it with" \
       "scripts/gpu_prepare.sh (its build-gpu is x86-64-v3: AVX2 and FMA)" >&2
  return 1
}

# The bundle beside the repository; its libraries only for its binaries (not for python3's torch).
U=$(mktemp -d); trap 'rm -rf "$U"' EXIT
tar xzf "$BUNDLE" -C "$U"
LIBS="$U/bundle/lib:/usr/local/cuda/lib64:/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$LIBS" "$U/bundle/bin/jtok" > "$U/jtok"
chmod +x "$U/jtok"
echo "gpu_session.sh: $(date -u '+%F %T') UTC, bundle of commit $(cat "$U/bundle/commit" 2>/dev/null || echo unknown)," \
     "tree $(git rev-parse --short HEAD 2>/dev/null || echo 'without .git')"
check_bundle_isa "$U/bundle/isa" || exit 3
if [ "$DRY" = 0 ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | tee "$OUT/nvidia-smi.txt"
  { lscpu; ldd --version | head -n 1; } > "$OUT/host.txt" 2>&1 || true  # the host's CPU and glibc, for the next bundle
  nvidia-smi >> "$OUT/nvidia-smi.txt" 2>&1 || true
  python3 -c 'import torch; print("python3: torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())' 2>&1 | tail -n 1
  # What this GPU reaches (checked bf16 products at 8192^3 and config b's shapes, device and pinned
  # copies): the denominators of this run's figures, a few seconds.
  timeout 60 "$U/jtok" bench-peak --device cuda > "$OUT/peak.json" || echo "gpu_session.sh: bench-peak failed (rc $?)"
fi

declare -A RESULT SECS
step() {  # step NAME BOX CMD...: runs CMD killed after BOX seconds, records its result
  local name=$1 box=$2; shift 2
  echo; echo "== $name (time box $box s): $*"
  if [ "$DRY" = 1 ]; then
    RESULT[$name]="dry run"; SECS[$name]=0
    case "$name" in peer|kernels|moe|curve|decode|beyond|store|evalref|study) "$@" --dry-run ;; esac
    return
  fi
  local t0=$SECONDS rc=0
  timeout "$box" "$@" || rc=$?
  SECS[$name]=$((SECONDS - t0))
  case $rc in
    0) RESULT[$name]=passed ;;
    124) RESULT[$name]="KILLED at its $box s box" ;;
    *) RESULT[$name]="FAILED (rc $rc)" ;;
  esac
  echo "== $name: ${RESULT[$name]} in ${SECS[$name]} s"
}

run_step() {  # run_step NAME BOX: the step's command in a box of BOX s (the benches' own --budget under it)
  local s=$1 box=$2
  case "$s" in
    tests) step tests "$box" env JTOK_CUDA_BUNDLE="$BUNDLE" JTOK_CUDA_LOGS="$OUT/tests" JTOK_GPU_SHARDS="$DIR/shards" \
             JTOK_GPU_TOKENIZER="$DIR/tokenizer" bash scripts/test_cuda.sh ;;
    peer) step peer "$box" bash bench/gpu_train_peer.sh --data "$DIR/shards" --jtok "$U/jtok" --out "$OUT/peer" \
            --budget $((box - 20)) --timeout 120 ;;
    attention)
      if [ -x "$U/bundle/bin/bench_cuda_attention" ]; then
        # shellcheck disable=SC2016  # $1.. are the inner shell's arguments
        # ours, then PyTorch's scaled_dot_product_attention (flash, efficient, cudnn, its pick) on the
        # same shape, with ours' ratio to each (bench/attention_peer.py).
        step attention "$box" sh -c 'LD_LIBRARY_PATH="$1" "$2" > "$3" || exit $?; cat "$3"
          python3 bench/attention_peer.py --ours "$3" > "$4"; rc=$?; cat "$4"; exit $rc' sh \
          "$LIBS" "$U/bundle/bin/bench_cuda_attention" "$OUT/attention.json" "$OUT/attention_peer.json"
      else
        echo; echo "== attention: the bundle has no bench_cuda_attention"; RESULT[attention]="not in the bundle"; SECS[attention]=0
      fi ;;
    products)
      # shellcheck disable=SC2016  # $1.. are the inner shell's arguments
      step products "$box" sh -c 'LD_LIBRARY_PATH="$1" "$2" > "$4" && LD_LIBRARY_PATH="$1" "$3" >> "$4"; rc=$?; cat "$4"; exit $rc' \
        sh "$LIBS" "$U/bundle/bin/bench_cuda_row_invariant" "$U/bundle/bin/bench_cuda_grouped" "$OUT/products.json" ;;
    kernels) step kernels "$box" bash bench/gpu_train_peer.sh --data "$DIR/shards" --jtok "$U/jtok" --out "$OUT/kernels" \
               --kernel-trace --models "dense jtokm" --modes compile --steps 3 --warmup 3 --budget $((box - 20)) \
               --timeout 110 ;;
    moe) step moe "$box" bash bench/gpu_train_peer.sh --config configs/bench_moe.json --batch 16 --data "$DIR/shards" \
           --jtok "$U/jtok" --out "$OUT/moe" --budget $((box - 30)) --timeout 100 ;;
    rows)
      shard=$(ls "$DIR"/shards/*.bin | head -n 1)
      # shellcheck disable=SC2016  # $1.. are the inner shell's arguments
      step rows "$box" sh -c 'LD_LIBRARY_PATH="$1" "$2" --shard "$3" > "$4"; rc=$?; cat "$4"; exit $rc' sh \
        "$LIBS" "$U/bundle/bin/bench_cuda_host_rows" "$shard" "$OUT/host_rows.json" ;;
    decode) step decode "$box" bash bench/gpu_decode_peer.sh --data "$DIR/shards" --jtok "$U/jtok" --out "$OUT/decode" \
              --kernel-trace --budget $((box - 30)) --timeout 220 ;;
    beyond) step beyond "$box" bash bench/gpu_decode_peer.sh --data "$DIR/shards" --jtok "$U/jtok" --out "$OUT/beyond" \
              --runs "dense beyond" --budget $((box - 30)) --timeout 330 ;;
    store) step store "$box" bash bench/gpu_decode_peer.sh --data "$DIR/shards" --jtok "$U/jtok" --out "$OUT/store" \
             --runs "dense disk" --budget $((box - 30)) --timeout 230 ;;
    evalref) step evalref "$box" bash bench/gpu_eval_reference.sh --jtok "$U/jtok" --data "$DIR/shards" \
               --tokenizer "$DIR/tokenizer" --out "$OUT/evalref" ;;
    curve) step curve "$box" bash bench/gpu_loss_curve.sh --jtok "$U/jtok" --data "$DIR/shards" --out "$OUT/curve" \
             --steps 300 --budget $((box - 30)) ;;
    study) step study "$box" env STUDY_COMMIT="$(cut -c1-7 "$U/bundle/commit" 2>/dev/null)" bash bench/gpu_study.sh \
             --jtok "$U/jtok" --data "$DIR/shards" --val "$DIR/val" --tokenizer "$DIR/tokenizer" --out "$OUT/study" \
             --steps "$STUDY_STEPS" --budget $((box - 30)) ;;
  esac
}

# With --budget, each step starts only if its box fits in what is left; one whose bench has a budget
# of its own starts in what is left down to half its box (its last runs cut). A dry run counts each
# step's whole box as spent, and nothing else (not its own seconds, which a loaded host stretches):
# the plan if every step took its box.
PLANNED=0
for s in $STEPS; do
  box=${BOX[$s]}
  if [ "$BUDGET" -gt 0 ]; then
    spent=$((SECONDS - START))
    [ "$DRY" = 1 ] && spent=$PLANNED
    left=$((BUDGET - spent))
    if [ "$left" -lt "$box" ]; then
      if [[ $SHRINKS == *" $s "* ]] && [ "$left" -ge $((box / 2)) ]; then
        echo; echo "== $s: its box cut from $box s to the $left s left of the --budget"; box=$left
      else
        echo; echo "== $s: not started (its box $box s, $left s left of the --budget $BUDGET s)"
        RESULT[$s]="not started ($left s left)"; SECS[$s]=0; continue
      fi
    fi
  fi
  run_step "$s" "$box"
  [ "$DRY" = 1 ] && PLANNED=$((PLANNED + box))
done

{
  echo "gpu_session.sh summary: $((SECONDS - START)) s in all"
  for s in $STEPS; do printf '  %-10s %-28s %4s s\n' "$s" "${RESULT[$s]:-not run}" "${SECS[$s]:-0}"; done
  if [ -f "$OUT/tests/cuda_ops.log" ]; then
    echo "cuda cases: $(grep -c '^cuda case' "$OUT/tests/cuda_ops.log") lines, $(grep -c 'FAILED\|Failure' "$OUT/tests/cuda_ops.log") failures"
  fi
  [ -f "$OUT/peer/table.md" ] && cat "$OUT/peer/table.md"
  [ -f "$OUT/kernels/kernels.md" ] && sed -n '1,/^### /p' "$OUT/kernels/kernels.md"
  [ -f "$OUT/moe/table.md" ] && cat "$OUT/moe/table.md"
  [ -f "$OUT/curve/summary.txt" ] && cat "$OUT/curve/summary.txt"
  [ -f "$OUT/evalref/summary.txt" ] && cat "$OUT/evalref/summary.txt"
  [ -f "$OUT/decode/table.md" ] && cat "$OUT/decode/plan.txt" "$OUT/decode/table.md"
  [ -f "$OUT/beyond/table.md" ] && cat "$OUT/beyond/plan.txt" "$OUT/beyond/table.md"
  [ -f "$OUT/store/table.md" ] && cat "$OUT/store/plan.txt" "$OUT/store/table.md"
  [ -f "$OUT/study/study.md" ] && cat "$OUT/study/study.md"
} | tee "$OUT/summary.txt"
for s in $STEPS; do
  case "${RESULT[$s]:-}" in passed|"dry run"|"not in the bundle"|"not started"*) ;; *) exit 1 ;; esac
done
exit 0
