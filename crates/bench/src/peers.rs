//! DRAM reference peers: the ordered maps a user would otherwise pick, behind the same [`Index`]
//! trait, so a run shows what persistence costs (DESIGN.md §5).
//!
//! - `crossbeam-skiplist`: [`crossbeam_skiplist::SkipMap`], lock-free.
//! - `scc-treeindex`: [`scc::TreeIndex`], a B+-tree with lock-free reads.
//! - `rwlock-btreemap`: `std::collections::BTreeMap` behind a `parking_lot::RwLock`.
//!
//! The concurrent maps keep immutable entries (scc even copies them when a leaf splits), so
//! each value lives in a shared `AtomicU64` cell and `update`/`upsert` store into it. An update
//! that races with a `remove` + re-`insert` of the same key may land on the removed cell; a
//! reference peer accepts that (the key's new incarnation keeps the inserted value).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_skiplist::SkipMap;
use numakv_index::{check_key, CheckReport, EngineStats, Error, Index, Result as IndexResult};
use parking_lot::RwLock;

use crate::error::Result;
use crate::target::{Target, TargetEnv, TargetInstance};

/// Approximate DRAM bytes per entry of each structure (key + value + node overhead), for
/// [`EngineStats::dram_bytes`].
const SKIPLIST_ENTRY_BYTES: u64 = 80;
const SCC_ENTRY_BYTES: u64 = 56;
const BTREE_ENTRY_BYTES: u64 = 24;

/// The three peers, in listing order.
pub fn all() -> Vec<Arc<dyn Target>> {
    vec![
        Arc::new(PeerTarget(Peer::SkipList)),
        Arc::new(PeerTarget(Peer::SccTree)),
        Arc::new(PeerTarget(Peer::RwLockBTree)),
    ]
}

/// Which peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// `crossbeam-skiplist`.
    SkipList,
    /// `scc-treeindex`.
    SccTree,
    /// `rwlock-btreemap`.
    RwLockBTree,
}

impl Peer {
    /// The name in `--engines`.
    pub fn name(self) -> &'static str {
        match self {
            Peer::SkipList => "crossbeam-skiplist",
            Peer::SccTree => "scc-treeindex",
            Peer::RwLockBTree => "rwlock-btreemap",
        }
    }

    /// A fresh, empty map.
    pub fn new_index(self) -> Arc<dyn Index> {
        match self {
            Peer::SkipList => Arc::new(SkipListPeer::default()),
            Peer::SccTree => Arc::new(SccPeer::default()),
            Peer::RwLockBTree => Arc::new(BTreePeer::default()),
        }
    }
}

/// A peer as a [`Target`].
#[derive(Clone, Copy, Debug)]
pub struct PeerTarget(pub Peer);

impl Target for PeerTarget {
    fn name(&self) -> String {
        self.0.name().to_owned()
    }
    fn description(&self) -> String {
        match self.0 {
            Peer::SkipList => "DRAM peer: crossbeam-skiplist SkipMap (lock-free skip list)",
            Peer::SccTree => "DRAM peer: scc TreeIndex (B+-tree, lock-free reads)",
            Peer::RwLockBTree => "DRAM peer: std BTreeMap behind a parking_lot RwLock",
        }
        .to_owned()
    }
    fn persistent(&self) -> bool {
        false
    }
    fn open(&self, _env: &TargetEnv) -> Result<Box<dyn TargetInstance>> {
        Ok(Box::new(PeerInstance(self.0.new_index())))
    }
}

struct PeerInstance(Arc<dyn Index>);

impl std::fmt::Debug for PeerInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PeerInstance").field(&self.0.name()).finish()
    }
}

impl TargetInstance for PeerInstance {
    fn index(&self) -> Arc<dyn Index> {
        Arc::clone(&self.0)
    }
}

// ORDERING (all value cells below): a value is published with Release by the writer and read
// with Acquire, so a reader that sees a value also sees whatever the writer did before; the
// maps' own insert/remove provide the happens-before for the cell itself.

