//! Cells: the root leaf of a prefix that holds one pair, rewritten in place with one fence
//! (docs/design.md, "Byte-string layer", Cells).
//!
//! A key with its own 8-byte prefix (the common case: YCSB's keys, a Redis key that is not
//! `key:000…`) is a prefix of one pair. A record for it would be copied on every write: a new
//! block, a persisted record, a second fence for the engine's pointer store, a deferred free.
//! A cell keeps two value slots instead, and a write fills the inactive one and flips the
//! version word — the engine is only read.
//!
//! ```text
//! offset             size  field
//!      0                4  magic    CELL_MAGIC ("NKC1", little-endian)
//!      4                4  count    1
//!      8                8  len      bytes of the cell
//!     16                8  version  the active slot is slot `version & 1` (an 8-byte atomic)
//!     24                2  klen     1..=1024
//!     26                2  zero
//!     28                4  words    data words per slot (≥ 1): the value holds ≤ 7·words bytes
//!     32       pad8(klen)  key
//!      …   8·(1 + words)   slot 0: a length word, then `words` data words
//!      …   8·(1 + words)   slot 1: the same
//! ```
//!
//! Every word of a slot carries, in its top byte, the **tag** of the version it was written
//! for (`version & 0xff`); the low 7 bytes hold the length (word 0) or 7 value bytes (the
//! others, little-endian, zero-padded). A slot is *complete* for version `v` when its length is
//! within the capacity and all its words carry `v`'s tag.
//!
//! **Crash argument.** A rewrite to version `v + 1` writes every word of the inactive slot with
//! `v + 1`'s tag, stores the version, flushes both and fences once. Before that fence any
//! subset of the slot's words and of the version may have reached PM, 8 bytes at a time:
//! - version `v` durable: slot `v & 1` is untouched since its own write was fenced: old value.
//! - version `v + 1` durable and its slot complete: the new value.
//! - version `v + 1` durable but some word without its tag: [`CellRef::repair`] (recovery)
//!   rolls back to `v`, whose slot is complete. A word not yet rewritten carries the tag of the
//!   slot's previous write (`v - 1`, two versions back, as every write fills the whole slot),
//!   never `v + 1`'s — so this is decided exactly, not by a checksum. Before the rollback the
//!   torn slot is scrubbed to `v - 1`'s tag, so that the next write of that slot (version
//!   `v + 1` again) cannot complete it with words left from the torn one.
//! - version `v` durable but some words of the inactive slot already with `v + 1`'s tag (the
//!   crash cut the rewrite before its version reached PM): the old value stands, and recovery
//!   scrubs those words to `v - 1`'s tag for the same reason (the next write is `v + 1` again).
//!
//! Readers copy the active slot under the version's sequence lock (a slot is rewritten only
//! after the version moved past it, and a reader re-checks the version after its copy).

use std::sync::atomic::{fence, AtomicU64, Ordering};

use numakv_index::{Error, Result};
use numakv_pmem::{account, PPtr, PmU64, Pool};

use crate::layout::{Record, ENTRY_HEADER_BYTES, HEADER_BYTES, LAYER, MAX_KEY_LEN, RECORD_MAGIC};

/// Magic of a cell ("NKC1" little-endian).
pub const CELL_MAGIC: u32 = u32::from_le_bytes(*b"NKC1");
/// Bytes of a cell before its key.
pub const CELL_FIXED_BYTES: usize = 32;
/// Offset of the version word.
const VERSION_OFF: usize = 16;
/// Offset of `klen` (u16), then 2 zero bytes and `words` (u32).
const SHAPE_OFF: usize = 24;
/// A one-pair root gets a cell when its value is at most this long (two slots of a larger
/// value cost more space than an in-place rewrite saves); a larger one gets a record.
pub const CELL_MAX_VALUE: usize = 1024;
/// Value bytes per data word (the eighth byte is the tag).
const PAYLOAD: usize = 7;
/// The low 7 bytes of a word.
const PAYLOAD_MASK: u64 = (1 << 56) - 1;

/// `n` rounded up to a multiple of 8.
#[inline]
fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// The tag of version `v`, in a word's top byte.
#[inline]
fn tag(v: u64) -> u64 {
    (v & 0xff) << 56
}

/// Data words per slot of a cell created for a value of `vlen` bytes: the value's, at least
/// one, so that rewrites with a value of the same size stay in place.
#[inline]
pub(crate) fn cell_words(vlen: usize) -> usize {
    vlen.div_ceil(PAYLOAD).max(1)
}

/// Bytes of a cell with a key of `klen` bytes and `words` data words per slot.
#[inline]
pub(crate) fn cell_bytes(klen: usize, words: usize) -> usize {
    CELL_FIXED_BYTES + pad8(klen) + 2 * 8 * (1 + words)
}

