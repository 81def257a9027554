//! The DRAM metadata layer of a decoupled leaf (papers/nbtree.txt §III-A) and the leaf-local
//! operations: fingerprint search, log-structured insert, in-place update/delete, and the
//! per-slot sync tags that carry the paper's `copy_bit` / `sync_bit`.
//!
//! # The bitmap word (`LeafMeta::bitmap`, 64 bits) and the pending word (`LeafMeta::pending`)
//!
//! ```text
//! bitmap  bits 0..63  commit   bit i: slot i holds a committed insert (its key may since be 0)
//!         bit  63     smo      the leaf is full; an SMO replaces it; no insert commits any more
//! pending bits 0..63           bit i: the insert of slot i may be committing or has committed
//!                              and is still writing its key to PM
//! ```
//!
//! An insert claims slot `pos` with `fetch_add` on `num`, writes the value to PM, sets the
//! fingerprint, sets its pending bit, then commits with one CAS on the bitmap — refused when the
//! SMO bit is set (the insert then clears its pending bit and helps the SMO), and only after
//! checking that no committed slot already holds the key (two concurrent inserts of one key: the
//! second CAS sees the first one's bit). Then it writes the key (the PM durability point of the
//! insert) and clears its pending bit. The pending bit is set *before* the commit CAS (with 63
//! slots, commit and pending bits no longer fit one word): whoever sees a commit bit through an
//! Acquire load of the bitmap sees that slot's pending bit set, or cleared after its key store. Writing the key only after winning keeps
//! PM free of duplicate keys at every instant, so recovery never has to choose between two
//! copies (docs/design.md "NBTree", insert).
//!
//! # The `next` word and the life of a new leaf
//!
//! ```text
//! next  bits 3..64  pointer to the next leaf (8-aligned)
//!       bit 0  FROZEN     this leaf's link phase has begun: `next` no longer changes
//!       bit 1  UNPATCHED  (last new leaf of an SMO) the old leaf's `next` of copy time, not
//!                         yet replaced by the old leaf's frozen `next`; never followed
//!       bit 2  PATCHING   (with UNPATCHED) one link-phase thread is writing the patch
//! ```
//!
//! A new leaf is born not LIVE ([`FLAG_LIVE`]) with `source` naming the old leaf; its SMO's
//! link phase patches the last new leaf's `next` (UNPATCHED → PATCHING → the frozen pointer)
//! before linking, and sets LIVE on the new leaves in the parent's transaction, before the old
//! leaf's LINK. Only live leaves take direct writes and run SMOs of their own; a writer that
//! reaches a leaf that is not live (along a predecessor's `next`) first finishes the old
//! leaf's SMO through `source` (docs/design.md "NBTree", link phase).
//!
//! # Sync tags (`LeafMeta::tags`, one `u32` per slot)
//!
//! ```text
//! bit 0  COPY   value copied by the copy phase, not yet synchronised or overwritten
//! bit 1  SYNC   value synchronised from the old leaf (sync phase, sync-on-write, sync-on-read)
//! bit 2  BUSY   one thread is storing the PM value of this slot under the tag
//! bit 3  SEAL   this leaf's own SMO has begun its sync phase: no delete or update commits
//!               here any more
//! bits 4..32    version, bumped at every release (ABA guard)
//! ```
//!
//! The paper keeps `copy_bit`/`sync_bit` in the two high bits of the PM value and changes value
//! and bits with one CAS. Here the value stays verbatim in PM (no value is out of range, no
//! out-of-line cell costs a second PM line) and the CAS is on the tag: `CAS(tag: t → BUSY)`,
//! store the value, release `BUSY → state'` — a one-store critical section per slot. A slot
//! whose state is 0 (a direct write happened) is never synchronised again, so direct writers
//! store without touching the tag once it is 0.
//!
//! SEAL is the old-leaf side of the same word (the leaf's role as the *source* of an SMO, where
//! COPY/SYNC describe its role as a *target*). Deletes and updates commit in a leaf only inside
//! the slot's BUSY section and only while the slot is unsealed; every sync-phase thread seals
//! each committed slot (waiting out BUSY) before it reads the old leaf. So a write either
//! committed before the sync pass read the slot (the pass, or the write's own sync-on-write,
//! carries it to the copy), or it finds SEAL and runs on the copy, which is authoritative for
//! the key from then on (a delete's success there is mirrored back into the old leaf for crash
//! consistency; an update first helps the SMO through its PM link, so that its write on the copy
//! is durable; docs/design.md "NBTree", sealing).

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};

