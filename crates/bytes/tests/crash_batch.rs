//! Write batches (docs/design.md, "Byte-string layer", Write batches): a crash at every fence of
//! a batch, in ADR and eADR shadow pools, recovers the state before the batch or the state after
//! it, never a mix — and so does a second crash during that recovery; bad arguments and a full
//! store write nothing.

use std::collections::BTreeMap;
use std::path::Path;

use numakv_bytes::{ByteMap, Bytes, WriteBatch};
use numakv_fastfair::FastFair;
use numakv_index::Engine;
use numakv_nbtree::NbTree;
use numakv_pmem::failpoint::Scenario;
use numakv_pmem::{CrashOptions, OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn scale() -> u64 {
    std::env::var("NUMAKV_TEST_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1).max(1)
}

fn shadow_create(dir: &Path, mode: PersistMode, capacity: u64) -> Bytes<FastFair> {
    shadow_create_on::<FastFair>(dir, mode, capacity)
}

fn shadow_create_on<E: Engine>(dir: &Path, mode: PersistMode, capacity: u64) -> Bytes<E>
where
    E::Options: Default,
{
    let mut cfg = PoolConfig::new(numakv_bytes::engine_id::<E>(), capacity);
    cfg.sim = SimMode::Shadow;
    cfg.mode = mode;
    let pool = Pool::create(dir, cfg).expect("create pool");
    Bytes::<E>::create(pool, &Default::default()).expect("create")
}

fn shadow_pool<E: Engine>(dir: &Path) -> std::sync::Arc<Pool> {
    let mut cfg = OpenConfig::new(numakv_bytes::engine_id::<E>());
    cfg.sim = SimMode::Shadow;
    Pool::open(dir, cfg).expect("open pool")
}

/// Reopens; returns the store and (batches rolled forward, rolled back).
fn reopen(dir: &Path) -> (Bytes<FastFair>, (u64, u64)) {
    reopen_on::<FastFair>(dir)
}

fn reopen_on<E: Engine>(dir: &Path) -> (Bytes<E>, (u64, u64))
where
    E::Options: Default,
{
    let (b, report) = Bytes::<E>::open(shadow_pool::<E>(dir), &Default::default()).expect("open");
    let counter = |name: &str| {
        report
            .counters
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, v)| v)
            .unwrap_or_else(|| panic!("open reports {name}"))
    };
    (b, (counter("bytes_batches_rolled_forward"), counter("bytes_batches_rolled_back")))
}

fn contents<E: Engine>(b: &Bytes<E>) -> Model {
    b.scan(b"\0", None, usize::MAX).map(|r| r.expect("scan")).collect()
}

fn user(i: u32) -> Vec<u8> {
    format!("user:{i:010}").into_bytes()
}

/// Cells (`a`, `b`), and 40 keys of one prefix (a tree that splits and shrinks).
fn populate<E: Engine>(b: &Bytes<E>) -> Model {
    let mut m = Model::new();
    let mut put = |k: Vec<u8>, v: Vec<u8>| {
        b.put(&k, &v).expect("put");
        m.insert(k, v);
    };
    put(b"a".to_vec(), b"a0".to_vec());
    put(b"b".to_vec(), vec![b'b'; 300]);
    for i in 0..40 {
        put(user(i), format!("v{i}").into_bytes());
    }
    m
}

/// A batch touching cells, leaves, splits and removals; and the model after it.
fn the_batch(before: &Model) -> (WriteBatch, Model) {
    let mut after = before.clone();
    let mut w = WriteBatch::new();
    let mut put = |w: &mut WriteBatch, k: Vec<u8>, v: Vec<u8>| {
        w.put(&k, &v);
        after.insert(k, v);
    };
    put(&mut w, b"a".to_vec(), b"a1".to_vec());
    put(&mut w, b"c".to_vec(), vec![b'c'; 2000]);
    put(&mut w, user(5), b"five".to_vec());
    for i in 50..60 {
        put(&mut w, user(i), format!("new{i}").into_bytes());
    }
    w.delete(b"b");
    w.delete(b"absent");
    // 16 adjacent keys: a whole leaf of the default limits empties.
    for i in 16..32 {
        w.delete(&user(i));
    }
    after.remove(&b"b"[..]);
    for i in 16..32 {
        after.remove(&user(i));
    }
    (w, after)
}

