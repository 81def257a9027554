//! Persistent layouts: the bottom-layer node (papers/nobtree.txt Fig. 5), the upper-layer
//! replica nodes, the migration log, and the engine's root slots.
//!
//! # Bottom-layer node (256 bytes, one NSM block, 64-byte aligned)
//!
//! ```text
//! offset  size  field
//!      0     8  state     bits 0..8 counter (mirror of the slot word's count), bits 8..16
//!                         sib_ver (bit 8 selects the functional sibling pointer), bits 16..64
//!                         version (seqlock: odd = write-locked)
//!      8     8  leftmost  inner nodes: child for keys < the first record; leaves: 0
//!     16     8  slots     slotArray: bits 4i..4i+4 = physical slot of the i-th smallest record
//!                         (i < 12), bits 48..52 = record count; one atomic word
//!     24     8  sib[0]    shadow sibling pointer 0 (PPtr)
//!     32     8  sib[1]    shadow sibling pointer 1 (PPtr)
//!     40     8  low       inclusive lower bound of the node's key range (0 = -inf); immutable
//!     48     8  id        node id (migration statistics), unique per store
//!     56     8  meta      bits 0..8 level (0 = leaf), bits 8..16 flags (bit 0 OBSOLETE,
//!                         bit 1 FROZEN: being copied by a migration; volatile meaning),
//!                         bits 32..64 NODE_MAGIC
//!     64   192  records   12 × (key u64, value u64); inner nodes: (separator, child PPtr)
//! ```
//!
//! The header is one cache line; record `i` lives in line `1 + i / 4`. The functional sibling
//! is `sib[sib_ver & 1]`; the node's exclusive high key is the functional sibling's `low`
//! (`+inf` without one). Records are physically unsorted; the slot word lists the live ones in
//! key order. Physical slots not listed are free (their bytes are garbage).
//!
//! **Why the count sits in the slot word** (a deviation from Fig. 5, where the counter is in
//! `state`): order and count must change in one failure-atomic 8-byte store, or a crash between
//! the two would expose a record that is not there or hide one that is. The `state` counter byte
//! is kept as the paper has it, as a mirror written under the lock; recovery rewrites it.
//!
//! # Upper-layer replica (one contiguous NSM block per NUMA node, on that node)
//!
//! ```text
//!      0    64  replica header: magic u64, levels u64, nodes u64, entries u64, 0…
//!     64  256·n nodes, level by level from the root (level 0 = the root, one node) to the
//!               leaves; level l+1's node 32·i + j is child j of level l's node i
//! ```
//!
//! Inner node: 32 keys; key `j` is the smallest key under child `j` (`u64::MAX` past the last
//! child). Leaf: `version u64` (seqlock, odd = being changed), `count u64`, then 15 sorted
//! entries (key = a subindex root's `low`, value = the root's PPtr); a rebuild fills 12 and
//! leaves 3 empty to absorb subindex splits. The replica is a cache of the bottom layer's top
//! level: never flushed, rebuilt at every open.
//!
//! # Migration log (one 64-byte NSM block, root slot [`SLOT_MIGLOG`])
//!
//! ```text
//!      0     8  state     0 = idle, 1 = active (a migration is updating its parent/previous)
//!      8     8  old       the node being replaced
//!     16     8  new       its copy on the target node (complete and durable before `state` = 1)
//!     24     8  parent    the parent holding a reference to `old` (0: none)
//!     32     8  prev      the left sibling whose functional sibling is `old` (0: none)
//! ```

use std::sync::atomic::Ordering;

use numakv_index::{Error, Result};
use numakv_pmem::{PPtr, PmType, PmU64, Pool};

/// Engine name for errors.
pub(crate) const ENGINE: &str = "nobtree";

/// Size of a bottom node (the paper's 256 bytes, Optane's internal page).
pub const NODE_SIZE: usize = 256;
/// Records per bottom node (4-bit positions in the 8-byte slot word).
pub const RECORDS: usize = 12;
/// Size of the node header.
pub const HEADER_SIZE: usize = 64;

/// Keys of an upper inner node (its fan-out).
pub const UP_FANOUT: usize = 32;
/// Entry slots of an upper leaf.
pub const UP_LEAF_SLOTS: usize = 15;
/// Entries a rebuild puts in an upper leaf (3 stay empty).
pub const UP_LEAF_FILL: usize = 12;
/// Size of an upper node.
pub const UP_NODE_SIZE: usize = 256;
/// Size of the replica header.
pub const UP_HEADER_SIZE: usize = 64;
/// Magic of a replica header.
pub const UP_MAGIC: u64 = 0x4e4f_4255_5050_4552; // "NOBUPPER"

