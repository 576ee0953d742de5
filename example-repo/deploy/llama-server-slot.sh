#!/usr/bin/env bash
# The agent's slot commands for llama.cpp's llama-server behind a node-local
# nginx, for applies with a warm standby (docs/standby.md):
#
#   reconciler agent ... --allow-live-apply --slot-ports 8081,8082 \
#       --slot-start-command '/usr/local/lib/reconciler/llama-server-slot.sh start' \
#       --slot-route-command '/usr/local/lib/reconciler/llama-server-slot.sh route' \
#       --slot-stop-command  '/usr/local/lib/reconciler/llama-server-slot.sh stop'
#
#   start  starts llama-server on $RECONCILER_SLOT_PORT with the model of the
#          slot's config ($RECONCILER_CONFIG: {modelDir}/model.gguf), through
#          llama-server-after-apply.sh beside this script (same settings, same
#          pid file $LLAMA_SERVER_RUN_DIR/PORT.pid, waits for /health). A
#          server still running in the slot (one kept warm, just routed away
#          from) is replaced, so start first waits for old nginx workers as
#          stop does;
#   stop   first waits until no worker of the nginx master named by
#          $NGINX_PID_FILE is "shutting down" (such a worker may still be
#          answering a request through this slot), at most $NGINX_RELOAD_WAIT
#          seconds, saying so; then stops the slot's server through
#          "llama-server-after-apply.sh stop": the server of that slot's pid
#          file only, and only while that pid is still a llama-server on the
#          slot's port (a pid file can outlive its process, and pids are
#          reused); under systemd, llama-server@PORT. With no nginx pid file
#          readable, it stops at once;
#   route  points nginx at the slot: rewrites the upstream include file
#          $NGINX_UPSTREAM_FILE to "server 127.0.0.1:PORT;" and reloads nginx
#          ($NGINX_RELOAD, default "nginx -s reload"): workers started by the
#          reload send new requests to the slot, old workers finish theirs.
#          If the reload fails, the previous include is put back. It returns
#          once every worker that ran before the reload is shutting down or
#          gone and a new worker runs, or after $NGINX_RELOAD_WAIT seconds,
#          saying so: a worker shutting down has closed its listening sockets
#          and idle connections, so every new request reaches a new worker.
#          It does not wait for the old workers' requests: stop does.
#
# Settings (environment), besides those of llama-server-after-apply.sh:
# NGINX_UPSTREAM_FILE (/etc/nginx/reconciler/llama-upstream.conf), NGINX_RELOAD,
# NGINX_PID_FILE (/run/nginx.pid), NGINX_RELOAD_WAIT (30).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
action=${1:?"usage: llama-server-slot.sh start|stop|route"}
port=${RECONCILER_SLOT_PORT:?"run by reconciler agent --slot-*-command (RECONCILER_SLOT_PORT is not set)"}

fail() {
  echo "llama-server-slot $action (slot ${RECONCILER_SLOT:-?}): $*" >&2
  exit 1
}

reload_wait=${NGINX_RELOAD_WAIT:-30}

# The nginx worker PID is retitled "... shutting down" after a reload.
shutting_down() {
  tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q "shutting down"
}

# Every worker of $old shutting down or gone, and a worker of master $1 not
# in $old running; bounded by $NGINX_RELOAD_WAIT.
wait_moved() {
  local master=$1 old=$2 deadline=$((SECONDS + reload_wait)) pid moved
  while :; do
    moved=yes
    for pid in $old; do
      [ -d "/proc/$pid" ] && ! shutting_down "$pid" && moved=""
    done
    [ -n "$moved" ] && pgrep -P "$master" | grep -qvxF -- "${old:-none}" && return
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "nginx workers of $master not yet replaced after ${reload_wait}s"
      return
    fi
    sleep 0.02
  done
}

# Before a slot's server is stopped or replaced: old nginx workers may
# still be answering requests through it; wait until none is shutting down.
wait_old_workers() {
  local pidfile=${NGINX_PID_FILE:-/run/nginx.pid} master pid busy deadline=$((SECONDS + reload_wait))
  [ -r "$pidfile" ] && master=$(cat "$pidfile") && [ -n "$master" ] || return 0
  while :; do
    busy=""
    for pid in $(pgrep -P "$master" || true); do
      shutting_down "$pid" && busy="$busy $pid"
    done
    [ -z "$busy" ] && return
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "nginx workers$busy still finishing requests after ${reload_wait}s; stopping anyway"
      return
    fi
    sleep 0.05
  done
}

route() {
  local upstream=${NGINX_UPSTREAM_FILE:-/etc/nginx/reconciler/llama-upstream.conf}
  local saved="$upstream.previous"
  if [ -f "$upstream" ]; then cp -p "$upstream" "$saved"; else rm -f "$saved"; fi
  printf 'server 127.0.0.1:%s;\n' "$port" >"$upstream.tmp"
  mv "$upstream.tmp" "$upstream"
  local master="" old="" pid deadline
  [ -r "${NGINX_PID_FILE:-/run/nginx.pid}" ] && master=$(cat "${NGINX_PID_FILE:-/run/nginx.pid}")
  [ -n "$master" ] && old=$(pgrep -P "$master" || true)
  # shellcheck disable=SC2086 # NGINX_RELOAD is a command line
  if ! ${NGINX_RELOAD:-nginx -s reload}; then
    if [ -f "$saved" ]; then mv "$saved" "$upstream"; else rm -f "$upstream"; fi
    fail "nginx reload failed; $upstream was put back as it was"
  fi
  rm -f "$saved"
  # The reload returns at once. Traffic has moved once each old worker has
  # begun shutting down (it closes its listening sockets and idle
  # connections then) and a new worker, reading the new upstream, runs.
  # The old workers' requests in flight are stop's to wait for, not ours.
  [ -n "$master" ] && wait_moved "$master" "$old"
  echo "nginx sends the runtime's requests to slot ${RECONCILER_SLOT:-?} on port $port"
}

# The server's settings and LLAMA_SERVER_MODE are llama-server-after-apply.sh's.
case "$action" in
  start) wait_old_workers && LLAMA_SERVER_PORT=$port exec bash "$here/llama-server-after-apply.sh" ;;
  stop) wait_old_workers && LLAMA_SERVER_PORT=$port exec bash "$here/llama-server-after-apply.sh" stop ;;
  route) route ;;
  *) fail "unknown action $action: use start, stop or route" ;;
esac