/// Crashes at fence 1, 2, … of the batch until it completes without reaching the scheduled fence;
/// after each, the store holds `before` or `after` exactly and passes `check`. Every few fences
/// a second crash hits the recovery itself.
fn crash_at_every_fence<E: Engine>(mode: PersistMode, capacity: u64, step: u64)
where
    E::Options: Default,
{
    let name = E::NAME;
    let _serial = Scenario::setup();
    let (mut saw_before, mut saw_after, mut forward, mut back, mut recovery_crashes) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut fence = 1u64;
    let mut round = 0u64;
    loop {
        assert!(fence < 5_000, "the batch never finished without a crash");
        let dir = tempfile::tempdir().expect("tempdir");
        let b = shadow_create_on::<E>(dir.path(), mode, capacity);
        let before = populate(&b);
        let (batch, after) = the_batch(&before);
        b.pool().crash_after_fences(fence, CrashOptions::random(fence)).expect("schedule");
        let result = b.write_batch(&batch);
        if !b.pool().has_crashed() {
            b.pool().cancel_crash();
            result.expect("a batch that no crash interrupted");
            assert_eq!(contents(&b), after, "{name}/{mode:?}: the batch without a crash");
            break;
        }
        drop(b);
        // Every 3rd crash point: crash again inside the recovery (at its k-th fence).
        round += 1;
        if round % 3 == 0 {
            let pool = shadow_pool::<E>(dir.path());
            pool.crash_after_fences(1 + fence % 7, CrashOptions::random(!fence)).expect("schedule");
            let reopened = Bytes::<E>::open(std::sync::Arc::clone(&pool), &Default::default());
            if pool.has_crashed() {
                recovery_crashes += 1;
            } else {
                pool.cancel_crash();
                reopened.expect("open").0.close().expect("close");
            }
        }
        let (b, (f, k)) = reopen_on::<E>(dir.path());
        forward += f;
        back += k;
        let got = contents(&b);
        if got == before {
            saw_before += 1;
        } else if got == after {
            saw_after += 1;
        } else {
            let mixed: Vec<_> = got
                .keys()
                .chain(after.keys())
                .filter(|k| got.get(*k) != before.get(*k))
                .take(5)
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect();
            panic!("{name}/{mode:?}: a crash at fence {fence} left a mix; differs from before: {mixed:?}");
        }
        if fence % 4 == 1 {
            // The structural check (with its leak count) costs more than the rest of a round.
            b.check().expect("check after recovery");
        }
        // The store keeps working, and a later write is not overwritten by anything.
        b.put(b"a", b"later").expect("put after recovery");
        b.close().expect("close");
        let (b, (f, k)) = reopen_on::<E>(dir.path());
        assert_eq!((f, k), (0, 0), "a finished batch was replayed again");
        assert_eq!(b.get(b"a").expect("get").as_deref(), Some(&b"later"[..]));
        drop(b);
        fence += step;
    }
    // Coverage: crashes before the commit, after it (rolled forward), and during recovery.
    assert!(
        saw_before > 0 && saw_after > 0,
        "{name}/{mode:?}: before {saw_before}, after {saw_after}"
    );
    assert!(forward > 0, "{name}/{mode:?}: no crash was rolled forward by recovery");
    assert!(recovery_crashes > 0, "{name}/{mode:?}: no crash hit a recovery");
    eprintln!(
        "{name}/{mode:?}: {fence} fences; before {saw_before}, after {saw_after}, rolled forward \
         {forward}, back {back}, crashes in recovery {recovery_crashes}"
    );
}

#[test]
fn a_crash_at_every_fence_of_a_batch_adr() {
    crash_at_every_fence::<FastFair>(PersistMode::Adr, 4 << 20, 1);
}

#[test]
fn a_crash_at_every_fence_of_a_batch_eadr() {
    crash_at_every_fence::<FastFair>(PersistMode::Eadr, 4 << 20, 1);
}

/// NBTree (eADR only): its writes may wait for a grace period, here with several stripes held.
/// Every third fence at scale 1 (NBTree's pools cost more to create), every fence above.
#[test]
fn a_crash_at_every_fence_of_a_batch_nbtree_eadr() {
    crash_at_every_fence::<NbTree>(PersistMode::Eadr, 32 << 20, if scale() > 1 { 1 } else { 3 });
}