fn corrupted(at: PPtr, what: impl std::fmt::Display) -> Error {
    Error::corrupted(LAYER, format!("cell at {at}: {what}"))
}

/// A published cell, read in place.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CellRef<'g> {
    at: PPtr,
    key: &'g [u8],
    version: &'g PmU64,
    /// Start of slot 0 (slot 1 follows); 8-byte aligned.
    slots: *const u8,
    words: usize,
}

impl<'g> CellRef<'g> {
    /// The cell at `p` whose header says `count` entries and `len` bytes.
    ///
    /// # Safety
    /// As for [`crate::layout::Node::at`]: `p` is published and not freed during 'g.
    pub(crate) unsafe fn at(pool: &'g Pool, p: PPtr, count: u32, len: u64) -> Result<CellRef<'g>> {
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l >= CELL_FIXED_BYTES && count == 1 && p.offset() % 8 == 0)
            .ok_or_else(|| corrupted(p, format_args!("length {len}, count {count}")))?;
        let all = pool.bytes(p, len)?;
        let mut shape = [0u8; 8];
        // SAFETY: klen and words are immutable once the cell is published.
        unsafe { all.read(SHAPE_OFF, &mut shape) };
        let klen = u16::from_le_bytes([shape[0], shape[1]]) as usize;
        let words = u32::from_le_bytes([shape[4], shape[5], shape[6], shape[7]]) as usize;
        if klen == 0
            || klen > MAX_KEY_LEN
            || words == 0
            || words > cell_words(CELL_MAX_VALUE)
            || cell_bytes(klen, words) != len
        {
            return Err(corrupted(p, format_args!("key {klen} B, {words} words, length {len}")));
        }
        let base = all.as_ptr();
        account::record_read(base as usize + CELL_FIXED_BYTES, klen);
        // SAFETY: the key lies inside the `len` bytes that `pool.bytes` checked, is immutable
        // once published, and the cell is not freed during 'g (the caller's contract).
        let key = unsafe { std::slice::from_raw_parts(base.add(CELL_FIXED_BYTES), klen) };
        // SAFETY: the version word is inside the checked range and 8-byte aligned (`p` is);
        // `PmU64` is valid for any bytes and accessed only atomically.
        let version = unsafe { &*(base.add(VERSION_OFF) as *const PmU64) };
        let slots = base.wrapping_add(CELL_FIXED_BYTES + pad8(klen));
        Ok(CellRef { at: p, key, version, slots, words })
    }

    /// Where the cell lives.
    pub(crate) fn at_ptr(&self) -> PPtr {
        self.at
    }

