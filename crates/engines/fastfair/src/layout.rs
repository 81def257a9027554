//! Persistent layout of FAST&FAIR nodes and of the engine's root slots.
//!
//! A node is one NSM block of `node_size` bytes (256..=4096, a multiple of 64, 64-byte aligned):
//!
//! ```text
//! offset  size  field
//!      0     8  lock      writer lock: the pool generation of the holder; any other value = free
//!      8     8  switch    FAST&FAIR switch counter (see below)
//!     16     8  sibling   PPtr of the right sibling (B-link), 0 for the rightmost node of a level
//!     24     8  leftmost  internal nodes: child for keys < the first separator; leaves: 0
//!     32     8  low       inclusive lower bound of the node's key range (0 = -inf)
//!     40     8  high      exclusive upper bound of the node's key range (u64::MAX = +inf)
//!     48     4  level     0 = leaf
//!     52     4  magic     NODE_MAGIC
//!     56     8  flags     bit 0 DEAD: merged away or replaced as root, unreachable; others 0
//!     64  16·n  entries   n = (node_size - 64) / 16 slots of (key, value) — internal: (separator, child)
//! ```
//!
//! All words are little-endian (the accessor atomics on x86-64 / aarch64) and 8-byte aligned, so
//! each is written failure-atomically. The header is exactly one cache line; entry slot `i` lives
//! in line `1 + i / 4`, its key and value in the same line.
//!
//! **Entry keys** (the scheme that replaces the original's pointer comparisons, see
//! docs/design.md "FAST&FAIR"): a slot whose key is
//! - `END` (`u64::MAX`) terminates the entries: slots after the first `END` are garbage;
//! - `HIDDEN` (0) is being rewritten (or was, at a crash) and is skipped;
//! - equal to or smaller than the previous accepted key is a transient duplicate and is skipped.
//!
//! **Switch counter** (`switch`, FAST&FAIR's `switch_counter`): bit 0 is the direction of the last
//! shift, 0 = rightward (insert; readers scan slots left to right), 1 = leftward (delete; readers
//! scan right to left). A writer about to shift the other way increments it by 1; a structural
//! change (split truncation, merge append) adds 2. Readers read it before and after a node and
//! retry when it changed: the counter only grows, so equality means no direction change and no
//! structural change happened meanwhile. Its value after a crash is irrelevant.
//!
//! **Lock word**: `lock == pool.generation()` means held; release stores 0. A lock held when the
//! process crashed carries an older generation and is free after reopening.

use std::sync::atomic::Ordering;

use numakv_index::{Error, Result};
use numakv_pmem::{PPtr, PmType, PmU32, PmU64, Pool};

/// Engine name for errors.
pub(crate) const ENGINE: &str = "fastfair";

/// Size of the node header, one cache line.
pub const HEADER_SIZE: usize = 64;
/// Size of one entry slot.
pub const ENTRY_SIZE: usize = 16;
/// Default node size (the paper's 512-byte nodes).
pub const DEFAULT_NODE_SIZE: usize = 512;
/// Smallest node size accepted.
pub const MIN_NODE_SIZE: usize = 256;
/// Largest node size accepted.
pub const MAX_NODE_SIZE: usize = 4096;

/// Key of a slot being rewritten (and key sentinel: never a user key).
pub const HIDDEN: u64 = 0;
/// Key of the terminator slot (and the `+inf` high bound).
pub const END: u64 = u64::MAX;

/// `magic` of every node.
pub const NODE_MAGIC: u32 = 0x4646_4e44; // "FFND"
/// `flags` bit: the node was merged into its left sibling, or was the root and was replaced by
/// its only child (root shrink); it is unreachable.
pub const FLAG_DEAD: u64 = 1;

/// Root slot holding the root node's PPtr, relative to
/// [`FastFairOptions::root_slot_base`](crate::FastFairOptions::root_slot_base).
pub const SLOT_ROOT: usize = 0;
/// Root slot holding the format word: bits 0..32 node size, bits 32..64 [`META_MAGIC`];
/// relative to the base, as [`SLOT_ROOT`].
pub const SLOT_META: usize = 1;
/// Root slots a tree occupies, from its base on.
pub const ROOT_SLOTS_USED: usize = 2;
/// Upper half of the format word.
pub const META_MAGIC: u64 = 0x4646_5452; // "FFTR"

