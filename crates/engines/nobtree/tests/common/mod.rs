//! Helpers shared by the scenario files.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use numakv_index::{Engine, Index, RecoveryReport};
use numakv_nobtree::{Nobtree, NobtreeOptions};
use numakv_pmem::{CrashOptions, OpenConfig, PersistMode, Pool, PoolConfig, SimMode};

pub const CAP: u64 = 32 << 20;

/// Options without the background coordinator (deterministic crash tests).
pub fn quiet() -> NobtreeOptions {
    let mut o = NobtreeOptions::default();
    o.migration.enabled = false;
    o
}

pub fn pool_cfg(mode: PersistMode, sim: SimMode) -> PoolConfig {
    let mut c = PoolConfig::new(Nobtree::engine_id(), CAP);
    c.nodes = 2;
    c.mode = mode;
    c.sim = sim;
    c
}

/// A volatile ADR pool on 2 emulated nodes.
pub fn volatile(opts: &NobtreeOptions) -> Nobtree {
    let pool = Pool::volatile(pool_cfg(PersistMode::Adr, SimMode::Direct)).unwrap();
    Nobtree::create(pool, opts).unwrap()
}

/// A store in `dir`.
pub fn create(dir: &Path, mode: PersistMode, sim: SimMode, opts: &NobtreeOptions) -> Nobtree {
    let pool = Pool::create(dir, pool_cfg(mode, sim)).unwrap();
    Nobtree::create(pool, opts).unwrap()
}

/// Reopens the store in `dir` (recovery included).
pub fn reopen(dir: &Path, sim: SimMode, opts: &NobtreeOptions) -> (Nobtree, RecoveryReport) {
    let mut c = OpenConfig::new(Nobtree::engine_id());
    c.sim = sim;
    let pool: Arc<Pool> = Pool::open(dir, c).unwrap();
    Nobtree::open(pool, opts).unwrap()
}

// The engine-independent scenario helpers (op, model, checks of a recovered tree).
pub use numakv_index::testkit::scenario::*;

/// One crash round: a fresh shadow store, `pre` applied, a crash armed for the `fence`-th
/// fence while `ops` run. `None` when the ops finished first. On crash: reopen, verify, more
/// ops, verify again.
pub fn crash_round(
    mode: PersistMode,
    opts: &NobtreeOptions,
    pre: &[Op],
    ops: &[Op],
    fence: u64,
    copts: CrashOptions,
) -> Option<RecoveryReport> {
    let d = tempfile::tempdir().unwrap();
    let t = create(d.path(), mode, SimMode::Shadow, opts);
    let mut model = BTreeMap::new();
    apply_all(&t, &mut model, pre.iter().copied());
    let pool = Arc::clone(t.pool());
    let pending = Some(run_to_crash(&t, &pool, fence, copts, &mut model, ops.iter().copied())?);
    drop(t);
    drop(pool);
    let (t, rep) = reopen(d.path(), SimMode::Shadow, opts);
    assert!(!rep.was_clean);
    verify(&t, &model, pending, true);
    keep_working(&t, fence * 7 + 1, 300, 3000, 6);
    Some(rep)
}

/// `check()` passes and counts the entries of a full scan, and every value names its key
/// ([`vk`]). Returns the scan.
pub fn check_values_name_keys(t: &Nobtree) -> Vec<(u64, u64)> {
    let r = t.check().unwrap();
    let mut out = Vec::new();
    t.scan(0, usize::MAX, &mut out).unwrap();
    assert_eq!(r.entries, out.len() as u64);
    for &(k, v) in &out {
        assert_eq!(v, vk(k));
    }
    out
}

/// An exact oracle for one thread of a concurrent test: the thread owns the keys `k` with
/// `k % threads == th` (interleaved with the other threads' keys, so all threads share leaves
/// and every split, merge and migration moves keys of several owners) and keeps a model of
/// them. Every value is versioned — `(version << 32) | key`, fresh for each write — so a lost
/// insert, update or delete, or a stale value, fails the very next read of that key: a get
/// must return exactly the model's value (`None` for a present key is a failure), insert /
/// update / remove must report exactly what the model predicts, and a scan must list exactly
/// the owner's modelled keys in the range it covers. Other owners' keys seen in a scan must
/// carry values that name them.
pub struct Owner {
    pub th: u64,
    pub threads: u64,
    pub model: BTreeMap<u64, u64>,
    version: u64,
}

