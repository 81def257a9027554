//! Forced schedules of Nap's switch (pause points listed in the crate docs).

mod common;

use std::sync::Arc;

use numakv_fastfair::FastFair;
use numakv_index::{Engine, Index};
use numakv_nap::{phase, Nap};
use numakv_pmem::failpoint::{Pause, Scenario};
use numakv_pmem::{Pool, PoolConfig};

type N = Nap<FastFair>;

/// Waits until a switch has published its NAL and waits for grace period 1; on a timeout the
/// parked thread is released first, so the failing test does not hang on its scope.
fn wait_for_grace_period_1(e: &N, pause: &Pause) {
    let t0 = std::time::Instant::now();
    while e.switch_phase() != phase::FLUSH {
        if t0.elapsed().as_secs() >= 20 {
            pause.release();
            panic!("the switch never reached its grace period");
        }
        std::thread::yield_now();
    }
}

fn pool() -> Arc<Pool> {
    Pool::volatile(PoolConfig::new(N::engine_id(), 64 << 20)).expect("pool")
}

/// A switch installs the first NAL (no previous one) while a writer whose snapshot still routes
/// the key to the raw index is parked just before its raw write. A lookup of the key in that
/// window finds the new NAL's entry unresolved: it must read through to the raw index, not cache
/// the raw value as final — the parked writer is about to change it. Once the writer returns
/// (its write acknowledged) and the switch is over, lookups return the written value, and the
/// NAL's later writes build on it.
#[test]
fn lookup_during_the_first_grace_period_does_not_cache_a_value_a_raw_write_replaces() {
    let sc = Scenario::setup();
    let e = N::create(pool(), &common::manual_options()).expect("create");
    e.upsert(5, 1).expect("load");
    let pause = sc.pause("nap.write.raw_routed");
    std::thread::scope(|t| {
        let e = &e;
        let writer = t.spawn(move || e.upsert(5, 2).expect("writer upsert"));
        pause.wait_parked();
        let switch = t.spawn(move || e.switch_to(&[5]).expect("switch"));
        // The switch has published the NAL and now waits for the parked writer's operation.
        wait_for_grace_period_1(e, &pause);
        // Not yet acknowledged: either value is right here.
        let early = e.get(5);
        pause.release(); // before asserting: a failure must not strand the parked writer
        let early = early.expect("get");
        assert!(matches!(early, Some(1) | Some(2)), "get during the switch: {early:?}");
        writer.join().expect("writer");
        switch.join().expect("switch thread");
    });
    assert_eq!(e.hot_keys(), vec![5], "key 5 is in the NAL");
    assert_eq!(e.get(5).expect("get"), Some(2), "the acknowledged raw write was lost");
    // A NAL write that reads the value (update: only if present) builds on the right one.
    assert!(e.update(5, 3).expect("update"));
    e.switch_to(&[]).expect("switch back");
    assert_eq!(e.get(5).expect("get"), Some(3));
    e.check().expect("check");
}

