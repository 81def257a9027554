//! Persistent layout of F3-tree: root slots, the PTFO directory, future objects (FOs) and their
//! entries. Byte-level formats and the invariants they carry: docs/design.md, "F3-tree".
//!
//! ```text
//! root slots   0, 1   the global FAST&FAIR tree (FastFairOptions::root_slot_base = 0)
//!              2      format word: F3_MAGIC << 32 | FORMAT_VERSION   (the create commit point)
//!              3      PPtr of the PTFO directory
//!
//! directory    DIR_SLOTS descriptors of one cache line each:
//!      0     8  tail   PPtr of the oldest FO of the list; 0 = slot free (the list commit point)
//!      8     8  head   PPtr of the newest FO (a hint: recovery finds the head by walking `prev`)
//!     16     8  node   NUMA node the list's FOs are placed on (a hint for the evaluators)
//!     24     8  applied  watermark: every entry of the list with sequence number < applied was
//!                      processed by its evaluator (applied to the tree, or superseded) and is
//!                      never replayed, DEAD-marked or not
//!     32    32  unused
//!
//! FO           an NSM block of 64 + 32·cap bytes, 64-byte aligned:
//!      0     8  magic  FO_MAGIC
//!      8     8  next   PPtr of the next OLDER FO (towards the tail), 0 for the tail
//!     16     8  prev   PPtr of the next NEWER FO (towards the head), 0 for the head
//!     24     8  base   sequence number of entry 0 within its list (the list's first FO has 0;
//!                      each newer FO continues where the older one's `cap` entries end)
//!     32     8  cap    entry slots
//!     40     8  list   directory slot of the list (diagnostics)
//!     48    16  unused
//!     64  32·i  entry i: key, value, meta, unused
//! ```
//!
//! **Entry meta word** (written last, after key and value, so a non-zero meta means a whole
//! entry; an entry never straddles a cache line):
//! - bits 0..=61: version (≥ 1), per key increasing across threads and crashes;
//! - bit 62 `TOMB`: the entry is a delete (the value is unused);
//! - bit 63 `DEAD`: the entry must never be replayed — it was applied to the tree, or a newer
//!   entry of its key superseded it.
//!
//! An entry is *processed* when its meta word has `DEAD` or its sequence number
//! (`base + index`) is below its list's `applied` watermark.
//!
//! States of an entry slot: `0` (never written: the FO is zeroed before it is linked, so the
//! valid entries of an FO are a prefix) → `version[|TOMB]` (live: pending, the latest of its key
//! or, only in a crash window, superseded by a durable newer one) → `…|DEAD`.

use std::sync::atomic::Ordering;

use numakv_index::{Error, Result};
use numakv_pmem::{PPtr, PmType, PmU64, Pool};

/// The engine's name, for errors.
pub const ENGINE: &str = "f3tree";

/// Root slot base of the global FAST&FAIR tree (it uses this slot and the next).
pub const TREE_SLOT_BASE: usize = 0;
/// Root slot of the F3-tree format word.
pub const SLOT_META: usize = 2;
/// Root slot of the PTFO directory pointer.
pub const SLOT_DIR: usize = 3;

/// "F3TR" in the high half of the format word.
pub const F3_MAGIC: u64 = 0x4633_5452;
/// Format version of everything in this file.
/// Version 2: FO `count` (a hint) became `base`, and the descriptor gained the `applied`
/// watermark.
pub const FORMAT_VERSION: u32 = 2;

/// The format word of a store of this layout.
pub const fn meta_word() -> u64 {
    (F3_MAGIC << 32) | FORMAT_VERSION as u64
}

/// PTFO lists a store can hold at once (each live producer (thread, node) pair owns one; a list
/// drained after recovery frees its slot).
pub const DIR_SLOTS: usize = 1024;

/// "FUTUREOB" — marks a block as an FO.
pub const FO_MAGIC: u64 = 0x4655_5455_5245_4F42;
/// Bytes of an FO header.
pub const FO_HEADER: u64 = 64;
/// Bytes of an FO entry.
pub const ENTRY_SIZE: u64 = 32;
/// Most entry slots an FO may have (keeps an FO within an NSM small block of a 256 KiB page).
pub const MAX_FO_ENTRIES: usize = 4094;

/// Meta bit: the entry is a delete.
pub const TOMB: u64 = 1 << 62;
/// Meta bit: the entry is never to be replayed.
pub const DEAD: u64 = 1 << 63;
/// Meta bits of the version.
pub const VERSION_MASK: u64 = TOMB - 1;

/// A directory descriptor (one cache line).
#[repr(C)]
#[derive(Debug)]
pub struct Desc {
    /// Oldest FO; 0 = free slot.
    pub tail: PmU64,
    /// Newest FO (hint).
    pub head: PmU64,
    /// Node of the list's FOs.
    pub node: PmU64,
    /// Entries with a sequence number below this are processed (see the module docs).
    pub applied: PmU64,
    /// Unused.
    pub pad: [PmU64; 4],
}

// SAFETY: a repr(C) struct of PM atomics without padding (8 · 8 = 64 bytes): valid for any bit
// pattern, no Drop, mutated only through the atomics.
unsafe impl PmType for Desc {}

/// The directory: one descriptor per list.
pub type Directory = [Desc; DIR_SLOTS];