#[test]
fn bad_arguments_write_nothing() {
    // Fail points are process-global: no other test's armed point fires in this one.
    let _serial = Scenario::setup();
    let dir = tempfile::tempdir().expect("tempdir");
    let b = shadow_create(dir.path(), PersistMode::Adr, 16 << 20);
    let before = populate(&b);
    let big_value = vec![0u8; numakv_bytes::MAX_VALUE_LEN + 1];
    let long_key = vec![b'k'; numakv_bytes::MAX_KEY_LEN + 1];
    type Case<'a> = (&'a str, &'a [u8], Option<&'a [u8]>);
    let cases: [Case<'_>; 4] = [
        ("1025-byte key", &long_key, Some(b"x")),
        ("empty key", b"", Some(b"x")),
        ("too large value", b"k", Some(&big_value)),
        ("empty key deleted", b"", None),
    ];
    for (what, k, v) in cases {
        let mut w = WriteBatch::new();
        w.put(b"a", b"changed").put(b"zzz", b"new").delete(&user(3));
        match v {
            Some(v) => w.put(k, v),
            None => w.delete(k),
        };
        w.put(b"after", b"x");
        assert!(w.validate().is_err(), "{what}: validate");
        assert!(b.write_batch(&w).is_err(), "{what}: accepted");
        assert_eq!(contents(&b), before, "{what}: something was written");
    }
    // A precondition that fails writes nothing either.
    let mut w = WriteBatch::new();
    w.put(b"new1", b"1").put(b"new2", b"2").require_absent(b"new1").require_absent(b"a");
    let out = b.write_batch(&w).expect("batch");
    assert!(!out.applied);
    assert_eq!(out.existed, [false, false]);
    assert_eq!(contents(&b), before);
    b.check().expect("check");
}

/// A store filled up: every batch fails (its log or its writes find no room) and leaves the
/// store as it was; the store stays usable.
#[test]
fn a_full_store_writes_nothing() {
    // Fail points are process-global: no other test's armed point fires in this one.
    let _serial = Scenario::setup();
    let dir = tempfile::tempdir().expect("tempdir");
    let b = shadow_create(dir.path(), PersistMode::Adr, 8 << 20);
    let mut model = Model::new();
    // Fill with 4 KiB values (each key its own prefix) until the store is full.
    let mut i = 0u32;
    loop {
        let k = format!("{i:08}").into_bytes();
        match b.put(&k, &[7u8; 4096]) {
            Ok(()) => {
                model.insert(k, vec![7u8; 4096]);
                i += 1;
            }
            Err(e) if e.is_out_of_space() => break,
            Err(e) => panic!("fill: {e}"),
        }
    }
    assert!(i > 100, "filled only {i} values");
    for round in 0..(10 * scale() as u32) {
        let mut w = WriteBatch::new();
        for j in 0..16u32 {
            w.put(format!("batch:{round:04}:{j}").as_bytes(), &[round as u8; 1500]);
        }
        w.delete(format!("{:08}", round).as_bytes());
        let e = b.write_batch(&w).expect_err("a batch fit in a full store");
        assert!(e.is_out_of_space(), "round {round}: {e}");
        assert_eq!(contents(&b), model, "round {round}: a failed batch wrote something");
    }
    b.check().expect("check");
    drop(b);
    let (b, (f, k)) = reopen(dir.path());
    assert_eq!((f, k), (0, 0));
    assert_eq!(contents(&b), model);
}

