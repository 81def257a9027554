//! Persistent layout of NStore: root slots, per-node meta pages, Nlog files and their entries,
//! the packed entry address (`v_addr`), and the clean-shutdown snapshot.
//!
//! Everything is little-endian 8-byte words written through the pool's accessors, so every word
//! store is failure-atomic. Byte-level formats and the invariants are in docs/design.md, section
//! "NStore".
//!
//! # Nlog file (one page-heap extent, owner [`OWNER_ENGINE`], aux [`AUX_LOG`])
//!
//! ```text
//! offset  size  field
//!      0     8  magic     FILE_MAGIC
//!      8     8  file_id   ≥ 1, unique per node for the store's life (see NodeMeta)
//!     16     8  node      the node whose pool holds the file
//!     24     8  cluster   hash cluster, < clusters
//!     32     8  size      bytes of the extent
//!     40     8  geometry  k_len | v_len << 16 of the fixed-size entries of this file
//!     48     8  checksum  crc32 of bytes 0..48
//!     56     8  reserved  0
//!     64  40·n  entries   n = (size - 64) / ENTRY_SIZE slots
//! ```
//!
//! # Entry (40 bytes for 8-byte keys and values)
//!
//! ```text
//!  0  meta     bits 0..2   op: 0 inv, 1 del, 2 upd, 3 ins (papers/nstore.txt §III-D)
//!              bits 2..8   0
//!              bits 8..20  k_len (bytes)
//!              bits 20..32 v_len (bytes)
//!              bits 32..64 stamp: the file id of the file the entry was written into
//!  8  version  per-cluster version, ≥ 1
//! 16  h_addr   v_addr of the previous entry of the key (0 = "invalid h_addr": none)
//! 24  key      k_len bytes (8), padded to 8
//! 32  value    v_len bytes (8), padded to 8
//! ```
//!
//! `meta` is written last, in one 8-byte store, after the rest of the entry is durable: an entry
//! is valid iff its stamp equals the file's id and its op is not `inv`. A torn entry's meta never
//! became durable. A new file is zeroed (durably, before its header) because the stamp alone does
//! not reject stale bytes: stale *entries* carry their file's different id, but the pages may
//! also hold client values shaped as entries stamped with the (predictable) id of the next file
//! (docs/design.md, "NStore", Nlog files).

use std::sync::atomic::Ordering;

use numakv_index::{Error, Result};
use numakv_pmem::{PmType, PmU64};

/// Engine name for errors.
pub(crate) const ENGINE: &str = "nstore";

pub use numakv_pmem::heap::OWNER_ENGINE;
/// Page-heap aux tag of an Nlog file extent.
pub const AUX_LOG: u16 = 1;
/// Page-heap aux tag of a node meta page.
pub const AUX_META: u16 = 2;
/// Page-heap aux tag of a clean-shutdown snapshot extent.
pub const AUX_SNAPSHOT: u16 = 3;

/// Root slot holding the format word ([`format_word`]).
pub const SLOT_FORMAT: usize = 0;
/// Root slot holding the clean-shutdown snapshot's PPtr — the "normal shutdown flag" of
/// §III-G: non-zero only between a completed snapshot and the next open, which resets it.
pub const SLOT_SNAPSHOT: usize = 1;

const FORMAT_MAGIC: u64 = 0x4e53; // "NS"

/// The format word: `magic << 48 | clusters << 24 | file_pages` (both below 2^24).
pub fn format_word(clusters: u32, file_pages: u32) -> u64 {
    (FORMAT_MAGIC << 48) | (u64::from(clusters) << 24) | u64::from(file_pages)
}

/// `(clusters, file_pages)` of a format word, `None` if it is not an NStore format word.
pub fn decode_format(w: u64) -> Option<(u32, u32)> {
    if w >> 48 != FORMAT_MAGIC {
        return None;
    }
    let clusters = ((w >> 24) & 0xff_ffff) as u32;
    let pages = (w & 0xff_ffff) as u32;
    (clusters > 0 && clusters <= MAX_CLUSTERS && pages > 0).then_some((clusters, pages))
}

/// Most hash clusters.
pub const MAX_CLUSTERS: u32 = 1 << 16;
/// Most NUMA nodes (6 bits of a v_addr).
pub const MAX_NODES: usize = 1 << NODE_BITS;

// ---------------------------------------------------------------------------------------------
// v_addr
// ---------------------------------------------------------------------------------------------

const NODE_BITS: u32 = 6;
const FILE_BITS: u32 = 26;
const SLOT_BITS: u32 = 24;
const LEN_BITS: u32 = 8;
const _: () = assert!(NODE_BITS + FILE_BITS + SLOT_BITS + LEN_BITS == 64);