    /// Its key.
    pub(crate) fn key(&self) -> &'g [u8] {
        self.key
    }

    /// The longest value a rewrite can keep in place.
    pub(crate) fn capacity(&self) -> usize {
        PAYLOAD * self.words
    }

    /// The slot that version `v` makes active.
    fn slot(&self, v: u64) -> *const u8 {
        self.slots.wrapping_add((v & 1) as usize * 8 * (1 + self.words))
    }

    /// Word `i` (0 = the length) of `slot`.
    ///
    /// # Safety
    /// `slot` is one of this cell's slots and `i ≤ words`.
    unsafe fn word(&self, slot: *const u8, i: usize) -> &'g AtomicU64 {
        // SAFETY: the word lies inside the cell (checked against its length at `at`), which
        // stays mapped and allocated during 'g, and is 8-byte aligned; slot words, which a
        // writer stores to while readers load, are only ever accessed as atomics.
        unsafe { &*(slot.wrapping_add(8 * i) as *const AtomicU64) }
    }

    /// Decodes `slot` into `out` if it is complete for the version of tag `t`; `false` if not.
    /// Reads the length word and the words the value occupies; with `all`, every word.
    fn decode(&self, slot: *const u8, t: u64, out: &mut Vec<u8>, all: bool) -> bool {
        // SAFETY: word 0 of a slot of this cell.
        let w0 = unsafe { self.word(slot, 0) }.load(Ordering::Relaxed);
        let vlen = (w0 & PAYLOAD_MASK) as usize;
        if w0 & !PAYLOAD_MASK != t || vlen > self.capacity() {
            return false;
        }
        out.clear();
        let n = if all { self.words } else { vlen.div_ceil(PAYLOAD) };
        for i in 1..=n {
            // SAFETY: i ≤ words.
            let w = unsafe { self.word(slot, i) }.load(Ordering::Relaxed);
            if w & !PAYLOAD_MASK != t {
                return false;
            }
            out.extend_from_slice(&w.to_le_bytes()[..PAYLOAD]);
        }
        out.truncate(vlen);
        true
    }

    /// Fills every word of `slot` with tag `t`: the length, the value, zeros after it.
    ///
    /// # Safety
    /// `slot` is this cell's inactive slot (no reader validates a copy of it until the version
    /// names it) or the cell is not published; the caller is the only writer; `value` fits.
    unsafe fn encode(&self, slot: *const u8, t: u64, value: &[u8]) {
        // SAFETY: word 0 of a slot of this cell.
        unsafe { self.word(slot, 0) }.store(t | value.len() as u64, Ordering::Relaxed);
        let mut chunks = value.chunks(PAYLOAD);
        for i in 1..=self.words {
            let mut b = [0u8; 8];
            if let Some(c) = chunks.next() {
                b[..c.len()].copy_from_slice(c);
            }
            // SAFETY: i ≤ words.
            unsafe { self.word(slot, i) }.store(t | u64::from_le_bytes(b), Ordering::Relaxed);
        }
        account::record_write(slot as usize, 8 * (1 + self.words));
    }

    /// The value, copied into `out` under the version's sequence lock: the value of one
    /// version, whatever writers do meanwhile. For lock-free readers (pinned).
    pub(crate) fn value_into(&self, out: &mut Vec<u8>) -> Result<()> {
        loop {
            let v = self.version.load(Ordering::Acquire);
            let slot = self.slot(v);
            let complete = self.decode(slot, tag(v), out, false);
            // A reader has copied a slot and not yet re-checked the version.
            numakv_pmem::pause_point!("bytes.cell.copied");
            // ORDERING: the slot's loads happen before the version's re-check. A writer's slot
            // stores follow a release fence issued after the version store that made the slot
            // inactive (`overwrite`), so a load that saw one of them makes the re-check see a
            // newer version than `v`.
            fence(Ordering::Acquire);
            if self.version.load_unaccounted(Ordering::Relaxed) == v {
                if !complete {
                    return Err(corrupted(self.at, format_args!("slot of version {v} incomplete")));
                }
                account::record_read(slot as usize, 8 + out.len());
                return Ok(());
            }
            std::hint::spin_loop();
        }
    }

    /// The pair as a one-entry record image in `buf` (a DRAM copy, linked to this cell's
    /// address), for the write paths that merge a leaf's entries. The caller holds the stripe
    /// lock of the cell's prefix.
    pub(crate) fn as_record<'b>(&self, buf: &'b mut Vec<u8>) -> Result<Record<'b>> {
        let mut value = Vec::new();
        self.value_into(&mut value)?;
        let len = HEADER_BYTES + ENTRY_HEADER_BYTES + self.key.len() + value.len();
        buf.clear();
        buf.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
        buf.extend_from_slice(&1u32.to_le_bytes());
        buf.extend_from_slice(&(len as u64).to_le_bytes());
        buf.extend_from_slice(&(self.key.len() as u16).to_le_bytes());
        buf.extend_from_slice(&(value.len() as u32).to_le_bytes());
        buf.extend_from_slice(self.key);
        buf.extend_from_slice(&value);
        Record::in_dram(self.at, buf)
    }

    /// Rewrites the value in place: every word of the inactive slot with the next version's
    /// tag, then the version, both made durable by one fence. `false` (nothing written) when
    /// `value` exceeds the capacity.
    ///
    /// # Safety
    /// The caller holds the stripe lock of the cell's prefix exclusively (no other writer of
    /// this cell runs), and the cell is the prefix's linked root.
    pub(crate) unsafe fn overwrite(&self, pool: &Pool, value: &[u8]) -> bool {
        if value.len() > self.capacity() {
            return false;
        }
        // ORDERING: Relaxed: only this writer stores the version (the stripe lock).
        let next = self.version.load(Ordering::Relaxed).wrapping_add(1);
        let slot = self.slot(next);
        // ORDERING: the sequence lock's writer side: a reader that loads one of the slot's
        // stores below then re-reads a version at least as new as the current one, which
        // already names the other slot (see `value_into`).
        fence(Ordering::Release);
        // SAFETY: the inactive slot, and we are the only writer (the caller's contract).
        unsafe { self.encode(slot, tag(next), value) };
        // A rewrite has filled the inactive slot; the version still names the old one.
        numakv_pmem::pause_point!("bytes.cell.slot_written");
        self.version.store(next, Ordering::Release);
        pool.flush(slot, 8 * (1 + self.words));
        pool.flush((self.version as *const PmU64).cast(), 8);
        // PERSIST: the slot and the version are durable together — in whatever order their
        // words reached PM before, `repair` decides exactly which version is complete — and
        // the rewrite is acknowledged when this returns.
        pool.fence();
        true
    }

    /// Recovery: if the version's slot is incomplete (a crash during a rewrite), rolls back to
    /// the previous version, whose slot is complete. `true` when it rolled back.
    ///
    /// # Safety
    /// Nothing runs concurrently (recovery); the cell is linked.
    pub(crate) unsafe fn repair(&self, pool: &Pool) -> Result<bool> {
        let mut scratch = Vec::new();
        // ORDERING: recovery is single-threaded.
        let v = self.version.load_unaccounted(Ordering::Acquire);
        if self.decode(self.slot(v), tag(v), &mut scratch, true) {
            // A rewrite to v + 1 may have been cut before its version reached PM while some
            // of its slot's words did: version v stands, but those words carry v + 1's tag,
            // and the next write of that slot is version v + 1 again — torn once more, it
            // would be completed by them (a mix of two values passing for one). Scrub them.
            let next = v.wrapping_add(1);
            let inactive = self.slot(next);
            let stale = (0..=self.words).any(|i| {
                // SAFETY: i ≤ words, a word of this cell's inactive slot.
                let w = unsafe { self.word(inactive, i) }.load(Ordering::Relaxed);
                w & !PAYLOAD_MASK == tag(next)
            });
            if stale {
                // SAFETY: nothing runs concurrently; the slot is the inactive one.
                unsafe { self.encode(inactive, tag(v.wrapping_sub(1)), &[]) };
                // PERSIST: no word of the inactive slot keeps v + 1's tag before anyone
                // writes version v + 1.
                pool.persist(inactive, 8 * (1 + self.words));
            }
            return Ok(false);
        }
        let prev = v.wrapping_sub(1);
        if v == 0 || !self.decode(self.slot(prev), tag(prev), &mut scratch, true) {
            return Err(corrupted(
                self.at,
                format_args!("neither version {v} nor {prev} complete"),
            ));
        }
        let torn = self.slot(v);
        // SAFETY: nothing runs concurrently; the slot is the torn, inactive-to-be one.
        unsafe { self.encode(torn, tag(v.wrapping_sub(2)), &[]) };
        // PERSIST: no word of the torn slot keeps version v's tag before the version goes back
        // (the next write of this slot is version v again). A crash before this fence leaves
        // version v incomplete: recovery repairs it again.
        pool.persist(torn, 8 * (1 + self.words));
        self.version.store(prev, Ordering::Release);
        // PERSIST: the rollback.
        pool.persist((self.version as *const PmU64).cast(), 8);
        Ok(true)
    }

    /// Structural check: the active slot complete. Quiescent.
    pub(crate) fn check(&self) -> Result<()> {
        let v = self.version.load_unaccounted(Ordering::Acquire);
        if self.decode(self.slot(v), tag(v), &mut Vec::new(), true) {
            Ok(())
        } else {
            Err(corrupted(self.at, format_args!("slot of version {v} incomplete")))
        }
    }
}

