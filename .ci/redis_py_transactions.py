"""redis-py transactions against a server on 127.0.0.1:PORT (issue 37).

Prints one line per observation; .ci/redis-clients.sh runs it against redis-server and against
`numakv serve` and requires the two outputs to be identical. Exits non-zero on any check that
must hold on both (a WATCH retry loop that loses an increment, ...).

Usage: python3 redis_py_transactions.py PORT
"""

import sys
import threading

import redis

port = int(sys.argv[1])
r = redis.Redis(port=port)
other = redis.Redis(port=port)
r.flushdb()


def show(label, value):
    print(f"{label}: {value!r}")


# pipeline(transaction=True): MULTI ... EXEC, one reply per queued command.
p = r.pipeline(transaction=True)
p.set("a", "1").incr("a").get("a").mset({"x": "1", "y": "2"})
p.msetnx({"x": "3", "z": "4"}).delete("x", "y", "nope").exists("x", "y", "z")
show("pipeline", p.execute())

# The default pipeline() is a transaction too: a retry of it applies INCR once per execute().
p = r.pipeline()
p.incr("n").incr("n")
show("default pipeline", p.execute())
show("n", r.get("n"))

# A queued command with a wrong number of arguments aborts EXEC: nothing of it is applied.
p = r.pipeline(transaction=True)
p.set("k1", "v").execute_command("SET", "k2")
try:
    p.execute()
    show("execabort", "executed")
except redis.exceptions.ResponseError as e:
    show("execabort", type(e).__name__ + " " + str(e).split(":")[0])
show("k1 after abort", r.get("k1"))

# A runtime error inside EXEC answers in place; the other commands run.
p = r.pipeline(transaction=True)
p.set("s", "abc").incr("s").set("t", "1")
res = p.execute(raise_on_error=False)
show("runtime error", [type(x).__name__ if isinstance(x, Exception) else x for x in res])
show("t", r.get("t"))

# WATCH: a write by another client between WATCH and EXEC aborts EXEC.
r.set("w", "0")
with r.pipeline() as p:
    p.watch("w")
    other.set("w", "5")
    p.multi()
    p.set("w", "1")
    try:
        p.execute()
        show("watch", "executed")
    except redis.exceptions.WatchError:
        show("watch", "WatchError")
show("w", r.get("w"))

# WATCH, unchanged: EXEC runs.
with r.pipeline() as p:
    p.watch("w")
    v = int(p.get("w"))
    p.multi()
    p.set("w", v + 1)
    show("watch unchanged", p.execute())

# DISCARD.
with r.pipeline() as p:
    p.multi()
    p.set("d", "1")
    p.reset()
show("d after discard", r.get("d"))

# The WATCH retry loop (redis-py's transaction()) from several threads: no lost increment.
r.set("counter", "0")
THREADS, ROUNDS = 4, 50
errors = []


def incr_loop():
    c = redis.Redis(port=port)
    try:
        for _ in range(ROUNDS):
            def body(pipe):
                cur = int(pipe.get("counter"))
                pipe.multi()
                pipe.set("counter", cur + 1)

            c.transaction(body, "counter")
    except Exception as e:  # noqa: BLE001 - reported below
        errors.append(repr(e))


threads = [threading.Thread(target=incr_loop) for _ in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if errors:
    print("retry loop errors:", errors, file=sys.stderr)
    sys.exit(1)
counter = int(r.get("counter"))
show("retry loop counter", counter)
if counter != THREADS * ROUNDS:
    print(f"lost increments: {counter} != {THREADS * ROUNDS}", file=sys.stderr)
    sys.exit(1)
r.flushdb()
