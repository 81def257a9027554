//! One NUMA-aware layer (NAL): its GV-view in DRAM (papers/nap.txt §4.2) and its per-node PC-views
//! in PM (§4.3): building them, the two-incarnation write, and reading a NAL's latest values back
//! from PM (recovery, §4.6).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use numakv_index::{check_key, Error, Result};
use numakv_pmem::{PPtr, Pool};
use parking_lot::RwLock;

use crate::layout::{
    self, entries_offset, keys_offset, view_bytes, PcEntry, ViewHeader, DEL, ENGINE, OWNER_NAP,
    VIEW_MAGIC,
};

/// The runtime state of one hot item (one GV entry's fields behind its readers-writer lock).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct GvState {
    /// `false` while the value still lives where it was before this NAL was installed (the
    /// previous NAL or the raw index): lazy initialisation, §4.5 ("val_location").
    pub resolved: bool,
    /// Latest value (`None`: absent) once `resolved`.
    pub value: Option<u64>,
    /// Last version written into a PC-view of this NAL (0: never written here).
    pub version: u64,
}

/// A GV entry: the lock and the state. Its PC-view position (`pc_pos`) is its index.
#[derive(Debug, Default)]
pub(crate) struct GvEntry {
    pub state: RwLock<GvState>,
}

/// A NAL in DRAM. Its key set never changes after it is built (the GV-view's structure is
/// immutable, §4.2), so lookups need no lock but the entry's.
#[derive(Debug)]
pub(crate) struct Nal {
    /// Sequence number (diagnostics).
    pub seq: u64,
    /// Hot keys, ascending: an ordered map (sorted array + binary search) so scans can merge.
    pub keys: Box<[u64]>,
    /// GV entries, parallel to `keys`.
    pub entries: Box<[GvEntry]>,
    /// Per node: the PC-view extent (index = node).
    pub views: Vec<PPtr>,
    /// Set after the switch's first grace period: before it, a thread that did not yet see this
    /// NAL may still write these keys elsewhere, so writes into this NAL wait (docs/design.md
    /// "Nap", why phase 2 starts with a grace period for writes too).
    pub writable: AtomicBool,
    pool: Arc<Pool>,
}

impl Nal {
    /// Position of `key` in the NAL.
    #[inline]
    pub fn find(&self, key: u64) -> Option<usize> {
        self.keys.binary_search(&key).ok()
    }

    /// PPtr that the root slots record for this NAL (its node-0 view).
    pub fn root(&self) -> PPtr {
        self.views.first().copied().unwrap_or(PPtr::NULL)
    }

    /// Builds a NAL over `keys` (sorted, deduplicated, valid): allocates and persists one
    /// PC-view per node. On error nothing stays allocated.
    pub fn build(pool: &Arc<Pool>, keys: Vec<u64>, seq: u64) -> Result<Nal> {
        let count = keys.len() as u64;
        let pages = view_bytes(count).div_ceil(pool.page_size());
        let mut views: Vec<PPtr> = Vec::with_capacity(pool.nodes());
        for node in 0..pool.nodes() {
            match pool.alloc_pages(node, pages, OWNER_NAP, 0) {
                Ok(p) => views.push(p),
                Err(e) => {
                    for p in views {
                        // A failure to free is reclaimed by the next recovery (it frees every
                        // Nap extent); the allocation error is the one worth reporting.
                        let _ = pool.free_pages(p);
                    }
                    return Err(e.into());
                }
            }
        }
        for (node, &p) in views.iter().enumerate() {
            let next = views.get(node + 1).copied().unwrap_or(PPtr::NULL);
            init_view(pool, p, seq, node as u64, &keys, views.len() as u64, next)?;
        }
        // PERSIST: every view's header, keys and zeroed entries were flushed by init_view; this
        // fence makes them durable before the caller links the NAL into the root slots.
        pool.fence();
        Ok(Nal {
            seq,
            entries: (0..keys.len()).map(|_| GvEntry::default()).collect(),
            keys: keys.into_boxed_slice(),
            views,
            writable: AtomicBool::new(false),
            pool: Arc::clone(pool),
        })
    }

