#!/usr/bin/env bash
# The project's test command: the whole suite (unit, integration, doc tests),
# with a throwaway PostgreSQL on loopback for the comparison-harness smoke
# test. Without PostgreSQL (and no way to install it) that one contender is
# skipped with a message; everything else still runs.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/with-postgres.sh cargo test --locked "$@"
