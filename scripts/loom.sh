#!/usr/bin/env bash
# Concurrency model checking: builds the crate with `--cfg dedupkv_loom`, so
# src/sync.rs hands out loom's locks, atomics, channel and threads, and runs
# tests/loom.rs in release mode. Each model explores every interleaving of
# two or three callers and the committer thread, up to a preemption bound,
# and checks:
#   - insert_if_absent and begin: exactly one caller wins a key;
#   - insert_if_absent, insert_batch, begin and complete: a caller is
#     acknowledged only once its batch is durable (a crash image taken at
#     the acknowledgement, reopened, holds the record);
#   - a failed sync: no caller of the failed batch is acknowledged, and the
#     store stays poisoned.
#   - the journal: across half switches and background checkpoints, every
#     acknowledged key reads back and is in the crash image of both media;
#     a failed checkpoint poisons the store and loses nothing acknowledged.
# Prints each model's execution count and time; exits non-zero on the first
# interleaving that breaks an assertion, or after LOOM_SECONDS (600).
#
#   scripts/loom.sh                        # every model, its own bound
#   scripts/loom.sh begin                  # models whose name contains "begin"
#   LOOM_MAX_PREEMPTIONS=3 scripts/loom.sh durable   # deeper (sets every model's bound)
#   LOOM_LOG=trace LOOM_LOCATION=1 scripts/loom.sh <model>  # trace a failure
#
# The build goes to LOOM_TARGET_DIR (target/loom), so the changed RUSTFLAGS
# do not throw away the normal build's cache.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${LOOM_SECONDS:-600}
export CARGO_TARGET_DIR=${LOOM_TARGET_DIR:-target/loom}
export RUSTFLAGS="${RUSTFLAGS:-} --cfg dedupkv_loom"

cargo test --locked --release --test loom --no-run
echo "loom: preemption bound ${LOOM_MAX_PREEMPTIONS:-per model}, at most ${seconds}s"
start=$SECONDS
timeout "$seconds" cargo test --locked --release --test loom -- \
    --nocapture --test-threads=1 "$@"
echo "loom: all models passed in $((SECONDS - start))s"
