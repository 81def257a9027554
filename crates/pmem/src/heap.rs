//! The per-node persistent page heap: extents of whole pages, the layer every allocator takes
//! memory from.
//!
//! Persistent state is one 8-byte descriptor per page (see docs/design.md, "Page descriptors"):
//!
//! ```text
//! bits 0..8    tag      HEAD_TAG (0xA5) on the first page of an allocated extent, else 0
//! bits 8..16   owner    who allocated it (OWNER_*; engines use OWNER_ENGINE and above), ≠ 0
//! bits 16..32  aux      owner-defined (NSM: size class; Calloc: region kind)
//! bits 32..64  pages    extent length in pages, ≥ 1
//! ```
//!
//! Invariant: only the first page of an allocated extent has a non-zero descriptor; every other
//! descriptor is 0. Allocation and free are therefore one failure-atomic 8-byte store each,
//! persisted before the call returns. The free-extent index is volatile and rebuilt at open by
//! scanning the table, which also validates it (overlaps, out-of-range lengths, bad tags).
//!
//! A crash between an allocation and the caller linking the extent leaks it; the allocators above
//! (NSM's GC, Calloc's logs) or the engine reclaim such extents at recovery.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::access::PmU64;
use crate::error::{PoolError, Result};
use crate::layout::{self, DESCRIPTORS_OFF};
use crate::pool::Pool;
use crate::pptr::PPtr;

/// Tag of an extent's head descriptor.
pub const HEAD_TAG: u64 = 0xA5;
/// Owner tag of NSM pages.
pub const OWNER_NSM: u8 = 1;
/// Owner tag of Calloc regions.
pub const OWNER_CALLOC: u8 = 2;
/// Owner tag of the naive bump allocator's regions.
pub const OWNER_NAIVE: u8 = 3;
/// First owner tag free for engines' own extents.
pub const OWNER_ENGINE: u8 = 16;

/// An allocated extent, as recorded in its head descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// First byte of the extent.
    pub ptr: PPtr,
    /// Length in pages.
    pub pages: u64,
    /// Owner tag.
    pub owner: u8,
    /// Owner-defined word.
    pub aux: u16,
}

fn encode(pages: u64, owner: u8, aux: u16) -> u64 {
    HEAD_TAG | (u64::from(owner) << 8) | (u64::from(aux) << 16) | (pages << 32)
}

/// Volatile index of one node's heap.
#[derive(Debug, Default)]
struct Index {
    /// Free extents: first page → length.
    free: BTreeMap<u64, u64>,
    /// Allocated extents: first page → (length, owner, aux).
    used: BTreeMap<u64, (u64, u8, u16)>,
    used_pages: u64,
}

/// One node's heap.
#[derive(Debug)]
pub(crate) struct NodeHeap {
    node: usize,
    page_size: u64,
    page_count: u64,
    data_off: u64,
    index: Mutex<Index>,
    /// DRAM mirror, per page: `owner << 56 | aux << 40 | head page`, 0 when free. Lets
    /// allocators find a block's page owner and head without a lock or a PM read.
    mirror: Box<[AtomicU64]>,
}

impl NodeHeap {
    pub(crate) fn placeholder() -> NodeHeap {
        NodeHeap {
            node: 0,
            page_size: 1,
            page_count: 0,
            data_off: u64::MAX,
            index: Mutex::new(Index::default()),
            mirror: Box::new([]),
        }
    }

