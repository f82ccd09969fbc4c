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
# Under scripts/test_asan.sh: Open MPI's components stay loaded at MPI_Finalize and leak stacks are
# unwound in full, so LeakSanitizer can attribute Open MPI's own leaks to it (tests/sanitizer/lsan.supp).
if [ -n "${JTOK_SANITIZER_BUILD:-}" ]; then
  export OMPI_MCA_mca_base_component_disable_dlclose=1
  export ASAN_OPTIONS="${ASAN_OPTIONS:-}:fast_unwind_on_malloc=0"
fi
