//! The read-optimized upper layer (papers/nobtree.txt §III-B1, §III-C, §IV-A/C): a static,
//! array-based k-ary tree over the subindex roots, one replica per NUMA node in that node's pool.
//!
//! - Inner nodes are full, pointer-free arrays of 32 keys; the child of node `i` at position `j`
//!   is node `32·i + j` of the next level (computed, not stored).
//! - Leaves hold up to 15 sorted `(low, root)` entries; a build fills 12, so a leaf absorbs three
//!   subindex splits before an insert fails and goes to the temporary list.
//! - Readers search inner nodes without validation (they never change after the build) and read
//!   leaves under the leaf's version (a seqlock: odd = being changed).
//! - Writers (a subindex root split inserting its new root into every replica, the growth of the
//!   first subindex, a rebuild) are serialised by the engine's upper-layer mutex.
//!
//! The replicas are caches of the bottom layer's top level: nothing here is ever flushed, and
//! every open rebuilds them (the previous session's blocks are unreachable and NSM's garbage
//! collection takes them back).

use std::sync::atomic::{fence, Ordering};

use numakv_index::{Error, Result};
use numakv_pmem::alloc::nsm::Nsm;
use numakv_pmem::alloc::PmAllocator;
use numakv_pmem::{PPtr, PmType, PmU64, Pool};

use crate::layout::{
    ENGINE, UP_FANOUT, UP_HEADER_SIZE, UP_LEAF_FILL, UP_LEAF_SLOTS, UP_MAGIC, UP_NODE_SIZE,
};

/// An upper node seen as 32 words (inner: keys; leaf: version, count, 15 × (key, root)).
#[repr(C)]
#[derive(Debug)]
pub struct UpNode {
    /// The node's words.
    pub w: [PmU64; 32],
}

// SAFETY: 32 PM atomics, 256 bytes, no padding, any bits valid, no Drop.
unsafe impl PmType for UpNode {}

const _: () = assert!(std::mem::size_of::<UpNode>() == UP_NODE_SIZE);
const _: () = assert!(2 + 2 * UP_LEAF_SLOTS == 32);

/// Word index of a leaf's version.
const LEAF_VERSION: usize = 0;
/// Word index of a leaf's count.
const LEAF_COUNT: usize = 1;
/// Word index of a leaf entry's key (value at +1).
#[inline]
fn leaf_key(i: usize) -> usize {
    2 + 2 * i
}

/// The geometry and replicas of one build of the upper layer (DRAM descriptor; the nodes live
/// in PM). Shared by readers through an epoch-protected pointer in the engine.
#[derive(Debug)]
pub struct Upper {
    /// Replica block per NUMA node (index = node).
    pub replicas: Vec<PPtr>,
    /// Per level, root first: index of its first node.
    pub level_first: Vec<usize>,
    /// Per level, root first: number of nodes.
    pub level_count: Vec<usize>,
}

impl Upper {
    /// Bytes of a replica with `nodes` nodes.
    fn bytes(nodes: usize) -> usize {
        UP_HEADER_SIZE + nodes * UP_NODE_SIZE
    }

    /// Total nodes per replica.
    pub fn nodes(&self) -> usize {
        self.level_count.iter().sum()
    }