use numakv_pmem::PPtr;
use parking_lot::{Mutex, RwLock};

use crate::layout::{fingerprint, Block, MAX_SLOTS};

/// Commit bits.
pub const COMMIT_MASK: u64 = (1 << 63) - 1;
/// The SMO bit.
pub const SMO_BIT: u64 = 1 << 63;

/// Tag: copied, not yet synchronised.
pub const TAG_COPY: u32 = 1;
/// Tag: synchronised from the old leaf.
pub const TAG_SYNC: u32 = 2;
/// Tag: a value store is in progress.
pub const TAG_BUSY: u32 = 4;
const TAG_STATE: u32 = 7;
/// Tag: the leaf's own SMO is in its sync phase; deletes go to the copy.
pub const TAG_SEAL: u32 = 8;
const TAG_VER: u32 = 16;

/// SMO flag: the sync phase is complete.
pub const FLAG_SYNC: u8 = 1;
/// SMO flag: the link phase is complete (parent updated); the leaf is retired.
pub const FLAG_LINK: u8 = 2;
/// The leaf is live: created by `create` or recovery, or a new leaf of an SMO whose link phase
/// is complete (set on both new leaves, in the parent's transaction, before the old leaf's
/// LINK). Writes land directly only in live leaves, and only a live leaf runs an SMO of its own
/// (docs/design.md "NBTree", link phase).
pub const FLAG_LIVE: u8 = 4;

/// `next` tag: the leaf's link phase has begun; its `next` no longer changes (a linker that
/// finds it frozen helps this leaf's SMO and then links into its copy instead).
pub const NEXT_FROZEN: usize = 1;
/// `next` tag: on the last new leaf of an SMO, the `next` copied from the old leaf, not yet
/// replaced by the old leaf's frozen `next` (the link phase's patch); never followed.
pub const NEXT_UNPATCHED: usize = 2;
/// `next` tag: with [`NEXT_UNPATCHED`], one link-phase thread is patching it.
pub const NEXT_PATCHING: usize = 4;
/// All tag bits of `next` (leaf metadata is 8-aligned).
pub const NEXT_TAGS: usize = 7;

/// The pointer in a `next` word, without its tags.
#[inline]
pub fn untag(p: *mut LeafMeta) -> *mut LeafMeta {
    (p as usize & !NEXT_TAGS) as *mut LeafMeta
}

/// One leaf's metadata (DRAM).
#[derive(Debug)]
pub struct LeafMeta {
    /// Fingerprint per slot (inline, like every per-slot array: one allocation per leaf).
    pub fps: [AtomicU8; MAX_SLOTS],
    /// Sync tag per slot (see the module docs); all 0 in leaves not born in an SMO.
    pub tags: [AtomicU32; MAX_SLOTS],
    /// Slots in use by the leaf's format (≤ `MAX_SLOTS`).
    slots: usize,
    /// Slots claimed by committed and in-flight inserts (may exceed the slot count).
    pub num: AtomicU32,
    /// Commit and SMO bits (see the module docs).
    pub bitmap: AtomicU64,
    /// Pending bits (see the module docs).
    pub pending: AtomicU64,
    /// The key-value block in PM.
    pub data: PPtr,
    /// Inclusive lower bound of the key range (immutable).
    pub low: u64,
    /// Exclusive upper bound (immutable; `u64::MAX` = +inf).
    pub high: u64,
    /// First new leaf of this leaf's SMO (the paper's `copy_ptr`); null before the copy phase.
    pub copy: AtomicPtr<LeafMeta>,
    /// SMO flags ([`FLAG_SYNC`], [`FLAG_LINK`]).
    pub flags: AtomicU8,
    /// Next leaf in key order, tagged ([`NEXT_FROZEN`], [`NEXT_UNPATCHED`],
    /// [`NEXT_PATCHING`]); read it with [`LeafMeta::next_ptr`].
    pub next: AtomicPtr<LeafMeta>,
    /// For a new leaf of an SMO, the old leaf (immutable). Dereferenced only while this leaf
    /// is not [`FLAG_LIVE`]: the old leaf is retired only after its LINK, which follows LIVE.
    pub source: *mut LeafMeta,
    /// Slots filled by the copy phase that created this leaf (0 for other leaves): the only
    /// slots synchronisation may touch.
    pub copied: u32,
    /// For each copied slot, the old leaf's slot it was copied from (immutable once published):
    /// a delete's sync-on-write zeroes only the copy of the instance it deleted, never a later
    /// instance of the key (docs/design.md "NBTree", sealing).
    pub src: [u8; MAX_SLOTS],
    /// For the first new leaf of an SMO that made two: the second one (immutable once the copy
    /// is published; `next` may later move on when that leaf is itself replaced).
    pub pair: *mut LeafMeta,
    /// In the first new leaf of an SMO: the Calloc SMO that allocated it, committed by whoever
    /// completes the link phase (set before the copy is published).
    pub(crate) smo: Mutex<Option<crate::alloc::SmoBlocks>>,
    /// Node-grained lock of the NBTree-W / NBTree-WR variants (unused by NBTree).
    pub lock: RwLock<()>,
}