/// docs/design.md "Nap", our addition: writes into a new NAL wait for its first grace period.
/// A type-① writer (its snapshot predates the NAL) is parked just before inserting a key into the
/// raw index while a switch installs a NAL over that key. A type-② insert of the same key must
/// wait until the parked insert is done and then see it (return `false`): had it written the NAL
/// at once, both inserts would return `true` and the raw one would be lost.
#[test]
fn a_write_into_a_new_nal_waits_for_a_writer_that_has_not_seen_it() {
    let sc = Scenario::setup();
    let e = N::create(pool(), &common::manual_options()).expect("create");
    let pause = sc.pause_thread("nap.write.raw_routed", "old-snapshot");
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|t| {
        let e = &e;
        let first = std::thread::Builder::new()
            .name("old-snapshot".into())
            .spawn_scoped(t, move || e.insert(9, 1).expect("first insert"))
            .expect("spawn");
        pause.wait_parked();
        let switch = t.spawn(move || e.switch_to(&[9]).expect("switch"));
        wait_for_grace_period_1(e, &pause);
        let done = &done;
        let second = t.spawn(move || {
            let r = e.insert(9, 2).expect("second insert");
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            r
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        let finished_early = done.load(std::sync::atomic::Ordering::SeqCst);
        // Released before asserting: a failed assertion must not leave the scope waiting for a
        // parked thread.
        pause.release();
        assert!(
            !finished_early,
            "an insert into the new NAL finished while a writer that has not seen it was parked"
        );
        assert!(first.join().expect("first"), "the first insert found the key present");
        assert!(!second.join().expect("second"), "both inserts of key 9 returned true");
        switch.join().expect("switch thread");
    });
    assert_eq!(e.get(9).expect("get"), Some(1));
    e.switch_to(&[]).expect("switch back");
    assert_eq!(e.get(9).expect("get"), Some(1));
    e.check().expect("check");
}

/// Waits until the switch, released from `nap.switch.pre_flush`, has left phase 2 (for phase 3,
/// or straight to idle when it does not wait for anything); on a timeout every pause is released
/// first, so the failing test does not hang on its scope.
fn wait_past_flush(e: &N, pauses: &[&Pause]) {
    let t0 = std::time::Instant::now();
    while e.switch_phase() == phase::FLUSH {
        if t0.elapsed().as_secs() >= 20 {
            pauses.iter().for_each(|q| q.release());
            panic!("the switch never finished flushing pre");
        }
        std::thread::yield_now();
    }
}

/// How long a test lets a thread run before it checks that the thread is (still) waiting.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(50);

/// Phase 2 (Route::WaitPre): a switch stands before flushing `pre` (NAL `[5]`, which holds the
/// newer value 10 of key 5; the raw index still has 1). A write of key 5, now only in `pre`, must
/// wait until `pre` is flushed and cleared, then write the raw index: written at once, the flush
/// of `pre`'s older value would overwrite it.
#[test]
fn a_write_of_a_key_only_in_pre_waits_for_the_flush() {
    let sc = Scenario::setup();
    let e = N::create(pool(), &common::manual_options()).expect("create");
    e.upsert(5, 1).expect("load");
    e.switch_to(&[5]).expect("switch");
    e.upsert(5, 10).expect("NAL write");
    let pause = sc.pause("nap.switch.pre_flush");
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|t| {
        let (e, done) = (&e, &done);
        let switch = t.spawn(move || e.switch_to(&[6]).expect("switch"));
        pause.wait_parked(); // (cur, pre) = ([6], [5]); [5] not flushed
        let writer = t.spawn(move || {
            e.upsert(5, 20).expect("writer upsert");
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        std::thread::sleep(SETTLE);
        let finished_early = done.load(std::sync::atomic::Ordering::SeqCst);
        pause.release(); // before asserting: a failure must not strand the parked switch
        assert!(!finished_early, "a write of a key only in pre finished before pre was flushed");
        writer.join().expect("writer");
        switch.join().expect("switch thread");
    });
    assert_eq!(e.get(5).expect("get"), Some(20), "the flush of pre overwrote a later write");
    e.switch_to(&[]).expect("switch back");
    assert_eq!(e.get(5).expect("get"), Some(20));
    e.check().expect("check");
}

/// Phase 3 (grace period 2) and a scan merging raw chunks with NAL keys: a scan took its
/// snapshot with `pre` = NAL `[5, 6]` (5 updated to 50, 6 removed there; the raw index still has
/// 5 = 5, 6 = 6) and read its raw chunk before the flush. Parked there, the switch flushes `pre`,
/// unpublishes it and must then wait for the scan before freeing it. The scan's result has each
/// key once, with `pre`'s values (5 = 50, no 6), not the raw chunk's stale ones.
#[test]
fn a_scan_holding_pre_delays_its_recycling_and_sees_its_values() {
    let sc = Scenario::setup();
    let e = N::create(pool(), &common::manual_options()).expect("create");
    for k in 1..=10 {
        e.insert(k, k).expect("load");
    }
    e.switch_to(&[5, 6]).expect("switch");
    e.upsert(5, 50).expect("NAL write");
    assert!(e.remove(6).expect("NAL remove"));
    let flush = sc.pause("nap.switch.pre_flush");
    let scan = sc.pause_thread("nap.scan.raw_chunk", "scanner");
    std::thread::scope(|t| {
        let e = &e;
        let switch = t.spawn(move || e.switch_to(&[7]).expect("switch"));
        flush.wait_parked(); // (cur, pre) = ([7], [5, 6])
        let scanner = std::thread::Builder::new()
            .name("scanner".into())
            .spawn_scoped(t, move || {
                let mut out = Vec::new();
                e.scan(1, 100, &mut out).expect("scan");
                out
            })
            .expect("spawn");
        scan.wait_parked(); // its snapshot holds pre; its raw chunk has 5 = 5, 6 = 6
        flush.release();
        wait_past_flush(e, &[&scan]);
        std::thread::sleep(SETTLE);
        let phase_then = e.switch_phase();
        if phase_then != phase::RECYCLE {
            // The switch freed `pre` under the parked scan: releasing it would be a
            // use-after-free, keeping it parked would hang the scope. Say so and stop.
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr().lock(),
                "FAILED: the switch recycled pre (phase now {phase_then}) while a scan holding it \
                 was parked; aborting rather than releasing the scan into freed memory"
            );
            std::process::abort();
        }
        scan.release();
        let out = scanner.join().expect("scanner");
        let want: Vec<(u64, u64)> =
            (1..=10u64).filter(|&k| k != 6).map(|k| (k, if k == 5 { 50 } else { k })).collect();
        assert_eq!(out, want, "scan across the flush of pre");
        switch.join().expect("switch thread");
    });
    assert_eq!(e.get(5).expect("get"), Some(50));
    assert_eq!(e.get(6).expect("get"), None);
    e.check().expect("check");
}

/// Phase 2/3 and a write into `cur` of a key also in `pre` whose `cur` entry is unresolved: key 5
/// was removed in `pre` (the raw index still has 5 = 1 until the flush). An insert into `cur`
/// resolves from `pre` (absent: the insert succeeds) and is parked before persisting while the
/// switch flushes `pre` (removing 5 from the raw index) and unpublishes it; grace period 2 waits
/// for the insert. After the switch, and after `cur` is flushed in turn, 5 = the insert's value.
#[test]
fn a_write_into_cur_resolving_from_pre_survives_the_flush_of_pre() {
    let sc = Scenario::setup();
    let e = N::create(pool(), &common::manual_options()).expect("create");
    e.upsert(5, 1).expect("load");
    e.switch_to(&[5]).expect("switch");
    assert!(e.remove(5).expect("NAL remove"));
    let flush = sc.pause("nap.switch.pre_flush");
    let resolved = sc.pause_thread("nap.write.nal_resolved", "writer");
    std::thread::scope(|t| {
        let e = &e;
        let switch = t.spawn(move || e.switch_to(&[5, 6]).expect("switch"));
        flush.wait_parked(); // (cur, pre) = ([5, 6], [5]); cur writable, its 5 unresolved
        let writer = std::thread::Builder::new()
            .name("writer".into())
            .spawn_scoped(t, move || e.insert(5, 20).expect("insert"))
            .expect("spawn");
        resolved.wait_parked(); // resolved from pre under the entry's lock, not persisted
        flush.release();
        wait_past_flush(e, &[&resolved]);
        std::thread::sleep(SETTLE);
        let phase_then = e.switch_phase();
        resolved.release(); // before asserting
        assert_eq!(
            phase_then,
            phase::RECYCLE,
            "the switch recycled pre while a write that resolved from it was parked"
        );
        assert!(writer.join().expect("writer"), "insert of a key pre had removed returned false");
        switch.join().expect("switch thread");
    });
    assert_eq!(e.get(5).expect("get"), Some(20));
    e.switch_to(&[]).expect("switch back");
    assert_eq!(e.get(5).expect("get"), Some(20));
    e.check().expect("check");
}

/// The lookup cache (the path fixed in 266c117): while `pre` exists, an unresolved `cur` entry is
/// read through `pre` and not cached. Here `cur` is writable (grace period 1 passed) but `pre`
/// = NAL `[5]` (5 = 10) is not flushed (the raw index still has 1): a lookup must return 10, and
/// must not fill the cache from the raw index — a cached 1 would outlive the flush.
#[test]
fn a_lookup_caches_an_unresolved_entry_only_once_pre_is_gone() {
    let sc = Scenario::setup();
    let e = N::create(pool(), &common::manual_options()).expect("create");
    e.upsert(5, 1).expect("load");
    e.switch_to(&[5]).expect("switch");
    e.upsert(5, 10).expect("NAL write");
    let flush = sc.pause("nap.switch.pre_flush");
    std::thread::scope(|t| {
        let e = &e;
        let switch = t.spawn(move || e.switch_to(&[5, 6]).expect("switch"));
        flush.wait_parked(); // (cur, pre) = ([5, 6], [5]); cur writable, its 5 unresolved
        let during = e.get(5);
        flush.release(); // before asserting
        assert_eq!(during.expect("get"), Some(10), "lookup during the flush of pre");
        switch.join().expect("switch thread");
    });
    // `pre` is gone: this lookup caches; a value cached during the flush would show here.
    assert_eq!(e.get(5).expect("get"), Some(10), "lookup after the switch");
    assert!(e.update(5, 11).expect("update"));
    e.switch_to(&[]).expect("switch back");
    assert_eq!(e.get(5).expect("get"), Some(11));
    e.check().expect("check");
}

/// A stalled switch (fail point `nap.switch.flush`: the flush of `pre` fails as out of space): a
/// writer of a key only in `pre`, blocked while the switch stood before its flush, gets the
/// switch's error instead of waiting forever; finishing the switch later (the next switch
/// finishes the stalled one first) unblocks writes, and nothing written is lost.
#[test]
fn writers_blocked_on_a_stalled_flush_get_its_error() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let sc = Scenario::setup();
    let e = N::create(pool(), &common::manual_options()).expect("create");
    e.upsert(5, 1).expect("load");
    e.switch_to(&[5]).expect("switch");
    e.upsert(5, 10).expect("NAL write");
    let fail = sc.fail("nap.switch.flush", None);
    let flush = sc.pause("nap.switch.pre_flush");
    let done = AtomicBool::new(false);
    std::thread::scope(|t| {
        let (e, done) = (&e, &done);
        let switch = t.spawn(move || e.switch_to(&[6]));
        flush.wait_parked();
        let writer = t.spawn(move || {
            let r = e.upsert(5, 20);
            done.store(true, SeqCst);
            r
        });
        std::thread::sleep(SETTLE);
        let finished_early = done.load(SeqCst);
        flush.release(); // the flush now fails: the switch stalls
        let switched = switch.join().expect("switch thread");
        let t0 = std::time::Instant::now();
        while !done.load(SeqCst) && t0.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let hung = !done.load(SeqCst);
        // Before asserting: a writer still waiting is freed by finishing the switch.
        fail.disarm();
        if hung {
            e.switch_to(&[6]).expect("finishing the stalled switch");
        }
        let written = writer.join().expect("writer");
        assert!(!finished_early, "a write of a key only in pre finished before the flush");
        assert!(!hung, "a writer blocked on pre hung on a stalled switch");
        assert!(
            matches!(
                switched,
                Err(numakv_index::Error::Pool(numakv_pmem::PoolError::OutOfSpace { .. }))
            ),
            "the switch: {switched:?}"
        );
        assert!(
            matches!(
                written,
                Err(numakv_index::Error::Pool(numakv_pmem::PoolError::OutOfSpace { .. }))
            ),
            "the blocked writer: {written:?}"
        );
    });
    assert_eq!(e.get(5).expect("get"), Some(10), "pre's value while the switch is stalled");
    let r = e.switch_to(&[6]).expect("the next switch finishes the stalled one");
    assert!(r.unchanged && r.flushed == 1, "{r:?}");
    e.upsert(5, 20).expect("upsert after the stall");
    assert_eq!(e.get(5).expect("get"), Some(20));
    e.switch_to(&[]).expect("switch back");
    assert_eq!(e.get(5).expect("get"), Some(20));
    e.check().expect("check");
}

