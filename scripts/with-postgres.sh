#!/usr/bin/env bash
# Usage: scripts/with-postgres.sh CMD [ARGS...]
#
# Runs CMD with a throwaway PostgreSQL server on 127.0.0.1 (a fresh cluster
# in a temp dir, trust auth, loopback only) and DEDUPKV_PG_URL pointing at
# it; stops the server and removes the dir on exit, and exits with CMD's
# status. If DEDUPKV_PG_URL is already set, that server is used as is. If
# no server can be had, says why and runs CMD without one (the PostgreSQL
# contender is then skipped) -- except under CI (CI set, and not "false" or
# "0"), where that is an error: CI must compare against PostgreSQL.
#
# Server binaries: DEDUPKV_PG_BIN if set, else Debian's (dpkg -S or
# /usr/lib/postgresql/*/bin, preferring 15), else initdb on PATH. With none
# found, installs postgresql-15 (or postgresql) with apt-get: as root, or
# under CI through passwordless sudo.
set -euo pipefail

if [ "$#" -eq 0 ]; then
    echo "usage: $0 CMD [ARGS...]" >&2
    exit 2
fi

log() { echo "with-postgres: $*" >&2; }

case "${CI:-}" in
    "" | false | 0) IN_CI="" ;;
    *) IN_CI=1 ;;
esac

without_pg() {
    if [ -n "$IN_CI" ]; then
        echo "with-postgres: PostgreSQL not available under CI: $1" >&2
        exit 1
    fi
    echo "PostgreSQL not available: $1; the postgres contender is skipped" >&2
    unset DEDUPKV_PG_URL
    local rc=0
    "${CMD[@]}" || rc=$?
    exit "$rc"
}

CMD=("$@")

if [ -n "${DEDUPKV_PG_URL:-}" ]; then
    log "DEDUPKV_PG_URL is already set; using that server"
    rc=0
    "${CMD[@]}" || rc=$?
    exit "$rc"
fi

find_pgbin() {
    local cands=() c
    if [ -n "${DEDUPKV_PG_BIN:-}" ]; then
        cands+=("$DEDUPKV_PG_BIN/initdb")
    fi
    if command -v dpkg >/dev/null 2>&1; then
        while IFS= read -r c; do cands+=("$c"); done < <(
            dpkg -S '*/bin/initdb' 2>/dev/null | sed -n 's/^[^:]*: //p' | grep '/bin/initdb$' | sort -V -r || true
        )
    fi
    for c in /usr/lib/postgresql/15/bin/initdb $(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V -r); do
        cands+=("$c")
    done
    if command -v initdb >/dev/null 2>&1; then
        cands+=("$(command -v initdb)")
    fi
    # Prefer 15 (the version the comparison names), then the newest.
    for c in "${cands[@]}"; do
        case "$c" in */15/bin/initdb) [ -x "$c" ] && { dirname "$c"; return 0; } ;; esac
    done
    for c in "${cands[@]}"; do
        [ -x "$c" ] && { dirname "$c"; return 0; }
    done
    return 1
}

PGBIN=$(find_pgbin || true)
if [ -z "$PGBIN" ]; then
    SUDO=()
    if [ "$(id -u)" -ne 0 ] && [ -n "$IN_CI" ] && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    fi
    if { [ "$(id -u)" -eq 0 ] || [ "${#SUDO[@]}" -gt 0 ]; } && command -v apt-get >/dev/null 2>&1; then
        log "no PostgreSQL server binaries: installing Debian's postgresql-15 with apt-get (as root; set DEDUPKV_PG_URL or DEDUPKV_PG_BIN to use your own)"
        if timeout 300 "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null >&2; then
            timeout 600 "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql-15 </dev/null >&2 ||
                timeout 600 "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql </dev/null >&2 || true
        fi
        PGBIN=$(find_pgbin || true)
    fi
    [ -n "$PGBIN" ] || without_pg "no initdb found (install postgresql-15, or set DEDUPKV_PG_BIN)"
fi

# As root the server must run as an unprivileged user.
AS=()
if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || without_pg "running as root and there is no 'postgres' user to run the server"
    command -v runuser >/dev/null 2>&1 || without_pg "running as root and runuser is missing"
    AS=(runuser -u postgres --)
fi

D=$(mktemp -d "${TMPDIR:-/tmp}/dedupkv-pg.XXXXXX")
PGPORT_CHOSEN=""
cleanup() {
    local rc=$?
    if [ -n "$PGPORT_CHOSEN" ] && [ -f "$D/data/postmaster.pid" ]; then
        (cd / && "${AS[@]}" "$PGBIN/pg_ctl" -D "$D/data" -m fast -w -t 60 stop >/dev/null 2>&1) || true
    fi
    rm -rf "$D"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ "${#AS[@]}" -gt 0 ]; then
    chown postgres: "$D"
fi
chmod 700 "$D"

# The server user's cwd may be unreadable to it (e.g. /root): run from /.
if ! (cd / && "${AS[@]}" "$PGBIN/initdb" -D "$D/data" -U postgres --auth=trust -E UTF8 \
    --locale=C.UTF-8 >"$D/initdb.log" 2>&1); then
    # Older or minimal systems may lack the C.UTF-8 locale.
    rm -rf "$D/data"
    if ! (cd / && "${AS[@]}" "$PGBIN/initdb" -D "$D/data" -U postgres --auth=trust -E UTF8 \
        --locale=C >"$D/initdb.log" 2>&1); then
        tail -n 20 "$D/initdb.log" >&2 || true
        without_pg "initdb failed (see above)"
    fi
fi

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

started=""
for _ in 1 2 3 4 5 6 7 8; do
    port=$((20000 + RANDOM % 30000))
    port_free "$port" || continue
    if (cd / && "${AS[@]}" "$PGBIN/pg_ctl" -D "$D/data" -l "$D/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$D" \
        start </dev/null >/dev/null 2>&1); then
        started=$port
        break
    fi
done
if [ -z "$started" ]; then
    tail -n 20 "$D/server.log" >&2 2>/dev/null || true
    without_pg "the server did not start (see the log above)"
fi
PGPORT_CHOSEN=$started

ready=""
for _ in $(seq 1 60); do
    if "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$started" 2>/dev/null; then
        ready=1
        break
    fi
    sleep 0.5
done
[ -n "$ready" ] || without_pg "the server on port $started did not become ready"

PSQL="$PGBIN/psql"
[ -x "$PSQL" ] || PSQL=$(command -v psql || true)
if [ -n "$PSQL" ]; then
    # Start timed work from a clean checkpoint.
    "$PSQL" -X -q -h 127.0.0.1 -p "$started" -U postgres -d postgres -c CHECKPOINT </dev/null >/dev/null
fi

export DEDUPKV_PG_URL="host=127.0.0.1 port=$started user=postgres dbname=postgres"
log "PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$started (data in $D)"

rc=0
"${CMD[@]}" || rc=$?
exit "$rc"
