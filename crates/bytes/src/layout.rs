//! Persistent layout of the byte-string layer: its root slot, the index key of a byte key, and the
//! out-of-line records (buckets) the index values point to. docs/design.md, "Byte-string layer".
//!
//! **Index key**: the first 8 bytes of the key, zero-padded, read big-endian, clamped into
//! `MIN_KEY..=MAX_KEY` ([`index_key`]). The map is monotone (never decreasing) in memcmp order,
//! so buckets ascend with the index and a scan of the index visits keys in order. Keys that
//! share an index key (a common 8-byte prefix, a short key and its zero-extensions, the clamped
//! extremes) share one bucket.
//!
//! **Bucket record** (one NSM block, owner [`OWNER_BYTES`], immutable once published):
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
//! Every key of a bucket maps to the index key under which the bucket is linked. A bucket is
//! written whole and persisted before the index points at it, and never written again: a change
//! writes a new bucket (copy-on-write), relinks the index key, and retires the old one.

use numakv_index::{Error, Result, MAX_KEY, MIN_KEY};
use numakv_pmem::heap::OWNER_ENGINE;
use numakv_pmem::{account, PPtr, Pool};

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

/// A published bucket record, read in place.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Record<'g> {
    at: PPtr,
    bytes: &'g [u8],
    count: u32,
}

impl<'g> Record<'g> {
    /// The record at `p`, its header validated.
    ///
    /// # Safety
    /// `p` must have been published (reached through the index, or under the stripe lock that
    /// publishes it) and must not be freed during `'g`: the caller is pinned in the epoch since
    /// before it read `p` from the index, or holds the stripe lock of its index key. Published
    /// records are never written again, so the shared slice does not alias a writer.
    pub(crate) unsafe fn at(pool: &'g Pool, p: PPtr) -> Result<Record<'g>> {
        let head = pool.bytes(p, HEADER_BYTES)?;
        let mut h = [0u8; HEADER_BYTES];
        // SAFETY: the record is published and immutable (contract above): no concurrent writer.
        unsafe { head.read(0, &mut h) };
        let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let count = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        let len = u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
        if magic != RECORD_MAGIC {
            return Err(corrupted(p, format_args!("magic {magic:#x}")));
        }
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

    /// Entries, ascending.
    pub(crate) fn entries(&self) -> Entries<'g> {
        Entries { at: self.at, bytes: self.bytes, off: HEADER_BYTES, left: self.count }
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
    let dst = pool.bytes(p, len)?;
    let mut h = [0u8; HEADER_BYTES];
    h[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&count.to_le_bytes());
    h[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    let mut off = HEADER_BYTES;
    let mut ok = true;
    let mut n = 0u32;
    // SAFETY: `p` is unpublished and ours alone (the caller's contract); `write` bounds-checks
    // the range against the `len` bytes of `dst`. The same holds for the writes below.
    ok &= unsafe { dst.write(0, &h) };
    fill(&mut |k: &[u8], v: &[u8]| {
        let mut eh = [0u8; ENTRY_HEADER_BYTES];
        eh[0..2].copy_from_slice(&(k.len() as u16).to_le_bytes());
        eh[2..6].copy_from_slice(&(v.len() as u32).to_le_bytes());
        // SAFETY: as above.
        unsafe {
            ok &= dst.write(off, &eh);
            ok &= dst.write(off + ENTRY_HEADER_BYTES, k);
            ok &= dst.write(off + ENTRY_HEADER_BYTES + k.len(), v);
        }
        off += entry_bytes(k, v);
        n += 1;
    })?;
    if !ok || off != len || n != count {
        return Err(Error::corrupted(
            LAYER,
            format!("record build: {off} of {len} bytes, {n} of {count} entries"),
        ));
    }
    // PERSIST: the whole record is durable before the index points at it (the index's write,
    // which follows, is durable when it returns): a reachable record is always complete.
    pool.persist(dst.as_ptr(), len);
    Ok(())
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
