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