/// A crash while a switch is stalled (fail point `nap.switch.flush`): the durable pointers are
/// `CUR` = new, `PRE` = old, and `cur` has taken writes since (keys also in `pre`, resolved from
/// it, and keys only in `cur`, resolved from the raw index). Recovery flushes `pre`, then `cur`:
/// every acknowledged value comes back, a key only in `pre` keeps `pre`'s value, and no PM leaks.
#[test]
fn a_crash_during_a_stalled_switch_loses_nothing() {
    use numakv_pmem::{CrashOptions, OpenConfig, SimMode};
    let sc = Scenario::setup();
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut cfg = PoolConfig::new(N::engine_id(), 32 << 20);
    cfg.nodes = 2;
    cfg.sim = SimMode::Shadow;
    let pool = Pool::create(tmp.path(), cfg).expect("pool");
    let opts = common::manual_options();
    let e = N::create(Arc::clone(&pool), &opts).expect("create");
    let mut model = std::collections::BTreeMap::new();
    for k in 1..=8u64 {
        e.upsert(k, k).expect("load");
        model.insert(k, k);
    }
    e.switch_to(&[1, 2, 3, 4]).expect("switch");
    e.upsert(1, 10).expect("NAL write"); // only in pre below
    e.upsert(3, 30).expect("NAL write"); // in pre and cur
    assert!(e.remove(4).expect("NAL remove")); // in pre and cur
    model.extend([(1, 10), (3, 30)]);
    model.remove(&4);
    let fail = sc.fail("nap.switch.flush", None);
    assert!(e.switch_to(&[3, 4, 5, 6]).is_err(), "the flush of pre was meant to fail");
    assert!(matches!(
        e.upsert(1, 11),
        Err(numakv_index::Error::Pool(numakv_pmem::PoolError::OutOfSpace { .. }))
    ));
    assert!(e.update(3, 31).expect("update a key of pre and cur"));
    assert!(e.insert(4, 41).expect("insert a key pre removed"));
    e.upsert(5, 50).expect("a key only in cur");
    assert!(e.remove(6).expect("remove a key only in cur"));
    model.extend([(3, 31), (4, 41), (5, 50)]);
    model.remove(&6);
    pool.crash(CrashOptions::STRICT).expect("crash");
    drop(fail);
    drop(e);
    drop(pool);
    let mut oc = OpenConfig::new(N::engine_id());
    oc.sim = SimMode::Shadow;
    let pool = Pool::open(tmp.path(), oc).expect("reopen");
    let (e, _) = N::open(pool, &opts).expect("recover");
    for k in 1..=10u64 {
        assert_eq!(e.get(k).expect("get"), model.get(&k).copied(), "key {k} after the crash");
    }
    let r = e.check().expect("check");
    assert_eq!(r.reachable_blocks, r.allocated_blocks, "leak");
}

