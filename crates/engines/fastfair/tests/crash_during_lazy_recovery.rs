//! Power failures (ADR, shadow) during the background recovery of a lazy open — in its node
//! repairs, orphan links and NSM page frees — and many crash rounds in a row in which the crash
//! falls anywhere: in operations, in the background pass, or in both at once. After each the
//! next (lazy) open serves the acknowledged contents at once, and once its own background pass
//! is done `check()` passes with reachable blocks equal to allocated blocks.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{
    apply_all, check_contents, model_apply, random_op, reopen, resolve, run_to_crash, scrambled,
    tree_apply, verify_recovered, Op, Rng,
};
use numakv_fastfair::{FastFair, FastFairOptions};
use numakv_index::{Engine, Index};
use numakv_pmem::{CrashOptions, OpenConfig, Pool, SimMode};

fn open_pool(dir: &Path) -> Arc<Pool> {
    let mut c = OpenConfig::new(FastFair::engine_id());
    c.sim = SimMode::Shadow;
    Pool::open(dir, c).unwrap()
}

/// A closed store of 2000 random keys in `dir` (4 MiB: copied for every crash point);
/// returns its contents.
fn loaded_store(dir: &Path) -> BTreeMap<u64, u64> {
    let t = common::create_small(dir, SimMode::Shadow, 256, 4 << 20);
    let mut model = BTreeMap::new();
    let mut rng = Rng(0x5eed);
    apply_all(&t, &mut model, (0..2_000).map(|_| Op::Insert(1 + rng.below(1_000_000), rng.next())));
    t.close().unwrap();
    model
}

/// The store `dir` (a copy of [`loaded_store`]'s) crashed at the `fence`-th fence of 40 appends
/// at the right edge (splits, internal splits): an image with an interrupted shift, split or
/// separator insert for the background pass to repair. `None` once the appends finish first.
fn split_crash(
    dir: &Path,
    mut model: BTreeMap<u64, u64>,
    fence: u64,
) -> Option<(BTreeMap<u64, u64>, Op)> {
    let (t, _) = common::reopen_with(dir, SimMode::Shadow, numakv_fastfair::RecoveryMode::Eager);
    let pool = Arc::clone(t.pool());
    let appends = (1_000_001..1_000_041).map(|k| Op::Insert(k, k * 3));
    let op = run_to_crash(&t, &pool, fence, CrashOptions::STRICT, &mut model, appends)?;
    Some((model, op))
}

#[test]
fn a_crash_at_each_fence_of_the_background_pass_is_recovered() {
    let d = common::scratch();
    let (loaded, base, k_dir) =
        (d.path().join("loaded"), d.path().join("base"), d.path().join("k"));
    let before = loaded_store(&loaded);
    let (mut crash_points, mut images) = (0, 0);
    let step = (4 / numakv_pmem::crash::test_scale().min(4)) as u64 / 2 + 1;
    for fence in (1..).step_by(step as usize) {
        common::copy_store(&loaded, &base);
        let Some((model, op)) = split_crash(&base, before.clone(), fence) else { break };
        let pending = Some(op);
        images += 1;
        // Crash at the 1st, 2nd, ... fence of the background pass (nothing else runs, so every
        // fence is its own) until it finishes before the crash fires.
        for k in 1.. {
            common::copy_store(&base, &k_dir);
            let pool = open_pool(&k_dir);
            pool.crash_after_fences(k, CrashOptions::random(fence * 1000 + k)).unwrap();
            let (t, _) = FastFair::open(Arc::clone(&pool), &FastFairOptions::default()).unwrap();
            let outcome = t.wait_recovery();
            let crashed = pool.has_crashed();
            if !crashed {
                pool.cancel_crash();
                outcome.unwrap();
            }
            drop(t);
            drop(pool);

            let (t, _) = reopen(&k_dir, SimMode::Shadow);
            check_contents(&t, &model, pending); // before its background pass is done
            let mut model = model.clone();
            resolve(&t, &mut model, pending);
            verify_recovered(&t, &model, None);
            t.close().unwrap();
            std::fs::remove_dir_all(&k_dir).unwrap();
            if !crashed {
                break;
            }
            crash_points += 1;
        }
        std::fs::remove_dir_all(&base).unwrap();
    }
    eprintln!("{crash_points} crash points in the background passes of {images} crash images");
    assert!(images > 20 && crash_points >= 10, "{crash_points} crash points, {images} images");
}