// SAFETY: every field is an atomic, a lock, or immutable after publication (`data`, `low`,
// `high`, `copied`, `pair`); `pair` points to a leaf reclaimed only through the epoch.
unsafe impl Send for LeafMeta {}
// SAFETY: as for Send.
unsafe impl Sync for LeafMeta {}

impl LeafMeta {
    /// A leaf with `slots` empty slots.
    pub fn new(slots: usize, data: PPtr, low: u64, high: u64) -> LeafMeta {
        LeafMeta {
            fps: std::array::from_fn(|_| AtomicU8::new(0)),
            tags: std::array::from_fn(|_| AtomicU32::new(0)),
            slots,
            num: AtomicU32::new(0),
            bitmap: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            data,
            low,
            high,
            copy: AtomicPtr::new(std::ptr::null_mut()),
            flags: AtomicU8::new(FLAG_LIVE),
            next: AtomicPtr::new(std::ptr::null_mut()),
            source: std::ptr::null_mut(),
            copied: 0,
            src: [0; MAX_SLOTS],
            pair: std::ptr::null_mut(),
            smo: Mutex::new(None),
            lock: RwLock::new(()),
        }
    }

    /// Slot count.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// True once the SMO bit is set.
    #[inline]
    pub fn in_smo(&self) -> bool {
        // ORDERING: Acquire; pairs with the AcqRel fetch_or that sets the bit.
        self.bitmap.load(Ordering::Acquire) & SMO_BIT != 0
    }

    /// The copy, if the copy phase completed.
    #[inline]
    pub fn copy_ptr(&self) -> *mut LeafMeta {
        // ORDERING: Acquire; pairs with the AcqRel CAS that installs the copy (its metadata and
        // PM block were written before).
        self.copy.load(Ordering::Acquire)
    }

    /// SMO flags.
    #[inline]
    pub fn flags(&self) -> u8 {
        // ORDERING: Acquire; pairs with the Release fetch_or of the flags.
        self.flags.load(Ordering::Acquire)
    }

    /// Next leaf, untagged; null while the word is [`NEXT_UNPATCHED`] (a copied pointer that
    /// may name a leaf retired since).
    #[inline]
    pub fn next_ptr(&self) -> *mut LeafMeta {
        // ORDERING: Acquire; pairs with the SeqCst CAS of the link phase and the Release store
        // of the patch (the leaf named is initialised).
        let n = self.next.load(Ordering::Acquire);
        if n as usize & NEXT_UNPATCHED != 0 {
            return std::ptr::null_mut();
        }
        untag(n)
    }

    /// True once the leaf is live ([`FLAG_LIVE`]).
    #[inline]
    pub fn live(&self) -> bool {
        self.flags() & FLAG_LIVE != 0
    }

