# shellcheck shell=bash
# Sourced by tests that inject write faults with the LD_PRELOAD shim tests/faults/write_fault_shim.cpp.
# fault_preload_list BINARY: prints the LD_PRELOAD value for BINARY: the shim ($JTOK_FAULT_SHIM, set by
# ctest), preceded by the sanitizer runtime when BINARY is an ASan build (ASan must come first).
fault_preload_list() {
  local shim=${JTOK_FAULT_SHIM:?JTOK_FAULT_SHIM is set by ctest}
  [ -f "$shim" ] || { echo "no fault shim at $shim" >&2; return 1; }
  local asan
  asan=$(ldd "$1" | awk '/libasan/ {print $3}')
  if [ -n "$asan" ]; then echo "$asan:$shim"; else echo "$shim"; fi
}