/// One round: a writer (with a model) and a reader run on a freshly (lazily) opened store while
/// its background recovery runs, until a crash scheduled at a random fence fires — wherever it
/// fires. Returns the operation it interrupted.
fn round(
    t: &FastFair,
    model: &mut BTreeMap<u64, u64>,
    stable: &[u64],
    rng: &mut Rng,
) -> Option<Op> {
    let pool = Arc::clone(t.pool());
    let done = AtomicBool::new(false);
    /// Sets `done` when the writer leaves the scope, also by a panic: the scope waits for the
    /// reader, which must stop then.
    struct Done<'a>(&'a AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            // ORDERING: Relaxed; `done` only ends the reader's loop.
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        let _done = Done(&done);
        s.spawn(|| {
            // Keys the writer never touches must always be found, by gets and scans.
            let mut out = Vec::new();
            let mut i = 0;
            // ORDERING: Relaxed; `done` only ends the loop.
            while !done.load(Ordering::Relaxed) && !pool.has_crashed() {
                let k = stable[i % stable.len()];
                let got = t.get(k).unwrap();
                if pool.has_crashed() {
                    break;
                }
                assert_eq!(got, Some(k), "stable key {k} lost while recovering");
                if i % 64 == 0 {
                    out.clear();
                    t.scan(0, usize::MAX, &mut out).unwrap();
                    assert!(out.windows(2).all(|w| w[0].0 < w[1].0), "scan not ascending");
                    let n = out.iter().filter(|e| e.0 == e.1 && e.0 % 1000 == 7).count();
                    assert!(pool.has_crashed() || n == stable.len(), "scan missed stable keys");
                }
                i += 1;
            }
        });
        let mut pending = None;
        while !pool.has_crashed() {
            let op = match random_op(rng, 3_000, 5) {
                Op::Insert(k, v) => Op::Insert(scrambled(k) / 1000 * 1000 + 1, v),
                Op::Upsert(k, v) => Op::Upsert(scrambled(k) / 1000 * 1000 + 1, v),
                Op::Update(k, v) => Op::Update(scrambled(k) / 1000 * 1000 + 1, v),
                Op::Remove(k) => Op::Remove(scrambled(k) / 1000 * 1000 + 1),
            };
            tree_apply(t, model, op);
            if pool.has_crashed() {
                pending = Some(op);
                break;
            }
            model_apply(model, op);
        }
        pending
    })
}

#[test]
fn many_crash_rounds_with_lazy_recovery() {
    let d = common::scratch();
    // 64 MiB: a session that crashes before its background collection is done leaves the
    // pages it took meanwhile (one per allocating thread and size class) until a later
    // collection completes — under load, many rounds in a row (docs/design.md §9).
    let t = common::create_small(d.path(), SimMode::Shadow, 256, 64 << 20);
    let stable: Vec<u64> = (0..300).map(|i| i * 1000 + 7).collect();
    for &k in &stable {
        t.insert(k, k).unwrap();
    }
    let mut model: BTreeMap<u64, u64> = stable.iter().map(|&k| (k, k)).collect();
    let mut rng = Rng(0x1a2f);
    let mut t = t;
    let rounds = 30 * numakv_pmem::crash::test_scale() as u64;
    for r in 1..=rounds {
        let pool = Arc::clone(t.pool());
        // Early fences fall in the background pass of the previous open (when it has one left).
        let fence = if r % 3 == 0 { 1 + rng.below(40) } else { 1 + rng.below(3_000) };
        pool.crash_after_fences(fence, CrashOptions::random(rng.next())).unwrap();
        let pending = round(&t, &mut model, &stable, &mut rng);
        if !pool.has_crashed() {
            pool.crash(CrashOptions::random(rng.next())).unwrap();
        }
        drop(t);
        drop(pool);
        let (next, rep) = reopen(d.path(), SimMode::Shadow);
        assert!(!rep.was_clean && rep.counters.contains(&("deferred", 1)));
        // Served at once, while its own background recovery runs.
        check_contents(&next, &model, pending);
        resolve(&next, &mut model, pending);
        if r % 5 == 0 {
            verify_recovered(&next, &model, None); // waits for the background pass
        }
        t = next;
    }
    t.close().unwrap();
    let (t, _) = reopen(d.path(), SimMode::Shadow);
    verify_recovered(&t, &model, None);
    // Once a collection completes, the frozen pages of earlier sessions are reused or freed:
    // what the tree holds stays within a page per round of what it needs.
    let (used, _) = t.pool().heap_usage(0).unwrap();
    assert!(used <= 2 + rounds, "{used} pages in use after {rounds} crash rounds");
    t.close().unwrap();
}