/// Times `f` on its own thread; fails (after releasing `pauses`, so the scope can end) when it
/// has not returned within `limit`.
fn timed<'scope, T: Send + 'scope>(
    t: &'scope std::thread::Scope<'scope, '_>,
    what: &str,
    limit: std::time::Duration,
    pauses: &[&Pause],
    f: impl FnOnce() -> T + Send + 'scope,
) -> (T, std::time::Duration) {
    let (tx, rx) = std::sync::mpsc::channel();
    let t0 = std::time::Instant::now();
    let h = t.spawn(move || {
        let r = f();
        let _ = tx.send(t0.elapsed());
        r
    });
    let Ok(took) = rx.recv_timeout(limit) else {
        for p in pauses {
            p.release();
        }
        panic!("{what}: still blocked after {limit:?} while a scan was parked");
    };
    (h.join().expect(what), took)
}

/// Issue 36 (papers/nap.txt §4.5: writes to the new NAL never block on readers): a scan
/// parked between its raw chunk and the merge of the NALs' values (`nap.scan.raw_chunk`) is
/// one operation in flight. Grace period 1 waited for it, so the new NAL stayed unwritable
/// and a hot write (`upsert(5)` after `switch_to([5])`) waited for the whole scan (seen: still
/// blocked after 300 ms; a cold write took 2 µs). A scan never writes, so grace period 1 no
/// longer waits for scans; grace period 2 (freeing the previous NAL a scan may read) still
/// does. Both cases: the first NAL (no previous one) and a switch with a previous NAL, where
/// a write of a key only in the previous NAL waits for its flush, not for the scan either.
/// The hot writes are timed; the bound asserted (1 s) is generous for a loaded machine, the
/// figures are printed (issue: within 10 ms).
#[test]
fn a_hot_write_does_not_wait_for_a_parked_scan() {
    use std::time::Duration;
    let sc = Scenario::setup();
    let limit = Duration::from_secs(1);
    for with_pre in [false, true] {
        let e = N::create(pool(), &common::manual_options()).expect("create");
        for k in 1..=10 {
            e.insert(k, k).expect("load");
        }
        if with_pre {
            e.switch_to(&[7]).expect("first switch");
            e.upsert(7, 77).expect("NAL write");
        }
        let scan = sc.pause_thread("nap.scan.raw_chunk", "scanner");
        std::thread::scope(|t| {
            let e = &e;
            let scanner = std::thread::Builder::new()
                .name("scanner".into())
                .spawn_scoped(t, move || {
                    let mut out = Vec::new();
                    e.scan(1, 100, &mut out).expect("scan");
                    out
                })
                .expect("spawn");
            scan.wait_parked();
            let switch = t.spawn(move || e.switch_to(&[5]).expect("switch"));
            // The switch has published the new NAL (or is already done).
            let t0 = std::time::Instant::now();
            while e.switch_phase() == phase::IDLE && !switch.is_finished() {
                assert!(t0.elapsed() < Duration::from_secs(20), "the switch never started");
                std::thread::yield_now();
            }
            let ((), hot) =
                timed(t, "hot write", limit, &[&scan], move || e.upsert(5, 50).expect("hot write"));
            let mut took = vec![("hot", hot)];
            if with_pre {
                let ((), pre_only) =
                    timed(t, "write of a key only in pre", limit, &[&scan], || {
                        e.upsert(7, 70).expect("pre-only write")
                    });
                took.push(("pre-only", pre_only));
            }
            let ((), cold) =
                timed(t, "cold write", limit, &[&scan], move || e.upsert(9, 90).expect("cold"));
            took.push(("cold", cold));
            eprintln!("with a previous NAL: {with_pre}; writes during a parked scan: {took:?}");
            assert_eq!(e.get(5).expect("get"), Some(50));
            scan.release();
            let out = scanner.join().expect("scanner");
            // The scan began before every write above: it shows the values it began with.
            let want: Vec<(u64, u64)> =
                (1..=10u64).map(|k| (k, if k == 7 && with_pre { 77 } else { k })).collect();
            assert_eq!(out, want, "the parked scan");
            switch.join().expect("switch thread");
        });
        assert_eq!(e.get(5).expect("get"), Some(50));
        assert_eq!(e.get(7).expect("get"), Some(if with_pre { 70 } else { 7 }));
        assert_eq!(e.get(9).expect("get"), Some(90));
        e.check().expect("check");
    }
}

