//! The DRAM hash table of keys pending in PTFOs (papers/f3tree.txt §4.2, Fig. 3 step ②).
//!
//! A key is *pending* while its latest write sits in an FO entry not yet applied to the global
//! tree. The table maps it to that entry: its location in PM, its version, and (as a DRAM copy)
//! its value or tombstone. It is sharded; a shard's mutex is also the **per-key serialisation
//! point** of the whole engine:
//!
//! - a producer decides an operation's result (insert-if-absent, update-if-present, remove) and
//!   appends its FO entry while holding the key's shard;
//! - an evaluator applies an entry to the tree only if the table names that very entry (checked
//!   under the shard lock), with the key flagged `applying` — the tree write itself runs outside
//!   the lock, so producers of the shard's other keys never wait for a tree split — and removes
//!   the key from the table, under the lock, once the entry is durably processed and only if the
//!   table still names it.
//!
//! Hence the logical value of a key is `table[key]` if pending, else the tree's: the tree changes
//! a key only while the key is pending (its write in flight), and only to the value of an entry
//! that was the key's latest when the write began; keys in flight are written by one evaluator
//! at a time, in version order. Each shard also draws the versions of
//! its keys from its own counter (bumped under the shard lock), so versions of one key increase
//! across threads; after a crash every counter restarts above every version found in PM.

use numakv_pmem::PPtr;
use parking_lot::{Mutex, MutexGuard};
use rustc_hash::FxHashMap;

/// Shards of the table (a power of two).
pub const SHARDS: usize = 256;

/// What the table knows of a pending key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending {
    /// Version of the entry (as in its meta word).
    pub version: u64,
    /// Where the entry lives in PM.
    pub loc: PPtr,
    /// The pending value; `None` for a pending delete (tombstone).
    pub value: Option<u64>,
    /// An evaluator is writing an entry of this key (this one or one it superseded) into the
    /// tree, outside the shard lock: no other evaluator may write the key until it clears the
    /// flag, so the tree receives a key's versions in order. A superseding write keeps it.
    pub applying: bool,
}

/// One shard: its keys and its version counter.
#[derive(Debug, Default)]
pub struct Shard {
    /// Pending keys of this shard. FxHash: keys are u64 and the table is not exposed to
    /// untrusted input in a way that makes collision attacks a concern beyond performance
    /// (a producer is probed once per write; SipHash cost a measurable share of the hot path).
    pub map: FxHashMap<u64, Pending>,
    /// The next version this shard hands out (≥ 1).
    pub next_version: u64,
}

impl Shard {
    /// A fresh version for a write of one of this shard's keys.
    pub fn bump(&mut self) -> u64 {
        let v = self.next_version;
        self.next_version += 1;
        v
    }
}

/// The sharded table.
#[derive(Debug)]
pub struct PendingTable {
    shards: Box<[Mutex<Shard>]>,
}

/// The shard of `key` (a multiplicative mix: sequential keys spread over shards).
#[inline]
pub fn shard_of(key: u64) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize & (SHARDS - 1)
}

impl PendingTable {
    /// An empty table whose versions start at `first_version`.
    pub fn new(first_version: u64) -> PendingTable {
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard { map: FxHashMap::default(), next_version: first_version.max(1) })
            })
            .collect();
        PendingTable { shards }
    }

    /// Locks the shard of `key`.
    #[inline]
    pub fn lock(&self, key: u64) -> MutexGuard<'_, Shard> {
        self.shards[shard_of(key)].lock()
    }

    /// Locks shard `i`.
    pub fn lock_shard(&self, i: usize) -> MutexGuard<'_, Shard> {
        self.shards[i].lock()
    }

    /// Pending keys in all shards (approximate under concurrency).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    /// No key is pending (approximate under concurrency).
    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| s.lock().map.is_empty())
    }

    /// Pending keys `≥ start`, each as seen when its shard was visited, sorted by key.
    pub fn snapshot_from(&self, start: u64) -> Vec<(u64, Option<u64>)> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            let s = s.lock();
            out.extend(s.map.iter().filter(|(&k, _)| k >= start).map(|(&k, p)| (k, p.value)));
        }
        out.sort_unstable_by_key(|&(k, _)| k);
        out
    }

    /// Approximate DRAM bytes.
    pub fn dram_bytes(&self) -> u64 {
        let per = std::mem::size_of::<(u64, Pending)>() as u64 + 8;
        self.shards.iter().map(|s| s.lock().map.capacity() as u64 * per).sum()
    }
}