/// `meta` magic of every bottom node.
pub const NODE_MAGIC: u64 = 0x4e4f_424e; // "NOBN"
/// `meta` flag: the node was migrated away and is no longer reachable.
pub const FLAG_OBSOLETE: u64 = 1;
/// `meta` flag: a migration is copying the node. Writers wait (merges give up) until the
/// migration ends — with the node obsolete, or unfrozen if it aborted; readers ignore it and
/// go on reading the node, whose contents cannot change meanwhile. Volatile meaning only:
/// recovery clears it.
pub const FLAG_FROZEN: u64 = 2;

/// +inf key bound.
pub const END: u64 = u64::MAX;

/// Root slot: the format word (bits 0..8 height threshold, bits 32..64 [`META_MAGIC`]).
pub const SLOT_META: usize = 0;
/// Root slot: the head — first node of the bottom layer's top level (the first subindex root).
pub const SLOT_HEAD: usize = 1;
/// Root slot: the migration log block (0 until the first migration).
pub const SLOT_MIGLOG: usize = 2;
/// Upper half of the format word.
pub const META_MAGIC: u64 = 0x4e4f_4254; // "NOBT"

// ---------------------------------------------------------------------------------------------
// state word
// ---------------------------------------------------------------------------------------------

/// One version step (the version field starts at bit 16).
pub const VERSION_ONE: u64 = 1 << 16;

/// Counter byte of a state word.
#[inline]
pub fn st_counter(s: u64) -> u64 {
    s & 0xff
}
/// sib_ver byte of a state word.
#[inline]
pub fn st_sib_ver(s: u64) -> u64 {
    (s >> 8) & 0xff
}
/// True when the version is odd (a writer holds the node).
#[inline]
pub fn st_locked(s: u64) -> bool {
    s & VERSION_ONE != 0
}
/// `s` with counter and sib_ver replaced, version kept.
#[inline]
pub fn st_with(s: u64, counter: u64, sib_ver: u64) -> u64 {
    (s & !0xffff) | (counter & 0xff) | ((sib_ver & 0xff) << 8)
}

// ---------------------------------------------------------------------------------------------
// slot word (slotArray)
// ---------------------------------------------------------------------------------------------

/// Record count of a slot word.
#[inline]
pub fn sl_count(w: u64) -> usize {
    ((w >> 48) & 0xf) as usize
}
/// Physical slot of the `i`-th smallest record.
#[inline]
pub fn sl_pos(w: u64, i: usize) -> usize {
    ((w >> (4 * i)) & 0xf) as usize
}
/// A slot word from physical positions in key order.
pub fn sl_build(positions: &[usize]) -> u64 {
    debug_assert!(positions.len() <= RECORDS);
    let mut w = (positions.len() as u64) << 48;
    for (i, &p) in positions.iter().enumerate() {
        w |= (p as u64 & 0xf) << (4 * i);
    }
    w
}
/// The position bits of a slot word (4 bits per record, logical order from the low end).
const SL_POSITIONS: u64 = (1 << (4 * RECORDS)) - 1;
/// `w` with physical slot `p` listed at logical index `at` (the records from `at` on move up
/// one). Word arithmetic, not a list: this runs on every insert.
#[inline]
pub fn sl_insert(w: u64, at: usize, p: usize) -> u64 {
    let n = sl_count(w);
    debug_assert!(at <= n && n < RECORDS && p < RECORDS);
    let below = (1u64 << (4 * at)) - 1;
    let nibbles = w & SL_POSITIONS;
    let moved = ((nibbles & !below) << 4) | ((p as u64) << (4 * at)) | (nibbles & below);
    (w & !(SL_POSITIONS | 0xf << 48)) | ((n as u64 + 1) << 48) | (moved & SL_POSITIONS)
}
/// `w` without its `i`-th record (the records after it move down one).
#[inline]
pub fn sl_remove(w: u64, i: usize) -> u64 {
    let n = sl_count(w);
    debug_assert!(i < n && n <= RECORDS);
    let below = (1u64 << (4 * i)) - 1;
    let nibbles = w & SL_POSITIONS;
    let moved = ((nibbles >> 4) & !below) | (nibbles & below);
    (w & !(SL_POSITIONS | 0xf << 48)) | ((n as u64 - 1) << 48) | (moved & SL_POSITIONS)
}
/// The logical index of physical slot `p` in `w`, if `w` lists it.
#[inline]
pub fn sl_index_of(w: u64, p: usize) -> Option<usize> {
    (0..sl_count(w).min(RECORDS)).find(|&i| sl_pos(w, i) == p)
}
/// The physical positions listed by a slot word, in key order.
pub fn sl_positions(w: u64) -> Vec<usize> {
    (0..sl_count(w).min(RECORDS)).map(|i| sl_pos(w, i)).collect()
}
/// A physical slot no record of `w` uses.
pub fn sl_free(w: u64) -> Option<usize> {
    let mut used = 0u16;
    for i in 0..sl_count(w).min(RECORDS) {
        used |= 1 << sl_pos(w, i);
    }
    (0..RECORDS).find(|&p| used & (1 << p) == 0)
}

