//! Persistent layout of the byte-string layer: its root slot, the index key of a byte key, and the
//! nodes of each prefix's tree (leaves, i.e. bucket records, and inner nodes) that the index
//! values point to. docs/design.md, "Byte-string layer".
//!
//! **Index key**: the first 8 bytes of the key, zero-padded, read big-endian, clamped into
//! `MIN_KEY..=MAX_KEY` ([`index_key`]). The map is monotone (never decreasing) in memcmp order,
//! so prefixes ascend with the index and a scan of the index visits keys in order. Keys that
//! share an index key (a common 8-byte prefix, a short key and its zero-extensions, the clamped
//! extremes) share one prefix, i.e. one tree.
//!
//! **Leaf** (bucket record; one NSM block, owner [`OWNER_BYTES`], immutable once published):
//!
//! ```text
//! offset  size  field
//!      0     4  magic  RECORD_MAGIC ("NKB1"), little-endian
//!      4     4  count  entries, ≥ 1
//!      8     8  len    bytes of the record, header included
//!     16     …  count entries, ascending by key (memcmp), keys distinct, each:
//!                 u16 klen (1..=1024), u32 vlen (0..=1 MiB), klen key bytes, vlen value bytes
//! ```
//!
//! **Inner node** (one NSM block; immutable once published except its child slots):
//!
//! ```text
//! offset          size     field
//!      0             4     magic  INNER_MAGIC ("NKI1")
//!      4             4     count  children, ≥ 1
//!      8             8     len    bytes of the node
//!     16     8 * count     child slots (PPtr, 8-byte aligned atomics)
//!   16+8c    4 * count     separator end offsets from the node's start (separator 0 empty)
//!  16+12c            …     separators 1..count: separator i is the least key of child i
//! ```
//!
//! **Cell**: a root leaf of one pair whose value is rewritten in place; its layout and crash
//! argument are in `crates/bytes/src/cell.rs` and docs/design.md.
//!
//! Every key of a tree maps to the index key under which the tree is linked. A node is written
//! whole and persisted before anything points at it.

use std::sync::atomic::Ordering;

use numakv_index::{Error, Result, MAX_KEY, MIN_KEY};
use numakv_pmem::heap::OWNER_ENGINE;

use numakv_pmem::{account, PPtr, PmU64, Pool};

use crate::cell::{CellRef, CELL_MAGIC};

/// Name for errors.
pub(crate) const LAYER: &str = "bytes";

/// Longest key, in bytes (keys are 1 B ..= 1 KiB).
pub const MAX_KEY_LEN: usize = 1024;
/// Longest value, in bytes (values are 0 B ..= 1 MiB).
pub const MAX_VALUE_LEN: usize = 1 << 20;

/// Root slot (node 0) holding [`BYTES_META`] once the layer exists. Raw engines keep to slots
/// below 8 and Nap to 8..16.
pub const SLOT_META: usize = 16;
/// Format version of the layer's own structures.
pub const BYTES_FORMAT: u32 = 1;
/// Contents of [`SLOT_META`]: "BYTE" and the format version.
pub const BYTES_META: u64 = 0x4259_5445_0000_0000 | BYTES_FORMAT as u64;
/// Page-heap owner tag of the layer's NSM extents (distinct from the engines' NSM, Calloc, Nap
/// and NStore tags: recovery collects only its own).
pub const OWNER_BYTES: u8 = OWNER_ENGINE + 0x40;

/// Magic of a bucket record ("NKB1" little-endian).
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"NKB1");
/// Bytes of a record header.
pub const HEADER_BYTES: usize = 16;
/// Bytes of an entry's length fields.
pub const ENTRY_HEADER_BYTES: usize = 6;

/// The index key of byte key `key`: its first 8 bytes (zero-padded) big-endian, clamped into
/// the index's key range. Monotone in memcmp order.
#[inline]
pub fn index_key(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b).clamp(MIN_KEY, MAX_KEY)
}

