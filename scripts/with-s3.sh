#!/usr/bin/env bash
# Usage: scripts/with-s3.sh CMD [ARGS...]
#
# Runs CMD with a throwaway S3 API on 127.0.0.1: moto's server (the Python
# package `moto[server]`, in a virtualenv of its own), a bucket
# `dedupkv-test` in it, and DEDUPKV_S3_ENDPOINT / DEDUPKV_S3_BUCKET pointing
# at it; stops the server on exit and exits with CMD's status. The replica
# tests (built with `--features replica-s3`) then run against it instead of
# local files. If DEDUPKV_S3_ENDPOINT is already set, that server is used
# as is. If no server can be had, says why and runs CMD without one -- except
# under CI (CI set, and not "false" or "0"), where that is an error.
#
# The virtualenv: DEDUPKV_S3_VENV, else ~/.cache/dedupkv/moto-venv, created
# with `python3 -m venv` and `pip install "moto[server]==5.2.5"` when it
# has no moto_server yet.
set -euo pipefail

if [ "$#" -eq 0 ]; then
    echo "usage: $0 CMD [ARGS...]" >&2
    exit 2
fi

log() { echo "with-s3: $*" >&2; }

case "${CI:-}" in
    "" | false | 0) IN_CI="" ;;
    *) IN_CI=1 ;;
esac

CMD=("$@")

without_s3() {
    if [ -n "$IN_CI" ]; then
        echo "with-s3: an S3 API is not available under CI: $1" >&2
        exit 1
    fi
    echo "with-s3: an S3 API is not available: $1; running without it (local files)" >&2
    unset DEDUPKV_S3_ENDPOINT
    local rc=0
    "${CMD[@]}" || rc=$?
    exit "$rc"
}

if [ -n "${DEDUPKV_S3_ENDPOINT:-}" ]; then
    log "DEDUPKV_S3_ENDPOINT is already set; using that server"
    rc=0
    "${CMD[@]}" || rc=$?
    exit "$rc"
fi

command -v python3 >/dev/null 2>&1 || without_s3 "no python3"
VENV="${DEDUPKV_S3_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dedupkv/moto-venv}"
if [ ! -x "$VENV/bin/moto_server" ]; then
    log "installing moto[server] into $VENV"
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV" >&2 || without_s3 "python3 -m venv failed"
    "$VENV/bin/pip" install --quiet "moto[server]==5.2.5" >&2 || without_s3 "pip install moto[server] failed"
fi

PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
DIR=$(mktemp -d)
"$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" >"$DIR/moto.log" 2>&1 &
MOTO=$!
cleanup() {
    kill "$MOTO" 2>/dev/null || true
    wait "$MOTO" 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

# Up within 30 s, then the bucket.
if ! python3 - "$PORT" <<'PY'
import sys, time, urllib.request
port = sys.argv[1]
for _ in range(300):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
        break
    except Exception:
        time.sleep(0.1)
else:
    sys.exit(1)
req = urllib.request.Request(f"http://127.0.0.1:{port}/dedupkv-test", method="PUT")
urllib.request.urlopen(req, timeout=5)
PY
then
    cat "$DIR/moto.log" >&2 || true
    without_s3 "moto_server did not start on 127.0.0.1:$PORT"
fi

export DEDUPKV_S3_ENDPOINT="http://127.0.0.1:$PORT"
export DEDUPKV_S3_BUCKET=dedupkv-test
log "moto on $DEDUPKV_S3_ENDPOINT, bucket $DEDUPKV_S3_BUCKET"
rc=0
"${CMD[@]}" || rc=$?
exit "$rc"
