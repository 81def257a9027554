//! Point operations: lock-free reads, and writes serialised per index key by striped locks.
//!
//! A write of key `k` with index key `x = index_key(k)`:
//! 1. takes the stripe lock of `x` (writers of one bucket run one at a time; the lock also
//!    keeps the old bucket from being retired under the writer);
//! 2. reads the current bucket pointer of `x` from the engine and decides (insert-if-absent,
//!    update-if-present, delete-if-present);
//! 3. allocates a fresh block, writes the merged entries and persists it ([`write_record`]);
//! 4. relinks `x` in the engine (`upsert`; `remove` when the bucket became empty) — the
//!    linearization point, durable when the engine returns;
//! 5. retires the old bucket: it is freed once every reader pinned now has unpinned.
//!
//! The writer is not pinned while the engine writes (an engine may wait for a grace period
//! inside its write; see [`Bytes::write`]).
//!
//! A read pins the epoch, reads the pointer of `x` from the engine and searches the bucket in
//! place; the pin keeps a bucket that a writer retires meanwhile from being freed under it.

use numakv_index::{Error, Index, Result};
use numakv_pmem::alloc::{epoch, retire, PmAllocator};
use numakv_pmem::PPtr;
use parking_lot::Mutex;

use crate::layout::{
    check_key, check_value, entry_bytes, index_key, write_record, Record, HEADER_BYTES, LAYER,
};
use crate::Bytes;

/// Stripe locks (a power of two).
const STRIPES: usize = 1024;

/// The writer locks, one per stripe of index keys.
pub(crate) struct Stripes(Box<[crossbeam_utils::CachePadded<Mutex<()>>]>);

impl Stripes {
    pub(crate) fn new() -> Stripes {
        Stripes((0..STRIPES).map(|_| Default::default()).collect())
    }

    fn of(&self, x: u64) -> &Mutex<()> {
        // Fibonacci hashing: neighbouring prefixes land on different stripes.
        let h = x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - STRIPES.trailing_zeros());
        &self.0[h as usize]
    }
}

/// A mutating operation on one key.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Write<'a> {
    Put(&'a [u8]),
    Insert(&'a [u8]),
    Update(&'a [u8]),
    Delete,
}

impl<E: Index> Bytes<E> {
    /// [`crate::ByteMap::get_into`].
    pub(crate) fn read(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        check_key(key)?;
        let x = index_key(key);
        // The pin comes before the engine read: a bucket unlinked after we read its pointer is
        // retired after this pin and cannot be freed before we unpin.
        let _guard = epoch::pin();
        let Some(p) = self.index.get(x)? else { return Ok(false) };
        // SAFETY: `p` was read from the index while pinned (Record::at's contract).
        let rec = unsafe { Record::at(&self.pool, PPtr::from_raw(p))? };
        match rec.find(key)? {
            Some(v) => {
                out.clear();
                out.extend_from_slice(v);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Applies `w` to `key`; the `bool` is what insert / update / delete report (put: `true`).
    pub(crate) fn write(&self, key: &[u8], w: Write<'_>) -> Result<bool> {
        check_key(key)?;
        let value = match w {
            Write::Put(v) | Write::Insert(v) | Write::Update(v) => {
                check_value(v)?;
                Some(v)
            }
            Write::Delete => None,
        };
        let x = index_key(key);
        let _lock = self.stripes.of(x).lock();
        // Not pinned while the engine writes: an engine may wait for a grace period inside its
        // write (NBTree's SMO waits, unpinned itself, for Calloc log slots that come back only
        // after one), which a pin held here would never let end. The old bucket needs no pin:
        // only a writer of `x`, under this lock, retires it.
        let old = self.index.get(x)?.map(PPtr::from_raw);
        let rec = match old {
            // SAFETY: `p` is the published bucket of `x`; we hold the stripe lock of `x`, so no
            // writer can unlink and retire it while we read it.
            Some(p) => Some(unsafe { Record::at(&self.pool, p)? }),
            None => None,
        };
        let present = match &rec {
            Some(r) => r.find(key)?.is_some(),
            None => false,
        };
        let proceed = match w {
            Write::Put(_) => true,
            Write::Insert(_) => !present,
            Write::Update(_) | Write::Delete => present,
        };
        if !proceed {
            return Ok(false);
        }
        // The merged bucket: the old entries with `key` replaced (or dropped), `key` inserted in
        // order. Sized first, then written, without a DRAM copy of the entries.
        let mut len = HEADER_BYTES;
        let mut count = 0u32;
        merged(rec.as_ref(), key, value, &mut |k, v| {
            len += entry_bytes(k, v);
            count += 1;
        })?;
        if count == 0 {
            // The bucket's last key goes: unlink the prefix.
            if !self.index.remove(x)? {
                return Err(Error::corrupted(
                    LAYER,
                    format!("index key {x:#x} vanished under its stripe lock"),
                ));
            }
        } else {
            let p = self.nsm.alloc(len)?;
            // SAFETY: `p` was just allocated and is not published yet.
            let built = unsafe {
                write_record(&self.pool, p, len, count, |emit| {
                    merged(rec.as_ref(), key, value, emit)
                })
            };
            // ORDERING/PERSIST: the record is durable (write_record persisted it) before the
            // engine's upsert makes it reachable; the upsert is durable when it returns.
            if let Err(e) = built.and_then(|()| self.index.upsert(x, p.raw())) {
                // Never published: nobody can hold it, free it now.
                // SAFETY: `p` came from this allocator and was never linked.
                let _ = unsafe { self.nsm.free(p) };
                return Err(e);
            }
        }
        if let Some(old) = old {
            // Pinned after the unlink: every reader that can still hold `old` pinned before it,
            // so the free waits for them.
            let guard = epoch::pin();
            // SAFETY: `old` is unlinked (the engine now maps `x` elsewhere or nowhere), came from
            // this allocator, and only this writer (under the stripe lock) retires it.
            unsafe { retire(&self.nsm, &guard, old) };
        }
        Ok(true)
    }
}

/// Emits the entries of `rec` with `key` set to `value` (or removed when `None`), ascending.
fn merged(
    rec: Option<&Record<'_>>,
    key: &[u8],
    value: Option<&[u8]>,
    emit: &mut dyn FnMut(&[u8], &[u8]),
) -> Result<()> {
    let mut placed = false;
    if let Some(r) = rec {
        for e in r.entries() {
            let (k, v) = e?;
            if !placed && k >= key {
                placed = true;
                if let Some(nv) = value {
                    emit(key, nv);
                }
                if k == key {
                    continue;
                }
            }
            emit(k, v);
        }
    }
    if !placed {
        if let Some(nv) = value {
            emit(key, nv);
        }
    }
    Ok(())
}
