//! The DRAM file table of one node: file id → [`LogFile`], a dense two-level array read without
//! locks on every get (papers/nstore.txt §III-E: an address resolves to its file, then its
//! entry).
//!
//! A directory of [`DIR`] chunk pointers, each chunk [`CHUNK`] file pointers; chunks are
//! allocated on first use and kept. A slot holds a pointer from `Arc::into_raw` (the table's
//! reference to the file) or null. Removing a file swaps its slot to null and drops the table's
//! reference after an epoch grace period, so a reader pinned before the removal may still use
//! the file it loaded.

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::Arc;

use numakv_pmem::alloc::epoch::{self, Guard};

use crate::layout::MAX_FILE_ID;
use crate::nlog::LogFile;

const CHUNK_BITS: u32 = 12;
/// File slots per chunk.
const CHUNK: usize = 1 << CHUNK_BITS;
/// Chunks in the directory: every id up to [`MAX_FILE_ID`].
const DIR: usize = (MAX_FILE_ID as usize >> CHUNK_BITS) + 1;

struct Chunk {
    slots: [AtomicPtr<LogFile>; CHUNK],
}

/// One node's file table.
pub(crate) struct FileTable {
    dir: Box<[AtomicPtr<Chunk>]>,
    /// Above every id ever inserted (bounds iteration).
    end: AtomicU32,
}

impl std::fmt::Debug for FileTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileTable(ids below {})", self.end.load(Ordering::Relaxed))
    }
}

impl FileTable {
    pub(crate) fn new() -> FileTable {
        FileTable {
            dir: (0..DIR).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect(),
            end: AtomicU32::new(0),
        }
    }

    /// The slot of `id`, if its chunk exists.
    fn slot(&self, id: u32) -> Option<&AtomicPtr<LogFile>> {
        let c = self.dir.get((id >> CHUNK_BITS) as usize)?;
        // ORDERING: Acquire; pairs with the AcqRel install in `slot_or_create`: the chunk's
        // initialised slots are seen.
        let p = c.load(Ordering::Acquire);
        // SAFETY: a non-null directory entry points at a chunk installed by `slot_or_create`,
        // freed only by `Drop` (which has `&mut self`).
        let chunk = unsafe { p.as_ref()? };
        Some(&chunk.slots[id as usize & (CHUNK - 1)])
    }