/// Whether `v` is a versioned value of key `k` (see [`Owner`]).
pub fn names(k: u64, v: u64) -> bool {
    v & 0xffff_ffff == k & 0xffff_ffff && v >> 32 != 0
}

impl Owner {
    pub fn new(th: u64, threads: u64) -> Owner {
        Owner { th, threads, model: BTreeMap::new(), version: 0 }
    }

    /// The owned key nearest above `k` (keys stay below 2^32).
    pub fn own(&self, k: u64) -> u64 {
        let k = k.max(1);
        k - k % self.threads + self.th + if k % self.threads > self.th { self.threads } else { 0 }
    }

    fn next(&mut self, k: u64) -> u64 {
        self.version += 1;
        (self.version << 32) | k
    }

    pub fn insert(&mut self, t: &dyn Index, k: u64) {
        let v = self.next(k);
        let want = !self.model.contains_key(&k);
        assert_eq!(t.insert(k, v).unwrap(), want, "insert {k}: model has {:?}", self.model.get(&k));
        if want {
            self.model.insert(k, v);
        }
    }

    pub fn upsert(&mut self, t: &dyn Index, k: u64) {
        let v = self.next(k);
        t.upsert(k, v).unwrap();
        self.model.insert(k, v);
    }

    pub fn update(&mut self, t: &dyn Index, k: u64) {
        let v = self.next(k);
        let want = self.model.contains_key(&k);
        assert_eq!(t.update(k, v).unwrap(), want, "update {k}: model has {:?}", self.model.get(&k));
        if want {
            self.model.insert(k, v);
        }
    }

    pub fn remove(&mut self, t: &dyn Index, k: u64) {
        let want = self.model.remove(&k);
        assert_eq!(t.remove(k).unwrap(), want.is_some(), "remove {k}: model had {want:?}");
    }

    pub fn get(&self, t: &dyn Index, k: u64) {
        assert_eq!(t.get(k).unwrap(), self.model.get(&k).copied(), "get {k} (thread {})", self.th);
    }

    pub fn scan(&self, t: &dyn Index, k: u64, max: usize, out: &mut Vec<(u64, u64)>) {
        out.clear();
        t.scan(k, max, out).unwrap();
        for w in out.windows(2) {
            assert!(w[0].0 < w[1].0, "scan order {w:?}");
        }
        for &(kk, v) in out.iter() {
            assert!(kk >= k && names(kk, v), "scan from {k}: ({kk}, {v:#x})");
        }
        // The range the scan covered: to its last key when it filled `max`, else to the end.
        let end =
            if out.len() == max { out.last().map_or(u64::MAX - 1, |e| e.0) } else { u64::MAX - 1 };
        let mine: Vec<(u64, u64)> =
            out.iter().copied().filter(|&(kk, _)| kk % self.threads == self.th).collect();
        let want: Vec<(u64, u64)> = self.model.range(k..=end).map(|(&a, &b)| (a, b)).collect();
        assert_eq!(mine, want, "scan from {k} to {end}: thread {}'s keys", self.th);
    }

    /// One random operation on an owned key near `k`: insert, upsert, update, remove, scan,
    /// get (weights 3, 1, 1, 2, 1, 4).
    pub fn random_op(&mut self, t: &dyn Index, rng: &mut Rng, k: u64, out: &mut Vec<(u64, u64)>) {
        let k = self.own(k);
        match rng.below(12) {
            0..=2 => self.insert(t, k),
            3 => self.upsert(t, k),
            4 => self.update(t, k),
            5 | 6 => self.remove(t, k),
            7 => self.scan(t, k, 30, out),
            _ => self.get(t, k),
        }
    }
}

/// The final state equals the union of the owners' models: `check()` passes, a full scan lists
/// exactly the modelled pairs, and every modelled key reads back its value.
pub fn check_owners(t: &Nobtree, owners: &[Owner]) {
    let mut all = BTreeMap::new();
    for o in owners {
        all.extend(o.model.iter().map(|(&k, &v)| (k, v)));
    }
    let r = t.check().unwrap();
    let mut out = Vec::new();
    t.scan(0, usize::MAX, &mut out).unwrap();
    assert_eq!(r.entries, out.len() as u64);
    assert_eq!(out.len(), all.len(), "entries in the tree vs the models");
    assert!(out.iter().copied().eq(all.iter().map(|(&k, &v)| (k, v))), "tree differs from models");
    for (&k, &v) in all.iter().step_by(7) {
        assert_eq!(t.get(k).unwrap(), Some(v));
    }
}

