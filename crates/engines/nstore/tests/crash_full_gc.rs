//! Byte keys to out-of-space, delete half, GC settles, fill again (issue 34): every acknowledged
//! write is readable and `check()` is clean — and so after a power failure at every fence of a
//! GC pass over the full store, in ADR and in eADR (shadow pools, `Pool::crash_after_fences`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use numakv_index::{Engine, Index};
use numakv_nstore::{NStore, NStoreOptions};
use numakv_pmem::{CrashOptions, OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// Two clusters of one-page files, no GC threads: GC runs when the test says.
fn opts() -> NStoreOptions {
    NStoreOptions {
        clusters: 2,
        log_file_size: 4096,
        gc_threads_per_node: 0,
        recovery_threads: 1,
        ..Default::default()
    }
}

fn create(dir: &Path, mode: PersistMode) -> NStore {
    let mut cfg = PoolConfig::new(NStore::engine_id(), 192 << 10);
    cfg.page_size = 4096;
    cfg.mode = mode;
    cfg.sim = SimMode::Shadow;
    NStore::create(Pool::create(dir, cfg).unwrap(), &opts()).unwrap()
}

fn reopen(dir: &Path) -> NStore {
    let mut oc = OpenConfig::new(NStore::engine_id());
    oc.sim = SimMode::Shadow;
    NStore::open(Pool::open(dir, oc).unwrap(), &opts()).unwrap().0
}

fn key(i: u64) -> Vec<u8> {
    format!("key {i:05}").into_bytes()
}

fn value(i: u64, round: u64) -> Vec<u8> {
    let len = ((i * 37 + round * 11) % 160) as usize;
    (0..len).map(|j| (i as usize + j + round as usize) as u8).collect()
}

/// Puts keys from `first` until the store is out of space; the model gets every acknowledged
/// put. Returns the next key.
fn fill(s: &NStore, model: &mut Model, first: u64, round: u64) -> u64 {
    let mut i = first;
    loop {
        assert!(i < first + 100_000, "never ran out of space");
        match s.put_bytes(&key(i), &value(i, round)) {
            Ok(()) => {
                model.insert(key(i), value(i, round));
            }
            Err(e) if e.is_out_of_space() => return i,
            Err(e) => panic!("put {i}: {e}"),
        }
        i += 1;
    }
}

/// Full store, then every other key deleted (as far as deletes fit).
fn full_then_half_deleted(s: &NStore) -> (Model, u64) {
    let mut model = Model::new();
    let next = fill(s, &mut model, 0, 0);
    assert!(model.len() > 200, "only {} puts fit", model.len());
    for i in (0..next).step_by(2) {
        match s.delete_bytes(&key(i)) {
            Ok(true) => {
                model.remove(&key(i));
            }
            Ok(false) => panic!("key {i} was present"),
            Err(e) if e.is_out_of_space() => break,
            Err(e) => panic!("delete {i}: {e}"),
        }
    }
    (model, next)
}

fn verify(s: &NStore, model: &Model, upto: u64, ctx: &str) {
    for i in 0..upto {
        assert_eq!(s.get_bytes(&key(i)).unwrap().as_ref(), model.get(&key(i)), "{ctx}: key {i}");
    }
    assert_eq!(s.bytes_len(), model.len(), "{ctx}");
    let r = s.check().unwrap_or_else(|e| panic!("{ctx}: check: {e}"));
    assert_eq!(r.entries, model.len() as u64, "{ctx}");
    assert_eq!(r.reachable_blocks, r.allocated_blocks, "{ctx}: leak");
}

/// GC settles, the freed space takes new puts, everything acknowledged reads back.
fn settle_and_refill(s: &NStore, model: &mut Model, next: u64, ctx: &str) {
    assert!(s.gc_quiesce(Duration::from_secs(30)).unwrap(), "{ctx}: GC did not settle");
    verify(s, model, next, &format!("{ctx}, GC settled"));
    let before = model.len();
    let end = fill(s, model, next, 1);
    assert!(model.len() > before + 20, "{ctx}: GC freed room for {} puts", model.len() - before);
    verify(s, model, end, &format!("{ctx}, filled again"));
}

#[test]
fn full_store_delete_half_gc_fill_again() {
    for mode in [PersistMode::Adr, PersistMode::Eadr] {
        let dir = tempfile::tempdir().unwrap();
        let s = create(dir.path(), mode);
        let (mut model, next) = full_then_half_deleted(&s);
        verify(&s, &model, next, &format!("{mode:?}: full"));
        settle_and_refill(&s, &mut model, next, &format!("{mode:?}"));
        assert!(s.stats().counter("gc_files_reclaimed").unwrap_or(0) > 0);
    }
}

/// The fence after `fence` to crash at: every fence with `NUMAKV_TEST_SCALE` ≥ 8 (a pass over
/// this store issues about 270, and each crash costs a pool create and open, which the file
/// system makes slow), else fences 1–3 and then doubling (9 per mode, a few seconds on CI).
fn next_fence(fence: u64) -> u64 {
    if numakv_pmem::crash::test_scale() >= 8 || fence < 3 {
        fence + 1
    } else {
        fence * 2
    }
}

/// A power failure at fence 1, 2, … of the first GC pass over the half-deleted full store
/// (until the pass finishes before the fence): the recovered store holds exactly the model, GC
/// settles, the store fills again.
#[test]
fn crash_at_every_fence_of_a_gc_pass_over_a_full_store() {
    for mode in [PersistMode::Adr, PersistMode::Eadr] {
        let mut crashed = 0;
        let mut fence = 1;
        loop {
            let dir = tempfile::tempdir().unwrap();
            let s = create(dir.path(), mode);
            let (mut model, next) = full_then_half_deleted(&s);
            let pool = s.pool().clone();
            let copts = if fence % 2 == 0 {
                CrashOptions::random(fence)
            } else {
                CrashOptions { seed: fence, ..CrashOptions::STRICT }
            };
            pool.crash_after_fences(fence, copts).unwrap();
            let r = s.collect_garbage();
            if !pool.has_crashed() {
                let n = r.unwrap();
                assert!(n > 0, "{mode:?}: the pass reclaimed nothing");
                pool.cancel_crash();
                break;
            }
            crashed += 1;
            drop(s);
            drop(pool);
            let ctx = format!("{mode:?}: crash at fence {fence} of the GC pass");
            let s = reopen(dir.path());
            verify(&s, &model, next, &ctx);
            settle_and_refill(&s, &mut model, next, &ctx);
            fence = next_fence(fence);
        }
        eprintln!("{mode:?}: {crashed} crashes inside one GC pass");
        assert!(crashed >= 8, "{mode:?}: the pass issued only {fence} fences");
    }
}
