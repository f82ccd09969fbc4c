// A test-only LD_PRELOAD library for the MPI tests of the sanitizer build (tests/mpi_env.sh under
// scripts/test_asan.sh): dlclose() does nothing, so every shared object a process dlopen()s stays
// mapped until it exits. Built by CMake (target keep_dsos_shim) without sanitizers, only with
// -DJTOK_SANITIZE=ON; it is never linked into jtok.
//
// Why: Open MPI 4.1 (Debian's libopenmpi3) dlopen()s its components (mca_*.so, and through them
// libpmix) and dlclose()s them at MPI_Finalize; it has no setting to keep them loaded. What those
// components leaked is checked by LeakSanitizer after that, at exit, when the code that allocated
// it is no longer mapped: the frame that called malloc shows as "<unknown module>", and only a full
// (DWARF) unwind of every malloc, ASan's fast_unwind_on_malloc=0, reached a frame in libmpi that a
// suppression could name. That unwind made the MPI tests ~2.7x more costly in CPU (~9x in wall
// clock on a loaded machine). With the components kept mapped the malloc's caller names its
// library, so the default frame-pointer unwinding suffices (tests/sanitizer/lsan.supp).
extern "C" int dlclose(void*) { return 0; }