/// Largest file id (ids are never reused on a node; see docs/design.md).
pub const MAX_FILE_ID: u32 = (1 << FILE_BITS) - 1;
/// Most entry slots per file.
pub const MAX_SLOTS: u64 = 1 << SLOT_BITS;

/// The address of a log entry, as the volatile index stores it (papers/nstore.txt Fig. 5):
///
/// ```text
/// bits 58..64  numa id   node whose pool holds the file
/// bits 32..58  file id   ≥ 1 (so a valid VAddr is never 0, the "invalid h_addr")
/// bits  8..32  offset    entry slot within the file (byte offset = 64 + slot · entry size)
/// bits  0..8   length    entry length in 8-byte words
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VAddr(pub u64);

impl VAddr {
    /// Packs the four fields; `None` when one does not fit.
    pub fn new(node: usize, file: u32, slot: u32, words: u32) -> Option<VAddr> {
        if node >= MAX_NODES
            || file == 0
            || file > MAX_FILE_ID
            || u64::from(slot) >= MAX_SLOTS
            || words >= 1 << LEN_BITS
        {
            return None;
        }
        Some(VAddr(
            ((node as u64) << (64 - NODE_BITS))
                | (u64::from(file) << (SLOT_BITS + LEN_BITS))
                | (u64::from(slot) << LEN_BITS)
                | u64::from(words),
        ))
    }
    /// The node.
    pub fn node(self) -> usize {
        (self.0 >> (64 - NODE_BITS)) as usize
    }
    /// The file id.
    pub fn file(self) -> u32 {
        ((self.0 >> (SLOT_BITS + LEN_BITS)) & u64::from(MAX_FILE_ID)) as u32
    }
    /// The entry slot.
    pub fn slot(self) -> u32 {
        ((self.0 >> LEN_BITS) & (MAX_SLOTS - 1)) as u32
    }
    /// The entry length in 8-byte words.
    pub fn words(self) -> u32 {
        (self.0 & ((1 << LEN_BITS) - 1)) as u32
    }
}

// ---------------------------------------------------------------------------------------------
// Entries
// ---------------------------------------------------------------------------------------------

/// Log entry operations (the 2-bit `op` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Invalid: torn, never written, or marked by GC as history.
    Inv = 0,
    /// Delete.
    Del = 1,
    /// Update (has a parent in `h_addr`).
    Upd = 2,
    /// Insert (no parent, or a GC rewrite whose parent is the rewritten original).
    Ins = 3,
}

impl Op {
    fn from_bits(b: u64) -> Op {
        match b & OP_MASK {
            1 => Op::Del,
            2 => Op::Upd,
            3 => Op::Ins,
            _ => Op::Inv,
        }
    }
}

/// Bits of `op` in the meta word.
pub const OP_MASK: u64 = 3;
/// Key length of every entry this build writes (u64 keys, DESIGN.md §2).
pub const K_LEN: u64 = 8;
/// Value length of every entry this build writes (u64 values).
pub const V_LEN: u64 = 8;
/// Header of every file; entries start here.
pub const FILE_HEADER: u64 = 64;

/// A log entry with 8-byte key and value.
#[repr(C)]
#[derive(Debug)]
pub struct Entry {
    /// op | k_len | v_len | stamp (see the module docs); written last.
    pub meta: PmU64,
    /// Per-cluster version.
    pub version: PmU64,
    /// Previous entry of the key, 0 for none.
    pub h_addr: PmU64,
    /// The key.
    pub key: PmU64,
    /// The value.
    pub value: PmU64,
}

// SAFETY: five PM words; every bit pattern is a valid (if meaningless) entry.
unsafe impl PmType for Entry {}

/// Bytes of one entry (header words + padded key + padded value).
pub const ENTRY_SIZE: u64 = 24 + K_LEN.next_multiple_of(8) + V_LEN.next_multiple_of(8);
/// [`ENTRY_SIZE`] in 8-byte words (the v_addr length field).
pub const ENTRY_WORDS: u32 = (ENTRY_SIZE / 8) as u32;
const _: () = assert!(std::mem::size_of::<Entry>() as u64 == ENTRY_SIZE);

/// The meta word of an entry.
pub fn meta_word(op: Op, file: u32) -> u64 {
    (op as u64) | (K_LEN << 8) | (V_LEN << 20) | (u64::from(file) << 32)
}

/// A decoded meta word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    /// The operation.
    pub op: Op,
    /// Whether the stamp and the lengths say this slot holds an entry of file `file` (valid or
    /// marked invalid by GC) — as opposed to stale bytes or a torn write.
    pub written: bool,
}