/// Bytes of the directory block.
pub const DIR_BYTES: usize = std::mem::size_of::<Directory>();

/// An FO header (one cache line).
#[repr(C)]
#[derive(Debug)]
pub struct FoHeader {
    /// [`FO_MAGIC`].
    pub magic: PmU64,
    /// Next older FO.
    pub next: PmU64,
    /// Next newer FO.
    pub prev: PmU64,
    /// Sequence number of entry 0 in the list.
    pub base: PmU64,
    /// Entry slots.
    pub cap: PmU64,
    /// Directory slot.
    pub list: PmU64,
    /// Unused.
    pub pad: [PmU64; 2],
}

// SAFETY: a repr(C) struct of PM atomics without padding (8 · 8 = 64 bytes).
unsafe impl PmType for FoHeader {}

/// An FO entry (half a cache line; entries start at a line boundary, so none straddles one).
#[repr(C)]
#[derive(Debug)]
pub struct FoEntry {
    /// The key.
    pub key: PmU64,
    /// The value (unused for a tombstone).
    pub value: PmU64,
    /// Version and flags, see the module docs.
    pub meta: PmU64,
    /// Unused.
    pub pad: PmU64,
}

// SAFETY: a repr(C) struct of PM atomics without padding (4 · 8 = 32 bytes).
unsafe impl PmType for FoEntry {}

const _: () = assert!(std::mem::size_of::<Desc>() == 64);
const _: () = assert!(std::mem::size_of::<FoHeader>() == FO_HEADER as usize);
const _: () = assert!(std::mem::size_of::<FoEntry>() == ENTRY_SIZE as usize);
const _: () = assert!(64 % ENTRY_SIZE == 0);

/// Bytes of an FO with `cap` entries.
pub const fn fo_bytes(cap: usize) -> usize {
    FO_HEADER as usize + cap * ENTRY_SIZE as usize
}

/// A resolved FO: its pointer and header.
#[derive(Clone, Copy, Debug)]
pub struct Fo<'a> {
    /// Where it lives.
    pub ptr: PPtr,
    /// Its header.
    pub hdr: &'a FoHeader,
    /// Entry slots (read from the header once, validated).
    pub cap: usize,
}

impl<'a> Fo<'a> {
    /// Resolves an FO whose header may not be initialised yet (a block just allocated), with
    /// `cap` slots, checking the whole block lies in the pool.
    pub fn resolve_new(pool: &'a Pool, ptr: PPtr, cap: usize) -> Result<Fo<'a>> {
        pool.bytes(ptr, fo_bytes(cap))?;
        Ok(Fo { ptr, hdr: pool.get::<FoHeader>(ptr)?, cap })
    }

    /// Resolves an existing FO, validating magic and capacity (for pointers read from PM).
    pub fn resolve(pool: &'a Pool, ptr: PPtr) -> Result<Fo<'a>> {
        let hdr = pool.get::<FoHeader>(ptr)?;
        if hdr.magic.load(Ordering::Acquire) != FO_MAGIC {
            return Err(Error::corrupted(ENGINE, format!("FO magic: block {ptr} is not an FO")));
        }
        let cap = hdr.cap.load(Ordering::Acquire);
        if cap == 0 || cap > MAX_FO_ENTRIES as u64 {
            return Err(Error::corrupted(ENGINE, format!("FO capacity: FO {ptr} has {cap} slots")));
        }
        let cap = cap as usize;
        pool.bytes(ptr, fo_bytes(cap))?;
        Ok(Fo { ptr, hdr, cap })
    }

    /// Pointer of entry `i`.
    pub fn entry_ptr(&self, i: usize) -> PPtr {
        debug_assert!(i < self.cap);
        PPtr::from_raw(self.ptr.raw() + FO_HEADER + i as u64 * ENTRY_SIZE)
    }

    /// Entry `i` (`i < cap`).
    pub fn entry(&self, pool: &'a Pool, i: usize) -> &'a FoEntry {
        assert!(i < self.cap, "FO entry index {i} out of {}", self.cap);
        // SAFETY: the whole block (header + cap entries) was checked to lie in the pool when
        // `self` was resolved, and entries are 32-byte aligned inside a 64-byte aligned block.
        unsafe { pool.get_unchecked::<FoEntry>(self.entry_ptr(i)) }
    }

    /// The next older FO.
    pub fn next(&self) -> PPtr {
        // ORDERING: Acquire; pairs with the Release store when the FO is initialised.
        PPtr::from_raw(self.hdr.next.load(Ordering::Acquire))
    }

    /// Sequence number of entry `i` of this FO within its list.
    pub fn seq(&self, i: usize) -> u64 {
        // ORDERING: Relaxed; written before the FO was linked (published by the Release store
        // that linked it, which the caller's resolution went through).
        self.hdr.base.load(Ordering::Relaxed) + i as u64
    }

    /// The next newer FO.
    pub fn prev(&self) -> PPtr {
        // ORDERING: Acquire; pairs with the producer's Release store linking a new FO: the new
        // FO's initialised contents are visible.
        PPtr::from_raw(self.hdr.prev.load(Ordering::Acquire))
    }
}

/// The directory of a store.
pub fn directory(pool: &Pool, p: PPtr) -> Result<&Directory> {
    Ok(pool.get::<Directory>(p)?)
}
