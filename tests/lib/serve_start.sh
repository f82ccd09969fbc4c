# shellcheck shell=bash
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

# serve_extra_args: JTOK_SERVE_ARGS (default empty) split into the array SERVE_EXTRA: arguments every
# server of these tests gets before its own, e.g. "--device cuda --precision fp32" (tests/cuda/infer_cuda.sh
# runs the HTTP tests on a GPU so).
serve_extra_args() { read -ra SERVE_EXTRA <<< "${JTOK_SERVE_ARGS:-}"; }

# start_serve NAME ARGS...: `jtok serve --port 0 $JTOK_SERVE_ARGS ARGS...` in the background, its output in
# $T/serve_NAME.out and .err, its pid appended to PIDS; waits (at most ~15 s, 60 s with JTOK_SERVE_ARGS:
# a GPU server starts its device first) for the port it prints and sets PORT. With JTOK_SERVE_ARGS its
# start line is echoed ("start_serve NAME: serve: ... (device ...)"), so a caller sees where it decodes.
start_serve() {
  local name=${1:?start_serve: no name}; shift
  local tries=300
  serve_extra_args
  [ ${#SERVE_EXTRA[@]} = 0 ] || tries=1200
  : > "$T/serve_$name.out"  # exists before the background server opens it: the loop reads it at once
  "${JTOK:?}" serve --port 0 "${SERVE_EXTRA[@]}" "$@" > "$T/serve_$name.out" 2> "$T/serve_$name.err" &
  PIDS+=($!)
  PORT=
  for _ in $(seq $tries); do
    PORT=$(sed -n 's|.*http://127.0.0.1:\([0-9]*\).*|\1|p' "$T/serve_$name.out")
    if [ -n "$PORT" ]; then
      [ ${#SERVE_EXTRA[@]} = 0 ] || echo "start_serve $name: $(grep -m 1 'http://127.0.0.1' "$T/serve_$name.out")"
      return 0
    fi
    kill -0 "${PIDS[-1]}" 2>/dev/null || fail "server $name did not start"
    sleep 0.05
  done
  fail "server $name printed no port"
}
