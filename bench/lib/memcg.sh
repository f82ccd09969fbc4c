# A memory limit that counts the page cache, for the benches of tables larger than memory
# (bench/table_store_limit.sh, bench/table_store_train_limit.sh). Sourced after bench/bench_lib.sh
# (PY). Needs root.
#   memcg_make NAME BYTES   makes the cgroup (cgroup v2's memory.max when /sys/fs/cgroup is cgroup2,
#                           else v1's memory.limit_in_bytes under /sys/fs/cgroup/memory), sets MEMCG
#                           to its directory and prints which
#   memcg_exec CMD...       becomes CMD inside MEMCG (a shell joins the cgroup, then execs CMD): call
#                           it in the background or in a subshell, `( memcg_exec ... )`, since it execs
#   memcg_peak              the cgroup's peak usage in bytes (v1 max_usage_in_bytes, v2 memory.peak)
#   memcg_reset_peak        v1: the peak counter restarted (v2 has none to reset: prints nothing)
#   memcg_remove            removes MEMCG (once no process is in it)
#   evict_page_cache FILE...  drops each file's pages from the page cache (posix_fadvise DONTNEED)
MEMCG=""

memcg_make() {
  local name=$1 bytes=$2
  if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
    MEMCG=/sys/fs/cgroup/$name
    grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory > /sys/fs/cgroup/cgroup.subtree_control
    mkdir "$MEMCG"; echo "$bytes" > "$MEMCG/memory.max"; echo 0 > "$MEMCG/memory.swap.max" 2>/dev/null || true
    echo "cgroup: v2, $MEMCG/memory.max = $(cat "$MEMCG/memory.max") (counts the page cache)"
  elif [ -d /sys/fs/cgroup/memory ]; then
    MEMCG=/sys/fs/cgroup/memory/$name
    mkdir "$MEMCG"; echo "$bytes" > "$MEMCG/memory.limit_in_bytes"
    echo "cgroup: v1, $MEMCG/memory.limit_in_bytes = $(cat "$MEMCG/memory.limit_in_bytes") (counts the page cache)"
  else
    echo "no memory cgroup hierarchy under /sys/fs/cgroup" >&2; return 2
  fi
}

memcg_exec() { exec sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$MEMCG" "$@"; }

memcg_peak() { cat "$MEMCG/memory.max_usage_in_bytes" 2>/dev/null || cat "$MEMCG/memory.peak" 2>/dev/null || echo '?'; }

memcg_reset_peak() { [ -f "$MEMCG/memory.max_usage_in_bytes" ] && echo 0 > "$MEMCG/memory.max_usage_in_bytes" || true; }

memcg_remove() { [ -n "$MEMCG" ] && rmdir "$MEMCG" 2>/dev/null || true; }

evict_page_cache() {
  for f in "$@"; do
    $PY -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$f"
  done
}