// ---------------------------------------------------------------------------------------------
// Node
// ---------------------------------------------------------------------------------------------

/// The node header (one cache line).
#[repr(C)]
#[derive(Debug)]
pub struct NodeHeader {
    /// counter | sib_ver | version.
    pub state: PmU64,
    /// Leftmost child (inner nodes).
    pub leftmost: PmU64,
    /// slotArray and count.
    pub slots: PmU64,
    /// The two shadow sibling pointers.
    pub sib: [PmU64; 2],
    /// Inclusive lower key bound.
    pub low: PmU64,
    /// Node id.
    pub id: PmU64,
    /// level | flags | magic.
    pub meta: PmU64,
}

// SAFETY: a repr(C) struct of eight PM atomics (64 bytes, no padding): valid for any bits, no
// Drop, mutated only through the atomics.
unsafe impl PmType for NodeHeader {}

/// One record.
#[repr(C)]
#[derive(Debug)]
pub struct Record {
    /// Key (leaves) or separator (inner nodes).
    pub key: PmU64,
    /// Value (leaves) or child PPtr (inner nodes).
    pub val: PmU64,
}

// SAFETY: two PM atomics, no padding, any bits valid, no Drop.
unsafe impl PmType for Record {}

const _: () = assert!(std::mem::size_of::<NodeHeader>() == HEADER_SIZE);
const _: () = assert!(std::mem::size_of::<Record>() == 16);
const _: () = assert!(HEADER_SIZE + RECORDS * 16 == NODE_SIZE);

/// Encodes `meta`.
pub fn meta_word(level: u32, flags: u64) -> u64 {
    (NODE_MAGIC << 32) | ((flags & 0xff) << 8) | u64::from(level & 0xff)
}

/// Encodes the format word of [`SLOT_META`].
pub fn format_word(height: u32) -> u64 {
    (META_MAGIC << 32) | u64::from(height)
}

/// Decodes the format word; `None` when it is not ours.
pub fn decode_format(word: u64) -> Option<u32> {
    (word >> 32 == META_MAGIC).then_some((word & 0xff) as u32)
}

/// A resolved bottom node, borrowed from the pool.
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    /// Where it lives.
    pub ptr: PPtr,
    /// The header.
    pub hdr: &'a NodeHeader,
    /// The 12 record slots.
    pub recs: &'a [Record; RECORDS],
}

