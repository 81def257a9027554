"""An adversarial review of the package's documented promises (the module and class docstrings):
each test states the promise it holds the package to. Tests that pass document what was tried."""

import gc
import os
import signal
import threading
import time
import warnings

import pytest

import numakv


def make(tmp_path, name="s", **kw):
    kw.setdefault("capacity", 64 << 20)
    return numakv.Store.create(str(tmp_path / name), **kw)


def test_a_store_collected_before_its_scan_iterator_is_still_closed_cleanly(tmp_path):
    # Promise (module doc): "Close it (with or close()); one collected open is closed with a
    # ResourceWarning." Here the store object is collected while a scan iterator of it is still
    # alive; the iterator goes later. The store must still end closed cleanly (no recovery).
    s = make(tmp_path)
    for k in range(1, 11):
        s[k] = k
    it = s.scan()
    assert next(it) == (1, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del s
        gc.collect()
        del it
        gc.collect()
    with numakv.Store.open(str(tmp_path / "s")) as s:
        assert s.recovered is False, "the collected store was not closed cleanly (a crash)"
        assert len(s) == 10


def test_an_exception_in_with_during_a_named_scan_still_ends_in_a_clean_close(tmp_path):
    # The usual shape of a loop that fails part-way: `with` + a scan kept in a variable + an
    # exception. __exit__ cannot close (the scan is open) and, by its doc, "the store is then
    # closed when collected". Both objects are then collected, the store first.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        with pytest.raises(KeyError):
            with make(tmp_path) as s:
                for k in range(1, 600):
                    s[k] = k
                it = s.scan()
                for k, v in it:
                    if k == 300:
                        raise KeyError(k)
        assert not it.closed
        del s
        gc.collect()
        del it
        gc.collect()
    with numakv.Store.open(str(tmp_path / "s")) as s:
        assert s.recovered is False, "the store ended as a crash, not closed"
        assert len(s) == 599


def test_close_while_another_thread_is_in_len_waits_instead_of_raising_busy(tmp_path):
    # Promise (close's doc): "Waits for calls other threads are making on it to return; raises
    # Busy while scan iterators are open". len(s) is a call, not a scan iterator of the caller.
    s = make(tmp_path)
    for k in range(1, 20001):
        s[k] = k
    started = threading.Event()
    stop = threading.Event()
    outcome = []

    def counter():
        try:
            while not stop.is_set():
                assert len(s) == 20000
                started.set()
        except numakv.Closed:
            outcome.append("closed")
        except BaseException as e:  # noqa: BLE001
            outcome.append(repr(e))
        started.set()

    t = threading.Thread(target=counter)
    t.start()
    assert started.wait(120)
    errors = []
    deadline = time.monotonic() + 60
    while not s.closed and time.monotonic() < deadline:
        try:
            s.close()
        except numakv.Busy as e:
            errors.append(str(e))
            break
    stop.set()
    t.join(120)
    if not s.closed:
        s.close()
    assert not errors, f"close() while another thread was in len(s) raised Busy: {errors[0]}"
    assert outcome in (["closed"], []), outcome


def test_close_while_another_thread_is_in_key_in_store_and_get(tmp_path):
    # The same promise for every kind of call: `in`, get with a default, del, write batches.
    b = make(tmp_path, bytes=True)
    for i in range(200):
        b[b"k%05d" % i] = b"v" * 100
    started = threading.Event()
    outcome = []

    def worker():
        i = 0
        try:
            while True:
                key = b"k%05d" % (i % 200)
                assert key in b
                assert b.get(key, b"none") == b"v" * 100
                wb = numakv.WriteBatch()
                wb.put(b"w%05d" % i, b"x")
                b.write(wb)
                i += 1
                started.set()
        except numakv.Closed:
            outcome.append("closed")
        except BaseException as e:  # noqa: BLE001
            outcome.append(repr(e))
            started.set()

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    assert started.wait(120)
    b.close()
    for t in threads:
        t.join(120)
        assert not t.is_alive()
    assert outcome == ["closed"] * 3, outcome
    with numakv.Store.open(str(tmp_path / "s")) as b:
        assert b.recovered is False


def test_bytes_scans_over_batches_of_maximum_length_keys(tmp_path):
    # Keys are 1 B..1 KiB; a scan fetches 256 pairs at a time and restarts after the last key.
    with make(tmp_path, bytes=True) as b:
        keys = [b"%03d" % i + b"z" * 1021 for i in range(600)]
        for i, k in enumerate(keys):
            assert len(k) == 1024
            b[k] = b"%d" % i
        assert [k for k, _ in b.scan()] == keys
        assert list(b) == keys and len(b) == 600
        assert [k for k in b.scan(prefix=b"1")] != []
        assert len(list(b.scan(prefix=b"1"))) == 100


def test_limits_exactly_at_the_edges(tmp_path):
    with make(tmp_path, bytes=True) as b:
        k, v = b"k" * 1024, bytes(range(256)) * 4096  # 1 KiB key, 1 MiB value
        b[k] = v
        assert b[k] == v and k in b and b.get(k, None) == v
        with pytest.raises(numakv.TooLarge):
            b[k + b"k"] = b"x"
        with pytest.raises(numakv.TooLarge):
            b[b"a"] = v + b"x"
        with pytest.raises(numakv.InvalidArgument):
            b[b""] = b"x"
        with pytest.raises(numakv.InvalidArgument):
            b.get(b"")
        with pytest.raises(numakv.InvalidArgument):
            b"" in b  # noqa: B015
        with pytest.raises(numakv.InvalidArgument):
            del b[b""]
        b[b"empty"] = b""
        assert b[b"empty"] == b"" and b.get(b"empty", b"default") == b"" and b"empty" in b
    with make(tmp_path, "i") as s:
        s[2**64 - 2] = 2**64 - 1
        assert s[2**64 - 2] == 2**64 - 1 and list(s) == [2**64 - 2]
        for bad in (0, 2**64 - 1):
            with pytest.raises(numakv.InvalidArgument):
                s[bad] = 1
            with pytest.raises(numakv.InvalidArgument):
                s.get(bad)
            with pytest.raises(numakv.InvalidArgument):
                bad in s  # noqa: B015
            with pytest.raises(numakv.InvalidArgument):
                del s[bad]
        with pytest.raises(numakv.InvalidArgument):
            s[2**64] = 1
        with pytest.raises(numakv.InvalidArgument):
            s[-1] = 1
        with pytest.raises(numakv.InvalidArgument):
            s[5] = -1


def test_buffer_protocol_values_of_every_shape(tmp_path):
    import array

    with make(tmp_path, bytes=True) as b:
        raw = bytes(range(256))
        b["strided"] = memoryview(raw)[::2]
        assert b["strided"] == raw[::2]
        b["ints"] = array.array("I", [1, 2])
        assert b["ints"] == array.array("I", [1, 2]).tobytes()
        b[memoryview(b"abc")[1:]] = b"slice-key"
        assert b["bc"] == b"slice-key"
        b[array.array("B", b"arr")] = b"1"
        assert b["arr"] == b"1"
        ro = memoryview(bytearray(b"ro")).toreadonly()
        b[ro] = ro
        assert b["ro"] == b"ro"
        mv = memoryview(bytearray(b"released"))
        mv.release()
        with pytest.raises(ValueError):
            b["x"] = mv


def test_write_batches_refuse_bad_arguments_before_writing(tmp_path):
    with make(tmp_path, bytes=True) as b:
        b["keep"] = "old"
        for bad_op in (
            lambda wb: wb.put(b"", b"x"),
            lambda wb: wb.delete(b""),
            lambda wb: wb.put(b"k" * 1025, b"x"),
            lambda wb: wb.delete(b"k" * 1025),
            lambda wb: wb.require_absent(b""),
        ):
            wb = numakv.WriteBatch()
            wb.put("keep", "new")
            wb.put("n1", "1")
            try:
                bad_op(wb)  # refused now, or by write below
            except (ValueError, numakv.NumakvError):
                continue
            with pytest.raises(ValueError):
                b.write(wb)
            assert b["keep"] == b"old" and "n1" not in b
        with pytest.raises(TypeError):
            numakv.WriteBatch().put(1, b"x")
        assert dict(b.items()) == {b"keep": b"old"}


def test_a_batch_too_big_for_the_store_writes_nothing(tmp_path):
    with make(tmp_path, bytes=True, capacity="16M") as b:
        b["keep"] = "old"
        wb = numakv.WriteBatch()
        wb.put("keep", "new")
        big = b"x" * (1 << 20)
        for i in range(40):
            wb.put(b"big%03d" % i, big)
        with pytest.raises(numakv.NumakvError):
            b.write(wb)
        assert b["keep"] == b"old"
        assert [k for k in b] == [b"keep"]
        assert b.check() == 1
        b["after"] = "1"
        assert b.write(numakv.WriteBatch()) is True


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_every_call_is_refused_in_a_fork_child(tmp_path):
    s = make(tmp_path, nodes=2)
    b = make(tmp_path, "b", bytes=True)
    for k in range(1, 301):
        s[k] = k
    b["a"] = "parent"
    it = s.scan()
    bit = b.scan()
    wb = numakv.WriteBatch()
    wb.put("c", "child")
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        os.close(r)
        verdicts = []
        calls = {
            "put": lambda: s.put(1000, 1),
            "setitem": lambda: s.__setitem__(1000, 1),
            "getitem": lambda: s[1],
            "get-default": lambda: s.get(99999, 5),
            "contains": lambda: 1 in s,
            "delitem": lambda: s.__delitem__(1),
            "insert": lambda: s.insert(2000, 1),
            "update": lambda: s.update(1, 2),
            "delete": lambda: s.delete(2),
            "len": lambda: len(s),
            "iter": lambda: list(s),
            "keys": lambda: s.keys(),
            "values": lambda: s.values(),
            "items": lambda: s.items(),
            "scan": lambda: s.scan(1, 5),
            "next-it": lambda: next(it),
            "next-bit": lambda: next(bit),
            "stats": lambda: s.stats(),
            "check": lambda: s.check(),
            "set_thread_node": lambda: s.set_thread_node(0),
            "bput": lambda: b.put("c", "child"),
            "bget": lambda: b.get("a"),
            "bcontains": lambda: "a" in b,
            "bdel": lambda: b.__delitem__("a"),
            "prefix": lambda: b.scan(prefix="a"),
            "write": lambda: b.write(wb),
            "with-batch": lambda: b.write_batch().__exit__(None, None, None),
            "close": lambda: s.close(),
            "bclose": lambda: b.close(),
            "exit": lambda: s.__exit__(None, None, None),
        }
        for name, call in calls.items():
            try:
                call()
                verdicts.append(name + "=ran")
            except numakv.Forked:
                pass
            except BaseException as e:  # noqa: BLE001
                verdicts.append(f"{name}={e!r}")
        os.write(w, ";".join(verdicts).encode() or b"all refused")
        os._exit(0)
    os.close(w)
    got = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        got += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert got == b"all refused", got.decode()
    assert next(it) == (1, 1)
    it.close()
    bit.close()
    assert s.check() == 300 and b.check() == 1 and b["a"] == b"parent"
    s.close()
    b.close()


def _child_own_store(d, q):
    try:
        with numakv.Store.create(d, capacity=32 << 20) as c:
            for k in range(1, 2001):
                c[k] = k
            q.put(("ok", len(c)))
    except BaseException as e:  # noqa: BLE001
        q.put(("error", repr(e)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_child_of_a_busy_parent_can_make_its_own_store(tmp_path):
    # The doc: "open the store in the child after the parent closed it" -- and a new store of
    # its own at any time. The parent has threads inside calls when it forks (locks held).
    import multiprocessing

    s = make(tmp_path, "parent", nodes=2)
    stop = threading.Event()

    def writer(i):
        k = 1 + i * 10_000_000
        while not stop.is_set():
            s.put(k, k)
            s.get(k)
            k += 1

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    ctx = multiprocessing.get_context("fork")
    failures = []
    try:
        for n in range(8):
            q = ctx.Queue()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                p = ctx.Process(target=_child_own_store, args=(str(tmp_path / f"c{n}"), q))
                p.start()
            try:
                got = q.get(timeout=120)
            except Exception:  # noqa: BLE001
                got = ("hang", "no answer in 120 s")
            p.join(30)
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(30)
                got = ("hang", str(got))
            if got != ("ok", 2000):
                failures.append((n, got, p.exitcode))
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    s.close()
    assert not failures, failures


def test_a_node_count_far_out_of_range_is_invalid_not_an_abort(tmp_path):
    # InvalidArgument's doc: "a bad option, engine name or node". 2**50 nodes: any per-node
    # table of that size exceeds the address space, so nothing is really allocated; run in a
    # child interpreter, since an abort would take pytest down with it.
    import subprocess
    import sys

    code = (
        "import numakv, sys\n"
        "for n in (0, 257, 2**50, 2**64 - 1):\n"
        "    try:\n"
        "        numakv.Store.create(sys.argv[1] + str(n), nodes=n, capacity=32 << 20)\n"
        "        print(n, 'created')\n"
        "    except numakv.InvalidArgument:\n"
        "        print(n, 'InvalidArgument')\n"
        "    except BaseException as e:\n"
        "        print(n, repr(e))\n"
        "    sys.stdout.flush()\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "n")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, f"the interpreter died ({run.returncode}):\n{out}"
    for n in (0, 257, 2**50, 2**64 - 1):
        assert f"{n} InvalidArgument" in run.stdout, out


def test_negative_or_huge_nodes_are_invalid_arguments(tmp_path):
    # set_thread_node's doc: "node (0..nodes, else InvalidArgument)"; InvalidArgument's doc: "a
    # bad option, engine name or node". A negative node is out of 0..nodes too.
    with make(tmp_path, nodes=2) as s:
        for bad in (2, -1, 2**64):
            with pytest.raises(numakv.InvalidArgument):
                s.set_thread_node(bad)
    with pytest.raises(numakv.InvalidArgument):
        make(tmp_path, "neg", nodes=-1)
