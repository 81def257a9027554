"""An adversarial review of the package's documented promises (the module and class docstrings):
these tests fail on the code they were written against; each states the promise it holds the
package to. (The probes that held are in this file's first commit on branch review-capi.)"""

import gc
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
