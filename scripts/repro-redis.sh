#!/usr/bin/env bash
# redis-benchmark SET/GET at -P 16 against `numakv serve` on bytes stores (fastfair, nbtree,
# nstore) and against Debian's redis-server with persistence off, one after another in one run on
# the same machine; prints a Markdown table with throughput ratios to redis-server and p99s.
#
#   scripts/repro-redis.sh [-n REQUESTS] [-c CLIENTS] [-r KEYSPACE] [-d VALUE_BYTES] [--threads N]
#       [--engines "fastfair nbtree nstore"]
#
# Without -r every request uses redis-benchmark's one key; with -r the keys are "key:%012d", which
# all share their first 8 bytes ("key:0000"), i.e. one prefix tree of the byte layer, whose
# writers take one lock (docs/design.md, "Byte-string layer").
# A server that fails (an error reply, e.g. out of PM) gets "failed" instead of figures.
# Needs redis-server and redis-benchmark (apt-get install redis-server redis-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
n=200000; c=50; r=; d=16; threads=$(nproc); engines="fastfair nbtree nstore"
while [ $# -gt 0 ]; do
    case $1 in
        -n) n=$2; shift 2;; -c) c=$2; shift 2;; -r) r=$2; shift 2;; -d) d=$2; shift 2;;
        --threads) threads=$2; shift 2;; --engines) engines=$2; shift 2;;
        *) echo "unknown option $1" >&2; exit 2;;
    esac
done
for tool in redis-server redis-benchmark redis-cli; do
    command -v "$tool" >/dev/null || { echo "repro-redis: $tool is not installed" >&2; exit 1; }
done
cargo build --release -q -p numakv-cli --bin numakv
base=/dev/shm; [ -w "$base" ] || base=${TMPDIR:-/tmp}
work=$(mktemp -d "$base/numakv-repro-redis.XXXXXX")
pid=
cleanup() { [ -n "$pid" ] && { kill -9 "$pid" && wait "$pid"; } 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

wait_up() { for _ in $(seq 1 200); do redis-cli -p "$port" ping >/dev/null 2>&1 && return 0; sleep 0.05; done; exit 1; }
bench() { # bench NAME: SET then GET; appends "NAME,test,rps,p50,p99" lines
    redis-benchmark -p "$port" -t set,get -n "$n" -c "$c" ${r:+-r "$r"} -d "$d" -P 16 --csv 2>"$work/$1.err" \
        | tr -d '"' | awk -F, -v name="$1" 'NR>1 { print name "," $1 "," $2 "," $5 "," $7 }' \
        >>"$work/results.csv" || true
    if [ -s "$work/$1.err" ]; then
        echo "$1: $(head -c 300 "$work/$1.err")" >&2
        echo "$1,FAILED,0,0,0" >>"$work/results.csv"
    fi
}

redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
    --dir "$work" >"$work/redis.log" 2>&1 &
pid=$!; wait_up; bench redis-server
redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; wait "$pid" 2>/dev/null || true; pid=
for e in $engines; do
    ./target/release/numakv serve "$work/$e" --create --engine "$e" --capacity 2G \
        --bind "127.0.0.1:$port" --threads "$threads" >"$work/$e.log" 2>&1 &
    pid=$!; wait_up; bench "numakv-$e"
    redis-cli -p "$port" shutdown >/dev/null 2>&1 || true; wait "$pid" 2>/dev/null || true; pid=
done

echo "redis-benchmark -t set,get -n $n -c $c ${r:+-r $r }-d $d -P 16; numakv serve --threads $threads;" \
    "$(nproc) CPUs; $(date -u +%FT%TZ)"
echo
echo "| server | SET req/s | SET / redis | SET p99 ms | GET req/s | GET / redis | GET p99 ms |"
echo "|---|---:|---:|---:|---:|---:|---:|"
awk -F, '
    { rps[$1 "," $2] = $3; p99[$1 "," $2] = $5; if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } }
    END {
        for (i = 1; i <= k; i++) {
            s = order[i]
            if ((s ",FAILED") in rps) { printf "| %s | failed | | | | | |\n", s; continue }
            printf "| %s | %.0f | %.2fx | %.3f | %.0f | %.2fx | %.3f |\n", s,
                rps[s ",SET"], rps[s ",SET"] / rps["redis-server,SET"], p99[s ",SET"],
                rps[s ",GET"], rps[s ",GET"] / rps["redis-server,GET"], p99[s ",GET"]
        }
    }' "$work/results.csv"
