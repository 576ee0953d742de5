#!/usr/bin/env bash
# The agent's --after-apply for llama.cpp's llama-server: restarts the server
# on the model the runtime config just written names, then waits until the
# server answers /health with 200. A non-zero exit makes the agent put the
# previous config back and run this script again for it.
#
#   reconciler agent ... --allow-live-apply \
#       --after-apply '/usr/local/lib/reconciler/llama-server-after-apply.sh'
#
# The model file: {modelDir}/model.gguf from the config ($RECONCILER_CONFIG);
# a config without modelDir (an older agent) names its one artifact's path.
#
# Two ways to run the server, chosen on its own (LLAMA_SERVER_MODE overrides):
#   systemd  when systemd is running: writes the model path to
#            $LLAMA_SERVER_RUN_DIR/PORT.env and restarts llama-server@PORT
#            (deploy/llama-server@.service reads that file);
#   pidfile  otherwise: stops the server in $LLAMA_SERVER_RUN_DIR/PORT.pid
#            (SIGTERM, then SIGKILL), starts $LLAMA_SERVER in a session of
#            its own and writes its pid there; its output goes to PORT.log.
#
# Settings (environment): LLAMA_SERVER_PORT (8080), LLAMA_SERVER_HOST
# (127.0.0.1), LLAMA_SERVER (llama-server on PATH), LLAMA_SERVER_ARGS (extra
# flags, pidfile mode; default "--metrics -c 4096 -np 4"), LLAMA_SERVER_RUN_DIR
# (/run/llama-server), LLAMA_SERVER_MODEL_FILE (model.gguf),
# LLAMA_SERVER_READY_TIMEOUT (seconds, 120), LLAMA_SERVER_STOP_TIMEOUT (10),
# LLAMA_SERVER_WAIT (1).
#
# LLAMA_SERVER_WAIT=0 starts the server and returns at once, leaving
# readiness to the rollout's warm-up: a model the server cannot load (a
# corrupt or truncated GGUF) then fails the job as warmup_failed, after
# which the agent puts the previous config back and runs this script for it.
# With the default (1) the same model fails here, as an after-apply failure.
#
# With the argument "stop" it stops the server of its port and starts none:
# under systemd llama-server@PORT; otherwise the server in PORT.pid, only
# while that pid is still a llama-server on the port (a pid file can
# outlive its process, and pids are reused). llama-server-slot.sh stops a
# slot with it.
set -euo pipefail

action=${1:-}
port=${LLAMA_SERVER_PORT:-8080}
host=${LLAMA_SERVER_HOST:-127.0.0.1}
run_dir=${LLAMA_SERVER_RUN_DIR:-/run/llama-server}
ready_timeout=${LLAMA_SERVER_READY_TIMEOUT:-120}
stop_timeout=${LLAMA_SERVER_STOP_TIMEOUT:-10}

fail() {
  echo "llama-server-after-apply: $*" >&2
  exit 1
}

# The value of a top-level "KEY: value" line of the config (quotes removed).
top_level() {
  sed -n "s/^$1:[[:space:]]*//p" "$config" | head -n 1 | sed -e "s/^'\(.*\)'\$/\1/" -e 's/^"\(.*\)"$/\1/'
}

model_file() {
  local dir paths
  dir=$(top_level modelDir)
  if [ -n "$dir" ]; then
    echo "$dir/${LLAMA_SERVER_MODEL_FILE:-model.gguf}"
    return
  fi
  # "artifacts: {NAME: {path, sha256}}" as the agent writes it, indented by two.
  paths=$(sed -n '/^artifacts:/,/^[^[:space:]]/s/^    path:[[:space:]]*//p' "$config")
  [ -n "$paths" ] || fail "$config has no modelDir and no artifacts: nothing for llama-server to load"
  [ "$(printf '%s\n' "$paths" | wc -l)" -eq 1 ] ||
    fail "$config has no modelDir and several artifacts: which one is the model is unclear"
  printf '%s\n' "$paths" | sed -e "s/^'\(.*\)'\$/\1/" -e 's/^"\(.*\)"$/\1/'
}