/// Issue 36: `check()` while a switch is stalled (fail point `nap.switch.flush`) with `pre`
/// still installed. Key 5 is in the raw index, then removed in NAL `[5]`; the switch to
/// `[5, 7]` stalls, so `cur`'s entry for 5 is unresolved and `pre` says absent. Lookups and
/// scans agree on 0 entries; `check()` skipped `cur`'s unresolved entry and, the key seen,
/// `pre`'s as well, counting the raw index's stale 5 (`entries = 1`). Also a key only in
/// `pre` (8, updated there) and one only in `cur` (7, never written).
#[test]
fn check_counts_entries_right_while_a_switch_is_stalled() {
    let sc = Scenario::setup();
    let e = N::create(pool(), &common::manual_options()).expect("create");
    e.upsert(5, 1).expect("load");
    e.upsert(8, 1).expect("load");
    e.switch_to(&[5, 8]).expect("switch");
    assert!(e.remove(5).expect("NAL remove"));
    e.upsert(8, 80).expect("NAL write");
    let fail = sc.fail("nap.switch.flush", None);
    assert!(e.switch_to(&[5, 7]).is_err(), "the flush fails: the switch stalls");
    let mut out = Vec::new();
    e.scan(1, 100, &mut out).expect("scan");
    assert_eq!(out, vec![(8, 80)]);
    assert_eq!(e.get(5).expect("get"), None);
    let r = e.check().expect("check");
    assert_eq!(r.entries, out.len() as u64, "check() while pre is installed: {r:?}");
    fail.disarm();
    e.switch_to(&[5, 7]).expect("the stalled switch finishes");
    assert_eq!(e.check().expect("check").entries, 1);
}