/// Decodes `w` as the meta word of a slot of file `file`.
pub fn decode_meta(w: u64, file: u32) -> Meta {
    let written =
        (w >> 32) == u64::from(file) && (w >> 8) & 0xfff == K_LEN && (w >> 20) & 0xfff == V_LEN;
    Meta { op: if written { Op::from_bits(w) } else { Op::Inv }, written }
}

// ---------------------------------------------------------------------------------------------
// Variable-length entries
// ---------------------------------------------------------------------------------------------

/// Geometry word of a file of fixed 8-byte keys and values.
pub const GEOMETRY_FIXED: u64 = K_LEN | (V_LEN << 16);
/// Geometry word of a file of variable-length entries.
pub const GEOMETRY_VAR: u64 = 0xffff | (0xffff << 16);

/// The head of a variable-length entry (at a word offset of a variable-length file); the key's
/// `k_len` bytes follow, padded to 8, then the value's `v_len` bytes, padded to 8.
///
/// ```text
///  0  meta     op | k_len << 8 | v_len << 20 | stamp << 32 — written last (as for fixed entries)
///  8  version
/// 16  h_addr
/// 24  size     entry words | stamp << 32 — persisted when the space is reserved, under the
///              cluster lock, so that recovery can step over an entry whose body is torn
/// 32  key, value
/// ```
#[repr(C)]
#[derive(Debug)]
pub struct VarHead {
    /// op | k_len | v_len | stamp; written last.
    pub meta: PmU64,
    /// Per-cluster version.
    pub version: PmU64,
    /// Previous entry of the key, 0 for none.
    pub h_addr: PmU64,
    /// Entry words | stamp << 32; durable from the reservation on.
    pub size: PmU64,
}

// SAFETY: four PM words; every bit pattern is a (possibly invalid) head, validated on read.
unsafe impl PmType for VarHead {}

/// Bytes of a [`VarHead`].
pub const VAR_HEAD: u64 = 32;
const _: () = assert!(std::mem::size_of::<VarHead>() as u64 == VAR_HEAD);
/// Most words of one entry (the v_addr length field).
pub const MAX_ENTRY_WORDS: u32 = (1 << LEN_BITS) - 1;
/// Longest key or value of a variable-length entry (the 12-bit length fields); the whole entry
/// must also fit [`MAX_ENTRY_WORDS`].
pub const MAX_VAR_LEN: usize = 0xfff;

/// Words of a variable-length entry with a `k_len`-byte key and a `v_len`-byte value; `None`
/// when the key is empty or too long, the value too long, or the entry longer than
/// [`MAX_ENTRY_WORDS`].
pub fn var_words(k_len: usize, v_len: usize) -> Option<u32> {
    if k_len == 0 || k_len > MAX_VAR_LEN || v_len > MAX_VAR_LEN {
        return None;
    }
    let w = VAR_HEAD / 8 + (k_len as u64).div_ceil(8) + (v_len as u64).div_ceil(8);
    u32::try_from(w).ok().filter(|&w| w <= MAX_ENTRY_WORDS)
}

/// The meta word of a variable-length entry.
pub fn var_meta_word(op: Op, k_len: usize, v_len: usize, file: u32) -> u64 {
    (op as u64) | ((k_len as u64) << 8) | ((v_len as u64) << 20) | (u64::from(file) << 32)
}

/// The size word of a variable-length entry.
pub fn var_size_word(words: u32, file: u32) -> u64 {
    u64::from(words) | (u64::from(file) << 32)
}

/// Words of the entry whose size word is `w` in file `file`: `None` when the word is not
/// stamped with `file` or out of range (no entry was ever reserved there).
pub fn decode_var_size(w: u64, file: u32) -> Option<u32> {
    let words = (w & 0xffff_ffff) as u32;
    ((w >> 32) == u64::from(file) && words > VAR_HEAD as u32 / 8 && words <= MAX_ENTRY_WORDS)
        .then_some(words)
}

/// Decodes the meta word `w` of a variable-length entry of `words` words in file `file`:
/// `(op, k_len, v_len)` when the entry was written (stamp and lengths agree with the size),
/// `None` for a torn entry.
pub fn decode_var_meta(w: u64, file: u32, words: u32) -> Option<(Op, usize, usize)> {
    let k_len = ((w >> 8) & 0xfff) as usize;
    let v_len = ((w >> 20) & 0xfff) as usize;
    ((w >> 32) == u64::from(file) && (w >> 2) & 0x3f == 0 && var_words(k_len, v_len) == Some(words))
        .then(|| (Op::from_bits(w), k_len, v_len))
}