    /// Builds replicas on every node of `nsm`'s pool from `entries` (sorted by key, the first
    /// key 0): leaves filled with 12, inner levels computed up to a single root.
    /// Nothing is published; on error every block allocated so far is freed.
    pub fn build(nsm: &Nsm, pool: &Pool, entries: &[(u64, PPtr)]) -> Result<Upper> {
        let leaves = entries.len().div_ceil(UP_LEAF_FILL).max(1);
        let mut counts = vec![leaves];
        while *counts.last().unwrap_or(&1) > 1 {
            let n = counts.last().copied().unwrap_or(1);
            counts.push(n.div_ceil(UP_FANOUT));
        }
        counts.reverse();
        let mut first = Vec::with_capacity(counts.len());
        let mut acc = 0;
        for &c in &counts {
            first.push(acc);
            acc += c;
        }
        let total = acc;
        let mut replicas = Vec::with_capacity(pool.nodes());
        for node in 0..pool.nodes() {
            match nsm.alloc_on(Self::bytes(total), Some(node)) {
                Ok(p) => replicas.push(p),
                Err(e) => {
                    for p in replicas {
                        // SAFETY: allocated just above, never published: nobody else holds it.
                        let _ = unsafe { nsm.free(p) };
                    }
                    return Err(e.into());
                }
            }
        }
        let up = Upper { replicas, level_first: first, level_count: counts };
        // Minimum key under every node of every level, leaves up.
        let levels = up.level_count.len();
        let mut mins: Vec<u64> =
            (0..leaves).map(|l| entries.get(l * UP_LEAF_FILL).map_or(0, |e| e.0)).collect();
        let mut per_level_mins = vec![Vec::new(); levels];
        per_level_mins[levels - 1] = mins.clone();
        for l in (0..levels - 1).rev() {
            mins = mins.chunks(UP_FANOUT).map(|c| c[0]).collect();
            per_level_mins[l] = mins.clone();
        }
        for &base in &up.replicas {
            let hdr = pool.bytes(base, UP_HEADER_SIZE)?;
            // SAFETY: 64 bytes of the block we own, 64-aligned (NSM blocks ≥ 64 bytes are).
            let words = unsafe { &*(hdr.as_ptr() as *const [PmU64; 8]) };
            words[0].store(UP_MAGIC, Ordering::Relaxed);
            words[1].store(levels as u64, Ordering::Relaxed);
            words[2].store(total as u64, Ordering::Relaxed);
            words[3].store(entries.len() as u64, Ordering::Relaxed);
            for l in 0..levels - 1 {
                for i in 0..up.level_count[l] {
                    let n = up.node(pool, base, up.level_first[l] + i);
                    let kids = &per_level_mins[l + 1];
                    for j in 0..UP_FANOUT {
                        let k = kids.get(i * UP_FANOUT + j).copied().unwrap_or(u64::MAX);
                        n.w[j].store(k, Ordering::Relaxed);
                    }
                }
            }
            for l in 0..leaves {
                let n = up.node(pool, base, up.level_first[levels - 1] + l);
                let chunk = entries.get(l * UP_LEAF_FILL..).unwrap_or(&[]);
                let chunk = &chunk[..chunk.len().min(UP_LEAF_FILL)];
                n.w[LEAF_VERSION].store(0, Ordering::Relaxed);
                n.w[LEAF_COUNT].store(chunk.len() as u64, Ordering::Relaxed);
                for (i, &(k, p)) in chunk.iter().enumerate() {
                    n.w[leaf_key(i)].store(k, Ordering::Relaxed);
                    n.w[leaf_key(i) + 1].store(p.raw(), Ordering::Relaxed);
                }
            }
        }
        // PERSIST: none — replicas are rebuilt at every open. The descriptor is published with
        // a Release store by the caller, which orders these stores before it.
        Ok(up)
    }

