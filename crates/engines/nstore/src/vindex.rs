//! The volatile index: key → [`VAddr`] of the key's newest log entry, in DRAM.
//!
//! papers/nstore.txt §III-A allows "an arbitrary existing concurrent range index for DRAM"; the
//! paper's own is c-ALEX (§IV). Nlog only needs [`VolatileIndex`], so a learned index can be
//! added later as another implementation without touching the log. Ours is scc's `TreeIndex`
//! (a B+-tree with lock-free reads).
//!
//! Writers of one key are serialised by the engine's key locks, so the trait needs no
//! read-modify-write atomicity; it must give lock-free-or-cheap concurrent `get`s and never
//! show a present key as absent while its address is being replaced.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::layout::VAddr;

/// What NStore needs of its volatile index.
pub trait VolatileIndex: Send + Sync + std::fmt::Debug {
    /// The address of `key`'s newest entry.
    fn get(&self, key: u64) -> Option<VAddr>;
    /// Maps `key` to `addr`, replacing any address it had. The caller holds `key`'s lock.
    fn set(&self, key: u64, addr: VAddr);
    /// Removes `key`; its address if it was present. The caller holds `key`'s lock.
    fn remove(&self, key: u64) -> Option<VAddr>;
    /// Appends up to `max` `(key, addr)` pairs with `key ≥ start`, ascending.
    fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, VAddr)>);
    /// Keys present.
    fn len(&self) -> usize;
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Approximate DRAM bytes.
    fn dram_bytes(&self) -> u64;
}

/// [`VolatileIndex`] over `scc::TreeIndex`.
///
/// TreeIndex entries are immutable and may be copied when a leaf splits, and replacing an entry
/// (remove + insert) would briefly hide the key from readers; so the value is a shared atomic
/// cell that a replacement stores into (the pattern of crates/bench/src/peers.rs).
#[derive(Debug, Default)]
pub struct SccIndex {
    tree: scc::TreeIndex<u64, Arc<AtomicU64>>,
}

impl SccIndex {
    /// An empty index.
    pub fn new() -> SccIndex {
        SccIndex::default()
    }
}

impl VolatileIndex for SccIndex {
    fn get(&self, key: u64) -> Option<VAddr> {
        // ORDERING: Acquire; pairs with the Release stores in `set`: the entry the address
        // names was persisted before the address was published.
        self.tree.peek_with(&key, |_, v| VAddr(v.load(Ordering::Acquire)))
    }

    fn set(&self, key: u64, addr: VAddr) {
        let stored = self.tree.peek_with(&key, |_, v| v.store(addr.0, Ordering::Release));
        if stored.is_none() {
            // Absent: the caller holds the key lock, so nobody else inserts it meanwhile.
            let _ = self.tree.insert_sync(key, Arc::new(AtomicU64::new(addr.0)));
        }
    }

    fn remove(&self, key: u64) -> Option<VAddr> {
        let old = self.get(key)?;
        self.tree.remove_sync(&key);
        Some(old)
    }

    fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, VAddr)>) {
        if max == 0 {
            return;
        }
        let guard = scc::Guard::new();
        let mut push =
            |(k, v): (&u64, &Arc<AtomicU64>)| out.push((*k, VAddr(v.load(Ordering::Acquire))));
        // scc 3.8's `range(start..)` with `start` below the smallest key walks the whole tree
        // before its first item (≈1 s at 100k keys, measured); an unbounded iteration starts at
        // the minimum directly. So: from the minimum when `start` is not above it.
        let first = self.tree.iter(&guard).next().map(|(k, _)| *k);
        numakv_pmem::pause_point!("nstore.vindex.scan_min_read");
        match first {
            None => {}
            // A key below `start` may have been inserted since the minimum was read: the
            // iteration from the (new) minimum skips it. (Without the skip a concurrent scan
            // returned "key 2 below the start" of 5 in the GC-heavy kit.)
            Some(min) if start <= min => self
                .tree
                .iter(&guard)
                .skip_while(|(k, _)| **k < start)
                .take(max)
                .for_each(&mut push),
            Some(_) => self.tree.range(start.., &guard).take(max).for_each(&mut push),
        }
    }

    fn len(&self) -> usize {
        self.tree.len()
    }

    fn dram_bytes(&self) -> u64 {
        // Leaf slot (key + Arc) plus the Arc's allocation (two counts + the cell), plus about a
        // third again for partly full leaves and the inner nodes.
        (self.len() as u64) * (16 + 24) * 4 / 3
    }
}