// ---------------------------------------------------------------------------------------------
// File header
// ---------------------------------------------------------------------------------------------

/// "NSTLOG01"
pub const FILE_MAGIC: u64 = u64::from_le_bytes(*b"NSTLOG01");

/// The file header (first cache line of a file).
#[repr(C)]
#[derive(Debug)]
pub struct FileHeader {
    /// [`FILE_MAGIC`].
    pub magic: PmU64,
    /// File id.
    pub file_id: PmU64,
    /// Node.
    pub node: PmU64,
    /// Cluster.
    pub cluster: PmU64,
    /// Extent bytes.
    pub size: PmU64,
    /// `k_len | v_len << 16`.
    pub geometry: PmU64,
    /// crc32 of the six words above.
    pub checksum: PmU64,
    /// 0.
    pub reserved: PmU64,
}

// SAFETY: eight PM words; any bit pattern is a (possibly invalid) header, validated on read.
unsafe impl PmType for FileHeader {}
const _: () = assert!(std::mem::size_of::<FileHeader>() as u64 == FILE_HEADER);

/// The decoded, validated contents of a file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileInfo {
    /// File id.
    pub id: u32,
    /// Node.
    pub node: usize,
    /// Cluster.
    pub cluster: u32,
    /// Extent bytes.
    pub size: u64,
    /// A file of variable-length entries (geometry [`GEOMETRY_VAR`]); otherwise every entry is
    /// a fixed [`ENTRY_SIZE`]-byte slot (geometry [`GEOMETRY_FIXED`]).
    pub var: bool,
}

impl FileInfo {
    /// Entry slots of a fixed file; 8-byte words for entries of a variable-length file.
    pub fn slots(&self) -> u64 {
        let unit = if self.var { 8 } else { ENTRY_SIZE };
        ((self.size - FILE_HEADER) / unit).min(MAX_SLOTS)
    }

    /// The geometry word of the header.
    pub fn geometry(&self) -> u64 {
        if self.var {
            GEOMETRY_VAR
        } else {
            GEOMETRY_FIXED
        }
    }

    fn words(&self) -> [u64; 6] {
        [
            FILE_MAGIC,
            u64::from(self.id),
            self.node as u64,
            u64::from(self.cluster),
            self.size,
            self.geometry(),
        ]
    }

    fn checksum(words: &[u64; 6]) -> u64 {
        let mut h = crc32fast::Hasher::new();
        for w in words {
            h.update(&w.to_le_bytes());
        }
        u64::from(h.finalize())
    }

    /// Writes the header (not persisted).
    pub fn write(&self, h: &FileHeader) {
        let w = self.words();
        for (slot, v) in
            [&h.magic, &h.file_id, &h.node, &h.cluster, &h.size, &h.geometry].into_iter().zip(w)
        {
            slot.store(v, Ordering::Relaxed);
        }
        h.checksum.store(Self::checksum(&w), Ordering::Relaxed);
        h.reserved.store(0, Ordering::Relaxed);
    }