/// The node header (one cache line).
#[repr(C)]
#[derive(Debug)]
pub struct NodeHeader {
    /// Writer lock (see [`crate::lock`]).
    pub lock: PmU64,
    /// Switch counter.
    pub switch: PmU64,
    /// Right sibling.
    pub sibling: PmU64,
    /// Leftmost child (internal nodes).
    pub leftmost: PmU64,
    /// Inclusive lower key bound.
    pub low: PmU64,
    /// Exclusive upper key bound.
    pub high: PmU64,
    /// 0 = leaf.
    pub level: PmU32,
    /// [`NODE_MAGIC`].
    pub magic: PmU32,
    /// [`FLAG_DEAD`].
    pub flags: PmU64,
}

// SAFETY: a repr(C) struct of PM atomics without padding (8·6 + 4·2 + 8 = 64 bytes): valid for
// any bit pattern, no Drop, mutated only through the atomics.
unsafe impl PmType for NodeHeader {}

/// One entry slot: a key and its value (leaves) or a separator and its child PPtr (internal).
#[repr(C)]
#[derive(Debug)]
pub struct Entry {
    /// Key, [`HIDDEN`] or [`END`].
    pub key: PmU64,
    /// Value or child.
    pub val: PmU64,
}

// SAFETY: two PM atomics, no padding, any bit pattern valid, no Drop.
unsafe impl PmType for Entry {}

const _: () = assert!(std::mem::size_of::<NodeHeader>() == HEADER_SIZE);
const _: () = assert!(std::mem::size_of::<Entry>() == ENTRY_SIZE);
const _: () = assert!(std::mem::align_of::<NodeHeader>() == 8);

/// Validates a node size (the only format-shaping option).
pub fn validate_node_size(size: usize) -> Result<()> {
    if !(MIN_NODE_SIZE..=MAX_NODE_SIZE).contains(&size) || size % 64 != 0 {
        return Err(Error::InvalidOptions(format!(
            "node_size {size} must be a multiple of 64 in {MIN_NODE_SIZE}..={MAX_NODE_SIZE}"
        )));
    }
    Ok(())
}

/// Validates a root slot base: the tree's slots `base..base + ROOT_SLOTS_USED` must exist in
/// the pool header.
pub fn validate_root_slot_base(base: usize) -> Result<()> {
    if base > numakv_pmem::ROOT_SLOTS - ROOT_SLOTS_USED {
        return Err(Error::InvalidOptions(format!(
            "root_slot_base {base}: a tree needs root slots base..base+{ROOT_SLOTS_USED}, the pool has {}",
            numakv_pmem::ROOT_SLOTS
        )));
    }
    Ok(())
}

/// Slots per node of `size` bytes.
pub const fn slots(size: usize) -> usize {
    (size - HEADER_SIZE) / ENTRY_SIZE
}

/// Encodes the format word of [`SLOT_META`].
pub fn meta_word(node_size: usize) -> u64 {
    (META_MAGIC << 32) | node_size as u64
}

/// Decodes the format word; `None` when it is not ours.
pub fn decode_meta(word: u64) -> Option<usize> {
    (word >> 32 == META_MAGIC).then_some((word & 0xffff_ffff) as usize)
}

/// A resolved node: its header and its entry slots, borrowed from the pool.
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    /// Where it lives.
    pub ptr: PPtr,
    /// The header.
    pub hdr: &'a NodeHeader,
    /// All `slots(node_size)` entry slots.
    pub entries: &'a [Entry],
}