/// Refuses a key outside 1 B ..= 1 KiB.
#[inline]
pub fn check_key(key: &[u8]) -> Result<()> {
    if key.is_empty() {
        Err(Error::EmptyKey { max: MAX_KEY_LEN })
    } else if key.len() > MAX_KEY_LEN {
        Err(Error::TooLarge { what: "key", len: key.len(), limit: MAX_KEY_LEN })
    } else {
        Ok(())
    }
}

/// Refuses a value over 1 MiB.
#[inline]
pub fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE_LEN {
        Err(Error::TooLarge { what: "value", len: value.len(), limit: MAX_VALUE_LEN })
    } else {
        Ok(())
    }
}

fn corrupted(at: PPtr, what: impl std::fmt::Display) -> Error {
    Error::corrupted(LAYER, format!("bucket record at {at}: {what}"))
}

/// Magic of an inner node ("NKI1" little-endian).
pub const INNER_MAGIC: u32 = u32::from_le_bytes(*b"NKI1");
/// Bytes of an inner node's child slot.
pub const SLOT_BYTES: usize = 8;
/// Bytes of an inner node's separator end offset.
pub const SEP_END_BYTES: usize = 4;

/// A published node of a prefix's tree, read in place: a leaf (bucket record), a cell (a root
/// leaf of one pair, rewritten in place; see [`crate::cell`]) or an inner node.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Node<'g> {
    Leaf(Record<'g>),
    Cell(CellRef<'g>),
    Inner(Inner<'g>),
}

impl<'g> Node<'g> {
    /// The node at `p`, its header validated.
    ///
    /// # Safety
    /// `p` must have been published (reached through the index and the tree while pinned, or
    /// under the stripe lock of its index key) and must not be freed during `'g`: the caller is
    /// pinned in the epoch since before it read `p`, or holds the stripe lock of its index key.
    /// Published nodes are never written again except an inner node's child slots and a cell's
    /// version and slots, which are atomics and never covered by a shared slice here.
    pub(crate) unsafe fn at(pool: &'g Pool, p: PPtr) -> Result<Node<'g>> {
        let head = pool.bytes(p, HEADER_BYTES)?;
        let mut h = [0u8; HEADER_BYTES];
        // SAFETY: the header of a published node is immutable (contract above).
        unsafe { head.read(0, &mut h) };
        let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let count = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        let len = u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
        match magic {
            // SAFETY: forwarded contract.
            RECORD_MAGIC => Ok(Node::Leaf(unsafe { Record::with(pool, p, count, len)? })),
            // SAFETY: forwarded contract.
            CELL_MAGIC => Ok(Node::Cell(unsafe { CellRef::at(pool, p, count, len)? })),
            // SAFETY: forwarded contract.
            INNER_MAGIC => Ok(Node::Inner(unsafe { Inner::with(pool, p, count, len)? })),
            _ => Err(corrupted(p, format_args!("magic {magic:#x}"))),
        }
    }
}

/// A published bucket record (a leaf of a prefix's tree), read in place.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Record<'g> {
    at: PPtr,
    bytes: &'g [u8],
    count: u32,
}

impl<'g> Record<'g> {
    /// The record at `p` whose header says `count` entries and `len` bytes.
    ///
    /// # Safety
    /// As for [`Node::at`]; the record is immutable while published.
    unsafe fn with(pool: &'g Pool, p: PPtr, count: u32, len: u64) -> Result<Record<'g>> {
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l > HEADER_BYTES + ENTRY_HEADER_BYTES && count >= 1)
            .ok_or_else(|| corrupted(p, format_args!("length {len}, count {count}")))?;
        let all = pool.bytes(p, len)?;
        account::record_read(all.as_ptr() as usize + HEADER_BYTES, len - HEADER_BYTES);
        // SAFETY: `pool.bytes` checked that the `len` bytes are mapped inside the pool, which
        // outlives 'g; the record is immutable while published and not freed during 'g (the
        // caller's contract), so a shared slice over it is sound.
        let bytes = unsafe { std::slice::from_raw_parts(all.as_ptr(), len) };
        Ok(Record { at: p, bytes, count })
    }

    /// A record image in DRAM (a cell's pair, [`CellRef::as_record`]) standing for the node at
    /// `at`: what the write paths read to merge, and `at` is what they retire.
    pub(crate) fn in_dram(at: PPtr, bytes: &'g [u8]) -> Result<Record<'g>> {
        let h = bytes.get(..HEADER_BYTES).ok_or_else(|| corrupted(at, "image too short"))?;
        let count = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        let len = u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
        if count == 0 || len != bytes.len() as u64 {
            return Err(corrupted(at, format_args!("image: length {len}, count {count}")));
        }
        Ok(Record { at, bytes, count })
    }

    /// Where the record lives.
    pub(crate) fn at_ptr(&self) -> PPtr {
        self.at
    }

    /// Entries, ascending.
    pub(crate) fn entries(&self) -> Entries<'g> {
        Entries { at: self.at, bytes: self.bytes, off: HEADER_BYTES, left: self.count }
    }

    /// Bytes of the record, header included.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Entries in the record.
    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    /// The value of `key`, if present.
    pub(crate) fn find(&self, key: &[u8]) -> Result<Option<&'g [u8]>> {
        for e in self.entries() {
            let (k, v) = e?;
            match k.cmp(key) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => return Ok(Some(v)),
                std::cmp::Ordering::Greater => return Ok(None),
            }
        }
        Ok(None)
    }
}