impl<'a> Node<'a> {
    /// Resolves the node at `p`, checking bounds and alignment; a bad pointer read from PM
    /// becomes `Corrupted`.
    #[inline]
    pub fn resolve(pool: &'a Pool, p: PPtr) -> Result<Node<'a>> {
        if p.is_null() || p.offset() % 64 != 0 {
            return Err(Error::corrupted(ENGINE, format!("node pointer {p} is not a node")));
        }
        let bytes = pool
            .bytes(p, NODE_SIZE)
            .map_err(|e| Error::corrupted(ENGINE, format!("node pointer {p}: {e}")))?;
        let base = bytes.as_ptr();
        // SAFETY: `bytes` checked that [p, p + 256) lies in a mapping that lives as long as
        // `pool`; the address is 64-aligned (offset checked, mappings are page aligned); header
        // and records are PmType (atomics only, any bits valid), so shared references are sound
        // while other threads store to the same words.
        let (hdr, recs) = unsafe {
            (&*(base as *const NodeHeader), &*(base.add(HEADER_SIZE) as *const [Record; RECORDS]))
        };
        Ok(Node { ptr: p, hdr, recs })
    }

    /// The state word.
    #[inline]
    pub fn state(&self) -> u64 {
        // ORDERING: Acquire; pairs with the Release unlock store (lock.rs): a reader that sees
        // a version sees every store made before it was published.
        self.hdr.state.load(Ordering::Acquire)
    }

    /// The meta word.
    #[inline]
    pub fn meta(&self) -> u64 {
        self.hdr.meta.load(Ordering::Acquire)
    }

    /// Level (0 = leaf).
    #[inline]
    pub fn level(&self) -> u32 {
        (self.meta() & 0xff) as u32
    }

    /// True when the node was migrated away.
    #[inline]
    pub fn is_obsolete(&self) -> bool {
        (self.meta() >> 8) & FLAG_OBSOLETE != 0
    }

    /// True while a migration copies the node ([`FLAG_FROZEN`]).
    #[inline]
    pub fn is_frozen(&self) -> bool {
        (self.meta() >> 8) & FLAG_FROZEN != 0
    }

    /// True when the magic is right.
    pub fn magic_ok(&self) -> bool {
        self.meta() >> 32 == NODE_MAGIC
    }

    /// The slot word.
    #[inline]
    pub fn slots(&self) -> u64 {
        // ORDERING: Acquire; pairs with the Release store that publishes records.
        self.hdr.slots.load(Ordering::Acquire)
    }

    /// The functional sibling for state word `s`.
    #[inline]
    pub fn sibling(&self, s: u64) -> PPtr {
        // ORDERING: Acquire; pairs with the Release store of the pointer (before the flip).
        PPtr::from_raw(self.hdr.sib[(st_sib_ver(s) & 1) as usize].load(Ordering::Acquire))
    }

    /// The leftmost child.
    #[inline]
    pub fn leftmost(&self) -> PPtr {
        PPtr::from_raw(self.hdr.leftmost.load(Ordering::Acquire))
    }

    /// The inclusive low key.
    #[inline]
    pub fn low(&self) -> u64 {
        self.hdr.low.load(Ordering::Acquire)
    }

    /// Key of record at physical slot `p`.
    #[inline]
    pub fn key(&self, p: usize) -> u64 {
        self.recs[p].key.load(Ordering::Relaxed)
    }

    /// Value of record at physical slot `p`.
    #[inline]
    pub fn val(&self, p: usize) -> u64 {
        self.recs[p].val.load(Ordering::Relaxed)
    }

    /// The live records (key order) of slot word `w`.
    pub fn records(&self, w: u64) -> Vec<(u64, u64)> {
        (0..sl_count(w).min(RECORDS))
            .map(|i| {
                let p = sl_pos(w, i);
                (self.key(p), self.val(p))
            })
            .collect()
    }

    /// Address of the header (for flushing).
    #[inline]
    pub fn hdr_addr(&self) -> *const u8 {
        self.hdr as *const NodeHeader as *const u8
    }

    /// Address of physical record slot `p` (for flushing).
    #[inline]
    pub fn rec_addr(&self, p: usize) -> *const u8 {
        &self.recs[p] as *const Record as *const u8
    }
}

// ---------------------------------------------------------------------------------------------
// Migration log
// ---------------------------------------------------------------------------------------------

/// The migration log block.
#[repr(C)]
#[derive(Debug)]
pub struct MigLog {
    /// 0 idle, 1 active.
    pub state: PmU64,
    /// Node being replaced.
    pub old: PmU64,
    /// Its copy.
    pub new: PmU64,
    /// Parent referencing `old`.
    pub parent: PmU64,
    /// Left sibling whose functional sibling is `old`.
    pub prev: PmU64,
    /// Padding to one line.
    pub pad: [PmU64; 3],
}

// SAFETY: PM atomics only, 64 bytes without padding, any bits valid, no Drop.
unsafe impl PmType for MigLog {}

const _: () = assert!(std::mem::size_of::<MigLog>() == 64);

/// Log state: a migration is updating references.
pub const MIGLOG_ACTIVE: u64 = 1;

#[cfg(test)]
mod tests {
    use super::*;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    /// `sl_insert` / `sl_remove` / `sl_index_of` agree with rebuilding the word from a list, for
    /// every count, index and a few hundred random slot orders.
    #[test]
    fn slot_word_edits_match_rebuilding_the_list() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..300 {
            let mut slots: Vec<usize> = (0..RECORDS).collect();
            slots.shuffle(&mut rng);
            let n = rng.gen_range(0..RECORDS);
            let (listed, free) = slots.split_at(n);
            let w = sl_build(listed);
            for at in 0..=n {
                let mut want = listed.to_vec();
                want.insert(at, free[0]);
                assert_eq!(sl_insert(w, at, free[0]), sl_build(&want), "insert at {at} of {n}");
            }
            for i in 0..n {
                let mut want = listed.to_vec();
                want.remove(i);
                assert_eq!(sl_remove(w, i), sl_build(&want), "remove {i} of {n}");
                assert_eq!(sl_index_of(w, listed[i]), Some(i));
            }
            assert_eq!(sl_index_of(w, free[0]), None);
        }
    }
}