impl<'a> Node<'a> {
    /// Resolves the node at `p`, checking that `node_size` bytes at `p` lie in the pool's heap
    /// and that `p` is cache-line aligned. A bad pointer read from PM becomes `Corrupted`.
    /// Inlined into every descent step (a search resolves one node per level); the error
    /// formatting lives in cold functions so that it does not keep LLVM from inlining.
    #[inline(always)]
    pub fn resolve(pool: &'a Pool, p: PPtr, node_size: usize) -> Result<Node<'a>> {
        #[cold]
        #[inline(never)]
        fn misaligned(p: PPtr) -> Error {
            Error::corrupted(ENGINE, format!("node pointer {p} is not line aligned"))
        }
        #[cold]
        #[inline(never)]
        fn bad(p: PPtr, e: numakv_pmem::PoolError) -> Error {
            Error::corrupted(ENGINE, format!("node pointer {p}: {e}"))
        }
        if p.offset() % 64 != 0 {
            return Err(misaligned(p));
        }
        let bytes = pool.bytes(p, node_size).map_err(|e| bad(p, e))?;
        let base = bytes.as_ptr();
        // SAFETY: `bytes` checked that [p, p + node_size) is inside a mapping that lives as long
        // as `pool`; the address is 64-aligned (checked above, mappings are page aligned); the
        // header (64 bytes) and the `slots` entries (16 bytes each) fit in node_size bytes;
        // NodeHeader and Entry are PmType (any bits valid, atomics only), so shared references
        // to them are sound even while other threads store to the same words.
        let (hdr, entries) = unsafe {
            let hdr = &*(base as *const NodeHeader);
            let first = base.add(HEADER_SIZE) as *const Entry;
            (hdr, std::slice::from_raw_parts(first, slots(node_size)))
        };
        Ok(Node { ptr: p, hdr, entries })
    }

    /// Level (0 = leaf).
    #[inline]
    pub fn level(&self) -> u32 {
        self.hdr.level.load(Ordering::Relaxed)
    }

    /// True for leaves.
    #[inline]
    pub fn is_leaf(&self) -> bool {
        self.level() == 0
    }

    /// Right sibling.
    #[inline]
    pub fn sibling(&self) -> PPtr {
        // ORDERING: Acquire; pairs with the Release store of the link in smo.rs, so the
        // sibling's initialisation is visible.
        PPtr::from_raw(self.hdr.sibling.load(Ordering::Acquire))
    }

    /// Exclusive high key.
    #[inline]
    pub fn high(&self) -> u64 {
        // ORDERING: Acquire; pairs with the Release stores of `high` in smo.rs (the sibling
        // link and merged entries written before are visible).
        self.hdr.high.load(Ordering::Acquire)
    }

    /// Inclusive low key.
    #[inline]
    pub fn low(&self) -> u64 {
        self.hdr.low.load(Ordering::Acquire)
    }

    /// True once merged away.
    #[inline]
    pub fn is_dead(&self) -> bool {
        self.hdr.flags.load(Ordering::Acquire) & FLAG_DEAD != 0
    }

    /// Slot `i`'s key.
    #[inline]
    pub fn key(&self, i: usize) -> u64 {
        // ORDERING: Acquire; pairs with the Release stores of the shifts (insert.rs,
        // delete.rs): a reader that sees a store sees every earlier store of the shift, and the
        // switch counter read after the last slot cannot move before it.
        self.entries[i].key.load(Ordering::Acquire)
    }

    /// Slot `i`'s value.
    #[inline]
    pub fn val(&self, i: usize) -> u64 {
        // ORDERING: Acquire, as in `key`.
        self.entries[i].val.load(Ordering::Acquire)
    }

    /// Slot `i`'s key, not accounted: for scans that record the slots they read once, with
    /// [`Node::record_slots_read`] (same lines counted, without a hook per load).
    #[inline(always)]
    pub fn key_unrecorded(&self, i: usize) -> u64 {
        // ORDERING: Acquire, as in `key`.
        self.entries[i].key.load_unaccounted(Ordering::Acquire)
    }

    /// Slot `i`'s value, not accounted (see [`Node::key_unrecorded`]).
    #[inline(always)]
    pub fn val_unrecorded(&self, i: usize) -> u64 {
        // ORDERING: Acquire, as in `key`.
        self.entries[i].val.load_unaccounted(Ordering::Acquire)
    }

    /// Accounts a read of slots `0..=last` (clamped to the node), the lines a scan that read
    /// them with the `_unrecorded` loads touched: one hook per node instead of two or three per
    /// slot, the same distinct lines per operation.
    #[inline(always)]
    pub fn record_slots_read(&self, last: usize) {
        let n = (last + 1).min(self.entries.len());
        numakv_pmem::account::record_read(
            self.entries.as_ptr() as usize,
            n * std::mem::size_of::<Entry>(),
        );
    }

    /// Accounts a read of the header line (for readers that load header words unrecorded).
    #[inline(always)]
    pub fn record_header_read(&self) {
        numakv_pmem::account::record_read(self.hdr as *const NodeHeader as usize, HEADER_SIZE);
    }

    /// Number of slots before the first `END` (hidden and duplicate slots included); all
    /// slots when there is no terminator (only possible in a corrupted node).
    pub fn used(&self) -> usize {
        (0..self.entries.len()).find(|&i| self.key(i) == END).unwrap_or(self.entries.len())
    }

    /// Address of slot `i` (for flushing).
    #[inline]
    pub fn slot_addr(&self, i: usize) -> *const u8 {
        &self.entries[i] as *const Entry as *const u8
    }

    /// Address of the header (for flushing).
    #[inline]
    pub fn hdr_addr(&self) -> *const u8 {
        self.hdr as *const NodeHeader as *const u8
    }
}
