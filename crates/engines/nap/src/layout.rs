//! Persistent layout of Nap: its root slots (the three NAL pointers and their undo log) and the
//! per-node PC-views of a NAL (papers/nap.txt §4.3, §4.5).
//!
//! **Root slots** (node 0's header, [`SLOT_BASE`]`..`[`SLOT_BASE`]` + 8`, one cache line; the raw
//! engine keeps the slots below — FAST&FAIR uses 0 and 1):
//!
//! ```text
//! slot  name        meaning
//!    8  META        NAP_META: this pool holds a Nap layer of this format (0: never initialised)
//!    9  CUR         PPtr of the current NAL's node-0 PC-view, 0 = empty NAL
//!   10  PRE         PPtr of the previous NAL (switch phase 2), 0 = none
//!   11  GC          PPtr of the NAL being recycled (switch phase 3), 0 = none
//!   12  UNDO_STATE  1 = the undo record below is valid (a pointer update is in flight), else 0
//!   13  UNDO_CUR    CUR before the update
//!   14  UNDO_PRE    PRE before the update
//!   15  UNDO_GC     GC before the update
//! ```
//!
//! **PC-view** of one NAL on one node: one page-heap extent on that node (owner [`OWNER_NAP`]):
//!
//! ```text
//! offset          size      field
//!      0            64      ViewHeader: magic, seq, node, count, nodes, next (PPtr of node+1's view)
//!     64   round64(8·n)     key array: the NAL's keys, ascending (read-only once built)
//!  64+K           64·n      value array: one PcEntry (one cache line) per key, same order
//! ```
//!
//! **PcEntry** (the two-incarnation toggle of §4.3, Fig. 6(b)): `ind` (bit 0 selects the valid
//! incarnation), then incarnation 0 `(value, version)` and incarnation 1 `(value, version)`. A
//! write fills the invalid incarnation, then flips `ind`, then one flush + fence: all three stores
//! are in one line, so the line reaches PM with them in program order (x86 TSO; the shadow model
//! captures whole lines) and a crash leaves either the old or the new incarnation valid.
//!
//! **Version word**: bits 0..63 a per-NAL, per-key counter (1 = first write in this NAL; 0 = the
//! entry was never written, its value lives elsewhere), bit 63 [`DEL`] the deletion marker.

use numakv_pmem::heap::OWNER_ENGINE;
use numakv_pmem::{PmType, PmU64};

/// Name for errors.
pub(crate) const ENGINE: &str = "nap";

/// First root slot Nap uses: above the raw engine's (FAST&FAIR uses 0 and 1; engines are expected
/// to stay below 8 — see docs/design.md "Nap").
pub const SLOT_BASE: usize = 8;
/// Format marker slot.
pub const SLOT_META: usize = SLOT_BASE;
/// `cur_NAL`.
pub const SLOT_CUR: usize = SLOT_BASE + 1;
/// `pre_NAL`.
pub const SLOT_PRE: usize = SLOT_BASE + 2;
/// `gc_NAL`.
pub const SLOT_GC: usize = SLOT_BASE + 3;
/// Undo record valid flag.
pub const SLOT_UNDO_STATE: usize = SLOT_BASE + 4;
/// Undo record: the three pointers before the update, in CUR, PRE, GC order.
pub const SLOT_UNDO: usize = SLOT_BASE + 5;

/// Format version of Nap's own structures.
pub const NAP_FORMAT: u32 = 1;
/// Contents of [`SLOT_META`]: "NAP" and the format version.
pub const NAP_META: u64 = 0x4E41_5000_0000_0000 | NAP_FORMAT as u64;
/// Magic of a PC-view header.
pub const VIEW_MAGIC: u64 = 0x5643_5650_4E41_5031; // "NAPVPCV1" in spirit

/// Page-heap owner tag of PC-view extents. Distinct from NSM/Calloc and from the small
/// `OWNER_ENGINE + k` tags raw engines take, so recovery can find every Nap extent.
pub const OWNER_NAP: u8 = OWNER_ENGINE + 0x30;

/// Deletion marker (top bit of a version).
pub const DEL: u64 = 1 << 63;

/// Bytes of the view header.
pub const HEADER_BYTES: u64 = 64;
/// Bytes of one PC entry.
pub const ENTRY_BYTES: u64 = 64;

/// First line of every PC-view extent.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct ViewHeader {
    /// [`VIEW_MAGIC`].
    pub magic: PmU64,
    /// Sequence number of the NAL (for diagnostics; every view of a NAL carries the same).
    pub seq: PmU64,
    /// Node of this view.
    pub node: PmU64,
    /// Keys in the NAL.
    pub count: PmU64,
    /// Views in the NAL (the pool's node count).
    pub nodes: PmU64,
    /// PPtr of the next node's view (0 after the last).
    pub next: PmU64,
    _pad: [PmU64; 2],
}

/// One hot item's slot in one PC-view (one cache line).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct PcEntry {
    /// Bit 0: the valid incarnation.
    pub ind: PmU64,
    /// `[value0, version0, value1, version1]`.
    pub inc: [PmU64; 4],
    _pad: [PmU64; 3],
}

const _: () = assert!(std::mem::size_of::<ViewHeader>() == HEADER_BYTES as usize);
const _: () = assert!(std::mem::size_of::<PcEntry>() == ENTRY_BYTES as usize);

// SAFETY: both are `repr(C)` structs of PmU64 words only: valid for any bits, no Drop, mutated
// only through the atomics.
unsafe impl PmType for ViewHeader {}
// SAFETY: as above.
unsafe impl PmType for PcEntry {}

impl PcEntry {
    /// The valid incarnation as `(value, version)`.
    pub fn current(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering;
        // ORDERING: Acquire on the indicator pairs with its Release store in `write`: the
        // incarnation it selects is read after it.
        let i = (self.ind.load_unaccounted(Ordering::Acquire) & 1) as usize;
        (
            self.inc[2 * i].load_unaccounted(Ordering::Relaxed),
            self.inc[2 * i + 1].load_unaccounted(Ordering::Relaxed),
        )
    }
}

/// Offset of the key array in a view.
pub const fn keys_offset() -> u64 {
    HEADER_BYTES
}

/// Offset of the value array in a view of `count` keys.
pub const fn entries_offset(count: u64) -> u64 {
    HEADER_BYTES + (count * 8).div_ceil(64) * 64
}

/// Bytes of a view of `count` keys.
pub const fn view_bytes(count: u64) -> u64 {
    entries_offset(count) + count * ENTRY_BYTES
}
