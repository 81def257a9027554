//! Access accounting and latency emulation: distinct PM lines per operation, local vs remote,
//! flushes and fences, and the emulated latency of first touches.
//!
//! The switches are process-global, so every test holds `LOCK` for its whole run and turns
//! everything off again when it ends (also when it fails).
//!
//! Built without the `accounting` feature the switches are inert: the tests that assert counts or
//! delays are ignored, and `accounting_off_counts_nothing` / `latency_emulation_charges_first_touches`
//! check that switching on does nothing.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use numakv_pmem::account::{self, AccessStats, LatencyModel};
use numakv_pmem::heap::OWNER_ENGINE;
use numakv_pmem::numa::set_current_node;
use numakv_pmem::{EngineId, PPtr, PersistMode, PmU64, Pool, PoolConfig, LINE};

static LOCK: Mutex<()> = Mutex::new(());

/// Holds the global lock; switches accounting and latency off when dropped.
struct Serial(#[allow(dead_code)] MutexGuard<'static, ()>);

impl Drop for Serial {
    fn drop(&mut self) {
        account::set_enabled(false);
        account::set_latency(LatencyModel::NONE);
        account::op_discard();
    }
}

fn serial(accounting: bool) -> Serial {
    let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    account::set_latency(LatencyModel::NONE);
    account::set_enabled(accounting);
    set_current_node(0);
    account::op_discard();
    Serial(g)
}

/// A 2-node volatile pool with a 2-page extent on each node; returns (pool, [node 0, node 1]).
fn pool(mode: PersistMode) -> (Arc<Pool>, [PPtr; 2]) {
    let mut c = PoolConfig::new(EngineId::new("accounting", 1), 2 << 20);
    c.nodes = 2;
    c.page_size = 64 << 10;
    c.mode = mode;
    let pool = Pool::volatile(c).unwrap();
    let a = pool.alloc_pages(0, 6, OWNER_ENGINE, 0).unwrap();
    let b = pool.alloc_pages(1, 6, OWNER_ENGINE, 0).unwrap();
    assert_eq!((a.node(), b.node()), (0, 1));
    (pool, [a, b])
}

fn at(p: PPtr, bytes: u64) -> PPtr {
    p.add(bytes).unwrap()
}

/// Runs `f` as one operation (set-up traffic discarded first) and returns what it counted.
fn one_op(f: impl FnOnce()) -> AccessStats {
    account::op_discard();
    let before = account::thread_stats();
    f();
    account::op_end();
    account::thread_stats().since(&before)
}

fn stats(ops: u64, rl: u64, rr: u64, wl: u64, wr: u64) -> AccessStats {
    AccessStats {
        ops,
        reads_local: rl,
        reads_remote: rr,
        writes_local: wl,
        writes_remote: wr,
        flushes: 0,
        fences: 0,
        ..AccessStats::default()
    }
}

#[test]
#[cfg_attr(not(feature = "accounting"), ignore = "accounting compiled out")]
fn two_words_in_one_line_are_one_line_read() {
    let _s = serial(true);
    let (pool, [p0, _]) = pool(PersistMode::Adr);
    let s = one_op(|| {
        let a: &PmU64 = pool.get(p0).unwrap();
        let b: &PmU64 = pool.get(at(p0, 56)).unwrap();
        a.load(Ordering::Acquire);
        b.load(Ordering::Acquire);
    });
    assert_eq!(s, stats(1, 1, 0, 0, 0));
    // The neighbouring line is another line.
    let s = one_op(|| {
        pool.get::<PmU64>(at(p0, 56)).unwrap().load(Ordering::Acquire);
        pool.get::<PmU64>(at(p0, 64)).unwrap().load(Ordering::Acquire);
    });
    assert_eq!(s, stats(1, 2, 0, 0, 0));
}

#[test]
#[cfg_attr(not(feature = "accounting"), ignore = "accounting compiled out")]
fn a_range_spanning_three_lines_counts_three() {
    let _s = serial(true);
    let (pool, [p0, p1]) = pool(PersistMode::Adr);
    let bytes = pool.bytes(p0, 4 * LINE).unwrap();
    let mut buf = [0u8; 70];
    // SAFETY: single-threaded; nobody writes the page.
    let s = one_op(|| assert!(unsafe { bytes.read(60, &mut buf) }));
    assert_eq!(s, stats(1, 3, 0, 0, 0));
    // Exactly one line, and exactly two (an aligned 128-byte range).
    // SAFETY: as above.
    let s = one_op(|| assert!(unsafe { bytes.read(64, &mut buf[..64]) }));
    assert_eq!(s, stats(1, 1, 0, 0, 0));
    let remote = pool.bytes(p1, 4 * LINE).unwrap();
    // SAFETY: as above.
    let s = one_op(|| assert!(unsafe { remote.fill(0, 2 * LINE, 7) }));
    assert_eq!(s, stats(1, 0, 0, 0, 2));
}

#[test]
#[cfg_attr(not(feature = "accounting"), ignore = "accounting compiled out")]
fn node_one_lines_are_remote_for_a_node_zero_thread() {
    let _s = serial(true);
    let (pool, [p0, p1]) = pool(PersistMode::Adr);
    let w0: &PmU64 = pool.get(p0).unwrap();
    let w1: &PmU64 = pool.get(p1).unwrap();
    assert_eq!(one_op(|| w1.store(5, Ordering::Release)), stats(1, 0, 0, 0, 1));
    assert_eq!(one_op(|| w0.store(5, Ordering::Release)), stats(1, 0, 0, 1, 0));
    assert_eq!(one_op(|| _ = w1.load(Ordering::Acquire)), stats(1, 0, 1, 0, 0));
    // A read-modify-write is a read and a write of its line.
    assert_eq!(one_op(|| _ = w1.fetch_add(1, Ordering::AcqRel)), stats(1, 0, 1, 0, 1));
    // The same accesses from a node-1 thread flip sides.
    set_current_node(1);
    assert_eq!(one_op(|| w1.store(5, Ordering::Release)), stats(1, 0, 0, 1, 0));
    assert_eq!(one_op(|| _ = w0.load(Ordering::Acquire)), stats(1, 0, 1, 0, 0));
    set_current_node(0);
    let s = one_op(|| {
        w0.load(Ordering::Acquire);
        w1.load(Ordering::Acquire);
        w0.store(1, Ordering::Release);
        w1.store(1, Ordering::Release);
    });
    assert_eq!(s, stats(1, 1, 1, 1, 1));
    assert!((s.remote_share() - 0.5).abs() < 1e-9);
}

#[test]
#[cfg_attr(not(feature = "accounting"), ignore = "accounting compiled out")]
fn op_end_closes_the_operation_and_repeats_count_once() {
    let _s = serial(true);
    let (pool, [p0, _]) = pool(PersistMode::Adr);
    let w: &PmU64 = pool.get(at(p0, 128)).unwrap();
    account::op_discard();
    let before = account::thread_stats();
    for _ in 0..100 {
        w.load(Ordering::Acquire);
    }
    w.store(1, Ordering::Release);
    w.store(2, Ordering::Release);
    // Nothing is published before the operation ends.
    assert_eq!(account::thread_stats(), before);
    account::op_end();
    let after_one = account::thread_stats();
    assert_eq!(after_one.since(&before), stats(1, 1, 0, 1, 0));
    // Each operation counts its lines afresh.
    for _ in 0..3 {
        w.load(Ordering::Acquire);
        account::op_end();
    }
    assert_eq!(account::thread_stats().since(&after_one), stats(3, 3, 0, 0, 0));
    // An empty operation is still an operation.
    let s = one_op(|| {});
    assert_eq!(s, stats(1, 0, 0, 0, 0));
    // Discarded traffic is not counted.
    w.load(Ordering::Acquire);
    account::op_discard();
    let s = one_op(|| {});
    assert_eq!(s.reads(), 0);
}

#[test]
#[cfg_attr(not(feature = "accounting"), ignore = "accounting compiled out")]
fn an_operation_larger_than_the_line_cap_counts_every_line() {
    let _s = serial(true);
    let (pool, [p0, _]) = pool(PersistMode::Adr);
    let n = 5000u64; // more than the 4096 distinct lines tracked per operation
    let s = one_op(|| {
        for i in 0..n {
            pool.get::<PmU64>(at(p0, i * LINE as u64)).unwrap().load(Ordering::Acquire);
        }
    });
    assert_eq!(s, stats(1, n, 0, 0, 0));
}

#[test]
#[cfg_attr(not(feature = "accounting"), ignore = "accounting compiled out")]
fn thread_deltas_and_global_totals() {
    let _s = serial(true);
    let (pool, [p0, p1]) = pool(PersistMode::Adr);
    let global_before = account::global_stats();
    let mine_before = account::thread_stats();
    let theirs = std::thread::scope(|s| {
        s.spawn(|| {
            set_current_node(1);
            let before = account::thread_stats();
            for i in 0..4 {
                pool.get::<PmU64>(at(p1, i * 64)).unwrap().load(Ordering::Acquire);
                pool.get::<PmU64>(at(p0, 0)).unwrap().store(i, Ordering::Release);
                account::op_end();
            }
            account::thread_stats().since(&before)
        })
        .join()
        .unwrap()
    });
    assert_eq!(theirs, stats(4, 4, 0, 0, 4));
    // This thread did nothing meanwhile; the global totals grew by exactly the other thread's.
    assert_eq!(account::thread_stats(), mine_before);
    assert_eq!(account::global_stats().since(&global_before), theirs);
}

#[test]
fn accounting_off_counts_nothing() {
    let _s = serial(false);
    assert!(!account::enabled());
    let (pool, [p0, p1]) = pool(PersistMode::Adr);
    let s = one_op(|| {
        pool.get::<PmU64>(p0).unwrap().load(Ordering::Acquire);
        pool.get::<PmU64>(p1).unwrap().store(1, Ordering::Release);
        pool.persist_obj(pool.get::<PmU64>(p1).unwrap());
    });
    assert_eq!(s, AccessStats::default());
    account::set_enabled(true);
    assert_eq!(account::enabled(), account::COMPILED);
    if !account::COMPILED {
        // Compiled out: the switch is inert and nothing is ever counted.
        let s = one_op(|| {
            pool.get::<PmU64>(p0).unwrap().load(Ordering::Acquire);
            pool.persist_obj(pool.get::<PmU64>(p1).unwrap());
        });
        assert_eq!(s, AccessStats::default());
        return;
    }
    let s = one_op(|| _ = pool.get::<PmU64>(p0).unwrap().load(Ordering::Acquire));
    assert_eq!(s, stats(1, 1, 0, 0, 0));
}

#[test]
#[cfg_attr(not(feature = "accounting"), ignore = "accounting compiled out")]
fn flushes_and_fences_count_in_adr_not_in_eadr() {
    let _s = serial(true);
    let (adr, [a0, _]) = pool(PersistMode::Adr);
    let w: &PmU64 = adr.get(a0).unwrap();
    let s = one_op(|| adr.persist_obj(w));
    assert_eq!((s.flushes, s.fences, s.ops), (1, 1, 1));
    let s = one_op(|| {
        adr.flush(adr.resolve(at(a0, 60)), 70); // 3 lines
        adr.flush(adr.resolve(a0), 0); // nothing
        adr.fence();
        adr.fence();
    });
    assert_eq!((s.flushes, s.fences), (3, 2));

    let (eadr, [e0, _]) = pool(PersistMode::Eadr);
    let w: &PmU64 = eadr.get(e0).unwrap();
    let s = one_op(|| {
        w.store(3, Ordering::Release);
        eadr.persist_obj(w);
        eadr.flush(eadr.resolve(e0), 4096);
        eadr.fence();
    });
    assert_eq!((s.flushes, s.fences), (0, 0), "eADR issues no flushes or fences: {s:?}");
    assert_eq!(s.writes_local, 1);
}

/// Reads one word in each of `n` consecutive lines from `p`.
fn read_lines(pool: &Pool, p: PPtr, n: u64) -> Duration {
    let t = Instant::now();
    for i in 0..n {
        pool.get::<PmU64>(at(p, i * LINE as u64)).unwrap().load(Ordering::Acquire);
    }
    t.elapsed()
}

#[test]
fn latency_emulation_charges_first_touches() {
    let _s = serial(false);
    let (pool, [p0, p1]) = pool(PersistMode::Adr);
    const N: u64 = 200;
    const NS: u32 = 20_000;
    let slow = Duration::from_nanos(N * u64::from(NS));

    if !account::COMPILED {
        // Compiled out: installing a model does nothing, and nothing is delayed.
        account::set_latency(LatencyModel { read_local_ns: NS, ..LatencyModel::NONE });
        assert!(account::latency().is_none());
        let before = account::thread_emulated_ns();
        read_lines(&pool, p0, N);
        assert_eq!(account::thread_emulated_ns(), before, "latency compiled out, yet charged");
        return;
    }
    // Charged latency is checked exactly through the per-thread counter; wall time only as a
    // lower bound (a busy-wait never ends early, but a loaded machine can stretch anything).
    let charged = |f: &mut dyn FnMut() -> Duration| {
        let before = account::thread_emulated_ns();
        let took = f();
        (account::thread_emulated_ns() - before, took)
    };
    let full = N * u64::from(NS);
    account::set_latency(LatencyModel { read_local_ns: NS, ..LatencyModel::NONE });
    assert_eq!(account::latency().read_local_ns, NS);
    account::op_discard();
    let (ns, first) = charged(&mut || read_lines(&pool, p0, N));
    assert_eq!(ns, full, "{N} local first touches must each be charged");
    assert!(first >= slow, "{N} local first touches took {first:?}, want ≥ {slow:?}");
    // Touched again within the same operation: not charged again.
    let (ns, _) = charged(&mut || read_lines(&pool, p0, N));
    assert_eq!(ns, 0, "repeated touches were charged");
    // Remote lines are not charged by a local-only model.
    let (ns, _) = charged(&mut || read_lines(&pool, p1, N));
    assert_eq!(ns, 0, "remote touches were charged by a local-only model");
    account::op_end();
    // A new operation pays again.
    let (ns, next) = charged(&mut || read_lines(&pool, p0, N));
    assert_eq!(ns, full, "the next operation was not charged");
    assert!(next >= slow, "next operation took {next:?}");
    account::op_end();

    account::set_latency(LatencyModel { read_remote_ns: NS, ..LatencyModel::NONE });
    account::op_discard();
    let (ns, remote) = charged(&mut || read_lines(&pool, p1, N));
    assert_eq!(ns, full, "remote first touches were not charged");
    assert!(remote >= slow, "{N} remote first touches took {remote:?}");
    let (ns, _) = charged(&mut || read_lines(&pool, at(p0, 64 << 10), N));
    assert_eq!(ns, 0, "local touches were charged by a remote-only model");
    account::op_end();

    // Writes are charged by the write figures, once per line and operation.
    account::set_latency(LatencyModel { write_remote_ns: NS, ..LatencyModel::NONE });
    account::op_discard();
    let (ns, writes) = charged(&mut || {
        let t = Instant::now();
        for i in 0..N {
            let w: &PmU64 = pool.get(at(p1, (64 << 10) + i * LINE as u64)).unwrap();
            w.store(i, Ordering::Release);
            w.store(i + 1, Ordering::Release);
        }
        t.elapsed()
    });
    assert!(writes >= slow, "{N} remote first writes took {writes:?}");
    assert_eq!(ns, full, "each line's first write is charged once, second writes not at all");
    account::op_end();

    account::set_latency(LatencyModel::NONE);
    assert!(account::latency().is_none());
    account::op_discard();
    let (ns, _) = charged(&mut || read_lines(&pool, at(p0, 128 << 10), N));
    account::op_end();
    assert_eq!(ns, 0, "no latency model, yet reads were charged");
}

#[test]
#[cfg_attr(not(feature = "accounting"), ignore = "accounting compiled out")]
fn a_split_counts_the_lines_so_far_but_no_operation() {
    let _s = serial(true);
    let (pool, [p0, p1]) = pool(PersistMode::Adr);
    account::op_discard();
    let before = account::thread_stats();
    pool.get::<PmU64>(p0).unwrap().load(Ordering::Acquire);
    pool.get::<PmU64>(p1).unwrap().store(1, Ordering::Release);
    account::op_split();
    let first = account::thread_stats().since(&before);
    assert_eq!(first, stats(0, 1, 0, 0, 1), "lines counted, no operation");
    // After the split de-duplication starts afresh: the same line counts again.
    pool.get::<PmU64>(p0).unwrap().load(Ordering::Acquire);
    account::op_end();
    assert_eq!(account::thread_stats().since(&before), stats(1, 2, 0, 0, 1));
}

#[test]
#[cfg_attr(not(feature = "accounting"), ignore = "accounting compiled out")]
fn smo_scope_attributes_lines_and_flushes_to_the_smo_share() {
    let _s = serial(true);
    let (pool, [p0, _]) = pool(PersistMode::Adr);
    let w: [&PmU64; 4] = std::array::from_fn(|i| pool.get(at(p0, 64 * i as u64)).unwrap());
    let s = one_op(|| {
        w[0].store(1, Ordering::Release); // the operation's own line
        pool.persist_obj(w[0]);
        let outer = account::smo_scope();
        w[1].store(1, Ordering::Release);
        {
            let _inner = account::smo_scope(); // nested (helping another SMO)
            w[2].store(1, Ordering::Release);
            w[0].load(Ordering::Acquire); // a line the operation wrote, read inside
        }
        pool.persist_obj(w[2]);
        drop(outer);
        w[3].store(1, Ordering::Release); // after the scope: the operation's again
        w[1].load(Ordering::Acquire); // read outside: the write stays the SMO's, not the read
    });
    assert_eq!((s.writes(), s.reads(), s.flushes), (4, 2, 2), "{s:?}");
    assert_eq!((s.smo_writes, s.smo_reads, s.smo_flushes), (2, 1, 1), "{s:?}");
    // A line written inside and outside the scope is the operation's own.
    let s = one_op(|| {
        let _scope = account::smo_scope();
        w[2].store(3, Ordering::Release);
        drop(_scope);
        w[2].store(4, Ordering::Release);
    });
    assert_eq!((s.writes(), s.smo_writes), (1, 0), "{s:?}");
    // No scope open: nothing in the SMO share.
    let s = one_op(|| w[1].store(2, Ordering::Release));
    assert_eq!((s.writes(), s.smo_writes), (1, 0));
}

#[test]
#[cfg_attr(not(feature = "accounting"), ignore = "accounting compiled out")]
fn repeated_accesses_to_one_line_take_the_fast_path_without_changing_counts() {
    let _s = serial(true);
    let (pool, [p0, _]) = pool(PersistMode::Adr);
    let w: [&PmU64; 2] = std::array::from_fn(|i| pool.get(at(p0, 8 * i as u64)).unwrap());
    // A line read inside a scope, then again outside it: the operation's own read.
    let s = one_op(|| {
        let scope = account::smo_scope();
        w[0].load(Ordering::Acquire);
        drop(scope);
        w[1].load(Ordering::Acquire); // same line
    });
    assert_eq!((s.reads(), s.smo_reads), (1, 0), "{s:?}");
    // Read, read again, then write the same line: one line read and one written.
    let s = one_op(|| {
        w[0].load(Ordering::Acquire);
        w[1].load(Ordering::Acquire);
        w[1].store(5, Ordering::Release);
        w[0].store(6, Ordering::Release);
    });
    assert_eq!((s.reads(), s.writes()), (1, 1), "{s:?}");
    // The next operation counts the line again, though it was the last one touched.
    let s = one_op(|| {
        w[0].load(Ordering::Acquire);
    });
    assert_eq!(s.reads(), 1, "{s:?}");
}

#[test]
#[cfg_attr(not(feature = "accounting"), ignore = "accounting compiled out")]
fn large_operations_still_count_each_line_once() {
    // Past a few dozen lines the de-duplication switches from a linear search to a hash index:
    // repeats, reads after writes and both nodes must count exactly as in a small operation.
    let _s = serial(true);
    let (pool, [p0, p1]) = pool(PersistMode::Adr);
    let word = |p: PPtr, i: u64| -> &PmU64 { pool.get(at(p, i * LINE as u64)).unwrap() };
    let n = 300u64;
    let s = one_op(|| {
        for round in 0..3 {
            for i in 0..n {
                // Out of order (a stride coprime to n), so the last-line shortcut rarely hits.
                let j = (i * 7) % n;
                word(p0, j).load(Ordering::Acquire);
                word(p1, j).load(Ordering::Acquire);
                if round == 1 && j % 2 == 0 {
                    word(p0, j).store(j, Ordering::Release);
                }
            }
        }
    });
    assert_eq!(s, stats(1, n, n, n / 2, 0));
    // The index is per operation: the next one counts the lines afresh.
    let s = one_op(|| {
        for i in 0..n {
            word(p1, i).load(Ordering::Acquire);
        }
    });
    assert_eq!(s, stats(1, 0, n, 0, 0));
}

#[test]
#[cfg_attr(not(feature = "accounting"), ignore = "accounting compiled out")]
fn cache_models_see_every_thread_access_and_flush_by_node() {
    use numakv_pmem::cachemodel::{CacheConfig, FlushKind};
    let _s = serial(true);
    let (pool, [p0, p1]) = pool(PersistMode::Adr);
    let w0: &PmU64 = pool.get(p0).unwrap();
    let w1: &PmU64 = pool.get(p1).unwrap();
    let clwb = CacheConfig { bytes_per_node: 1 << 20, ways: 16, flush: FlushKind::Clwb };
    account::start_cache_models(&[clwb.with_flush(FlushKind::Clflush), clwb]);
    one_op(|| {
        w1.store(1, Ordering::Release); // node 0 writes a node-1 line: remote read for ownership
        pool.persist_obj(w1); // written back to node 1: remote
        w1.load(Ordering::Acquire); // clflush: read again (remote); clwb: hit
        w0.load(Ordering::Acquire); // local miss
    });
    // A node-1 thread reads both lines: w1 is local (in its memory), w0 remote.
    std::thread::scope(|s| {
        s.spawn(|| {
            set_current_node(1);
            w1.load(Ordering::Acquire);
            w0.load(Ordering::Acquire);
            account::op_end();
        });
    });
    let got = account::stop_cache_models();
    assert_eq!(got.len(), 2);
    let (cfg, f) = got[0];
    assert_eq!(cfg.flush, FlushKind::Clflush);
    assert_eq!((f.memory_reads_remote, f.writebacks_remote, f.hits), (3, 1, 0), "{f:?}");
    assert_eq!((f.memory_reads_local, f.transfers_remote), (2, 0), "{f:?}");
    let (_, k) = got[1];
    assert_eq!((k.memory_reads_remote, k.writebacks_remote, k.hits), (2, 1, 1), "{k:?}");
    // Stopped: nothing is replayed any more, and a second stop returns no models.
    one_op(|| _ = w0.load(Ordering::Acquire));
    assert!(account::stop_cache_models().is_empty());
}