    /// Scans and validates node `node`'s descriptor table.
    pub(crate) fn load(pool: &Pool, node: usize) -> Result<NodeHeap> {
        let ps = pool.page_size();
        let (page_count, data_off) = layout::geometry(pool.capacity(), ps)
            .ok_or_else(|| PoolError::corrupted("capacity holds no heap page"))?;
        let mirror: Box<[AtomicU64]> = (0..page_count).map(|_| AtomicU64::new(0)).collect();
        let mut index = Index::default();
        let mut page = 0;
        let mut free_start = None;
        while page < page_count {
            let d = descriptor(pool, node, page).load_unaccounted(Ordering::Acquire);
            if d == 0 {
                free_start.get_or_insert(page);
                page += 1;
                continue;
            }
            let bad = |why: &str| {
                PoolError::corrupted(format!("node {node} page {page}: descriptor {d:#x}: {why}"))
            };
            if d & 0xff != HEAD_TAG {
                return Err(bad("bad tag"));
            }
            let owner = (d >> 8) as u8;
            let aux = (d >> 16) as u16;
            let len = d >> 32;
            if owner == 0 {
                return Err(bad("no owner"));
            }
            if len == 0 || page + len > page_count {
                return Err(bad("extent length out of range"));
            }
            if let Some(s) = free_start.take() {
                index.free.insert(s, page - s);
            }
            for p in page + 1..page + len {
                if descriptor(pool, node, p).load_unaccounted(Ordering::Acquire) != 0 {
                    return Err(bad("overlaps the next extent"));
                }
            }
            for p in page..page + len {
                mirror[p as usize].store(mirror_word(page, owner, aux), Ordering::Relaxed);
            }
            index.used.insert(page, (len, owner, aux));
            index.used_pages += len;
            page += len;
        }
        if let Some(s) = free_start {
            index.free.insert(s, page_count - s);
        }
        Ok(NodeHeap { node, page_size: ps, page_count, data_off, index: Mutex::new(index), mirror })
    }

    pub(crate) fn data_offset(&self) -> u64 {
        self.data_off
    }

    fn ptr_of_page(&self, page: u64) -> PPtr {
        PPtr::new(self.node, self.data_off + page * self.page_size).unwrap_or(PPtr::NULL)
    }

    fn page_of(&self, p: PPtr) -> Option<u64> {
        let off = p.offset().checked_sub(self.data_off)?;
        let page = off / self.page_size;
        (p.node() == self.node && page < self.page_count).then_some(page)
    }
}

fn mirror_word(head: u64, owner: u8, aux: u16) -> u64 {
    (u64::from(owner) << 56) | (u64::from(aux) << 40) | head
}

fn descriptor(pool: &Pool, node: usize, page: u64) -> &PmU64 {
    let p = PPtr::new(node, DESCRIPTORS_OFF as u64 + 8 * page).unwrap_or(PPtr::NULL);
    // SAFETY: the descriptor table lies between the header and the data area of every node file
    // (layout::geometry), 8-aligned, mapped for the pool's lifetime; `page < page_count`.
    unsafe { &*(pool.resolve(p) as *const PmU64) }
}

/// Page-level facts about the page that holds a pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageInfo {
    /// First byte of the extent that contains the page.
    pub extent: PPtr,
    /// Owner tag of that extent.
    pub owner: u8,
    /// Owner-defined word of that extent.
    pub aux: u16,
}

impl Pool {
    /// Allocates `pages` contiguous pages on `node` (lowest address first fit), recording
    /// `owner` and `aux` in the head descriptor, which is persisted before returning.
    /// `OutOfSpace` leaves the heap unchanged.
    pub fn alloc_pages(&self, node: usize, pages: u64, owner: u8, aux: u16) -> Result<PPtr> {
        if owner == 0 || pages == 0 || pages >= 1 << 32 {
            return Err(PoolError::InvalidArgument(format!(
                "alloc_pages: owner must be non-zero and pages in 1..2^32 (owner {owner}, pages {pages})"
            )));
        }
        if self.has_crashed() {
            return Err(PoolError::InvalidArgument("pool crashed; reopen it to recover".into()));
        }
        let heap = self.heap(node)?;
        let mut idx = heap.index.lock();
        let Some((&start, &len)) = idx.free.iter().find(|(_, &len)| len >= pages) else {
            return Err(PoolError::OutOfSpace { node, requested: pages * heap.page_size });
        };
        let d = descriptor(self, node, start);
        d.store(encode(pages, owner, aux), Ordering::Release);
        // PERSIST: the head descriptor is the allocation's commit point; it is durable before
        // the caller can link the extent anywhere.
        self.persist_obj(d);
        idx.free.remove(&start);
        if len > pages {
            idx.free.insert(start + pages, len - pages);
        }
        idx.used.insert(start, (pages, owner, aux));
        idx.used_pages += pages;
        for p in start..start + pages {
            heap.mirror[p as usize].store(mirror_word(start, owner, aux), Ordering::Release);
        }
        Ok(heap.ptr_of_page(start))
    }