/// Checks that scanned pairs ascend strictly and returns their count.
fn check_ascending(
    name: &'static str,
    keys: impl Iterator<Item = u64>,
) -> IndexResult<CheckReport> {
    let mut prev = 0u64;
    let mut entries = 0u64;
    for k in keys {
        if k <= prev || check_key(k).is_err() {
            return Err(Error::corrupted(
                name,
                format!("key {k} after {prev}: keys ascend strictly"),
            ));
        }
        prev = k;
        entries += 1;
    }
    Ok(CheckReport { entries, reachable_blocks: 0, allocated_blocks: 0 })
}

fn stats(entries: usize, per_entry: u64) -> EngineStats {
    EngineStats {
        pm_bytes_per_node: Vec::new(),
        dram_bytes: entries as u64 * per_entry,
        counters: vec![("entries", entries as u64)],
    }
}

/// `crossbeam-skiplist`.
#[derive(Debug, Default)]
pub struct SkipListPeer {
    map: SkipMap<u64, AtomicU64>,
}

impl Index for SkipListPeer {
    fn name(&self) -> &'static str {
        Peer::SkipList.name()
    }
    fn insert(&self, key: u64, value: u64) -> IndexResult<bool> {
        check_key(key)?;
        let mut inserted = false;
        self.map.get_or_insert_with(key, || {
            inserted = true;
            AtomicU64::new(value)
        });
        Ok(inserted)
    }
    fn upsert(&self, key: u64, value: u64) -> IndexResult<()> {
        check_key(key)?;
        let mut inserted = false;
        let e = self.map.get_or_insert_with(key, || {
            inserted = true;
            AtomicU64::new(value)
        });
        if !inserted {
            e.value().store(value, Ordering::Release);
        }
        Ok(())
    }
    fn update(&self, key: u64, value: u64) -> IndexResult<bool> {
        check_key(key)?;
        Ok(self.map.get(&key).map(|e| e.value().store(value, Ordering::Release)).is_some())
    }
    fn get(&self, key: u64) -> IndexResult<Option<u64>> {
        check_key(key)?;
        Ok(self.map.get(&key).map(|e| e.value().load(Ordering::Acquire)))
    }
    fn remove(&self, key: u64) -> IndexResult<bool> {
        check_key(key)?;
        Ok(self.map.remove(&key).is_some())
    }
    fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, u64)>) -> IndexResult<usize> {
        let before = out.len();
        out.extend(
            self.map
                .range(start..)
                .take(max)
                .map(|e| (*e.key(), e.value().load(Ordering::Acquire))),
        );
        Ok(out.len() - before)
    }
    fn stats(&self) -> EngineStats {
        stats(self.map.len(), SKIPLIST_ENTRY_BYTES)
    }
    fn check(&self) -> IndexResult<CheckReport> {
        check_ascending(self.name(), self.map.iter().map(|e| *e.key()))
    }
}

/// `scc-treeindex`. Values are `Arc<AtomicU64>` cells: scc copies entries when a leaf splits
/// and `peek` may return the old copy, so the cell itself must be shared.
#[derive(Debug, Default)]
pub struct SccPeer {
    tree: scc::TreeIndex<u64, Arc<AtomicU64>>,
}

impl Index for SccPeer {
    fn name(&self) -> &'static str {
        Peer::SccTree.name()
    }
    fn insert(&self, key: u64, value: u64) -> IndexResult<bool> {
        check_key(key)?;
        Ok(self.tree.insert_sync(key, Arc::new(AtomicU64::new(value))).is_ok())
    }
    fn upsert(&self, key: u64, value: u64) -> IndexResult<()> {
        check_key(key)?;
        loop {
            if self.update(key, value)? {
                return Ok(());
            }
            if self.insert(key, value)? {
                return Ok(());
            }
        }
    }
    fn update(&self, key: u64, value: u64) -> IndexResult<bool> {
        check_key(key)?;
        Ok(self.tree.peek_with(&key, |_, v| v.store(value, Ordering::Release)).is_some())
    }
    fn get(&self, key: u64) -> IndexResult<Option<u64>> {
        check_key(key)?;
        Ok(self.tree.peek_with(&key, |_, v| v.load(Ordering::Acquire)))
    }
    fn remove(&self, key: u64) -> IndexResult<bool> {
        check_key(key)?;
        Ok(self.tree.remove_sync(&key))
    }
    fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, u64)>) -> IndexResult<usize> {
        let guard = scc::Guard::new();
        let before = out.len();
        out.extend(
            self.tree
                .range(start.., &guard)
                .take(max)
                .map(|(k, v)| (*k, v.load(Ordering::Acquire))),
        );
        Ok(out.len() - before)
    }
    fn stats(&self) -> EngineStats {
        stats(self.tree.len(), SCC_ENTRY_BYTES)
    }
    fn check(&self) -> IndexResult<CheckReport> {
        let guard = scc::Guard::new();
        check_ascending(self.name(), self.tree.iter(&guard).map(|(k, _)| *k))
    }
}