    /// Node `idx` of the replica at `base`.
    #[inline]
    fn node<'p>(&self, pool: &'p Pool, base: PPtr, idx: usize) -> &'p UpNode {
        debug_assert!(idx < self.nodes());
        let off = (UP_HEADER_SIZE + idx * UP_NODE_SIZE) as u64;
        // SAFETY: `base` is a block this engine allocated with room for `nodes()` nodes
        // (`build`), kept alive while this descriptor is reachable (retired with it under an
        // epoch); offsets are multiples of 64 from a 64-aligned block.
        unsafe { pool.get_unchecked::<UpNode>(PPtr::from_raw(base.raw() + off)) }
    }

    /// The leaf index (within the leaf level) for `key`, by the computed-child formula.
    fn leaf_for(&self, pool: &Pool, base: PPtr, key: u64) -> usize {
        let levels = self.level_count.len();
        let mut i = 0usize;
        for l in 0..levels - 1 {
            let n = self.node(pool, base, self.level_first[l] + i);
            // Keys ascend; the child is the last one whose minimum is ≤ key (child 0 always:
            // the parent routed here because its minimum is ≤ key).
            let mut j = 0;
            while j + 1 < UP_FANOUT && n.w[j + 1].load(Ordering::Relaxed) <= key {
                j += 1;
            }
            i = i * UP_FANOUT + j;
        }
        i.min(self.level_count[levels - 1] - 1)
    }

    /// Algorithm 2's `Up_Lookup` in the replica of `node`: the root of the last entry whose key
    /// is ≤ `key`.
    pub fn lookup(&self, pool: &Pool, node: usize, key: u64) -> PPtr {
        let base = self.replicas[node % self.replicas.len()];
        let leaf_idx = self.leaf_for(pool, base, key);
        let leaf = self.node(pool, base, *self.level_first.last().unwrap_or(&0) + leaf_idx);
        loop {
            // ORDERING: Acquire; pairs with the Release that ends a leaf insert.
            let v = leaf.w[LEAF_VERSION].load(Ordering::Acquire);
            if v & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let count = (leaf.w[LEAF_COUNT].load(Ordering::Relaxed) as usize).min(UP_LEAF_SLOTS);
            let mut found = leaf.w[leaf_key(0) + 1].load(Ordering::Relaxed);
            for i in 1..count {
                if leaf.w[leaf_key(i)].load(Ordering::Relaxed) > key {
                    break;
                }
                found = leaf.w[leaf_key(i) + 1].load(Ordering::Relaxed);
            }
            // ORDERING: Acquire fence before re-reading the version (seqlock validation).
            fence(Ordering::Acquire);
            if leaf.w[LEAF_VERSION].load(Ordering::Relaxed) == v {
                return PPtr::from_raw(found);
            }
        }
    }

    /// Inserts `(key, root)` into every replica (Algorithm 3 `Up_Insert`); an existing key has
    /// its root replaced. `false` (nothing changed) when the leaf is full. Caller holds the
    /// upper-layer mutex.
    pub fn insert(&self, pool: &Pool, key: u64, root: PPtr) -> bool {
        for (r, &base) in self.replicas.iter().enumerate() {
            let leaf_idx = self.leaf_for(pool, base, key);
            let leaf = self.node(pool, base, *self.level_first.last().unwrap_or(&0) + leaf_idx);
            let count = (leaf.w[LEAF_COUNT].load(Ordering::Relaxed) as usize).min(UP_LEAF_SLOTS);
            let pos = (0..count)
                .find(|&i| leaf.w[leaf_key(i)].load(Ordering::Relaxed) >= key)
                .unwrap_or(count);
            let exists = pos < count && leaf.w[leaf_key(pos)].load(Ordering::Relaxed) == key;
            if !exists && count == UP_LEAF_SLOTS {
                // Replicas are identical: the first one decides for all.
                debug_assert_eq!(r, 0);
                return false;
            }
            let v = leaf.w[LEAF_VERSION].load(Ordering::Relaxed);
            leaf.w[LEAF_VERSION].store(v | 1, Ordering::Relaxed);
            // ORDERING: Release fence; the odd version is ordered before the entry stores
            // (pairs with the reader's Acquire fence).
            fence(Ordering::Release);
            if exists {
                leaf.w[leaf_key(pos) + 1].store(root.raw(), Ordering::Relaxed);
            } else {
                for i in (pos..count).rev() {
                    let k = leaf.w[leaf_key(i)].load(Ordering::Relaxed);
                    let p = leaf.w[leaf_key(i) + 1].load(Ordering::Relaxed);
                    leaf.w[leaf_key(i + 1)].store(k, Ordering::Relaxed);
                    leaf.w[leaf_key(i + 1) + 1].store(p, Ordering::Relaxed);
                }
                leaf.w[leaf_key(pos)].store(key, Ordering::Relaxed);
                leaf.w[leaf_key(pos) + 1].store(root.raw(), Ordering::Relaxed);
                leaf.w[LEAF_COUNT].store(count as u64 + 1, Ordering::Relaxed);
            }
            // ORDERING: Release; publishes the entries with the even version.
            leaf.w[LEAF_VERSION].store((v | 1) + 1, Ordering::Release);
            // PERSIST: none (see the module docs).
        }
        true
    }

    /// Points the entry `(key, old)` of every replica at `new` (a migrated subindex root);
    /// `false` (nothing changed) when the replicas do not hold that entry. Caller holds the
    /// upper-layer mutex.
    pub fn replace(&self, pool: &Pool, key: u64, old: PPtr, new: PPtr) -> bool {
        for (r, &base) in self.replicas.iter().enumerate() {
            let leaf_idx = self.leaf_for(pool, base, key);
            let leaf = self.node(pool, base, *self.level_first.last().unwrap_or(&0) + leaf_idx);
            let count = (leaf.w[LEAF_COUNT].load(Ordering::Relaxed) as usize).min(UP_LEAF_SLOTS);
            let Some(pos) = (0..count).find(|&i| {
                leaf.w[leaf_key(i)].load(Ordering::Relaxed) == key
                    && leaf.w[leaf_key(i) + 1].load(Ordering::Relaxed) == old.raw()
            }) else {
                // Replicas are identical: the first one decides for all.
                debug_assert_eq!(r, 0);
                return false;
            };
            let v = leaf.w[LEAF_VERSION].load(Ordering::Relaxed);
            leaf.w[LEAF_VERSION].store(v | 1, Ordering::Relaxed);
            // ORDERING: Release fence; the odd version is ordered before the entry store
            // (pairs with the reader's Acquire fence).
            fence(Ordering::Release);
            leaf.w[leaf_key(pos) + 1].store(new.raw(), Ordering::Relaxed);
            // ORDERING: Release; publishes the entry with the even version.
            leaf.w[LEAF_VERSION].store((v | 1) + 1, Ordering::Release);
            // PERSIST: none (see the module docs).
        }
        true
    }

    /// Whether the replicas hold the entry `(key, root)` (caller holds the upper mutex, so
    /// no writer changes them): one leaf of replica 0 is searched, not the whole layer.
    pub fn names(&self, pool: &Pool, key: u64, root: PPtr) -> bool {
        let base = self.replicas[0];
        let leaf_idx = self.leaf_for(pool, base, key);
        let leaf = self.node(pool, base, *self.level_first.last().unwrap_or(&0) + leaf_idx);
        let count = (leaf.w[LEAF_COUNT].load(Ordering::Relaxed) as usize).min(UP_LEAF_SLOTS);
        (0..count).any(|i| {
            leaf.w[leaf_key(i)].load(Ordering::Relaxed) == key
                && leaf.w[leaf_key(i) + 1].load(Ordering::Relaxed) == root.raw()
        })
    }

    /// Every entry of the replica of `node`, in key order (caller holds the upper mutex).
    pub fn entries(&self, pool: &Pool, node: usize) -> Vec<(u64, PPtr)> {
        let base = self.replicas[node % self.replicas.len()];
        let first = *self.level_first.last().unwrap_or(&0);
        let mut out = Vec::new();
        for l in 0..*self.level_count.last().unwrap_or(&0) {
            let leaf = self.node(pool, base, first + l);
            let count = (leaf.w[LEAF_COUNT].load(Ordering::Relaxed) as usize).min(UP_LEAF_SLOTS);
            for i in 0..count {
                out.push((
                    leaf.w[leaf_key(i)].load(Ordering::Relaxed),
                    PPtr::from_raw(leaf.w[leaf_key(i) + 1].load(Ordering::Relaxed)),
                ));
            }
        }
        out
    }

    /// Every entry of replica 0 in key order, read without the upper-layer mutex: each leaf
    /// under its version (a leaf a writer changes meanwhile is read again), so every leaf's
    /// entries are a state that leaf had. Used by a rebuild, which logs every write made after
    /// it started reading ([`Writers::since_snapshot`]) and applies them to what it built.
    pub fn snapshot(&self, pool: &Pool) -> Vec<(u64, PPtr)> {
        let base = self.replicas[0];
        let first = *self.level_first.last().unwrap_or(&0);
        let mut out = Vec::new();
        for l in 0..*self.level_count.last().unwrap_or(&0) {
            let leaf = self.node(pool, base, first + l);
            let at = out.len();
            loop {
                // ORDERING: Acquire; pairs with the Release that ends a leaf write.
                let v = leaf.w[LEAF_VERSION].load(Ordering::Acquire);
                if v & 1 == 1 {
                    std::hint::spin_loop();
                    continue;
                }
                let count =
                    (leaf.w[LEAF_COUNT].load(Ordering::Relaxed) as usize).min(UP_LEAF_SLOTS);
                for i in 0..count {
                    out.push((
                        leaf.w[leaf_key(i)].load(Ordering::Relaxed),
                        PPtr::from_raw(leaf.w[leaf_key(i) + 1].load(Ordering::Relaxed)),
                    ));
                }
                // ORDERING: Acquire fence before re-reading the version (seqlock validation).
                fence(Ordering::Acquire);
                if leaf.w[LEAF_VERSION].load(Ordering::Relaxed) == v {
                    break;
                }
                out.truncate(at);
            }
        }
        out
    }

    /// Checks every replica: the same sorted entries, the first key 0, every inner key the
    /// minimum of its child. Returns replica 0's entries.
    pub fn check(&self, pool: &Pool) -> Result<Vec<(u64, PPtr)>> {
        let bad = |s: String| Error::corrupted(ENGINE, s);
        let e0 = self.entries(pool, 0);
        if e0.first().map(|e| e.0) != Some(0) {
            return Err(bad("upper entries: the first entry must have key 0".into()));
        }
        if e0.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(bad("upper entries: keys must strictly ascend".into()));
        }
        for r in 1..self.replicas.len() {
            if self.entries(pool, r) != e0 {
                return Err(bad(format!("upper replicas: replica {r} differs from replica 0")));
            }
        }
        for &base in &self.replicas {
            for (k, p) in &e0 {
                let got = self.lookup_in(pool, base, *k);
                if got != *p {
                    return Err(bad(format!("upper routing: key {k} routes to {got}, not {p}")));
                }
            }
        }
        Ok(e0)
    }

    fn lookup_in(&self, pool: &Pool, base: PPtr, key: u64) -> PPtr {
        let r = self.replicas.iter().position(|&b| b == base).unwrap_or(0);
        self.lookup(pool, r, key)
    }
}