/// Issue 36: phase 3's free of the previous NAL's PC-views fails (fail point
/// `nap.switch.free`, as if the page heap refused it). The switch itself had completed — the
/// previous NAL flushed and unpublished — but it was reported as an error, and `check()`
/// failed for good ("nal pointers": GC still named the NAL). Now the switch succeeds, the
/// views wait for a retry (the next switch), `check()` accepts the pending GC and counts its
/// extents as live, and the retry frees them.
#[test]
fn a_failed_free_of_the_previous_nal_is_retried_not_reported() {
    let sc = Scenario::setup();
    let e = N::create(pool(), &common::manual_options()).expect("create");
    e.upsert(5, 1).expect("load");
    e.switch_to(&[5]).expect("switch");
    e.upsert(5, 50).expect("NAL write");
    let fail = sc.fail("nap.switch.free", Some(1));
    let r = e.switch_to(&[7]);
    fail.disarm();
    let r = r.expect("the switch completed; only the free failed");
    assert_eq!(r.flushed, 1);
    assert_eq!(e.get(5).expect("get"), Some(50));
    let c = e.check().expect("check with the free pending");
    assert_eq!(c.entries, 1);
    assert_eq!(c.reachable_blocks, c.allocated_blocks, "{c:?}");
    let counter = |n: &str| e.stats().counters.iter().find(|c| c.0 == n).map(|c| c.1);
    assert_eq!(counter("nap_recycle_failures"), Some(1));
    e.switch_to(&[]).expect("the next switch retries the free");
    let c = e.check().expect("check after the retry");
    assert_eq!(c.reachable_blocks, c.allocated_blocks, "{c:?}");
    assert_eq!(counter("nap_recycle_pending"), Some(0));
    assert_eq!(e.get(5).expect("get"), Some(50));
}