/// Iterator over a record's entries; a malformed entry is [`Error::Corrupted`].
#[derive(Debug)]
pub(crate) struct Entries<'g> {
    at: PPtr,
    bytes: &'g [u8],
    off: usize,
    left: u32,
}

impl<'g> Iterator for Entries<'g> {
    type Item = Result<(&'g [u8], &'g [u8])>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            if self.off != self.bytes.len() {
                self.left = u32::MAX; // report once, then stop
                return Some(Err(corrupted(self.at, "length disagrees with the entries")));
            }
            return None;
        }
        if self.left == u32::MAX {
            return None;
        }
        let b = self.bytes;
        let o = self.off;
        let Some(h) = b.get(o..o + ENTRY_HEADER_BYTES) else {
            self.left = u32::MAX;
            return Some(Err(corrupted(self.at, "entry header past the end")));
        };
        let klen = usize::from(u16::from_le_bytes([h[0], h[1]]));
        let vlen = u32::from_le_bytes([h[2], h[3], h[4], h[5]]) as usize;
        let ks = o + ENTRY_HEADER_BYTES;
        let vs = ks + klen;
        let end = vs + vlen;
        if klen == 0 || klen > MAX_KEY_LEN || vlen > MAX_VALUE_LEN || end > b.len() {
            self.left = u32::MAX;
            return Some(Err(corrupted(
                self.at,
                format_args!("entry at {o}: key {klen} B, value {vlen} B"),
            )));
        }
        self.off = end;
        self.left -= 1;
        Some(Ok((&b[ks..vs], &b[vs..end])))
    }
}

/// Bytes of a record holding entries of these key and value lengths.
#[inline]
pub(crate) fn entry_bytes(key: &[u8], value: &[u8]) -> usize {
    ENTRY_HEADER_BYTES + key.len() + value.len()
}

/// A record built in DRAM (header and entries), written to its block with one copy: the
/// entries are produced once (a merge of a leaf with the written pair runs one pass, not one to
/// size the record and another to write it) and PM sees one write instead of three per entry.
pub(crate) struct RecordImage {
    buf: Vec<u8>,
    count: u32,
}

impl RecordImage {
    /// An empty record with room for `capacity` bytes.
    pub(crate) fn with_capacity(capacity: usize) -> RecordImage {
        let mut buf = Vec::with_capacity(capacity.max(HEADER_BYTES));
        buf.resize(HEADER_BYTES, 0);
        RecordImage { buf, count: 0 }
    }

