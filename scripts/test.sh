#!/usr/bin/env bash
# The project's test command: the whole workspace's suite (the library's
# unit, integration and doc tests, the fixture command's tests, and the
# comparison harness's smoke test, the PostgreSQL backend's tests, the
# HTTP layer's tests over PostgreSQL and its 2-instance webhook), with a
# throwaway PostgreSQL on loopback for those. Without PostgreSQL (and
# no way to install it) they skip with a message and everything else still
# runs; under CI (CI=true; .ci/run sets it) that is an error instead.
#
# `cargo test` alone tests the library only, and never builds SQLite or
# librdkafka. Two consumer-group runs are tested on their own, after the
# rest of the workspace (each turns the library's "replica" feature on,
# which would otherwise reach every member's build), every scenario in
# both replica modes: crates/redis-streams (tests/redis_streams.rs, ~2 min)
# against a throwaway Redis (scripts/with-redis.sh installs and starts it;
# without one the run is skipped with a message, under CI an error), and
# crates/dedupkv-kafka (tests/group_run/, ~1 min) against librdkafka's
# in-process mock cluster, which needs no service, so it is never
# skipped. Then every example runs (scripts/examples.sh). The replica
# (feature "replica") is tested last, against local files: its unit tests,
# doc tests, tests/replica_*.rs and the partition set (tests/partitions_*.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/with-postgres.sh cargo test --workspace --exclude dedupkv-kafka --exclude dedupkv-redis-streams --locked "$@"
bash scripts/with-redis.sh cargo test -p dedupkv-redis-streams --locked "$@"
cargo test -p dedupkv-kafka --locked "$@"
bash scripts/examples.sh
cargo test --locked --features replica --lib replica "$@"
cargo test --locked --features replica --doc replica "$@"
cargo test --locked --features replica --doc partitions "$@"
exec cargo test --locked --features replica \
    --test replica_restore --test replica_fencing --test replica_ownership --test replica_faults --test replica_crash \
    --test replica_async --test replica_reader --test replica_bad_input \
    --test replica_provider_key --test replica_provider_key_sigkill --test partitions_handover \
    --test api_metrics "$@"