/// `rwlock-btreemap`.
#[derive(Debug, Default)]
pub struct BTreePeer {
    map: RwLock<BTreeMap<u64, u64>>,
}

impl Index for BTreePeer {
    fn name(&self) -> &'static str {
        Peer::RwLockBTree.name()
    }
    fn insert(&self, key: u64, value: u64) -> IndexResult<bool> {
        check_key(key)?;
        let mut m = self.map.write();
        if m.contains_key(&key) {
            return Ok(false);
        }
        m.insert(key, value);
        Ok(true)
    }
    fn upsert(&self, key: u64, value: u64) -> IndexResult<()> {
        check_key(key)?;
        self.map.write().insert(key, value);
        Ok(())
    }
    fn update(&self, key: u64, value: u64) -> IndexResult<bool> {
        check_key(key)?;
        Ok(self.map.write().get_mut(&key).map(|v| *v = value).is_some())
    }
    fn get(&self, key: u64) -> IndexResult<Option<u64>> {
        check_key(key)?;
        Ok(self.map.read().get(&key).copied())
    }
    fn remove(&self, key: u64) -> IndexResult<bool> {
        check_key(key)?;
        Ok(self.map.write().remove(&key).is_some())
    }
    fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, u64)>) -> IndexResult<usize> {
        let before = out.len();
        out.extend(self.map.read().range(start..).take(max).map(|(&k, &v)| (k, v)));
        Ok(out.len() - before)
    }
    fn stats(&self) -> EngineStats {
        stats(self.map.read().len(), BTREE_ENTRY_BYTES)
    }
    fn check(&self) -> IndexResult<CheckReport> {
        let m = self.map.read();
        check_ascending(self.name(), m.keys().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap as Model;

    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn peers_agree_with_a_model() {
        for t in all() {
            let idx = t.open(&env()).unwrap().index();
            let mut model = Model::new();
            let mut rng = SmallRng::seed_from_u64(3);
            for _ in 0..20_000 {
                let k = rng.gen_range(1..300u64);
                let v = rng.gen::<u64>();
                match rng.gen_range(0..6) {
                    0 => {
                        let absent = !model.contains_key(&k);
                        assert_eq!(idx.insert(k, v).unwrap(), absent);
                        model.entry(k).or_insert(v);
                    }
                    1 => {
                        idx.upsert(k, v).unwrap();
                        model.insert(k, v);
                    }
                    2 => {
                        assert_eq!(idx.update(k, v).unwrap(), model.contains_key(&k));
                        if let Some(x) = model.get_mut(&k) {
                            *x = v;
                        }
                    }
                    3 => assert_eq!(idx.remove(k).unwrap(), model.remove(&k).is_some()),
                    4 => assert_eq!(idx.get(k).unwrap(), model.get(&k).copied()),
                    _ => {
                        let mut out = Vec::new();
                        let n = idx.scan(k, 7, &mut out).unwrap();
                        let want: Vec<_> =
                            model.range(k..).take(7).map(|(&a, &b)| (a, b)).collect();
                        assert_eq!((n, out), (want.len(), want));
                    }
                }
            }
            assert_eq!(idx.check().unwrap().entries, model.len() as u64, "{}", t.name());
            assert_eq!(idx.stats().counter("entries"), Some(model.len() as u64));
            assert!(idx.insert(0, 1).is_err() && idx.get(u64::MAX).is_err());
        }
    }

    fn env() -> TargetEnv {
        TargetEnv {
            dir: std::env::temp_dir(),
            topology: Arc::new(numakv_numa::Topology::emulated(1, &[0]).unwrap()),
            persist: numakv_pmem::PersistMode::Adr,
            max_keys: 0,
            threads: 1,
        }
    }
}