/// What NStore needs of the index of its variable-length keys (byte strings, a key space of
/// their own beside the u64 keys); the same contract as [`VolatileIndex`].
pub trait VolatileBytesIndex: Send + Sync + std::fmt::Debug {
    /// The address of `key`'s newest entry.
    fn get(&self, key: &[u8]) -> Option<VAddr>;
    /// Maps `key` to `addr`. The caller holds `key`'s lock.
    fn set(&self, key: &[u8], addr: VAddr);
    /// Removes `key`; its address if it was present. The caller holds `key`'s lock.
    fn remove(&self, key: &[u8]) -> Option<VAddr>;
    /// Every `(key, addr)` pair, ascending.
    fn pairs(&self) -> Vec<(Vec<u8>, VAddr)>;
    /// Keys present.
    fn len(&self) -> usize;
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Approximate DRAM bytes.
    fn dram_bytes(&self) -> u64;
}

/// [`VolatileBytesIndex`] over `scc::TreeIndex` (same cell pattern as [`SccIndex`]).
#[derive(Debug, Default)]
pub struct SccBytesIndex {
    tree: scc::TreeIndex<Box<[u8]>, Arc<AtomicU64>>,
    /// Key bytes held (for `dram_bytes`).
    key_bytes: AtomicU64,
}

impl SccBytesIndex {
    /// An empty index.
    pub fn new() -> SccBytesIndex {
        SccBytesIndex::default()
    }
}

impl VolatileBytesIndex for SccBytesIndex {
    fn get(&self, key: &[u8]) -> Option<VAddr> {
        // ORDERING: Acquire; as in SccIndex::get.
        self.tree.peek_with(key, |_, v| VAddr(v.load(Ordering::Acquire)))
    }

    fn set(&self, key: &[u8], addr: VAddr) {
        let stored = self.tree.peek_with(key, |_, v| v.store(addr.0, Ordering::Release));
        if stored.is_none() {
            // Absent: the caller holds the key lock, so nobody else inserts it meanwhile.
            let _ = self.tree.insert_sync(key.into(), Arc::new(AtomicU64::new(addr.0)));
            self.key_bytes.fetch_add(key.len() as u64, Ordering::Relaxed);
        }
    }

    fn remove(&self, key: &[u8]) -> Option<VAddr> {
        let old = self.get(key)?;
        if self.tree.remove_sync(key) {
            self.key_bytes.fetch_sub(key.len() as u64, Ordering::Relaxed);
        }
        Some(old)
    }

    fn pairs(&self) -> Vec<(Vec<u8>, VAddr)> {
        let guard = scc::Guard::new();
        self.tree
            .iter(&guard)
            .map(|(k, v)| (k.to_vec(), VAddr(v.load(Ordering::Acquire))))
            .collect()
    }

    fn len(&self) -> usize {
        self.tree.len()
    }

    fn dram_bytes(&self) -> u64 {
        (self.len() as u64) * (16 + 16 + 24) * 4 / 3 + self.key_bytes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_replace_remove_scan() {
        let ix = SccIndex::new();
        let a = |n| VAddr::new(0, 1, n, 5).unwrap();
        ix.set(5, a(1));
        ix.set(3, a(2));
        ix.set(5, a(3));
        assert_eq!(ix.get(5), Some(a(3)));
        assert_eq!(ix.len(), 2);
        let mut out = Vec::new();
        ix.scan(4, 10, &mut out);
        assert_eq!(out, vec![(5, a(3))]);
        assert_eq!(ix.remove(5), Some(a(3)));
        assert_eq!(ix.remove(5), None);
        assert_eq!(ix.get(5), None);
    }

    #[test]
    fn bytes_set_replace_remove_pairs() {
        let ix = SccBytesIndex::new();
        let a = |n| VAddr::new(0, 1, n, 5).unwrap();
        ix.set(b"beta", a(1));
        ix.set(b"alpha", a(2));
        ix.set(b"beta", a(3));
        assert_eq!(ix.get(b"beta"), Some(a(3)));
        assert_eq!(ix.pairs(), vec![(b"alpha".to_vec(), a(2)), (b"beta".to_vec(), a(3))]);
        assert_eq!(ix.remove(b"beta"), Some(a(3)));
        assert_eq!(ix.get(b"beta"), None);
        assert_eq!(ix.len(), 1);
    }
}
