"""The Python package's promises: the mapping protocol, closing (on drop, while other threads
are in calls, scan iterators), exceptions that are also builtins, buffer-protocol values, the
GIL released in calls, refusal after fork, scans longer than one batch, and types shipped."""

import array
import gc
import os
import sys
import threading
import time
import warnings

import pytest

import numakv


def make(tmp_path, name="s", **kw):
    kw.setdefault("capacity", 64 << 20)
    return numakv.Store.create(str(tmp_path / name), **kw)


def test_an_int_store_is_an_ordered_mapping(tmp_path):
    with make(tmp_path, nodes=2) as s:
        for k in (5, 3, 9, 1):
            s[k] = k * 10
        assert 5 in s and 4 not in s
        assert list(s) == [1, 3, 5, 9]
        assert [k for k in s] == [1, 3, 5, 9]
        assert list(s.keys()) == [1, 3, 5, 9]
        assert list(s.values()) == [10, 30, 50, 90]
        assert list(s.items()) == [(1, 10), (3, 30), (5, 50), (9, 90)]
        assert len(s) == 4
        del s[3]
        assert 3 not in s and len(s) == 3
        with pytest.raises(KeyError):
            del s[3]
        with pytest.raises(KeyError):
            s[3]
        assert s.get(3) is None and s.get(3, "absent") == "absent" and s.get(5, 0) == 50
        assert dict(s.items()) == {1: 10, 5: 50, 9: 90}
        assert list(s.scan(2, 9)) == [(5, 50)]  # end is exclusive for int stores too


def test_a_bytes_store_is_an_ordered_mapping(tmp_path):
    with make(tmp_path, bytes=True) as b:
        b["b"] = "2"
        b[b"a"] = b"1"
        b[bytearray(b"c")] = memoryview(b"3")
        assert "a" in b and b"a" in b and bytearray(b"b") in b and "z" not in b
        assert list(b) == [b"a", b"b", b"c"]
        assert list(b.items()) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
        assert len(b) == 3
        del b["b"]
        assert list(b.keys()) == [b"a", b"c"]
        assert b.get("zz", b"none") == b"none"


def test_values_through_the_buffer_protocol(tmp_path):
    with make(tmp_path, bytes=True) as b:
        big = bytearray(os.urandom(1 << 20))
        b.put("ba", big)
        b.put("mv", memoryview(big)[10:20])
        b.put("arr", array.array("B", [1, 2, 3]))
        b.put(memoryview(b"key"), b"v")
        assert b.get("ba") == bytes(big)
        assert b.get("mv") == bytes(big[10:20])
        assert b.get("arr") == b"\x01\x02\x03"
        assert b.get("key") == b"v"
        with pytest.raises(TypeError):
            b.put("x", 1.5)


def test_exceptions_are_also_the_builtins_they_mean(tmp_path):
    s = make(tmp_path)
    with pytest.raises(ValueError):
        s.put(0, 1)  # reserved key: InvalidArgument
    with pytest.raises(numakv.InvalidArgument):
        s.put(0, 1)
    with pytest.raises(TypeError):
        s.put(b"k", b"v")  # WrongKind
    with pytest.raises(ValueError):
        s.set_thread_node(1)  # one node
    s.close()
    with pytest.raises(ValueError):
        s.get(1)  # Closed, like a closed file
    with pytest.raises(OSError):
        numakv.Store.open(str(tmp_path / "missing"))  # StoreIoError
    with pytest.raises(OSError):
        make(tmp_path)  # already there
    with pytest.raises(ValueError):
        numakv.Store.create(str(tmp_path / "x"), engine="no-such-engine")
    assert issubclass(numakv.TooLarge, ValueError) and issubclass(numakv.OutOfSpace, OSError)
    assert issubclass(numakv.Corrupted, OSError) and issubclass(numakv.Busy, RuntimeError)
    assert all(
        issubclass(e, numakv.NumakvError)
        for e in (numakv.InvalidArgument, numakv.TooLarge, numakv.OutOfSpace, numakv.Corrupted,
                  numakv.StoreIoError, numakv.WrongKind, numakv.Closed, numakv.Busy, numakv.Forked)
    )


