# Sourced by the shell tests that run `jtok serve` (tests/test_serve*.sh, tests/test_table_store_*.sh),
# right after they set JTOK and ROOT: serve_test_env, then start_serve for each server.

# serve_test_env: T (a temporary directory), PIDS (the servers: the EXIT trap kills them, waits for
# them and removes T), and one OpenMP thread: a tiny model's decode step is microseconds, and with
# two OpenMP threads on a loaded 2-core machine every parallel region waits for a time slice (100x
# slower, measured).
serve_test_env() {
  T=$(mktemp -d)
  PIDS=()
  trap serve_test_cleanup EXIT
  export OMP_NUM_THREADS=1
}

serve_test_cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$T"
}

# fail MESSAGE: prints it and the last lines of every server's stderr, and exits 1.
fail() {
  echo "FAIL: $*"
  local f
  for f in "$T"/serve_*.err; do [ -e "$f" ] && { echo "--- $f"; tail -5 "$f"; }; done
  exit 1
}

# start_serve NAME ARGS...: `jtok serve --port 0 ARGS...` in the background, its output in
# $T/serve_NAME.out and .err, its pid appended to PIDS; waits (at most ~15 s) for the port it prints
# and sets PORT.
start_serve() {
  local name=${1:?start_serve: no name}; shift
  : > "$T/serve_$name.out"  # exists before the background server opens it: the loop reads it at once
  "${JTOK:?}" serve --port 0 "$@" > "$T/serve_$name.out" 2> "$T/serve_$name.err" &
  PIDS+=($!)
  PORT=
  for _ in $(seq 300); do
    PORT=$(sed -n 's|.*http://127.0.0.1:\([0-9]*\).*|\1|p' "$T/serve_$name.out")
    [ -n "$PORT" ] && return 0
    kill -0 "${PIDS[-1]}" 2>/dev/null || fail "server $name did not start"
    sleep 0.05
  done
  fail "server $name printed no port"
}
