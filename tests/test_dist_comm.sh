#!/usr/bin/env bash
# src/dist/communicator under `mpirun -np 2` (the C++ checks of tests/test_dist_comm.cpp, which
# ctest also runs alone as a world of one), and the rule that the model knows no MPI.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
source "$ROOT/tests/mpi_env.sh"
if grep -rlE '#include (<mpi\.h>|"dist/)' "$ROOT"/src/{core,ops,model,infer,data,io} ; then
  echo "FAIL: the files above include MPI or src/dist; only src/dist, src/train and apps may"; exit 1
fi
for t in test_dist_comm test_dist_embp; do "${MPIRUN[@]}" -np 2 "$(dirname "$JTOK")/$t" --gtest_brief=1; done
echo "ok: communicator and embedding-parallel checks pass on 2 ranks"