    /// The PC entry of item `i` in `node`'s view.
    #[inline]
    fn pc_entry(&self, node: usize, i: usize) -> &PcEntry {
        let base = self.views[node];
        let off = entries_offset(self.keys.len() as u64) + i as u64 * layout::ENTRY_BYTES;
        // SAFETY: `views[node]` is an extent of view_bytes(count) bytes allocated by `build`
        // (64-byte aligned: page-aligned start, line-multiple offsets) and freed only after the
        // NAL became unreachable and a grace period passed; `i < count`.
        unsafe { self.pool.get_unchecked::<PcEntry>(PPtr::from_raw(base.raw() + off)) }
    }

    /// Persists `(value, version)` of item `i` into `node`'s PC-view with the two-incarnation
    /// toggle: one flush, one fence. Caller holds the item's write lock.
    pub fn pc_write(&self, node: usize, i: usize, value: u64, version: u64) {
        let e = self.pc_entry(node % self.views.len(), i);
        // ORDERING: the writer holds the GV write lock, so it is the only one touching the entry.
        let valid = e.ind.load(Ordering::Relaxed) & 1;
        let inv = (1 - valid) as usize;
        e.inc[2 * inv].store(value, Ordering::Relaxed);
        e.inc[2 * inv + 1].store(version, Ordering::Relaxed);
        // ORDERING: Release keeps the incarnation's stores before the toggle (compiler and CPU);
        // on x86 TSO they also reach the (one) cache line in this order.
        e.ind.store(inv as u64, Ordering::Release);
        // PERSIST: incarnation and indicator share this line: one clwb + sfence makes the new
        // pair the durable valid one (or, if the crash comes first, the old pair stays valid).
        self.pool.persist_obj(e);
    }

    /// Bytes of DRAM this NAL holds (GV-view).
    pub fn dram_bytes(&self) -> u64 {
        (self.keys.len() * (8 + std::mem::size_of::<GvEntry>())) as u64
    }

    /// Bytes of PM this NAL holds (all PC-views).
    pub fn pm_bytes(&self) -> u64 {
        let pages = view_bytes(self.keys.len() as u64).div_ceil(self.pool.page_size());
        pages * self.pool.page_size() * self.views.len() as u64
    }

    /// Frees the PC-views. Caller guarantees nobody reaches them any more.
    pub fn free_pm(&self) -> Result<()> {
        self.free_pm_from(&mut 0)
    }

    /// [`Nal::free_pm`], resumable: `freed` views (counted from the last) are already free;
    /// it counts the ones this call frees, so a failed call can be retried.
    pub fn free_pm_from(&self, freed: &mut usize) -> Result<()> {
        // Node 0's view last: it is what the root slots name, the others hang off it.
        while let Some(&p) = self.views.len().checked_sub(*freed + 1).map(|i| &self.views[i]) {
            self.pool.free_pages(p)?;
            *freed += 1;
        }
        Ok(())
    }

    /// The views not freed by `freed` views of [`Nal::free_pm_from`].
    pub fn views_left(&self, freed: usize) -> &[PPtr] {
        &self.views[..self.views.len().saturating_sub(freed)]
    }

    /// The latest `(value, version)` of item `i` across this NAL's PC-views (for `check`).
    pub fn pm_latest(&self, i: usize) -> (u64, u64) {
        (0..self.views.len())
            .map(|n| self.pc_entry(n, i).current())
            .max_by_key(|&(_, ver)| ver & !DEL)
            .unwrap_or((0, 0))
    }
}