    /// Appends an entry (keys must come in ascending order; the caller's merge ensures it).
    pub(crate) fn push(&mut self, k: &[u8], v: &[u8]) {
        self.buf.extend_from_slice(&(k.len() as u16).to_le_bytes());
        self.buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(k);
        self.buf.extend_from_slice(v);
        self.count += 1;
    }

    /// Entries so far.
    pub(crate) fn count(&self) -> usize {
        self.count as usize
    }

    /// Bytes of the record, header included.
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// Writes the record into the fresh block `p` (at least [`RecordImage::len`] bytes), then
    /// persists it.
    ///
    /// # Safety
    /// `p` must be a block of at least `self.len()` bytes just allocated and not yet published:
    /// no other thread reads or writes it.
    pub(crate) unsafe fn write_to(&mut self, pool: &Pool, p: PPtr) -> Result<()> {
        let len = self.buf.len();
        self.buf[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        self.buf[4..8].copy_from_slice(&self.count.to_le_bytes());
        self.buf[8..16].copy_from_slice(&(len as u64).to_le_bytes());
        let dst = pool.bytes(p, len)?;
        // SAFETY: `p` is unpublished and ours alone (the caller's contract); `write` bounds-checks
        // the range against the `len` bytes of `dst`.
        if self.count == 0 || !unsafe { dst.write(0, &self.buf) } {
            return Err(Error::corrupted(
                LAYER,
                format!("record build: {len} bytes, {} entries", self.count),
            ));
        }
        // PERSIST: the whole record is durable before the index points at it (the index's
        // write, which follows, is durable when it returns): a reachable record is complete.
        pool.persist(dst.as_ptr(), len);
        Ok(())
    }
}

/// Writes a record of `count` entries and `len` bytes into the fresh block `p`, the entries
/// produced by `fill` (which gets a writer closure), then persists it.
///
/// # Safety
/// `p` must be a block of at least `len` bytes just allocated and not yet published: no other
/// thread reads or writes it.
pub(crate) unsafe fn write_record(
    pool: &Pool,
    p: PPtr,
    len: usize,
    count: u32,
    fill: impl FnOnce(&mut dyn FnMut(&[u8], &[u8])) -> Result<()>,
) -> Result<()> {
    let mut image = RecordImage::with_capacity(len);
    fill(&mut |k: &[u8], v: &[u8]| image.push(k, v))?;
    if image.len() != len || image.count() != count as usize {
        return Err(Error::corrupted(
            LAYER,
            format!(
                "record build: {} of {len} bytes, {} of {count} entries",
                image.len(),
                image.count()
            ),
        ));
    }
    // SAFETY: forwarded contract; the image is `len` bytes.
    unsafe { image.write_to(pool, p) }
}

/// A published inner node of a prefix's tree, read in place. Its header, separator offsets and
/// separators are immutable; its child slots are atomics a writer of the prefix may replace in
/// place (one 8-byte store, persisted), so they are read through [`PmU64`], never as bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Inner<'g> {
    pool: &'g Pool,
    at: PPtr,
    count: usize,
    /// Bytes `[SLOTS + 8 * count, len)` of the node: the separator end offsets, then the
    /// separators.
    tail: &'g [u8],
}

impl<'g> Inner<'g> {
    /// The inner node at `p` whose header says `count` children and `len` bytes.
    ///
    /// # Safety
    /// As for [`Node::at`].
    unsafe fn with(pool: &'g Pool, p: PPtr, count: u32, len: u64) -> Result<Inner<'g>> {
        let count = count as usize;
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| count >= 1 && l >= inner_fixed_bytes(count))
            .ok_or_else(|| corrupted(p, format_args!("inner length {len}, count {count}")))?;
        let all = pool.bytes(p, len)?;
        let tail_off = HEADER_BYTES + SLOT_BYTES * count;
        // SAFETY: `pool.bytes` checked that the `len` bytes are mapped inside the pool, which
        // outlives 'g; bytes from `tail_off` on are immutable while the node is published and it
        // is not freed during 'g (the caller's contract); the slice leaves out the slots, which
        // writers may store to.
        let tail =
            unsafe { std::slice::from_raw_parts(all.as_ptr().add(tail_off), len - tail_off) };
        // Only the header line and the lines the search probes are accounted: see `find_child`.
        Ok(Inner { pool, at: p, count, tail })
    }

