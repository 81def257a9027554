//! Persistent layout of NBTree: the key-value layer of the decoupled leaves, and the root slots.
//!
//! Only the key-value layer lives in PM (papers/nbtree.txt §III-A); leaf metadata and inner nodes
//! are DRAM and are rebuilt from this layer at open ([`crate::recovery`]).
//!
//! A **key-value block** is one Calloc block of `16 + 16·slots` bytes rounded up to 64
//! (`slots` = 63 by default: 1 KB, the paper's node size, §VI "Default Configuration"):
//!
//! ```text
//! offset   size  field
//!      0      8  next   PPtr of the next block in key order (0 = last block)
//!      8      8  low    inclusive lower bound of the leaf's key range (0 for the first leaf);
//!                       written once before the block is linked, never changed
//!     16  16·n   entries[n]: key u64 (0 = empty or deleted), value u64 (any 64-bit value)
//! ```
//!
//! Entries are 16-byte aligned, so an entry never straddles a cache line: an insert, update or
//! delete writes exactly one PM line and a fingerprint-guided search reads one (Table I).
//! A leaf's exclusive upper bound is the next block's `low` (`u64::MAX` for the last block).
//!
//! The **coupled-leaf** variant (papers/nbtree.txt Fig. 13, [`Shape::coupled`]) puts the leaf
//! metadata in PM too: its blocks start with a metadata area (`32 + slots` bytes rounded up to
//! 64: one line up to 32 slots, two for the default 63) and the entries follow it:
//!
//! ```text
//!      0      8  next
//!      8      8  low
//!     16      8  bitmap   mirror of the commit bitmap (written at every commit)
//!     24      8  num      mirror of the slot counter (fetch_add at every insert)
//!     32      n  fps      mirror of the fingerprints (written at every insert)
//!   base  16·n  entries  (base = (32 + n) rounded up to 64)
//! ```
//!
//! Coupled leaves write that area on every insert and read it on every search (the PM cost the
//! decoupled design removes); DRAM metadata remains the synchronisation point, and recovery
//! rebuilds from the keys as for decoupled leaves.
//!
//! Values are stored as they are: the paper's `copy_bit`/`sync_bit` are kept in DRAM beside the
//! fingerprints ([`crate::leaf`]), so no value bit is reserved in PM (docs/design.md "NBTree").
//!
//! **Root slots** (node 0's header, [`Pool::root`]): [`SLOT_META`] format word,
//! [`SLOT_HEAD`] PPtr of the first block, [`SLOT_CALLOC`] Calloc directory.

use numakv_index::{Error, Result};
use numakv_pmem::{PPtr, PmType, PmU64, PmU8, Pool};

/// Engine name for errors.
pub(crate) const ENGINE: &str = "nbtree";

/// Root slot of the format word ([`meta_word`]); 0 means "not initialised".
pub const SLOT_META: usize = 0;
/// Root slot of the first key-value block.
pub const SLOT_HEAD: usize = 1;
/// Root slot of the Calloc directory.
pub const SLOT_CALLOC: usize = 2;

/// Bytes of the block header (`next`, `low`).
pub const BLOCK_HEADER: usize = 16;
/// Bytes of one entry.
pub const ENTRY_SIZE: usize = 16;
/// Most entries per leaf: the DRAM bitmap word holds 63 commit bits and the SMO bit
/// ([`crate::leaf`]); a 1 KB block holds 63 entries after its header.
pub const MAX_SLOTS: usize = 63;
/// Fewest entries per leaf (an SMO must be able to split a full leaf in two non-empty halves).
pub const MIN_SLOTS: usize = 2;
/// Default entries per leaf: 63, i.e. 1 KB blocks — the paper's node size ("The node size of
/// each tree is configured to 1 KB", §VI). (The prototype's `LEAF_NODE_SIZE` is 31.)
pub const DEFAULT_SLOTS: usize = 63;

/// "NBT1" in the high half of the format word; the low byte holds the slot count, bit 8 the
/// coupled-leaf layout, bits 9..11 the block allocator ([`crate::LeafAllocator`]; 0 = Calloc).
const META_MAGIC: u64 = 0x4E42_5431 << 32;
const META_COUPLED: u64 = 1 << 8;
const META_ALLOC_SHIFT: u32 = 9;
const META_LOW_BITS: u64 = (1 << 11) - 1;