    /// Frees the extent that starts at `p`. Freeing anything else is an error, not UB.
    pub fn free_pages(&self, p: PPtr) -> Result<()> {
        if self.has_crashed() {
            return Err(PoolError::InvalidArgument("pool crashed; reopen it to recover".into()));
        }
        let heap = self.heap(p.node())?;
        let bad = |why| PoolError::BadPointer { ptr: p.to_string(), why };
        let page = heap.page_of(p).ok_or_else(|| bad("not in the page heap"))?;
        if (p.offset() - heap.data_off) % heap.page_size != 0 {
            return Err(bad("not page aligned"));
        }
        let mut idx = heap.index.lock();
        let (len, _, _) =
            idx.used.remove(&page).ok_or_else(|| bad("not the start of an allocated extent"))?;
        let d = descriptor(self, p.node(), page);
        d.store(0, Ordering::Release);
        // PERSIST: the extent is durably free before its pages can be handed out again.
        self.persist_obj(d);
        idx.used_pages -= len;
        for q in page..page + len {
            heap.mirror[q as usize].store(0, Ordering::Release);
        }
        // Coalesce with the neighbours.
        let mut start = page;
        let mut total = len;
        if let Some((&prev, &plen)) = idx.free.range(..page).next_back() {
            if prev + plen == page {
                idx.free.remove(&prev);
                start = prev;
                total += plen;
            }
        }
        if let Some(&nlen) = idx.free.get(&(page + len)) {
            idx.free.remove(&(page + len));
            total += nlen;
        }
        idx.free.insert(start, total);
        Ok(())
    }

    /// Owner and extent of the page holding `p` (lock-free, from the DRAM mirror); `None` for
    /// free pages and pointers outside the heap.
    #[inline]
    pub fn page_info(&self, p: PPtr) -> Option<PageInfo> {
        let heap = self.heap(p.node()).ok()?;
        let page = heap.page_of(p)?;
        let w = heap.mirror[page as usize].load(Ordering::Acquire);
        if w == 0 {
            return None;
        }
        Some(PageInfo {
            extent: heap.ptr_of_page(w & ((1 << 40) - 1)),
            owner: (w >> 56) as u8,
            aux: (w >> 40) as u16,
        })
    }

    /// Every allocated extent of `node`, in address order.
    pub fn extents(&self, node: usize) -> Result<Vec<Extent>> {
        let heap = self.heap(node)?;
        let idx = heap.index.lock();
        Ok(idx
            .used
            .iter()
            .map(|(&page, &(pages, owner, aux))| Extent {
                ptr: heap.ptr_of_page(page),
                pages,
                owner,
                aux,
            })
            .collect())
    }

    /// `(used, total)` pages of `node`'s heap.
    pub fn heap_usage(&self, node: usize) -> Result<(u64, u64)> {
        let heap = self.heap(node)?;
        Ok((heap.index.lock().used_pages, heap.page_count))
    }

    /// Bytes of PM in allocated extents on `node`.
    pub fn used_bytes(&self, node: usize) -> Result<u64> {
        Ok(self.heap_usage(node)?.0 * self.page_size())
    }

    /// Re-reads `node`'s descriptor table and checks that it matches the volatile index
    /// (structural fsck of the heap).
    pub fn check_heap(&self, node: usize) -> Result<()> {
        let fresh = NodeHeap::load(self, node)?;
        let heap = self.heap(node)?;
        let (a, b) = (heap.index.lock(), fresh.index.lock());
        if a.used != b.used || a.free != b.free {
            return Err(PoolError::corrupted(format!(
                "node {node}: heap index differs from the descriptor table"
            )));
        }
        Ok(())
    }
}