/// The kit's shared-key oracle (`Kit::concurrent_shared`) on a tree the test holds, with a
/// side thread driving a mechanism at random meanwhile (`side`, until its flag is set): 4
/// threads (on NUMA nodes `t % nodes`) run inserts, upserts, updates, gets, removes and short
/// scans on `1..=keys` (odd keys preloaded) with unique values; every outcome and the final
/// state must be explained by a linearization of each key's history
/// (`numakv_index::testkit::linearize`); `check()` passes and counts the final entries.
pub fn shared_keys_linearizable(
    e: &(dyn Index + Sync),
    nodes: usize,
    keys: u64,
    ops: usize,
    seed: u64,
    side: impl FnOnce(&std::sync::atomic::AtomicBool) + Send,
) {
    use numakv_index::testkit::linearize::{check_history, Event, Op as LinOp, Outcome};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const THREADS: usize = 4;
    let mut initial = BTreeMap::new();
    for k in (1..=keys).step_by(2) {
        assert!(e.insert(k, k).unwrap(), "preload {k}");
        initial.insert(k, k);
    }
    let clock = AtomicU64::new(0);
    // ORDERING: AcqRel on one counter: real-time order of invocations and responses.
    let tick = || clock.fetch_add(1, Ordering::AcqRel);
    let stop = AtomicBool::new(false);
    let events: Vec<(u64, Event)> = std::thread::scope(|s| {
        let stop = &stop;
        let side = s.spawn(move || side(stop));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let tick = &tick;
                s.spawn(move || {
                    numakv_pmem::numa::set_current_node(t % nodes);
                    let mut rng = Rng(seed ^ ((t as u64 + 1) << 32) | 1);
                    let mut events = Vec::with_capacity(ops * 2);
                    for i in 0..ops as u64 {
                        let k = rng.below(keys) + 1;
                        let v = ((t as u64 + 1) << 48) | (i + 1);
                        let invoke = tick();
                        let (op, outcome) = match rng.below(16) {
                            0..=3 => (LinOp::Insert(v), Outcome::Bool(e.insert(k, v).unwrap())),
                            4..=5 => {
                                e.upsert(k, v).unwrap();
                                (LinOp::Upsert(v), Outcome::Unit)
                            }
                            6..=7 => (LinOp::Update(v), Outcome::Bool(e.update(k, v).unwrap())),
                            8..=10 => (LinOp::Get, Outcome::Value(e.get(k).unwrap())),
                            11..=13 => (LinOp::Remove, Outcome::Bool(e.remove(k).unwrap())),
                            _ => {
                                let max = rng.below(11) as usize + 1;
                                let mut out = Vec::new();
                                e.scan(k, max, &mut out).unwrap();
                                let response = tick();
                                assert!(
                                    out.len() <= max && out.windows(2).all(|w| w[0].0 < w[1].0)
                                );
                                let end =
                                    if out.len() == max { out.last().unwrap().0 } else { keys };
                                let mut found = out.iter().peekable();
                                for key in k..=end.min(keys) {
                                    let seen = match found.peek() {
                                        Some(&&(fk, fv)) if fk == key => {
                                            found.next();
                                            Some(fv)
                                        }
                                        _ => None,
                                    };
                                    let ev = Event::new(
                                        t,
                                        LinOp::Observe,
                                        Outcome::Value(seen),
                                        invoke,
                                        response,
                                    );
                                    events.push((key, ev));
                                }
                                assert!(found.next().is_none(), "scan({k}, {max}) = {out:?}");
                                continue;
                            }
                        };
                        let response = tick();
                        events.push((k, Event::new(t, op, outcome, invoke, response)));
                    }
                    events
                })
            })
            .collect();
        let events = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        stop.store(true, Ordering::Release);
        side.join().unwrap();
        events
    });
    let mut out = Vec::new();
    e.scan(0, usize::MAX, &mut out).unwrap();
    let last: BTreeMap<u64, u64> = out.iter().copied().collect();
    assert!(last.keys().all(|k| (1..=keys).contains(k)), "a key nobody inserted");
    if let Err(why) = check_history(&initial, events, &last, 1..=keys) {
        panic!("not linearizable (seed {seed:#x}): {why}");
    }
    let r = e.check().unwrap();
    assert_eq!(r.entries, last.len() as u64, "check() entries vs the final scan");
}
