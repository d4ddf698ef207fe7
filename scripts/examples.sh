#!/usr/bin/env bash
# Runs every example in examples/ (one idea each; each asserts what it
# shows and exits non-zero if it does not hold), with the "replica"
# feature so the replica's example runs too.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in examples/*.rs; do
    name=$(basename "$f" .rs)
    echo "example $name"
    cargo run --quiet --locked --features replica --example "$name" "$@"
done
