"""The numakv Python package against real stores (pytest; CI runs it after `pip install crates/python`)."""

import os
import subprocess
import sys

import pytest

import numakv

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


@pytest.fixture(params=["fastfair", "nbtree"])
def engine(request):
    return request.param


def test_int_store_round_trip(tmp_path, engine):
    d = str(tmp_path / "s")
    with numakv.Store.create(d, engine=engine, nodes=2, capacity="64M") as s:
        assert (s.engine, s.kind_name) == (engine, "int")
        for k in range(1, 1001):
            assert s.insert(k, k * 3)
        assert not s.insert(5, 0)
        assert s.update(5, 55) and not s.update(5000, 1)
        assert s.delete(6) and not s.delete(6)
        assert s.get(5) == 55 and s.get(6) is None
        assert s[7] == 21
        with pytest.raises(KeyError):
            s[6]
        s[2000] = 1
        pairs = list(s.scan(995, limit=10))
        assert pairs == [(k, k * 3) for k in range(995, 1001)] + [(2000, 1)]
        assert len(list(s.scan())) == 1000
        assert s.check() == 1000
        st = s.stats()
        assert st["kind"] == "int" and st["pm_bytes"] > 0 and len(st["pm_bytes_per_node"]) == 2
        assert isinstance(st["counters"], dict)
    with numakv.Store.open(d) as s:
        assert s.get(999) == 2997 and s.get(6) is None


def test_bytes_store_round_trip(tmp_path, engine):
    d = str(tmp_path / "b")
    with numakv.Store.create(d, engine=engine, capacity="64M", bytes=True) as s:
        assert s.kind_name == "bytes"
        s.put("user:1", "hello")
        s.put(b"user:2", b"")
        s.put("user:10", b"\x00\xff")
        s.put(b"\x00\x01", b"bin")
        assert s.get("user:1") == b"hello" and s.get("user:2") == b""
        assert s.get("nope") is None
        assert [k for k, _ in s.scan("user:", "user;")] == [b"user:1", b"user:10", b"user:2"]
        assert list(s.scan(limit=1)) == [(b"\x00\x01", b"bin")]
        big = b"x" * (1 << 20)
        s.put("big", big)
        assert s.get("big") == big
        with pytest.raises(numakv.InvalidArgument):
            s.put("", "x")
        with pytest.raises(numakv.TooLarge):
            s.put("huge", b"x" * (2 << 20))
        assert s.delete("user:2") and s.get("user:2") is None
        assert s.check() == 4
    with numakv.Store.open(d) as s:
        with pytest.raises(numakv.WrongKind):
            s.get(1)


def test_errors_are_exceptions_not_crashes(tmp_path):
    d = str(tmp_path / "e")
    with pytest.raises(numakv.InvalidArgument):
        numakv.Store.create(d, engine="no-such-engine")
    with pytest.raises(numakv.InvalidArgument):
        numakv.Store.create(d, engine="nbtree", leaf_slots="many")
    with pytest.raises(numakv.StoreIoError):
        numakv.Store.open(str(tmp_path / "missing"))
    s = numakv.Store.create(d, capacity="32M")
    with pytest.raises(numakv.InvalidArgument):
        s.put(0, 1)  # reserved key
    with pytest.raises(numakv.WrongKind):
        s.put(b"k", b"v")
    with pytest.raises(TypeError):
        s.put(1.5, 1)
    it = s.scan()
    with pytest.raises(RuntimeError):
        s.close()  # an iterator is alive
    del it
    s.close()
    s.close()  # idempotent
    with pytest.raises(numakv.Closed):
        s.get(1)
    with pytest.raises(numakv.StoreIoError):
        numakv.Store.create(d)  # already there


CRASHER = """
import os, sys, numakv
s = numakv.Store.open(sys.argv[1])
for k in range(1, 100001):
    s.put(k, k + 1)
    print(k, flush=True)
"""


def test_acknowledged_writes_survive_a_kill(tmp_path):
    d = str(tmp_path / "c")
    numakv.Store.create(d, engine="nbtree", capacity="64M").close()
    p = subprocess.Popen([sys.executable, "-c", CRASHER, d], stdout=subprocess.PIPE, text=True)
    last = 0
    for line in p.stdout:
        last = int(line)
        if last >= 3000:
            break
    p.kill()
    # Keys the child acknowledged before the kill landed are still in the pipe: they count too.
    for line in p.stdout:
        last = int(line)
    p.wait()
    assert last >= 3000
    with numakv.Store.open(d) as s:  # recovers
        for k in range(1, last + 1):
            assert s.get(k) == k + 1, k
        assert s.check() in (last, last + 1)


def test_bench_load_reads_the_drivers_json(tmp_path):
    exe = os.environ.get("NUMAKV_BIN", os.path.join(ROOT, "target", "release", "numakv"))
    assert os.path.exists(exe), f"{exe}: build the CLI first (cargo build --release -p numakv-cli)"
    out = tmp_path / "out"
    subprocess.run(
        [exe, "bench", "-e", "fastfair,nbtree", "-w", "ycsb-a", "--threads", "1",
         "--keys", "2000", "--ops", "4000", "--out", str(out)],
        check=True, capture_output=True,
    )
    runs = numakv.bench.load(str(out))
    rows = runs.to_dict("records") if hasattr(runs, "to_dict") else runs
    assert [r["engine"] for r in rows] == ["fastfair", "nbtree"]
    assert all(r["ops"] == 4000 and r["throughput_mops"] > 0 for r in rows)
    failed = numakv.bench.load(str(out), failures=True)
    assert len(failed) == 0, failed  # both runs succeeded: no failure rows
    with pytest.raises(ValueError):
        bad = tmp_path / "bad.json"
        bad.write_text("[1, 2]")
        numakv.bench.load(str(bad))