/// The shape of the key-value blocks (recorded in the format word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Entries per block.
    pub slots: usize,
    /// Coupled-leaf layout (metadata line in PM).
    pub coupled: bool,
}

impl Shape {
    /// Offset of entry 0 in a block.
    pub const fn entry_base(self) -> usize {
        if self.coupled {
            (32 + self.slots).div_ceil(64) * 64
        } else {
            BLOCK_HEADER
        }
    }

    /// Bytes of a block.
    pub const fn block_size(self) -> usize {
        (self.entry_base() + ENTRY_SIZE * self.slots).div_ceil(64) * 64
    }
}

/// The format word recorded at create (Calloc blocks).
pub fn meta_word(shape: Shape) -> u64 {
    META_MAGIC | shape.slots as u64 | if shape.coupled { META_COUPLED } else { 0 }
}

/// The format word of a store whose blocks come from `alloc`.
pub fn meta_word_with(shape: Shape, alloc: crate::LeafAllocator) -> u64 {
    meta_word(shape) | alloc.code() << META_ALLOC_SHIFT
}

/// The block allocator a format word records (`None`: an unknown code).
pub fn meta_allocator(w: u64) -> Option<crate::LeafAllocator> {
    crate::LeafAllocator::from_code((w & META_LOW_BITS) >> META_ALLOC_SHIFT)
}

/// The shape of a format word, `None` if it is not an NBTree word or the count is invalid.
pub fn decode_meta(w: u64) -> Option<Shape> {
    let slots = (w & 0xff) as usize;
    let coupled = w & META_COUPLED != 0;
    (w & !META_LOW_BITS == META_MAGIC && (MIN_SLOTS..=MAX_SLOTS).contains(&slots))
        .then_some(Shape { slots, coupled })
}

/// Bytes of a (decoupled) key-value block holding `slots` entries.
pub const fn block_size(slots: usize) -> usize {
    Shape { slots, coupled: false }.block_size()
}

/// Rejects slot counts outside `MIN_SLOTS..=MAX_SLOTS`.
pub fn validate_slots(slots: usize) -> Result<()> {
    if (MIN_SLOTS..=MAX_SLOTS).contains(&slots) {
        Ok(())
    } else {
        Err(Error::InvalidOptions(format!(
            "leaf_slots {slots} must be in {MIN_SLOTS}..={MAX_SLOTS}"
        )))
    }
}

/// Head of a key-value block.
#[repr(C)]
#[derive(Debug)]
pub struct BlockHead {
    /// Next block (PPtr raw), 0 = none.
    pub next: PmU64,
    /// Inclusive low bound of the leaf.
    pub low: PmU64,
}
const _: () = assert!(std::mem::size_of::<BlockHead>() == BLOCK_HEADER);
// SAFETY: repr(C) struct of PmU64 only: valid for any bits, no Drop, interior mutability only.
unsafe impl PmType for BlockHead {}

/// One key-value entry.
#[repr(C)]
#[derive(Debug)]
pub struct Entry {
    /// Key; 0 = empty or deleted.
    pub key: PmU64,
    /// Value, stored verbatim.
    pub val: PmU64,
}
const _: () = assert!(std::mem::size_of::<Entry>() == ENTRY_SIZE);
// SAFETY: as for BlockHead.
unsafe impl PmType for Entry {}

/// A resolved key-value block.
#[derive(Clone, Copy, Debug)]
pub struct Block<'a> {
    /// Its pointer.
    pub ptr: PPtr,
    /// Header.
    pub head: &'a BlockHead,
    base: *const u8,
    shape: Shape,
}

// SAFETY: a Block is a view of PM words that are all atomics (PmU64); sharing it between threads
// is as safe as sharing `&PmU64`.
unsafe impl Send for Block<'_> {}
// SAFETY: as for Send.
unsafe impl Sync for Block<'_> {}