/// Writes one view: header, keys, every entry zeroed (version 0 in both incarnations: a fresh
/// extent may hold a previous NAL's bytes), flushed (the caller fences).
fn init_view(
    pool: &Pool,
    p: PPtr,
    seq: u64,
    node: u64,
    keys: &[u64],
    nodes: u64,
    next: PPtr,
) -> Result<()> {
    let count = keys.len() as u64;
    let hdr = pool.get::<ViewHeader>(p)?;
    for (i, &k) in keys.iter().enumerate() {
        let w = pool.get::<numakv_pmem::PmU64>(at(p, keys_offset() + 8 * i as u64)?)?;
        w.store(k, Ordering::Relaxed);
    }
    for i in 0..count {
        let e = pool.get::<PcEntry>(at(p, entries_offset(count) + i * layout::ENTRY_BYTES)?)?;
        e.ind.store(0, Ordering::Relaxed);
        for w in &e.inc {
            w.store(0, Ordering::Relaxed);
        }
    }
    hdr.seq.store(seq, Ordering::Relaxed);
    hdr.node.store(node, Ordering::Relaxed);
    hdr.count.store(count, Ordering::Relaxed);
    hdr.nodes.store(nodes, Ordering::Relaxed);
    hdr.next.store(next.raw(), Ordering::Relaxed);
    hdr.magic.store(VIEW_MAGIC, Ordering::Release);
    // PERSIST (with the caller's fence): the whole view, so that once the NAL is linked,
    // recovery reads keys and version-0 entries, never stale bytes.
    pool.flush(pool.resolve(p), view_bytes(count) as usize);
    Ok(())
}

fn at(p: PPtr, off: u64) -> Result<PPtr> {
    p.add(off).ok_or_else(|| Error::corrupted(ENGINE, format!("view {p} + {off} overflows")))
}

/// A NAL read back from PM: its keys and, per key, the latest `(value, version)` across nodes
/// (version 0: never written in this NAL). Validates the headers.
pub(crate) fn read_pm(pool: &Pool, root: PPtr) -> Result<Vec<(u64, u64, u64)>> {
    let bad = |why: String| Error::corrupted(ENGINE, format!("NAL {root}: {why}"));
    let mut views = Vec::new();
    let mut p = root;
    while !p.is_null() {
        if views.len() >= pool.nodes() {
            return Err(bad("more PC-views than nodes (cycle?)".into()));
        }
        let h = pool.get::<ViewHeader>(p)?;
        if h.magic.load_unaccounted(Ordering::Acquire) != VIEW_MAGIC {
            return Err(bad(format!("view {p}: bad magic")));
        }
        if h.node.load_unaccounted(Ordering::Acquire) != views.len() as u64
            || p.node() != views.len()
        {
            return Err(bad(format!("view {p}: wrong node")));
        }
        views.push(p);
        p = PPtr::from_raw(h.next.load_unaccounted(Ordering::Acquire));
    }
    if views.len() != pool.nodes() {
        return Err(bad(format!("{} PC-views for {} nodes", views.len(), pool.nodes())));
    }
    let count = pool.get::<ViewHeader>(root)?.count.load_unaccounted(Ordering::Acquire);
    let extent = pool.page_info(root).map(|i| i.extent);
    if extent != Some(root) || count > pool.capacity() / layout::ENTRY_BYTES {
        return Err(bad(format!("count {count} does not fit its extent")));
    }
    let mut out = Vec::with_capacity(count as usize);
    for i in 0..count {
        let key = pool.get::<numakv_pmem::PmU64>(at(root, keys_offset() + 8 * i)?)?;
        let key = key.load_unaccounted(Ordering::Acquire);
        check_key(key).map_err(|_| bad(format!("key {i} is {key}")))?;
        let mut best = (0u64, 0u64);
        for &v in &views {
            let h = pool.get::<ViewHeader>(v)?;
            if h.count.load_unaccounted(Ordering::Acquire) != count {
                return Err(bad(format!("view {v}: key count differs")));
            }
            let e = pool.get::<PcEntry>(at(v, entries_offset(count) + i * layout::ENTRY_BYTES)?)?;
            let (val, ver) = e.current();
            if ver & !DEL > best.1 & !DEL {
                best = (val, ver);
            }
        }
        out.push((key, best.0, best.1));
    }
    Ok(out)
}