/// A write of the batch fails (fail point `bytes.batch.apply`: out of space) after `k` keys
/// were written: the batch rolls back, the store holds the state before, and the error comes
/// back. Every third `k` a crash hits the rollback itself: the next open finishes it — forward
/// if the crash came before the log's state word said "rolling back", else back.
#[test]
fn a_failed_write_rolls_the_batch_back() {
    let mut crashed_rollbacks = 0;
    let entries = {
        let (w, _) = the_batch(&Model::new());
        let keys: std::collections::BTreeSet<&[u8]> = w.ops().map(|(k, _)| k).collect();
        keys.len()
    };
    for k in (0..entries - 1).step_by(if scale() > 1 { 1 } else { 3 }) {
        let scenario = Scenario::setup();
        let dir = tempfile::tempdir().expect("tempdir");
        let b = shadow_create(dir.path(), PersistMode::Adr, 16 << 20);
        let before = populate(&b);
        let (batch, after) = the_batch(&before);
        let seen = std::sync::atomic::AtomicUsize::new(0);
        let after_k = scenario.pause_when("bytes.batch.applied", move || {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == k
        });
        let crash = k % 3 == 0;
        let result = std::thread::scope(|s| {
            let batcher = s.spawn(|| b.write_batch(&batch));
            after_k.wait_parked();
            let _fail = scenario.fail("bytes.batch.apply", Some(1));
            if crash {
                b.pool()
                    .crash_after_fences(1 + (k as u64 % 4), CrashOptions::random(k as u64))
                    .expect("schedule");
            }
            after_k.release();
            batcher.join().expect("batch thread")
        });
        drop(scenario);
        if crash && b.pool().has_crashed() {
            drop(b);
            let (b, (f, back)) = reopen(dir.path());
            // Before the rollback's state word was durable the batch is still committed: the
            // next open rolls it forward (the caller never saw an answer); after, back.
            crashed_rollbacks += back;
            let want = if f == 1 { &after } else { &before };
            assert_eq!(&contents(&b), want, "k {k}: a crash in the rollback left a mix");
            b.check().expect("check");
            continue;
        }
        let e = result.expect_err("the injected failure");
        assert!(e.is_out_of_space(), "k {k}: {e}");
        assert_eq!(contents(&b), before, "k {k}: the rollback left a mix");
        b.check().expect("check");
        b.put(b"a", b"works").expect("the store stays usable");
        drop(b);
        let (_, (f, back)) = reopen(dir.path());
        assert_eq!((f, back), (0, 0), "k {k}: a rolled-back batch was left in the log");
    }
    assert!(crashed_rollbacks > 0, "no crash hit a rollback");
}

/// Batches from two threads race single puts and deletes of other keys of the same prefixes
/// (same stripes) and reads of the batches' keys: nothing deadlocks, every group a batch
/// writes is whole at the end, and the structure checks.
#[test]
fn batches_race_single_writes_of_the_same_prefixes() {
    // Fail points are process-global: hold the scenario lock so that another test's armed
    // `bytes.batch.apply` (an injected out-of-space) cannot fire in these batches.
    let _serial = Scenario::setup();
    let pool = Pool::volatile(PoolConfig::new(numakv_bytes::engine_id::<FastFair>(), 64 << 20))
        .expect("pool");
    let b = Bytes::<FastFair>::create(pool, &Default::default()).expect("create");
    let rounds = 1000 * scale() as u32;
    std::thread::scope(|s| {
        for t in 0..2u32 {
            let b = &b;
            s.spawn(move || {
                for i in 0..rounds {
                    let mut w = WriteBatch::new();
                    for j in 0..6u32 {
                        // grp:000T:J shares its 8-byte prefix with the single writers' keys.
                        w.put(format!("grp:{t:04}:{j}").as_bytes(), format!("{i}").as_bytes());
                    }
                    if i % 5 == 4 {
                        w.delete(format!("grp:{t:04}:5").as_bytes());
                    }
                    b.write_batch(&w).expect("batch");
                }
            });
        }
        for t in 0..2u32 {
            let b = &b;
            s.spawn(move || {
                for i in 0..rounds * 3 {
                    let k = format!("grp:{t:04}:x{}", i % 40);
                    if i % 4 == 3 {
                        b.delete(k.as_bytes()).expect("delete");
                    } else {
                        b.put(k.as_bytes(), &[i as u8; 40]).expect("put");
                    }
                    let _ = b.get(format!("grp:{t:04}:0").as_bytes()).expect("get");
                }
            });
        }
    });
    for t in 0..2u32 {
        let vals: Vec<_> =
            (0..5u32).map(|j| b.get(format!("grp:{t:04}:{j}").as_bytes()).expect("get")).collect();
        assert!(vals.iter().all(|v| *v == vals[0] && v.is_some()), "group {t}: {vals:?}");
    }
    b.check().expect("check");
}
