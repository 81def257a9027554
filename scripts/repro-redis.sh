#!/usr/bin/env bash
# redis-benchmark SET/GET at -P 16 against `numakv serve` on bytes stores (fastfair, nbtree,
# nstore) and against Debian's redis-server with persistence off, one after another in one run on
# the same machine; prints a Markdown table with throughput ratios to redis-server and p99s.
# A wrapper around `numakv repro redis` (crates/bench/src/repro_redis.rs), kept for its flags:
#
#   scripts/repro-redis.sh [-n REQUESTS] [-c CLIENTS] [-r KEYSPACE] [-d VALUE_BYTES] [--threads N]
#       [--engines "fastfair nbtree nstore"] [--rounds R] [--out DIR]
#
# Without -r every request uses redis-benchmark's one key; with -r the keys are "key:%012d", which
# all share their first 8 bytes ("key:0000"), i.e. one prefix tree of the byte layer
# (docs/design.md, "Byte-string layer").
# A server that fails (an error reply, e.g. out of PM) gets "failed" and the exit status is 3; a
# missing redis-server or redis-benchmark is an error naming it.
# Needs redis-server and redis-benchmark (apt-get install redis-server redis-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
while [ $# -gt 0 ]; do
    case $1 in
        -n) args+=(--requests "$2"); shift 2;;
        -c) args+=(--clients "$2"); shift 2;;
        -r) args+=(--keyspace "$2"); shift 2;;
        -d) args+=(--value-bytes "$2"); shift 2;;
        --threads) args+=(--threads "$2"); shift 2;;
        --engines) args+=(--engines "$(echo "$2" | tr ' ' ',')"); shift 2;;
        --out) args+=(--out "$2"); shift 2;;
        --rounds) args+=(--rounds "$2"); shift 2;;
        *) echo "unknown option $1" >&2; exit 2;;
    esac
done
cargo build --release -q -p numakv-cli --bin numakv
target=${CARGO_TARGET_DIR:-target}
out=$(mktemp -d "${TMPDIR:-/tmp}/numakv-repro-redis.XXXXXX")
exec "$target/release/numakv" repro redis --quiet --out "$out" "${args[@]}"