def test_capacity_is_an_int_or_a_size(tmp_path):
    with make(tmp_path, "a", capacity=32 << 20) as s:
        s[1] = 1
    with make(tmp_path, "b", capacity="32M") as s:
        s[1] = 1
    with pytest.raises(ValueError):
        make(tmp_path, "c", capacity=-1)
    with pytest.raises(TypeError):
        make(tmp_path, "d", capacity=1.5)


def test_a_store_dropped_open_is_closed_with_a_resource_warning(tmp_path):
    s = make(tmp_path)
    s[7] = 49
    with pytest.warns(ResourceWarning, match="not closed"):
        del s
        gc.collect()
    with numakv.Store.open(str(tmp_path / "s")) as s:
        assert s.recovered is False, "the drop closed it cleanly"
        assert s[7] == 49


def test_close_waits_for_calls_in_other_threads(tmp_path):
    s = make(tmp_path, nodes=2)
    started = [threading.Event() for _ in range(4)]
    outcomes = []

    def writer(i):
        k = 1 + i * 1_000_000
        try:
            while True:
                s.put(k, k)
                k += 1
                started[i].set()
        except numakv.Closed:
            outcomes.append("closed")
        except Exception as e:  # noqa: BLE001 - the outcome is the assertion
            outcomes.append(repr(e))
            started[i].set()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for e in started:
        assert e.wait(60), "a writer never got going"
    s.close()  # while the writers are in calls: waits for them, never "Already borrowed"
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert outcomes == ["closed"] * 4
    with numakv.Store.open(str(tmp_path / "s")) as s2:
        assert s2.recovered is False and s2.check() > 0


def test_scan_iterators_close_and_are_context_managers(tmp_path):
    s = make(tmp_path)
    for k in range(1, 11):
        s[k] = k
    it = s.scan()
    with pytest.raises(numakv.Busy):
        s.close()
    it.close()
    assert it.closed and list(it) == []
    with s.scan(3) as it2:
        assert next(it2) == (3, 3)
    assert it2.closed
    exhausted = s.scan()
    assert len(list(exhausted)) == 10 and exhausted.closed  # an exhausted scan closes itself
    with pytest.raises(ZeroDivisionError):
        with s.scan() as it3:
            next(it3)
            1 / 0
    assert it3.closed
    s.close()


