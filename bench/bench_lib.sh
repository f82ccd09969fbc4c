# shellcheck shell=bash disable=SC2034  # sourced: its variables are the sourcing script's
# Shared preamble of the bench scripts (sourced from the repository root): JTOK (built if
# missing), PY, the OpenMP wait policy and the openmp flavour of OpenBLAS for the PyTorch peer.
JTOK=${JTOK_BIN:-build/jtok}
if [ ! -x "$JTOK" ]; then
  echo "building $JTOK ..." >&2
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >&2
  cmake --build build -j"$(nproc)" --target jtok >&2
  JTOK=build/jtok
fi
PY=/usr/bin/python3
# Both engines run with OpenMP's PASSIVE wait policy unless the environment sets one: on a machine
# shared with other work, threads spinning at a barrier for a descheduled partner slowed
# train_bench.py's attention up to 50x and `jtok generate` 20x (docs/benchmarks.md).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
OPENBLAS_OMP=/usr/lib/x86_64-linux-gnu/openblas-openmp

# bench_b_fields [KEY...]: config b's backbone (configs/bench_b.json: hidden size, layers, heads, KV
# heads, intermediate size, context) and any further KEYs, as config.json fields without the braces.
# shellcheck disable=SC2120  # callers in other scripts pass KEYs
bench_b_fields() {
  $PY - "$@" <<'PYEOF'
import json, sys
c = json.load(open("configs/bench_b.json"))
keys = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
        "max_position_embeddings"] + sys.argv[1:]
print(", ".join(f"\"{k}\": {json.dumps(c[k])}" for k in keys))
PYEOF
}

# bench_backbone QUICK: config b's backbone fields, or with QUICK 1 a d=256, 6-layer one (context
# 512) that checks a script in a minute or two.
bench_backbone() {
  if [ "$1" = 1 ]; then
    echo '"hidden_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 1024, "max_position_embeddings": 512'
  else
    bench_b_fields
  fi
}

# bench_stamp [--mem] [--wait-policy]: the line a bench prints under its title: the UTC date, the
# cores (and with --mem the RAM), the load, (with --wait-policy OMP_WAIT_POLICY) and the commit.
bench_stamp() {
  local host extra="" a
  host="$(nproc) cores"
  for a in "$@"; do
    case $a in
      --mem) host+=", $(free -g | awk '/Mem:/{print $2}') GiB" ;;
      --wait-policy) extra=" | OMP_WAIT_POLICY=$OMP_WAIT_POLICY" ;;
      *) echo "bench_stamp: unknown option $a" >&2; return 2 ;;
    esac
  done
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC') | host: $host | load $(cut -d' ' -f1-3 /proc/loadavg)$extra | commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
}