    /// The slot of `id`, allocating its chunk when missing; `None` for an id out of range.
    fn slot_or_create(&self, id: u32) -> Option<&AtomicPtr<LogFile>> {
        let c = self.dir.get((id >> CHUNK_BITS) as usize)?;
        if c.load(Ordering::Acquire).is_null() {
            let fresh = Box::into_raw(Box::new(Chunk {
                slots: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            }));
            // ORDERING: AcqRel; Release publishes the chunk's null slots, Acquire sees a
            // competitor's chunk.
            if c.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // SAFETY: `fresh` was never published; this is its only owner.
                drop(unsafe { Box::from_raw(fresh) });
            }
        }
        self.slot(id)
    }

    /// Registers `f` under its id (replacing nothing: ids are never reused).
    pub(crate) fn insert(&self, f: Arc<LogFile>) {
        let id = f.info.id;
        let Some(slot) = self.slot_or_create(id) else { return };
        self.end.fetch_max(id + 1, Ordering::AcqRel);
        // ORDERING: AcqRel; Release publishes the file (its fields were set before), and a
        // replaced pointer (never expected) is released as in `remove`.
        let old = slot.swap(Arc::into_raw(f).cast_mut(), Ordering::AcqRel);
        Self::release_later(old);
    }

    /// Unregisters file `id`; the table's reference goes after the epoch grace period.
    pub(crate) fn remove(&self, id: u32) {
        if let Some(slot) = self.slot(id) {
            // ORDERING: AcqRel; pairs with the loads of readers and with `insert`.
            let old = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
            Self::release_later(old);
        }
    }

    /// Drops the table's reference `p` (from `Arc::into_raw`, or null) once every thread pinned
    /// now has unpinned.
    fn release_later(p: *mut LogFile) {
        if p.is_null() {
            return;
        }
        let addr = p as usize;
        let guard = epoch::pin();
        guard.defer(move || {
            // SAFETY: `addr` is the table's reference from `Arc::into_raw`, unlinked from its
            // slot before this was deferred: after the grace period no reader holds a borrow
            // taken from the slot, and this is the one release of that reference.
            drop(unsafe { Arc::from_raw(addr as *const LogFile) });
        });
    }

    /// File `id`, borrowed for as long as `guard` stays pinned.
    pub(crate) fn get<'g>(&self, id: u32, _guard: &'g Guard) -> Option<&'g LogFile> {
        // ORDERING: Acquire; pairs with the AcqRel swap in `insert`.
        let p = self.slot(id)?.load(Ordering::Acquire);
        // SAFETY: a non-null slot holds the table's `Arc` reference; `remove` releases it only
        // after the grace period of a guard pinned after the slot was cleared, which `_guard`
        // (pinned before this load) outlives.
        unsafe { p.as_ref() }
    }

    /// File `id`, as a new reference.
    pub(crate) fn get_arc(&self, id: u32) -> Option<Arc<LogFile>> {
        let guard = epoch::pin();
        let f = self.get(id, &guard)?;
        let p: *const LogFile = f;
        // SAFETY: `p` came from `Arc::into_raw` and the table's reference is alive while
        // `guard` is pinned (see `get`): taking one more strong count is sound.
        unsafe {
            Arc::increment_strong_count(p);
            Some(Arc::from_raw(p))
        }
    }

    /// Every file, in id order.
    pub(crate) fn all(&self) -> Vec<Arc<LogFile>> {
        let end = self.end.load(Ordering::Acquire);
        let mut out = Vec::new();
        let mut id = 0;
        while id < end {
            if self.slot(id).is_none() {
                id = (id | (CHUNK as u32 - 1)) + 1; // no chunk: skip it
                continue;
            }
            if let Some(f) = self.get_arc(id) {
                out.push(f);
            }
            id += 1;
        }
        out
    }
}

impl Drop for FileTable {
    fn drop(&mut self) {
        for c in self.dir.iter() {
            let p = c.load(Ordering::Acquire);
            if p.is_null() {
                continue;
            }
            // SAFETY: `&mut self`: nobody else uses the table; the chunk came from
            // `Box::into_raw` and is freed once, here.
            let chunk = unsafe { Box::from_raw(p) };
            for s in chunk.slots.iter() {
                let f = s.load(Ordering::Acquire);
                if !f.is_null() {
                    // SAFETY: the table's reference, still linked: released once, here (a
                    // removed file's reference was unlinked and is released by its deferral).
                    drop(unsafe { Arc::from_raw(f.cast_const()) });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::FileInfo;
    use numakv_pmem::PPtr;

    fn file(id: u32) -> Arc<LogFile> {
        let info = FileInfo { id, node: 0, cluster: 0, size: 4096, var: false };
        Arc::new(LogFile::new(info, PPtr::from_raw(0), 0, true))
    }

    #[test]
    fn insert_get_remove_and_iterate_across_chunks() {
        let t = FileTable::new();
        let ids = [1, 2, CHUNK as u32 - 1, CHUNK as u32, 5 * CHUNK as u32 + 3, MAX_FILE_ID];
        for &id in &ids {
            t.insert(file(id));
        }
        let all: Vec<u32> = t.all().iter().map(|f| f.info.id).collect();
        assert_eq!(all, ids);
        let kept = t.get_arc(CHUNK as u32).unwrap();
        t.remove(CHUNK as u32);
        assert!(t.get_arc(CHUNK as u32).is_none());
        assert_eq!(kept.info.id, CHUNK as u32, "a reference taken before stays valid");
        assert!(t.get_arc(7).is_none() && t.get_arc(3 * CHUNK as u32).is_none());
        let g = epoch::pin();
        assert_eq!(t.get(MAX_FILE_ID, &g).map(|f| f.info.id), Some(MAX_FILE_ID));
        assert_eq!(t.all().len(), ids.len() - 1);
    }
}