/// Writes a cell holding `key` and `value` (version 0 in slot 0; slot 1 filled with the tag of
/// version −1, so that its first write — version 1 — starts from no word of its own tag) into
/// the fresh block `p` of [`cell_bytes`]`(key.len(), cell_words(value.len()))` bytes, then
/// persists it.
///
/// # Safety
/// `p` must be a block of at least that size, just allocated and not yet published.
pub(crate) unsafe fn write_cell(pool: &Pool, p: PPtr, key: &[u8], value: &[u8]) -> Result<()> {
    let words = cell_words(value.len());
    let len = cell_bytes(key.len(), words);
    if key.is_empty() || key.len() > MAX_KEY_LEN || value.len() > CELL_MAX_VALUE {
        return Err(Error::corrupted(
            LAYER,
            format!("cell build: key {} B, value {} B", key.len(), value.len()),
        ));
    }
    let dst = pool.bytes(p, len)?;
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&CELL_MAGIC.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&(len as u64).to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&(key.len() as u16).to_le_bytes());
    b.extend_from_slice(&[0, 0]);
    b.extend_from_slice(&(words as u32).to_le_bytes());
    b.extend_from_slice(key);
    b.resize(CELL_FIXED_BYTES + pad8(key.len()), 0);
    for (t, v) in [(tag(0), value), (tag(u64::MAX), &[][..])] {
        b.extend_from_slice(&(t | v.len() as u64).to_le_bytes());
        let mut chunks = v.chunks(PAYLOAD);
        for _ in 0..words {
            let mut w = [0u8; 8];
            if let Some(c) = chunks.next() {
                w[..c.len()].copy_from_slice(c);
            }
            b.extend_from_slice(&(t | u64::from_le_bytes(w)).to_le_bytes());
        }
    }
    debug_assert_eq!(b.len(), len);
    // SAFETY: `p` is unpublished and ours alone (the caller's contract); `b.len() == len`.
    if !unsafe { dst.write(0, &b) } {
        return Err(Error::corrupted(LAYER, format!("cell build: {} of {len} bytes", b.len())));
    }
    // PERSIST: the whole cell is durable before the index points at it (the index's write,
    // which follows, is durable when it returns): a reachable cell is always complete.
    pool.persist(dst.as_ptr(), len);
    Ok(())
}