    /// Reads and validates a header; `Err` names what is wrong.
    pub fn read(h: &FileHeader) -> Result<FileInfo, String> {
        let w = [
            h.magic.load(Ordering::Acquire),
            h.file_id.load(Ordering::Acquire),
            h.node.load(Ordering::Acquire),
            h.cluster.load(Ordering::Acquire),
            h.size.load(Ordering::Acquire),
            h.geometry.load(Ordering::Acquire),
        ];
        if w[0] != FILE_MAGIC {
            return Err("bad file magic".into());
        }
        if h.checksum.load(Ordering::Acquire) != Self::checksum(&w) {
            return Err("file header checksum mismatch".into());
        }
        if w[5] != GEOMETRY_FIXED && w[5] != GEOMETRY_VAR {
            return Err(format!("unsupported entry geometry {:#x}", w[5]));
        }
        let id = u32::try_from(w[1]).ok().filter(|i| (1..=MAX_FILE_ID).contains(i));
        let Some(id) = id else { return Err(format!("file id {} out of range", w[1])) };
        if w[4] < FILE_HEADER + ENTRY_SIZE {
            return Err(format!("file size {} holds no entry", w[4]));
        }
        Ok(FileInfo {
            id,
            node: w[2] as usize,
            cluster: u32::try_from(w[3]).map_err(|_| "cluster out of range".to_string())?,
            size: w[4],
            var: w[5] == GEOMETRY_VAR,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Node meta page
// ---------------------------------------------------------------------------------------------

/// "NSTMETA1"
pub const META_MAGIC: u64 = u64::from_le_bytes(*b"NSTMETA1");

/// The per-node meta page (one page-heap page on every node, aux [`AUX_META`]).
#[repr(C)]
#[derive(Debug)]
pub struct NodeMeta {
    /// [`META_MAGIC`].
    pub magic: PmU64,
    /// The node this page belongs to.
    pub node: PmU64,
    /// File-id high-water mark: every file id ever used on this node is below it. Raised (and
    /// persisted) in batches before an id at or above it is handed out, so ids — which are the
    /// entries' stamps — are never reused, even after a crash that lost the newest files.
    pub id_hwm: PmU64,
}

// SAFETY: three PM words; validated on read.
unsafe impl PmType for NodeMeta {}

/// How far the id high-water mark is raised at a time.
pub const ID_BATCH: u32 = 64;

// ---------------------------------------------------------------------------------------------
// Snapshot
// ---------------------------------------------------------------------------------------------

/// "NSTSNAP1"
pub const SNAP_MAGIC: u64 = u64::from_le_bytes(*b"NSTSNAP1");

/// Words of the snapshot header (then: versions, files, pairs; see docs/design.md).
pub const SNAP_HEADER_WORDS: u64 = 8;

/// Validates an op read during recovery for use as an error message.
pub(crate) fn corrupted(what: impl Into<String>) -> Error {
    Error::corrupted(ENGINE, what)
}

/// Reads an entry's `op`, `key`, `version` and `h_addr` if its slot holds one of file `file`.
pub(crate) fn read_entry(e: &Entry, file: u32) -> Option<(Op, u64, u64, u64)> {
    let m = decode_meta(e.meta.load(Ordering::Acquire), file);
    if !m.written {
        return None;
    }
    Some((
        m.op,
        e.key.load(Ordering::Acquire),
        e.version.load(Ordering::Acquire),
        e.h_addr.load(Ordering::Acquire),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vaddr_round_trips_and_is_never_zero() {
        let v = VAddr::new(63, MAX_FILE_ID, (MAX_SLOTS - 1) as u32, 255).unwrap();
        assert_eq!((v.node(), v.file(), v.slot(), v.words()), (63, MAX_FILE_ID, 16_777_215, 255));
        let v = VAddr::new(0, 1, 0, ENTRY_WORDS).unwrap();
        assert_ne!(v.0, 0);
        assert_eq!((v.node(), v.file(), v.slot(), v.words()), (0, 1, 0, 5));
        assert!(VAddr::new(64, 1, 0, 5).is_none());
        assert!(VAddr::new(0, 0, 0, 5).is_none());
        assert!(VAddr::new(0, MAX_FILE_ID + 1, 0, 5).is_none());
    }

    #[test]
    fn meta_stamp_rejects_other_files_and_zero() {
        let w = meta_word(Op::Upd, 7);
        assert_eq!(decode_meta(w, 7), Meta { op: Op::Upd, written: true });
        assert!(!decode_meta(w, 8).written);
        assert!(!decode_meta(0, 7).written);
        let inv = w & !OP_MASK;
        assert_eq!(decode_meta(inv, 7), Meta { op: Op::Inv, written: true });
    }

    #[test]
    fn var_words_and_words_round_trip() {
        assert_eq!(var_words(1, 0), Some(5));
        assert_eq!(var_words(9, 17), Some(4 + 2 + 3));
        assert_eq!(var_words(0, 1), None);
        assert_eq!(var_words(MAX_VAR_LEN + 1, 0), None);
        assert_eq!(var_words(1000, 1000), Some(4 + 125 + 125));
        assert_eq!(var_words(1000, 1040), None, "longer than the v_addr length field");
        let m = var_meta_word(Op::Upd, 9, 17, 3);
        assert_eq!(decode_var_meta(m, 3, 9), Some((Op::Upd, 9, 17)));
        assert_eq!(decode_var_meta(m, 4, 9), None, "other file");
        assert_eq!(decode_var_meta(m, 3, 10), None, "lengths disagree with the size word");
        assert_eq!(decode_var_meta(m & !OP_MASK, 3, 9), Some((Op::Inv, 9, 17)));
        assert_eq!(decode_var_size(var_size_word(9, 3), 3), Some(9));
        assert_eq!(decode_var_size(var_size_word(9, 3), 2), None);
        assert_eq!(decode_var_size(0, 3), None);
    }

    #[test]
    fn format_word_round_trips() {
        assert_eq!(decode_format(format_word(256, 32)), Some((256, 32)));
        assert_eq!(decode_format(0), None);
        assert_eq!(decode_format(format_word(0, 32)), None);
    }
}