    /// Committed slots (commit bits only).
    #[inline]
    pub fn committed(&self) -> u64 {
        // ORDERING: Acquire; pairs with the AcqRel commit CAS (fingerprint and value of a
        // committed slot are visible).
        self.bitmap.load(Ordering::Acquire) & COMMIT_MASK
    }

    /// The slot holding `key` among committed slots, if any (fingerprint-filtered: in most cases
    /// one PM line is read).
    #[inline]
    pub fn find(&self, blk: &Block<'_>, key: u64) -> Option<usize> {
        if blk.shape().coupled {
            return Self::find_coupled(blk, key);
        }
        let fp = fingerprint(key);
        let mut bits = self.committed();
        while bits != 0 {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            // ORDERING: Relaxed; the fingerprint was published by the commit CAS read above.
            if self.fps[i].load(Ordering::Relaxed) == fp
                && blk.entry(i).key.load(Ordering::Acquire) == key
            {
                return Some(i);
            }
        }
        None
    }

    /// [`LeafMeta::find`] on a coupled leaf: bitmap and fingerprints are read from the block's
    /// PM metadata line (the PM line read the decoupled design saves).
    fn find_coupled(blk: &Block<'_>, key: u64) -> Option<usize> {
        let fp = fingerprint(key);
        // ORDERING: Acquire; pairs with the Release fetch_or of the committing insert (its
        // fingerprint store precedes it).
        let mut bits = blk.pm_bitmap().load(Ordering::Acquire) & COMMIT_MASK;
        while bits != 0 {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            // ORDERING: Relaxed; published by the bitmap load above.
            if blk.pm_fp(i).load(Ordering::Relaxed) == fp
                && blk.entry(i).key.load(Ordering::Acquire) == key
            {
                return Some(i);
            }
        }
        None
    }

    /// The value of slot `i` if it still holds `key`: the value is read between two reads of
    /// the key, and a slot's key only ever changes from a key to 0, so the value belonged to
    /// `key` at the moment it was read.
    #[inline]
    pub fn read_slot(blk: &Block<'_>, i: usize, key: u64) -> Option<u64> {
        let e = blk.entry(i);
        // ORDERING: Acquire loads; pair with the Release stores of key and value.
        let v = e.val.load(Ordering::Acquire);
        (e.key.load(Ordering::Acquire) == key).then_some(v)
    }

    /// If slot `i`'s tag satisfies `cond`, takes it (BUSY), runs `store`, and releases it with
    /// state `state`; false when `cond` failed.
    pub fn tagged_store(
        &self,
        i: usize,
        cond: impl Fn(u32) -> bool,
        state: u32,
        store: impl FnOnce(),
    ) -> bool {
        let tag = &self.tags[i];
        loop {
            // ORDERING: Acquire; pairs with the Release below (the previous holder's value store
            // is visible).
            let t = tag.load(Ordering::Acquire);
            if t & TAG_BUSY != 0 {
                std::hint::spin_loop();
                continue;
            }
            if !cond(t & TAG_STATE) {
                return false;
            }
            // ORDERING: Acquire on success, as the load above.
            if tag
                .compare_exchange(
                    t,
                    (t & !TAG_STATE) | TAG_BUSY,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                store();
                let ver = (t & !TAG_STATE).wrapping_add(TAG_VER);
                // ORDERING: Release; publishes the value store to the next tag holder.
                tag.store(ver | state, Ordering::Release);
                return true;
            }
        }
    }