    /// Where the node lives.
    pub(crate) fn at_ptr(&self) -> PPtr {
        self.at
    }

    /// Children.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Child slot `i` (`i < count`).
    pub(crate) fn slot(&self, i: usize) -> Result<&'g PmU64> {
        debug_assert!(i < self.count);
        let off = (HEADER_BYTES + SLOT_BYTES * i) as u64;
        let p = self.at.add(off).ok_or_else(|| corrupted(self.at, "slot offset overflows"))?;
        Ok(self.pool.get::<PmU64>(p)?)
    }

    /// Child `i`: the node its slot points to now.
    pub(crate) fn child(&self, i: usize) -> Result<PPtr> {
        // ORDERING: Acquire pairs with the Release store that linked the child: its contents
        // (written and persisted before) are visible.
        let raw = self.slot(i)?.load(Ordering::Acquire);
        if raw == 0 {
            return Err(corrupted(self.at, format_args!("child {i} is null")));
        }
        Ok(PPtr::from_raw(raw))
    }

    /// Separator `i`: the least key child `i` may hold (empty for child 0, which is bounded
    /// only by the node's own range).
    pub(crate) fn sep(&self, i: usize) -> Result<&'g [u8]> {
        if i == 0 {
            return Ok(&[]);
        }
        let end = |j: usize| -> Result<usize> {
            let o = SEP_END_BYTES * j;
            let b = self
                .tail
                .get(o..o + SEP_END_BYTES)
                .ok_or_else(|| corrupted(self.at, "separator offsets past the end"))?;
            Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        };
        let base = HEADER_BYTES + SLOT_BYTES * self.count;
        let (from, to) = (end(i - 1)?, end(i)?);
        let sep = from
            .checked_sub(base)
            .zip(to.checked_sub(base))
            .and_then(|(f, t)| self.tail.get(f..t))
            .filter(|s| !s.is_empty() && s.len() <= MAX_KEY_LEN)
            .ok_or_else(|| corrupted(self.at, format_args!("separator {i} at {from}..{to}")))?;
        account::record_read(self.tail.as_ptr() as usize + SEP_END_BYTES * (i - 1), 8);
        account::record_read(sep.as_ptr() as usize, sep.len());
        Ok(sep)
    }

    /// The child whose range holds `key`: the last `i` with `sep(i) <= key`.
    pub(crate) fn find_child(&self, key: &[u8]) -> Result<usize> {
        let (mut lo, mut hi) = (0, self.count);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.sep(mid)? <= key {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }
}

/// Bytes of an inner node of `count` children without its separators.
#[inline]
pub(crate) fn inner_fixed_bytes(count: usize) -> usize {
    HEADER_BYTES + (SLOT_BYTES + SEP_END_BYTES) * count
}

