#!/usr/bin/env bash
# Soak: first the concurrent-history check (tests/claims_linearizable.rs,
# release build) on fresh seeds for SOAK_LIN_SECONDS (default 120; 0 skips
# it): many threads making every call on a few keys, each key's recorded
# history checked for linearizability against the model, a hang past 20 s
# a failure. Then the crash soak: re-runs the real-process SIGKILL test
# (tests/log_crash_sigkill.rs, 20 kills per round, every acknowledged key
# checked after each kill) for SOAK_ROUNDS rounds (default 10) within
# SOAK_SECONDS (default 600), then prints the kills survived and the
# acknowledged keys checked. Stops by itself: at the round limit, at the
# time limit (the running round is cut short and not counted), or at the
# first failing round or history (exit 1). Then the damage sweeps at full
# size (tests/log_damage.rs, release): every byte of the small store's
# B-tree pages and SOAK_DAMAGE_FLIPS (default 2000) random flips of a store
# the size of the reported one (8,553 facts, 1.2 MB); SOAK_DAMAGE_FLIPS=0
# skips them.
#
#   scripts/soak.sh
#   SOAK_LIN_SECONDS=1800 SOAK_ROUNDS=100 SOAK_SECONDS=3600 scripts/soak.sh
#   SOAK_LIN_SECONDS=600 SOAK_ROUNDS=0 scripts/soak.sh   # histories only
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${SOAK_ROUNDS:-10}
budget=${SOAK_SECONDS:-600}
lin_seconds=${SOAK_LIN_SECONDS:-120}
test_name=kills_never_lose_an_acknowledged_key

if ((lin_seconds > 0)); then
    echo "concurrent histories: fresh seeds for ${lin_seconds}s (release build)"
    lin_log=$(mktemp)
    # Seeds past the CI's fixed ones; a failure prints the shrunk history
    # and the DEDUPKV_LIN_SEEDS that reproduces its calls. A hung call
    # fails its run after 20 s; the outer timeout only guards the harness.
    first=$(((RANDOM << 15 | RANDOM) + 100))
    status=0
    DEDUPKV_LIN_SEEDS=$first DEDUPKV_LIN_SECS=$lin_seconds \
        timeout --kill-after=10 $((lin_seconds + 900)) \
        cargo test --release --locked --test claims_linearizable -- --nocapture \
        >"$lin_log" 2>&1 || status=$?
    if ((status != 0)); then
        echo "concurrent histories FAILED (exit $status); the end of the output:" >&2
        tail -n 120 "$lin_log" >&2
        rm -f "$lin_log"
        exit 1
    fi
    grep -E '^[0-9]+ runs, ' "$lin_log" | tail -1
    rm -f "$lin_log"
    if ((rounds == 0)); then
        exit 0
    fi
fi

echo "building the crash test (release)"
exe=$(cargo test --release --test log_crash_sigkill --no-run --message-format=json \
    | grep '"name":"log_crash_sigkill"' | grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4 || true)
if [[ -z $exe || ! -x $exe ]]; then
    echo "could not find the log_crash_sigkill test binary" >&2
    exit 1
fi

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
start=$SECONDS
kills=0
keys=0
done_rounds=0
stopped_by=rounds
for ((r = 1; r <= rounds; r++)); do
    left=$((budget - (SECONDS - start)))
    if ((left <= 0)); then
        stopped_by=time
        break
    fi
    round_start=$SECONDS
    status=0
    # timeout signals its whole process group, so a child the test spawned
    # dies with it.
    timeout --kill-after=10 "$left" "$exe" --exact "$test_name" --nocapture \
        --test-threads=1 >"$logs/round" 2>&1 || status=$?
    if ((status == 124 || status == 137)); then
        echo "round $r: cut short by the ${budget}s limit (not counted)"
        stopped_by=time
        break
    fi
    if ((status != 0)); then
        echo "round $r FAILED (exit $status); the end of its output:" >&2
        tail -n 40 "$logs/round" >&2
        exit 1
    fi
    line=$(grep -E '^[0-9]+ kills survived, [0-9]+ acknowledged keys checked' "$logs/round" | tail -1)
    if [[ -z $line ]]; then
        echo "round $r passed but printed no summary line; its output:" >&2
        cat "$logs/round" >&2
        exit 1
    fi
    read -r k _ _ n _ <<<"$line"
    kills=$((kills + k))
    keys=$((keys + n))
    done_rounds=$r
    echo "round $r: $k kills survived, $n acknowledged keys checked ($((SECONDS - round_start))s)"
done

echo "soak: $done_rounds round(s), $kills kills survived, $keys acknowledged keys checked" \
    "in $((SECONDS - start))s (stopped at the $stopped_by limit)"

flips=${SOAK_DAMAGE_FLIPS:-2000}
if ((flips > 0)); then
    echo "damage sweeps: every byte of the small store, $flips flips of a 1.2 MB one (release)"
    status=0
    DEDUPKV_DAMAGE_ALL=1 DEDUPKV_DAMAGE_FLIPS=$flips \
        cargo test --release --test log_damage -- --nocapture >"$logs/damage" 2>&1 || status=$?
    grep -E ' flips: ' "$logs/damage" || true
    if ((status != 0)); then
        echo "the damage sweeps FAILED (exit $status); the end of their output:" >&2
        tail -n 40 "$logs/damage" >&2
        exit 1
    fi
fi