    /// Seals slot `i` (sync phase of this leaf's SMO), waiting out a BUSY holder: a delete that
    /// held the slot has committed and is visible to the caller's subsequent reads.
    pub fn seal(&self, i: usize) {
        let tag = &self.tags[i];
        loop {
            // ORDERING: Acquire; pairs with the Release of a BUSY holder (its key CAS visible).
            let t = tag.load(Ordering::Acquire);
            if t & TAG_SEAL != 0 {
                return;
            }
            if t & TAG_BUSY != 0 {
                // Test hook: a sealer waiting out a BUSY holder.
                numakv_pmem::pause_point!("nbtree.smo.seal_wait");
                std::hint::spin_loop();
                continue;
            }
            // ORDERING: AcqRel; Acquire as the load above, Release orders nothing in particular
            // but keeps the RMW a full fence on the seal's side of the handshake.
            if tag.compare_exchange(t, t | TAG_SEAL, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }

    /// True once slot `i` is sealed.
    #[inline]
    pub fn sealed(&self, i: usize) -> bool {
        // ORDERING: Acquire; pairs with the AcqRel seal CAS.
        self.tags[i].load(Ordering::Acquire) & TAG_SEAL != 0
    }

    /// Runs `f` holding slot `i`'s BUSY bit, unless the slot is sealed (`None`). The tag's state
    /// bits are kept; the version is bumped.
    pub fn unsealed<R>(&self, i: usize, f: impl FnOnce() -> R) -> Option<R> {
        self.unsealed_with(i, TAG_STATE, f)
    }

    /// [`LeafMeta::unsealed`], keeping only the state bits in `keep` (0: the slot becomes a
    /// direct write's).
    fn unsealed_with<R>(&self, i: usize, keep: u32, f: impl FnOnce() -> R) -> Option<R> {
        let t = self.begin_unsealed(i)?;
        let r = f();
        self.end_unsealed(i, t, keep);
        Some(r)
    }

    /// Takes slot `i`'s BUSY bit unless the slot is sealed (`None`); returns the tag it
    /// replaced, for [`LeafMeta::end_unsealed`].
    pub(crate) fn begin_unsealed(&self, i: usize) -> Option<u32> {
        let tag = &self.tags[i];
        loop {
            // ORDERING: Acquire; pairs with the Release of the previous holder.
            let t = tag.load(Ordering::Acquire);
            if t & TAG_SEAL != 0 {
                return None;
            }
            if t & TAG_BUSY != 0 {
                // A BUSY section is one store or CAS (two loads and a store for a sync): a
                // wait as long as the holder's few instructions, unless it is preempted.
                std::hint::spin_loop();
                continue;
            }
            // ORDERING: Acquire on success, as the load above (the handshake with the seal is
            // the total order of RMWs on this word).
            if tag.compare_exchange(t, t | TAG_BUSY, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return Some(t);
            }
        }
    }

    /// Releases the BUSY bit [`LeafMeta::begin_unsealed`] took (`t`: the tag it returned),
    /// keeping only the state bits in `keep`.
    pub(crate) fn end_unsealed(&self, i: usize, t: u32, keep: u32) {
        let kept = (t & !TAG_STATE) | (t & keep);
        // ORDERING: Release; publishes what the section wrote to the sealer's Acquire.
        self.tags[i].store(kept.wrapping_add(TAG_VER), Ordering::Release);
    }

    /// The tag state of slot `i` (COPY / SYNC / 0), waiting out a BUSY holder.
    pub fn tag_state(&self, i: usize) -> u32 {
        loop {
            // ORDERING: Acquire, as in tagged_store.
            let t = self.tags[i].load(Ordering::Acquire);
            if t & TAG_BUSY == 0 {
                return t & TAG_STATE;
            }
            std::hint::spin_loop();
        }
    }

    /// Waits until no slot is pending (an insert committing, or writing its key). Called once
    /// the SMO bit is set: no insert commits any more, and one that set its pending bit clears
    /// it either after its key store or on finding the SMO bit.
    pub fn wait_pending(&self) {
        // ORDERING: Acquire; this thread has seen the SMO bit, so this load reads the SMO
        // fetch_or or later — an RMW in the release sequence of every earlier commit CAS — and
        // so synchronises with every committed insert: its pending bit (set before its CAS) is
        // visible here unless cleared since.
        let _ = self.bitmap.load(Ordering::Acquire);
        // ORDERING: Acquire; pairs with the Release fetch_and that clears a pending bit after
        // the key store (the key is visible once the bit reads clear).
        while self.pending.load(Ordering::Acquire) != 0 {
            std::hint::spin_loop();
        }
    }
}

/// What a leaf-level insert attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertOutcome {
    /// Inserted in slot.
    Inserted,
    /// The key is already present in the slot.
    Present(usize),
    /// The leaf is full or in an SMO: help the SMO and retry from the root.
    Smo,
}