def test_an_exception_in_with_is_not_replaced_by_a_close_error(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with make(tmp_path) as s:
            s[1] = 1
            it = s.scan()  # keeps the store from closing
            1 / 0
    it.close()
    s.close()  # the close that failed in __exit__ succeeds now
    with numakv.Store.open(str(tmp_path / "s")) as s:
        assert s.recovered is False and s[1] == 1


def test_calls_release_the_gil(tmp_path):
    # With a switch interval far longer than the test, the GIL changes hands only when its
    # holder releases it. The spinner makes progress while the writer is still writing only if
    # the store's calls release the GIL.
    s = make(tmp_path)
    spins = [0]
    done = threading.Event()
    seen_during_writes = []

    def spinner():
        while not done.is_set():
            spins[0] += 1
            time.sleep(0)  # hands the GIL back at once (the interval would not, for 1000 s)

    for k in range(1, 3001):
        s.put(k, k)

    def writer():
        # check() walks the whole store in native code (milliseconds): while it has the GIL
        # released, a waiting thread gets it. Up to 200 of them, until the spinner has run.
        for i in range(200):
            assert s.check() == 3000
            if spins[0] > 0:
                seen_during_writes.append(i)
                break
        done.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        t1 = threading.Thread(target=spinner)
        t2 = threading.Thread(target=writer)
        t2.start()
        t1.start()
        t2.join()
        done.set()
        t1.join()
    finally:
        sys.setswitchinterval(old)
    assert seen_during_writes, "no other thread ran while the writer was in store calls"
    s.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_child_is_refused_and_the_parent_goes_on(tmp_path):
    s = make(tmp_path, nodes=2)
    for k in range(1, 501):
        s[k] = k
    it = s.scan()
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (Python 3.12)
        pid = os.fork()
    if pid == 0:
        os.close(r)
        verdicts = []
        for call in (lambda: s.put(1000, 1), lambda: s.get(1), lambda: s.close(),
                     lambda: next(it), lambda: len(s)):
            try:
                call()
                verdicts.append("ran")
            except numakv.Forked:
                verdicts.append("refused")
            except BaseException as e:  # noqa: BLE001
                verdicts.append(repr(e))
        del it
        del s  # collected in the child: must not close the parent's store
        gc.collect()
        os.write(w, ",".join(verdicts).encode())
        os._exit(0)
    os.close(w)
    got = os.read(r, 4096).decode()
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert got == ",".join(["refused"] * 5), got
    assert next(it) == (1, 1)
    it.close()
    for k in range(501, 1001):
        s[k] = k
    assert s.check() == 1000
    s.close()
    with numakv.Store.open(str(tmp_path / "s")) as s:
        assert s.recovered is False and len(s) == 1000


def test_scans_longer_than_one_batch(tmp_path):
    with make(tmp_path) as s:
        for k in range(1, 2001):
            s[k] = k * 2
        assert list(s.scan()) == [(k, k * 2) for k in range(1, 2001)]
        assert list(s.scan(700, 1300)) == [(k, k * 2) for k in range(700, 1300)]
        assert len(list(s.scan(limit=1000))) == 1000
    with make(tmp_path, "b", bytes=True) as b:
        for i in range(700):
            b[b"p:%05d" % i] = b"v"
        b["q"] = "other"
        got = [k for k, _ in b.scan(prefix="p:")]
        assert got == [b"p:%05d" % i for i in range(700)]
        assert len(b) == 701


def test_threads_are_placed_on_valid_nodes_only(tmp_path):
    with make(tmp_path, nodes=2) as s:
        assert s.nodes == 2
        with pytest.raises(numakv.InvalidArgument):
            s.set_thread_node(2)

        def placed():
            s.set_thread_node(1, pin=True)
            s[1] = 1

        t = threading.Thread(target=placed)
        t.start()
        t.join()
        assert s[1] == 1


def test_the_package_is_typed():
    here = os.path.dirname(numakv.__file__)
    assert os.path.exists(os.path.join(here, "py.typed"))
    stub = os.path.join(here, "_native.pyi")
    assert os.path.exists(stub)
    text = open(stub, encoding="utf-8").read()
    import ast

    ast.parse(text)  # a stub that is not valid Python would break every type checker
    for name in ("class Store", "def __contains__", "def __delitem__", "class Forked", "def scan"):
        assert name in text


def test_write_batches_are_all_or_nothing(tmp_path):
    with make(tmp_path, bytes=True) as b:
        b["old"] = "x"
        wb = numakv.WriteBatch()
        wb.put("a", "1")
        wb.put(b"b", bytearray(b"2"))
        wb.delete("old")
        assert len(wb) == 3
        assert b.write(wb) is True
        assert dict(b.items()) == {b"a": b"1", b"b": b"2"}
        nx = numakv.WriteBatch()
        nx.put("c", "3")
        nx.require_absent("a")
        assert b.write(nx) is False and "c" not in b  # precondition failed: nothing written
        bad = numakv.WriteBatch()
        bad.put("d", "4")
        bad.put("huge", b"x" * (2 << 20))
        with pytest.raises(numakv.TooLarge):
            b.write(bad)
        assert "d" not in b  # checked before anything was written
        with b.write_batch() as wb2:
            wb2.put("e", "5")
            wb2.delete("a")
        assert b["e"] == b"5" and "a" not in b
        with pytest.raises(ZeroDivisionError):
            with b.write_batch() as wb3:
                wb3.put("f", "6")
                1 / 0
        assert "f" not in b  # an exception drops the batch
    with make(tmp_path, "i") as s:
        with pytest.raises(numakv.WrongKind):
            s.write(numakv.WriteBatch())


def _mp_child(s, q):
    try:
        s.put(99_999, 1)
        q.put("ran")
    except numakv.Forked as e:
        q.put("refused: " + str(e))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_multiprocessing_with_fork_is_refused_too(tmp_path):
    import multiprocessing

    s = make(tmp_path)
    s[1] = 1
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_mp_child, args=(s, q))
    p.start()
    got = q.get(timeout=120)
    p.join(120)
    assert p.exitcode == 0
    assert got.startswith("refused: ") and "fork child" in got, got
    s[2] = 2
    assert s.check() == 2
    s.close()
    with numakv.Store.open(str(tmp_path / "s")) as s:
        assert s.recovered is False and list(s) == [1, 2]