impl<'a> Block<'a> {
    /// Resolves a block this engine allocated (hot path: no checks).
    ///
    /// # Safety
    /// `p` must be a Calloc block of this engine's allocator (size `shape.block_size()`),
    /// alive for `'a` (the caller is pinned or owns it).
    pub unsafe fn at(pool: &'a Pool, p: PPtr, shape: Shape) -> Block<'a> {
        // SAFETY: per the caller's contract, `p` is an allocated 64-aligned block of
        // shape.block_size() bytes.
        let head = unsafe { pool.get_unchecked::<BlockHead>(p) };
        Block { ptr: p, head, base: pool.resolve(p), shape }
    }

    /// Resolves a pointer read from PM (recovery): bounds and alignment checked.
    pub fn checked(pool: &'a Pool, p: PPtr, shape: Shape) -> Result<Block<'a>> {
        if p.offset() % 64 != 0 {
            return Err(Error::corrupted(ENGINE, format!("block {p} is not 64-byte aligned")));
        }
        pool.bytes(p, shape.block_size())?;
        // SAFETY: the range of the whole block was checked just above (mapped, in the heap area,
        // aligned).
        Ok(unsafe { Block::at(pool, p, shape) })
    }

    /// Entry `i` (`i < slots`).
    #[inline]
    pub fn entry(&self, i: usize) -> &'a Entry {
        debug_assert!(i < self.shape.slots);
        // SAFETY: i < slots, so the entry lies inside the block; 16-aligned in a 64-aligned block.
        unsafe { &*(self.base.add(self.shape.entry_base() + ENTRY_SIZE * i) as *const Entry) }
    }

    /// Coupled layout: the PM mirror of the commit bitmap.
    #[inline]
    pub fn pm_bitmap(&self) -> &'a PmU64 {
        debug_assert!(self.shape.coupled);
        // SAFETY: offset 16 of a coupled block's metadata line, 8-aligned, inside the block.
        unsafe { &*(self.base.add(16) as *const PmU64) }
    }

    /// Coupled layout: the PM mirror of `num`.
    #[inline]
    pub fn pm_num(&self) -> &'a PmU64 {
        debug_assert!(self.shape.coupled);
        // SAFETY: offset 24 of a coupled block's metadata line, 8-aligned, inside the block.
        unsafe { &*(self.base.add(24) as *const PmU64) }
    }

    /// Coupled layout: the PM mirror of fingerprint `i`.
    #[inline]
    pub fn pm_fp(&self, i: usize) -> &'a PmU8 {
        debug_assert!(self.shape.coupled && i < MAX_SLOTS);
        // SAFETY: offsets 32..32+slots of a coupled block's metadata area, inside the block.
        unsafe { &*(self.base.add(32 + i) as *const PmU8) }
    }

    /// Start address (for flushes).
    pub fn addr(&self) -> *const u8 {
        self.base
    }

    /// Number of entry slots.
    pub fn slots(&self) -> usize {
        self.shape.slots
    }

    /// The block's shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }
}

/// One-byte fingerprint of a key: the top byte of a Fibonacci (multiplicative) hash — one
/// multiply, every key bit reaching the result. (The prototype uses FNV-1a; fingerprints are
/// DRAM-only, so the choice is not part of the format.)
#[inline]
pub fn fingerprint(key: u64) -> u8 {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(block_size(31), 512);
        assert_eq!(block_size(63), 1024);
        assert_eq!(block_size(DEFAULT_SLOTS), 1024);
        assert_eq!(block_size(3), 64);
        assert_eq!(block_size(2), 64);
        assert_eq!(block_size(4), 128);
    }

    #[test]
    fn meta_round_trips() {
        for coupled in [false, true] {
            let sh = Shape { slots: 31, coupled };
            assert_eq!(decode_meta(meta_word(sh)), Some(sh));
        }
        assert_eq!(Shape { slots: 31, coupled: true }.block_size(), 576);
        assert_eq!(Shape { slots: 63, coupled: true }.block_size(), 1152);
        assert_eq!(decode_meta(meta_word(Shape { slots: 63, coupled: false })).unwrap().slots, 63);
        assert_eq!(decode_meta(meta_word(Shape { slots: 64, coupled: false })), None);
        assert_eq!(decode_meta(0), None);
        assert_eq!(decode_meta(0xdead_beef), None);
    }
}