/// Writes an inner node over `children` — `(separator, child)` pairs, ascending, the first
/// separator ignored (stored empty) — into the fresh block `p` of [`inner_bytes`] bytes, then
/// persists it.
///
/// # Safety
/// `p` must be a block of at least that many bytes just allocated and not yet published.
pub(crate) unsafe fn write_inner(pool: &Pool, p: PPtr, children: &[(Vec<u8>, u64)]) -> Result<()> {
    let count = children.len();
    let len = inner_bytes(children);
    let dst = pool.bytes(p, len)?;
    let mut h = [0u8; HEADER_BYTES];
    h[0..4].copy_from_slice(&INNER_MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&(count as u32).to_le_bytes());
    h[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    let mut ok = true;
    // SAFETY: `p` is unpublished and ours alone (the caller's contract); `write` bounds-checks
    // each range against the `len` bytes of `dst`. The same holds for the writes below.
    ok &= unsafe { dst.write(0, &h) };
    let ends_at = HEADER_BYTES + SLOT_BYTES * count;
    let mut sep_off = inner_fixed_bytes(count);
    for (i, (sep, child)) in children.iter().enumerate() {
        if i > 0 {
            // SAFETY: as above.
            ok &= unsafe { dst.write(sep_off, sep) };
            sep_off += sep.len();
        }
        // SAFETY: as above.
        unsafe {
            ok &= dst.write(HEADER_BYTES + SLOT_BYTES * i, &child.to_le_bytes());
            ok &= dst.write(ends_at + SEP_END_BYTES * i, &(sep_off as u32).to_le_bytes());
        }
    }
    if !ok || sep_off != len {
        return Err(Error::corrupted(LAYER, format!("inner build: {sep_off} of {len} bytes")));
    }
    // PERSIST: the whole node is durable before a slot or the index points at it.
    pool.persist(dst.as_ptr(), len);
    Ok(())
}

/// Bytes of an inner node over `children` (the first separator not stored).
pub(crate) fn inner_bytes(children: &[(Vec<u8>, u64)]) -> usize {
    inner_fixed_bytes(children.len()) + children.iter().skip(1).map(|(s, _)| s.len()).sum::<usize>()
}

/// The shortest key `s` with `left < s <= right` (`left < right`): the separator of two
/// neighbouring leaves, as short as their keys allow (suffix truncation).
pub(crate) fn separator(left: &[u8], right: &[u8]) -> Vec<u8> {
    debug_assert!(left < right);
    let common = left.iter().zip(right).take_while(|(a, b)| a == b).count();
    // `right` is longer than the common part: were it a prefix of `left`, it would sort first.
    right[..(common + 1).min(right.len())].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_key_is_monotone_and_in_range() {
        let keys: Vec<&[u8]> = vec![
            b"\0",
            b"\0\0\0\0\0\0\0\0\0",
            b"\0\0\0\0\0\0\0\x01",
            b"\0\0\0\0\0\0\0\x02",
            b"a",
            b"a\0",
            b"a\0\0\0\0\0\0\0z",
            b"ab",
            b"user:1",
            b"user:10",
            b"user:100",
            b"user:1000",
            b"user:2",
            b"\xff\xff\xff\xff\xff\xff\xff\xfe",
            b"\xff\xff\xff\xff\xff\xff\xff\xff",
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        ];
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        for w in keys.windows(2) {
            assert!(index_key(w[0]) <= index_key(w[1]), "{:?} {:?}", w[0], w[1]);
        }
        for k in &keys {
            assert!((MIN_KEY..=MAX_KEY).contains(&index_key(k)));
        }
        assert_eq!(index_key(b"\0"), index_key(b"\0\0\0\0\0\0\0\x01"));
        assert_eq!(index_key(b"a"), index_key(b"a\0"));
        assert_ne!(index_key(b"user:1"), index_key(b"user:2"));
    }

    #[test]
    fn limits_are_checked() {
        assert!(matches!(check_key(b""), Err(Error::EmptyKey { max: 1024 })));
        assert!(check_key(&[7; 1024]).is_ok());
        let e = check_key(&[7; 1025]).unwrap_err();
        assert!(e.to_string().contains("limit is 1024 bytes"), "{e}");
        assert!(check_value(b"").is_ok());
        assert!(check_value(&vec![0; MAX_VALUE_LEN]).is_ok());
        let e = check_value(&vec![0; MAX_VALUE_LEN + 1]).unwrap_err();
        assert!(e.to_string().contains("limit is 1048576 bytes"), "{e}");
    }
}
