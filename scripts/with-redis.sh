#!/usr/bin/env bash
# Usage: scripts/with-redis.sh CMD [ARGS...]
#
# Runs CMD with a throwaway Redis 7 server on 127.0.0.1 and a free port
# (no persistence, a temp dir) and DEDUPKV_REDIS_URL pointing at it; shuts
# the server down and removes the dir on exit, and exits with CMD's
# status. If DEDUPKV_REDIS_URL is already set, that server is used as is.
# Debian's redis-server is installed with apt-get when missing (as root).
# If no server can be had, says why and runs CMD without one (the Redis
# Streams test then skips) -- except under CI (CI set, and not "false" or
# "0"), where that is an error.
set -euo pipefail

if [ "$#" -eq 0 ]; then
    echo "usage: $0 CMD [ARGS...]" >&2
    exit 2
fi

log() { echo "with-redis: $*" >&2; }

case "${CI:-}" in
    "" | false | 0) IN_CI="" ;;
    *) IN_CI=1 ;;
esac

CMD=("$@")

run_cmd() {
    local rc=0
    "${CMD[@]}" || rc=$?
    exit "$rc"
}

without_redis() {
    if [ -n "$IN_CI" ]; then
        echo "with-redis: Redis not available under CI: $1" >&2
        exit 1
    fi
    echo "Redis not available: $1; the Redis Streams test is skipped" >&2
    unset DEDUPKV_REDIS_URL
    run_cmd
}

if [ -n "${DEDUPKV_REDIS_URL:-}" ]; then
    log "DEDUPKV_REDIS_URL is already set; using that server"
    run_cmd
fi

if ! command -v redis-server >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
        without_redis "redis-server is not installed and this is not root"
    fi
    log "installing Debian's redis-server"
    if ! { apt-get install -y --no-install-recommends redis-server >/dev/null 2>&1 ||
        { apt-get update >/dev/null 2>&1 &&
            apt-get install -y --no-install-recommends redis-server >/dev/null 2>&1; }; }; then
        without_redis "apt-get could not install redis-server"
    fi
fi

D=$(mktemp -d)
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
cleanup() {
    redis-cli -h 127.0.0.1 -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
    rm -rf "$D"
}
trap cleanup EXIT

if ! redis-server --bind 127.0.0.1 --port "$PORT" --daemonize yes --pidfile "$D/r.pid" \
    --dir "$D" --save '' --appendonly no --logfile "$D/redis.log"; then
    without_redis "redis-server did not start"
fi
for _ in $(seq 1 50); do
    if redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null | grep -q PONG; then
        break
    fi
    sleep 0.1
done
if ! redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null | grep -q PONG; then
    without_redis "redis-server did not answer on 127.0.0.1:$PORT"
fi
log "redis-server $(redis-server --version | awk '{print $3}') on 127.0.0.1:$PORT"
export DEDUPKV_REDIS_URL="redis://127.0.0.1:$PORT/"
rc=0
"${CMD[@]}" || rc=$?
exit "$rc"