# 200 from /health: the model is loaded (503 while loading).
healthy() {
  timeout 2 bash -c '
    exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf "GET /health HTTP/1.0\r\nHost: %s\r\n\r\n" "$0" >&3
    IFS= read -r status <&3
    case "$status" in "HTTP/1."?" 200"*) exit 0 ;; *) exit 1 ;; esac
  ' "$host" "$port" 2>/dev/null
}

# The pid file names a running llama-server on our port (not a process that
# took a dead server's pid).
alive() {
  local pid
  [ -f "$1" ] && pid=$(cat "$1") && kill -0 "$pid" 2>/dev/null &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--port $port "
}

# SIGTERM the server in the pid file, SIGKILL after $LLAMA_SERVER_STOP_TIMEOUT
# seconds, and remove the file; $stopped names the pid stopped, if any.
stopped=""
stop_pidfile() {
  local pidfile="$run_dir/$port.pid" pid waited=0
  if alive "$pidfile"; then
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt $((stop_timeout * 10)) ]; do
      sleep 0.1
      waited=$((waited + 1))
    done
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    stopped=$pid
  fi
  rm -f "$pidfile"
}

restart_pidfile() {
  local pidfile="$run_dir/$port.pid"
  stop_pidfile
  # shellcheck disable=SC2086 # LLAMA_SERVER_ARGS is a list of flags
  setsid "${LLAMA_SERVER:-llama-server}" -m "$1" --host "$host" --port "$port" \
    ${LLAMA_SERVER_ARGS:---metrics -c 4096 -np 4} </dev/null >>"$run_dir/$port.log" 2>&1 &
  echo $! >"$pidfile"
}

restart_systemd() {
  printf 'LLAMA_MODEL=%s\n' "$1" >"$run_dir/$port.env.tmp"
  mv "$run_dir/$port.env.tmp" "$run_dir/$port.env"
  systemctl restart "llama-server@$port.service"
}

# Stop the server of this port, saying which (and the slot, run for one).
stop() {
  local where="port $port"
  if [ -n "${RECONCILER_SLOT:-}" ]; then where="slot $RECONCILER_SLOT on port $port"; fi
  case "$mode" in
    systemd) systemctl stop "llama-server@$port.service" ;;
    pidfile)
      stop_pidfile
      if [ -n "$stopped" ]; then
        echo "$where: llama-server $stopped stopped"
      else
        echo "$where: no llama-server of ours running"
      fi
      ;;
  esac
}

mode=${LLAMA_SERVER_MODE:-}
if [ -z "$mode" ]; then
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then mode=systemd; else mode=pidfile; fi
fi
case "$mode" in
  systemd | pidfile) ;;
  *) fail "LLAMA_SERVER_MODE=$mode: use systemd or pidfile" ;;
esac
if [ "$action" = stop ]; then
  stop
  exit 0
fi
[ -z "$action" ] || fail "unknown argument $action: use stop, or none to restart on \$RECONCILER_CONFIG"
config=${RECONCILER_CONFIG:?"run by reconciler agent --after-apply (RECONCILER_CONFIG is not set)"}
model=$(model_file)
[ -f "$model" ] || fail "model file $model (from $config) does not exist"
mkdir -p "$run_dir"
case "$mode" in
  systemd) restart_systemd "$model" ;;
  pidfile) restart_pidfile "$model" ;;
esac

if [ "${LLAMA_SERVER_WAIT:-1}" = 0 ]; then
  echo "llama-server on $host:$port starting on $model (not waiting: LLAMA_SERVER_WAIT=0)"
  exit 0
fi
[ "${LLAMA_SERVER_WAIT:-1}" = 1 ] || fail "LLAMA_SERVER_WAIT=${LLAMA_SERVER_WAIT}: use 1 (wait for /health) or 0"

deadline=$((SECONDS + ready_timeout))
until healthy; do
  # Our own child, just started: whether it still runs, not what it runs
  # (until it has exec'd, its command line is this shell's, without --port).
  if [ "$mode" = pidfile ] && ! kill -0 "$(cat "$run_dir/$port.pid")" 2>/dev/null; then
    fail "llama-server exited while loading $model; the end of $run_dir/$port.log:
$(tail -n 5 "$run_dir/$port.log")"
  fi
  [ "$SECONDS" -lt "$deadline" ] || fail "llama-server on $host:$port did not answer /health with 200 within ${ready_timeout}s (model $model)"
  sleep 0.1
done
echo "llama-server on $host:$port serves $model"