/// What the upper-layer mutex guards: the writers' side of the layer.
#[derive(Debug, Default)]
pub(crate) struct Writers {
    /// Algorithm 3's temporary list (`mutable`): roots whose replica leaf was full.
    pub temp: Vec<(u64, PPtr)>,
    /// While a rebuild builds from a snapshot (`Some`): every write to the layer since the
    /// snapshot, in order, as `(key, root)` = "the entry of `key` names `root`". The swap
    /// applies them to the built layer, so a root inserted or migrated during the build is
    /// not lost (the rebuild's temporary list, §IV-C).
    pub since_snapshot: Option<Vec<(u64, PPtr)>>,
}

impl Writers {
    /// Sets the entry of `key` to `root` in `up` (insert, or replace an existing key), or
    /// appends it to the temporary list when the replicas' leaf is full. Returns whether the
    /// replicas took it. Logged for a rebuild in flight. The list is not searched: a key
    /// inserted here is new to it (a new subindex root's `low`, or key 0, which the replicas
    /// always hold; a migrated root's entry changes through [`Writers::replace`]). Searching
    /// it cost each insert into a full leaf a walk over up to ~16 000 entries under the mutex.
    pub fn put(&mut self, up: Option<&Upper>, pool: &Pool, key: u64, root: PPtr) -> bool {
        if let Some(log) = &mut self.since_snapshot {
            log.push((key, root));
        }
        if up.is_some_and(|u| u.insert(pool, key, root)) {
            return true;
        }
        self.temp.push((key, root));
        false
    }

    /// A rebuild's step 3: the logged writes, in order, into the new layer `up` and this
    /// (new) temporary list. Unlike [`Writers::put`] a key may come twice (a root inserted
    /// and then migrated during the build), so the list — only what the log put there — is
    /// searched.
    pub fn apply(&mut self, up: &Upper, pool: &Pool, log: Vec<(u64, PPtr)>) {
        for (key, root) in log {
            if up.insert(pool, key, root) {
                continue;
            }
            match self.temp.iter_mut().find(|e| e.0 == key) {
                Some(e) => e.1 = root,
                None => self.temp.push((key, root)),
            }
        }
    }

    /// Points the entry `(key, old)` at `new` (a migrated subindex root) in the replicas and
    /// the temporary list; logged for a rebuild in flight.
    pub fn replace(&mut self, up: Option<&Upper>, pool: &Pool, key: u64, old: PPtr, new: PPtr) {
        if let Some(log) = &mut self.since_snapshot {
            log.push((key, new));
        }
        if let Some(u) = up {
            u.replace(pool, key, old, new);
        }
        for e in self.temp.iter_mut().filter(|e| e.0 == key && e.1 == old) {
            e.1 = new;
        }
    }
}
