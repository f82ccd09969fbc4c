# shellcheck shell=bash
# Sourced by the tests that launch several ranks. CI runs as root in a container with 2 cores:
# - OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1: Open MPI's mpirun refuses to run as root without both;
#   harmless when not root.
# - --oversubscribe: allow more ranks than Open MPI counts slots (cores) on small CI machines.
# - --bind-to none: ctest runs two tests at once; pinning each job's ranks to cores 0 and 1 would
#   stack both jobs on the same cores.
# - mpi_yield_when_idle=1: a rank waiting in a collective yields its core instead of spinning;
#   with 2 ranks on 2 shared cores (and other tests beside them) spinning cost ~6x the CPU time.
# - OMP_NUM_THREADS=1: one thread per rank (2 ranks on 2 cores).
# - btl self,vader with single-copy "none": shared memory between the ranks of one machine
#   without CMA (process_vm_readv), which containers often forbid.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
# Under scripts/test_asan.sh: the ranks preload tests/sanitizer/keep_dsos_shim.cpp (after the
# ASan runtime, which must come first), whose dlclose() does nothing, so Open MPI's components stay
# mapped until exit and LeakSanitizer's default (frame-pointer) stacks name the library that leaked
# (tests/sanitizer/lsan.supp). Before it, a full unwind of every malloc (fast_unwind_on_malloc=0)
# was needed to reach a named frame: 2.7x the CPU of a 2-rank run, sh_test_dist_train 669 s.
if [ -n "${JTOK_SANITIZER_BUILD:-}" ]; then
  keep=${JTOK_KEEP_DSOS_SHIM:?the sanitizer build passes JTOK_KEEP_DSOS_SHIM (CMake target keep_dsos_shim)}
  [ -f "$keep" ] || { echo "FAIL: no $keep (build the keep_dsos_shim target)"; exit 1; }
  asan_rt=$(ldd "${JTOK_BIN:?}" | awk '/libasan/ {print $3}')
  [ -n "$asan_rt" ] || { echo "FAIL: JTOK_SANITIZER_BUILD is set but $JTOK_BIN has no ASan runtime"; exit 1; }
  MPIRUN+=(-x "LD_PRELOAD=$asan_rt:$keep")
fi
