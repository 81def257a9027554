#!/usr/bin/env bash
# Real Redis clients against `numakv serve` (issue 23): redis-cli commands, redis-benchmark, a
# SIGKILL after acknowledged writes, SIGTERM, and three servers behind nutcracker (twemproxy).
# Issue 37: multi-key writes all or nothing (bad keys, a full store), SIGKILLs under pipelined
# MSETs and DELs with ten restarts, another program's write after a crash, and redis-py
# transactions (pipeline(transaction=True), WATCH retry loops) compared with redis-server.
# Every missing tool and every unexpected reply FAILS the script; nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "redis-clients: FAIL: $*" >&2; exit 1; }
for tool in redis-cli redis-benchmark redis-server nutcracker python3; do
    command -v "$tool" >/dev/null || fail "$tool is not installed (apt-get install redis-tools redis-server nutcracker)"
done
python3 -c 'import redis' 2>/dev/null || fail "redis-py is not installed (python3 -m pip install redis)"

cargo build --release -q -p numakv-cli --bin numakv
NUMAKV=$PWD/target/release/numakv
base=/dev/shm; [ -w "$base" ] || base=${TMPDIR:-/tmp}
work=$(mktemp -d "$base/numakv-redis-ci.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do { kill -9 "$p" && wait "$p"; } 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# A free port per server: ask the kernel for one.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start NAME ENGINE PORT: numakv serve on a bytes store in $work/NAME (created if new).
start() {
    # Removed here, not by the redirection below: that runs in the background job, and a
    # restart could otherwise find the previous run's "listening on" line before it truncates.
    rm -f "$work/$1.log"
    "$NUMAKV" serve "$work/$1" --create --engine "$2" --capacity 256M --bind "127.0.0.1:$3" \
        --threads 2 >"$work/$1.log" 2>&1 &
    last_pid=$!
    pids+=("$last_pid")
    for _ in $(seq 1 200); do
        grep -q "^listening on" "$work/$1.log" 2>/dev/null && return 0
        kill -0 "$last_pid" 2>/dev/null || { cat "$work/$1.log"; fail "numakv serve $1 exited"; }
        sleep 0.05
    done
    fail "numakv serve $1 did not start"
}

expect() { # expect WANT CMD...: the command's output must be exactly WANT
    local want=$1; shift
    local got; got=$("$@" 2>&1) || fail "'$*' exited $?: $got"
    [ "$got" = "$want" ] || fail "'$*': expected [$want], got [$got]"
}

echo "== redis-cli against numakv serve"
port=$(free_port)
start main fastfair "$port"
main_pid=$last_pid
R=(redis-cli -p "$port")
expect PONG "${R[@]}" ping
expect OK "${R[@]}" set user:1 hello
expect hello "${R[@]}" get user:1
expect 6 "${R[@]}" append user:1 '!'
expect 6 "${R[@]}" strlen user:1
expect 1 "${R[@]}" incr n
expect 11 "${R[@]}" incrby n 10
expect 10 "${R[@]}" decr n
expect OK "${R[@]}" mset a 1 b 2
expect $'1\n\n2' "${R[@]}" mget a zz b
expect 2 "${R[@]}" exists a b
expect "" "${R[@]}" set user:1 x nx
expect $'a\nb\nn\nuser:1' "${R[@]}" keys '*'
expect $'a\nb\nn\nuser:1' "${R[@]}" --scan
expect 4 "${R[@]}" dbsize
expect 1 "${R[@]}" del a
expect save "${R[@]}" config get save
expect "ERR unknown command 'nosuch', with args beginning with: 'x' " "${R[@]}" nosuch x
expect "ERR wrong number of arguments for 'get' command" "${R[@]}" get
expect "ERR SET EX is not supported: numakv keys do not expire" "${R[@]}" set k v ex 5
"${R[@]}" info numakv | grep -q '^engine:fastfair' || fail "INFO numakv lacks the engine"
"${R[@]}" info keyspace | grep -q '^db0:keys=3,' || fail "INFO keyspace lacks db0"
expect OK "${R[@]}" flushdb
expect 0 "${R[@]}" dbsize

echo "== multi-key writes are all or nothing (redis-cli)"
long=$(printf 'k%.0s' $(seq 1 1025))
"${R[@]}" mset m1 1 m2 2 "$long" 3 m4 4 | grep -q "^ERR" || fail "MSET with a 1025-byte key was accepted"
"${R[@]}" mset m1 1 m2 2 "" 3 m4 4 | grep -q "^ERR" || fail "MSET with an empty key was accepted"
"${R[@]}" msetnx m1 1 "$long" 2 | grep -q "^ERR" || fail "MSETNX with a 1025-byte key was accepted"
expect 0 "${R[@]}" dbsize
expect OK "${R[@]}" mset m1 1 m2 2
"${R[@]}" del m1 "" m2 | grep -q "^ERR" || fail "DEL with an empty key was accepted"
expect 2 "${R[@]}" exists m1 m2
expect 0 "${R[@]}" msetnx m3 3 m1 9
expect 0 "${R[@]}" exists m3
expect 1 "${R[@]}" msetnx m3 3 m5 5
expect 4 "${R[@]}" del m1 m2 m3 m5 m1 nope
printf 'MULTI\nSET t 1\nINCR t\nGET t\nEXEC\n' | "${R[@]}" >"$work/multi.out" 2>&1
expect $'OK\nQUEUED\nQUEUED\nQUEUED\nOK\n2\n2' cat "$work/multi.out"
printf 'MULTI\nSET u 1\nSET u\nEXEC\nEXISTS u\n' | "${R[@]}" >"$work/abort.out" 2>&1
grep -q "^EXECABORT Transaction discarded because of previous errors" "$work/abort.out" \
    || { cat "$work/abort.out"; fail "a queued syntax error did not abort EXEC"; }
[ "$(tail -1 "$work/abort.out")" = 0 ] || fail "an aborted EXEC wrote u"
expect OK "${R[@]}" flushdb

echo "== transactions: redis-py against redis-server and numakv serve"
rport=$(free_port)
redis-server --port "$rport" --save '' --appendonly no >"$work/redis-server.log" 2>&1 &
pids+=("$!")
for _ in $(seq 1 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
python3 .ci/redis_py_transactions.py "$rport" >"$work/py-redis.out" || fail "redis-py against redis-server"
python3 .ci/redis_py_transactions.py "$port" >"$work/py-numakv.out" || fail "redis-py against numakv serve"
cat "$work/py-numakv.out"
diff "$work/py-redis.out" "$work/py-numakv.out" || fail "redis-py transactions differ from redis-server's"
expect 0 "${R[@]}" dbsize

echo "== redis-cli -3 (RESP3 after HELLO 3)"
R3=(redis-cli -3 -p "$port")
"${R3[@]}" hello 3 | grep -qx 'proto 3' || fail "HELLO 3 does not answer proto 3"
expect "appendonly no" "${R3[@]}" config get appendonly  # a map (RESP2: two lines)
expect OK "${R3[@]}" set r3 v
expect v "${R3[@]}" get r3
expect "" "${R3[@]}" get missing
expect 1 "${R3[@]}" del r3

echo "== redis-benchmark -t ping,set,get,mset,incr -n 50000 -P 16 -q"
redis-benchmark -p "$port" -t ping,set,get,mset,incr -n 50000 -P 16 -q >"$work/bench.out" 2>&1 \
    || { cat "$work/bench.out"; fail "redis-benchmark exited $?"; }
tr '\r' '\n' <"$work/bench.out" | grep "requests per second" | tee "$work/bench.lines"
grep -qi "error" "$work/bench.out" && { cat "$work/bench.out"; fail "redis-benchmark saw errors"; }
for t in PING_INLINE PING_MBULK SET GET INCR "MSET (10 keys)"; do
    grep -q "^ *$t: .* requests per second" "$work/bench.lines" || fail "redis-benchmark: no result for $t"
done

echo "== SIGKILL after acknowledged writes, restart, read back"
expect OK "${R[@]}" flushdb
n=2000
for i in $(seq 1 $n); do printf 'SET ack:%05d v%d\r\n' "$i" "$i"; done >"$work/sets.txt"
"${R[@]}" --pipe <"$work/sets.txt" >"$work/pipe.out" 2>&1 || { cat "$work/pipe.out"; fail "redis-cli --pipe"; }
grep -q "errors: 0, replies: $n" "$work/pipe.out" || { cat "$work/pipe.out"; fail "not every SET acknowledged"; }
kill -9 "$main_pid"; wait "$main_pid" 2>/dev/null || true
start main fastfair "$port"
main_pid=$last_pid
grep -q "not closed cleanly" "$work/main.log" || fail "restart after SIGKILL did not recover"
expect "$n" "${R[@]}" dbsize
keys=$(for i in $(seq 1 $n); do printf 'ack:%05d ' "$i"; done)
want=$(for i in $(seq 1 $n); do echo "v$i"; done)
# shellcheck disable=SC2086
expect "$want" "${R[@]}" mget $keys

echo "== SIGKILL while redis-cli pipelines MSETs and DELs: 10 restarts, no partial write"
# Groups of 8 keys, each MSET writing one value to a whole group; MSETs the store refuses
# (1025-byte key, empty key) in between; DELs of whole groups.
python3 - "$work/msets.txt" <<'PY'
import sys
def resp(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out
with open(sys.argv[1], "wb") as f:
    for i in range(1, 3001):
        g = i % 5
        f.write(resp("MSET", *[x for j in range(8) for x in (f"g{g}:{j}", str(i))]))
        f.write(resp("MSET", f"bad:{i}", "1", "k" * 1025, "2"))
        f.write(resp("MSET", f"bad2:{i}", "1", "", "2"))
        if i % 7 == 0:
            f.write(resp("DEL", *[f"g{g}:{j}" for j in range(8)]))
PY
for round in $(seq 1 10); do
    "${R[@]}" --pipe <"$work/msets.txt" >"$work/pipe-$round.out" 2>&1 &
    piper=$!
    # Kill while the pipe is in flight (how far it got differs per round; any point must do).
    for _ in $(seq 1 $((round * 3))); do
        [ "$("${R[@]}" exists g1:0 2>/dev/null)" = 1 ] && break
        sleep 0.01
    done
    kill -9 "$main_pid"; wait "$main_pid" 2>/dev/null || true
    wait "$piper" 2>/dev/null || true
    start main fastfair "$port"   # fails the script if the store does not reopen
    main_pid=$last_pid
    for g in 0 1 2 3 4; do
        vals=$("${R[@]}" mget "g$g:0" "g$g:1" "g$g:2" "g$g:3" "g$g:4" "g$g:5" "g$g:6" "g$g:7" | sort -u | wc -l)
        [ "$vals" -eq 1 ] || fail "round $round: group g$g is partial: $("${R[@]}" mget "g$g:0" "g$g:1" "g$g:7" | tr '\n' ' ')"
    done
    [ -z "$("${R[@]}" --scan --pattern 'bad*')" ] || fail "round $round: a refused MSET wrote a key"
done
echo "10 of 10 restarts after SIGKILL; every group whole"

echo "== a write by another program after a crash is never overwritten"
expect OK "${R[@]}" mset a 1 b 2
kill -9 "$main_pid"; wait "$main_pid" 2>/dev/null || true
"$NUMAKV" del "$work/main" a >"$work/del.out" 2>&1 || { cat "$work/del.out"; fail "numakv del after the crash"; }
start main fastfair "$port"
main_pid=$last_pid
"${R[@]}" ping >/dev/null 2>&1 || { cat "$work/main.log"; fail "numakv serve does not answer after the restart"; }
expect "" "${R[@]}" get a
expect 2 "${R[@]}" get b

echo "== a full store: MSET writes nothing and answers an error"
fport=$(free_port)
"$NUMAKV" serve "$work/full" --create --engine fastfair --capacity 8M --bind "127.0.0.1:$fport" \
    --threads 1 >"$work/full.log" 2>&1 &
pids+=("$!")
F=(redis-cli -p "$fport")
for _ in $(seq 1 200); do "${F[@]}" ping >/dev/null 2>&1 && break; sleep 0.05; done
big=$(head -c 8192 /dev/zero | tr '\0' v)
for i in $(seq 1 2000); do printf 'SET fill:%05d %s\r\n' "$i" "$big"; done >"$work/fill.txt"
"${F[@]}" <"$work/fill.txt" >"$work/fill.out" 2>&1 || true
grep -q "out of persistent memory" "$work/fill.out" || fail "the small store never filled"
before=$("${F[@]}" dbsize)
"${F[@]}" mset new:1 "$big" new:2 "$big" new:3 "$big" new:4 "$big" new:5 "$big" new:6 "$big" \
    new:7 "$big" new:8 "$big" | grep -q "out of persistent memory" || fail "MSET in a full store did not fail"
expect "$before" "${F[@]}" dbsize
[ -z "$("${F[@]}" --scan --pattern 'new:*')" ] || fail "a failed MSET in a full store wrote a key"

echo "== SIGTERM closes the store cleanly"
kill -TERM "$main_pid"
wait "$main_pid" || fail "numakv serve exited $? on SIGTERM"
grep -q "store closed cleanly" "$work/main.log" || fail "no clean close on SIGTERM"
"$NUMAKV" inspect "$work/main" | grep -qi "clean" || fail "inspect after SIGTERM"

echo "== three numakv serve behind nutcracker (ketama)"
ports=()
for s in 1 2 3; do
    p=$(free_port); ports+=("$p")
    start "shard$s" nbtree "$p"
done
proxy=$(free_port)
sed -e "s/@PROXY@/$proxy/" -e "s/@S1@/${ports[0]}/" -e "s/@S2@/${ports[1]}/" -e "s/@S3@/${ports[2]}/" \
    deploy/nutcracker-local.yml >"$work/nutcracker.yml"
nutcracker -t -c "$work/nutcracker.yml" >/dev/null 2>&1 || fail "nutcracker rejects the config"
nutcracker -c "$work/nutcracker.yml" -o "$work/nutcracker.log" &
pids+=("$!")
P=(redis-cli -p "$proxy")
for _ in $(seq 1 100); do "${P[@]}" set probe 1 >/dev/null 2>&1 && break; sleep 0.05; done
expect OK "${P[@]}" set probe 1
redis-benchmark -p "$proxy" -t set,get,incr -n 20000 -P 16 -q >"$work/proxy-bench.out" 2>&1 \
    || { cat "$work/proxy-bench.out"; fail "redis-benchmark through nutcracker exited $?"; }
tr '\r' '\n' <"$work/proxy-bench.out" | grep "requests per second"
grep -qi "error" "$work/proxy-bench.out" && { cat "$work/proxy-bench.out"; fail "errors through nutcracker"; }
m=300
# Not --pipe: it ends with an ECHO, which twemproxy does not forward.
for i in $(seq 1 $m); do printf 'SET shard:%04d s%d\n' "$i" "$i"; done >"$work/sets2.txt"
"${P[@]}" <"$work/sets2.txt" >"$work/sets2.out" 2>&1 || { cat "$work/sets2.out"; fail "SETs through nutcracker"; }
[ "$(grep -c '^OK$' "$work/sets2.out")" -eq "$m" ] || { cat "$work/sets2.out"; fail "not every SET through nutcracker acknowledged"; }
for i in $(seq 1 $m); do
    k=$(printf 'shard:%04d' "$i")
    [ "$("${P[@]}" get "$k")" = "s$i" ] || fail "$k not readable through nutcracker"
done
: >"$work/found"
for p in "${ports[@]}"; do
    c=$(redis-cli -p "$p" --scan --pattern 'shard:*' | tee -a "$work/found" | wc -l)
    echo "backend :$p holds $c of $m shard:* keys (DBSIZE $(redis-cli -p "$p" dbsize))"
    [ "$c" -gt 0 ] || fail "backend :$p got no keys: not spread"
done
[ "$(wc -l <"$work/found")" -eq "$m" ] || fail "keys found $(wc -l <"$work/found") times on the backends, want $m"
[ "$(sort -u "$work/found" | wc -l)" -eq "$m" ] || fail "a key is on more than one backend"
echo "== numakv repro redis: a small run against redis-server and numakv serve (fastfair)"
"$NUMAKV" repro redis --requests 3000 --clients 4 --engines fastfair --threads 1 \
    --out "$work/repro" -q >"$work/repro.md" || { cat "$work/repro.md"; fail "numakv repro redis exited $?"; }
cat "$work/repro.md"
grep -q -- "-n 3000 -c 4 -d 16 -P 16" "$work/repro.md" || fail "repro redis: the run's parameters are missing"
grep -q '^| redis-server |.*| 1.00x |' "$work/repro.md" || fail "repro redis: no redis-server baseline row"
row=$(grep '^| numakv-fastfair |' "$work/repro.md") || fail "repro redis: no numakv-fastfair row"
case $row in *failed*) fail "repro redis: numakv-fastfair failed";; esac
[ "$(grep -o 'x |' <<<"$row" | wc -l)" -eq 2 ] || fail "repro redis: numakv-fastfair row lacks its ratios: $row"
cmp -s "$work/repro.md" "$work/repro/redis.md" || fail "repro redis: redis.md differs from what it printed"
python3 - "$work/repro/redis.json" <<'PY' || fail "repro redis: redis.json"
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
assert len(runs) == 4, runs
assert all(r["throughput_mops"] > 0 for r in runs), runs
PY

echo "redis-clients: all checks passed"
