# Shell functions the image and node scripts share; source it, do not run it.

# Starts crane's in-memory registry on a free 127.0.0.1 port, its log in $2. Sets REGISTRY_PID
# and REGISTRY_PORT; fails (printing the log) when it does not come up.
#   start_local_registry "$CRANE" "$WORK/registry.log"
start_local_registry() {
  local crane="$1" log="$2"
  "$crane" registry serve --address 127.0.0.1:0 2>"$log" &
  REGISTRY_PID=$!
  REGISTRY_PORT=""
  for _ in $(seq 100); do
    REGISTRY_PORT="$(sed -n 's/.*serving on port \([0-9][0-9]*\).*/\1/p' "$log")"
    [[ -n "$REGISTRY_PORT" ]] && return 0
    kill -0 "$REGISTRY_PID" 2>/dev/null || break
    sleep 0.1
  done
  cat "$log" >&2
  return 1
}
