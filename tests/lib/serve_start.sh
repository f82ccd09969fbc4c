# Sourced by the shell tests that run `jtok serve` (tests/test_serve*.sh): a server on a free port.
# Needs JTOK (the jtok binary), T (the test's temporary directory), a PIDS array (the test's trap kills
# them) and a fail function, as those tests define them.

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
