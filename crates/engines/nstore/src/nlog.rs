//! Nlog (papers/nstore.txt §III-C–E): per node and per hash cluster an active log file in that
//! node's pool; every write appends one entry to the active file of its cluster on the writer's
//! own node — a single local PM write — under a per-(node, cluster) lock held only to reserve the
//! slot.
//!
//! - Files are page-heap extents (owner `OWNER_ENGINE`, aux `AUX_LOG`). The page heap's
//!   descriptor table is the persistent file table: recovery finds every file by listing the
//!   extents, and allocation/free are its failure-atomic commit points.
//! - A new file's extent is zeroed durably before its header is written (§III-E), so that no
//!   stale byte of the pages — a client's value shaped as entries among them — is read as one of
//!   its entries.
//! - A full active file is sealed (read-only from then on) and a new one is allocated at once. A
//!   sealed file leaves its active slot at once: no reservation, GC's included, ever lands in a
//!   sealed file (one GC may be reclaiming or have freed).
//!   File sizes adapt (docs/design.md, "NStore", Space): the first file of a (node, cluster) is
//!   small ([`FIRST_FILE_BYTES`]) and each next one doubles, up to the format's `log_file_size`,
//!   so a store with many clusters and few keys holds little PM.
//! - A node keeps a GC reserve ([`Nlog::reserve_pages`]): a put may not allocate a file into it,
//!   a delete may use half of it, GC all of it, so that GC can always rewrite the live entries of
//!   a file it reclaims, and a full store recovers once keys are deleted.
//! - The DRAM file table maps (node, file id) → [`LogFile`] (a dense array per node,
//!   [`FileTable`]); an address resolves through it, so a `v_addr`/`h_addr` naming a reclaimed
//!   file is recognised as dangling (ids are never reused).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use numakv_index::{Error, Result};
use numakv_pmem::alloc::epoch;
use numakv_pmem::{PPtr, Pool, PoolError};
use parking_lot::Mutex;

use numakv_pmem::PmBytes;

use crate::filetable::FileTable;
use crate::layout::{
    self, meta_word, var_meta_word, var_size_word, Entry, FileHeader, FileInfo, NodeMeta, Op,
    VAddr, VarHead, AUX_LOG, ENTRY_SIZE, ENTRY_WORDS, FILE_HEADER, ID_BATCH, MAX_FILE_ID,
    OWNER_ENGINE, VAR_HEAD,
};

/// Most reservations of one fixed-size file in flight at once (reserved, entry not yet durable):
/// a reservation waits while a file has this many. So at most this many unwritten slots can
/// precede a written one after a crash, and recovery stops reading a file after that many
/// unwritten slots in a row (`recovery::MAX_GAP`) without missing an entry.
pub(crate) const MAX_PENDING: u32 = numakv_numa::MAX_THREADS as u32;

/// The size a (node, cluster)'s first log file aims at (rounded up to a page, at most the
/// format's `log_file_size`); each next file of it doubles.
pub const FIRST_FILE_BYTES: u64 = 64 << 10;

/// The pages of a (node, cluster)'s first file in a pool of `page_size`-byte pages whose files
/// grow to `file_pages` pages.
pub(crate) fn first_pages(page_size: u64, file_pages: u32) -> u32 {
    (FIRST_FILE_BYTES.div_ceil(page_size).max(1) as u32).min(file_pages)
}

/// Frees the extent of a log file at `base` — a file GC retired, an orphan found at open, an
/// extent whose header was never written — after durably invalidating its header: the page heap
/// hands freed pages out again as they are, and a new file whose allocation is durable but whose
/// header is not yet (power failure in [`Nlog::new_file`]) would otherwise carry this file's old
/// header, which validates, and recovery would revive every entry of the freed file — among
/// them entries that GC dropped unmarked because a newer entry (a delete, freed too) superseded
/// them (docs/design.md, "NStore", GC).
pub(crate) fn free_file_extent(pool: &Pool, base: PPtr) -> Result<()> {
    let h: &FileHeader = pool.get(base)?;
    h.magic.store(0, Ordering::Release);
    // PERSIST: no header of this file can validate once its pages are free (and so can be part
    // of a new file whose own header is not durable yet).
    pool.persist_obj(&h.magic);
    pool.free_pages(base)?;
    Ok(())
}

/// The GC reserve of a node in pages: what a put may not allocate into (see [`Need`]). One
/// reclaim rewrites at most the live entries of one file (at most `file_pages`) into its
/// cluster's active file, which may need one new file of at most `file_pages`: twice that for
/// GC, and as much again for the deletes that make a full store reclaimable.
pub(crate) fn reserve_pages(file_pages: u32) -> u64 {
    4 * u64::from(file_pages)
}

/// Who asks for a new log file, which decides how much of the node's GC reserve it may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// An insert, update or upsert: leaves the whole reserve free.
    Put,
    /// A delete: may use half the reserve (deletes are what let GC free space in a full store).
    Delete,
    /// A GC rewrite: may use all of it.
    Gc,
}

/// The active file of one (node, cluster, kind) and the size of its next file.
#[derive(Debug)]
struct Active {
    file: Option<Arc<LogFile>>,
    /// Pages of the next file allocated for this slot (doubling up to the format's size).
    next_pages: u32,
}

/// A variable-length entry in PM: its head and its body (key then value, each padded to 8).
#[derive(Clone, Copy, Debug)]
pub(crate) struct VarEntry<'p> {
    pub head: &'p VarHead,
    pub body: &'p PmBytes,
    /// Entry words (from the v_addr or the durable size word).
    pub words: u32,
}

impl VarEntry<'_> {
    /// `(op, key, value)` if the entry is written in file `file` (valid or marked `inv`).
    pub(crate) fn read(&self, file: u32) -> Option<(Op, Vec<u8>, Vec<u8>)> {
        let m = self.head.meta.load(Ordering::Acquire);
        let (op, k_len, v_len) = layout::decode_var_meta(m, file, self.words)?;
        let mut key = vec![0u8; k_len];
        let mut value = vec![0u8; v_len];
        let koff = 0;
        let voff = k_len.next_multiple_of(8);
        // SAFETY: a written entry's body was persisted before its meta word and is immutable
        // from then on (GC only rewrites the meta word), so nothing writes it concurrently.
        let ok = unsafe { self.body.read(koff, &mut key) && self.body.read(voff, &mut value) };
        ok.then_some((op, key, value))
    }
}

/// DRAM state of one Nlog file.
#[derive(Debug)]
pub(crate) struct LogFile {
    pub info: FileInfo,
    pub base: PPtr,
    /// Entry slots (a variable-length file: 8-byte words).
    pub slots: u32,
    /// Slots (words) handed out (reserved); only grows, only while the file is active.
    pub tail: AtomicU32,
    /// Reserved slots whose entry is not yet durable. GC takes only sealed files with none.
    pub pending: AtomicU32,
    /// No more reservations (full, or not the active file of its (node, cluster)).
    pub sealed: AtomicBool,
    /// Entries (a variable-length file: their words) known to be garbage: superseded, deleted,
    /// or delete entries themselves.
    pub dead: AtomicU32,
    /// Taken by the GC pass that reclaims the file, so that two passes (a GC thread and
    /// [`crate::NStore::collect_garbage`]) never reclaim — and free — the same file twice.
    pub claimed: AtomicBool,
    /// GC's view of an active file's activity ([`crate::gc`]: idle active files are sealed and
    /// collected): the tail at its previous pass over the file (`u32::MAX`: none yet) ...
    pub seen_tail: AtomicU32,
    /// ... and since when (`gc::clock_ms`) the passes found it unchanged (0: it changed).
    pub idle_since: AtomicU64,
}

impl LogFile {
    pub(crate) fn new(info: FileInfo, base: PPtr, tail: u32, sealed: bool) -> LogFile {
        LogFile {
            info,
            base,
            slots: info.slots() as u32,
            tail: AtomicU32::new(tail),
            pending: AtomicU32::new(0),
            sealed: AtomicBool::new(sealed),
            dead: AtomicU32::new(0),
            claimed: AtomicBool::new(false),
            seen_tail: AtomicU32::new(u32::MAX),
            idle_since: AtomicU64::new(0),
        }
    }

    /// Entry `slot` of this file.
    pub(crate) fn entry<'p>(&self, pool: &'p Pool, slot: u32) -> Result<&'p Entry> {
        let off = FILE_HEADER + u64::from(slot) * ENTRY_SIZE;
        let p = self.base.add(off).ok_or_else(|| layout::corrupted("entry pointer overflows"))?;
        Ok(pool.get::<Entry>(p)?)
    }

    /// The address of entry `slot`.
    pub(crate) fn vaddr(&self, slot: u32) -> VAddr {
        // Every field was range-checked when the file was created or validated at open.
        VAddr::new(self.info.node, self.info.id, slot, ENTRY_WORDS).unwrap_or(VAddr(0))
    }

    /// Bytes of the file in use: the header and the slots reserved so far.
    pub(crate) fn used_bytes(&self) -> u64 {
        let unit = if self.info.var { 8 } else { ENTRY_SIZE };
        FILE_HEADER + u64::from(self.tail.load(Ordering::Acquire)) * unit
    }

    /// The variable-length entry of `words` words at word `off` of this (variable-length) file.
    pub(crate) fn var_entry<'p>(
        &self,
        pool: &'p Pool,
        off: u32,
        words: u32,
    ) -> Result<VarEntry<'p>> {
        if !self.info.var || u64::from(off) + u64::from(words) > u64::from(self.slots) {
            return Err(layout::corrupted(format!(
                "file {}: variable entry at word {off} ({words} words) out of range",
                self.info.id
            )));
        }
        let at = FILE_HEADER + u64::from(off) * 8;
        let p = self.base.add(at).ok_or_else(|| layout::corrupted("entry pointer overflows"))?;
        let head: &VarHead = pool.get(p)?;
        let bp = p.add(VAR_HEAD).ok_or_else(|| layout::corrupted("entry pointer overflows"))?;
        let body = pool.bytes(bp, (u64::from(words) * 8 - VAR_HEAD) as usize)?;
        Ok(VarEntry { head, body, words })
    }

    /// The size word at word `off` of this variable-length file.
    pub(crate) fn var_size_at(&self, pool: &Pool, off: u32) -> Result<u64> {
        let at = FILE_HEADER + u64::from(off) * 8 + 24;
        let p = self.base.add(at).ok_or_else(|| layout::corrupted("entry pointer overflows"))?;
        Ok(pool.get::<numakv_pmem::PmU64>(p)?.load(Ordering::Acquire))
    }

    /// The address of the variable-length entry at word `off`.
    pub(crate) fn var_vaddr(&self, off: u32, words: u32) -> VAddr {
        VAddr::new(self.info.node, self.info.id, off, words).unwrap_or(VAddr(0))
    }

    /// The garbage weight of the entry at `va` in this file (entries or words).
    pub(crate) fn weight(&self, va: VAddr) -> u32 {
        if self.info.var {
            va.words()
        } else {
            1
        }
    }

    /// Share of the written entries that are garbage.
    pub(crate) fn dead_share(&self) -> f64 {
        let used = self.tail.load(Ordering::Acquire);
        if used == 0 {
            return 0.0;
        }
        f64::from(self.dead.load(Ordering::Relaxed)) / f64::from(used)
    }
}

/// Per-node file-id allocation.
#[derive(Debug)]
struct IdAlloc {
    next: u32,
    hwm: u32,
    meta: PPtr,
}

/// The log: files, active files, versions.
#[derive(Debug)]
pub(crate) struct Nlog {
    pub pool: Arc<Pool>,
    pub nodes: usize,
    pub clusters: u32,
    /// Pages a file grows to (the format's `log_file_size`).
    pub file_pages: u32,
    /// Pages of a (node, cluster)'s first file.
    pub first_pages: u32,
    /// Pages of every node's GC reserve ([`reserve_pages`]).
    pub reserve_pages: u64,
    /// Per node: file id → file.
    tables: Vec<FileTable>,
    /// `(node * clusters + cluster) * 2 + var` → the active file of fixed (var = 0) or
    /// variable-length (var = 1) entries; the mutex is the per-cluster write lock of §III-E,
    /// held only to reserve a slot (and to replace a full file). One cache line each.
    actives: Box<[CachePadded<Mutex<Active>>]>,
    /// Per node: file ids, and the lock that makes a file allocation's space check and
    /// allocation one step (so the reserve holds against concurrent allocations).
    ids: Vec<Mutex<IdAlloc>>,
    /// Per cluster: the next version (shared by the cluster's files on every node, so the
    /// entries of one key — always in one cluster — are totally ordered).
    /// One cache line each: writers of different clusters do not share one.
    versions: Box<[CachePadded<AtomicU64>]>,
    /// Files allocated this session.
    pub files_created: AtomicU64,
}

impl Nlog {
    /// An empty log over `pool`, with the node meta pages at `metas` and the id high-water marks
    /// read from them.
    pub(crate) fn new(
        pool: Arc<Pool>,
        clusters: u32,
        file_pages: u32,
        metas: Vec<(PPtr, u32)>,
    ) -> Nlog {
        let nodes = pool.nodes();
        let first = first_pages(pool.page_size(), file_pages);
        Nlog {
            pool,
            nodes,
            clusters,
            file_pages,
            first_pages: first,
            reserve_pages: reserve_pages(file_pages),
            tables: (0..nodes).map(|_| FileTable::new()).collect(),
            actives: (0..nodes * clusters as usize * 2)
                .map(|_| CachePadded::new(Mutex::new(Active { file: None, next_pages: first })))
                .collect(),
            ids: metas
                .into_iter()
                .map(|(meta, hwm)| Mutex::new(IdAlloc { next: hwm.max(1), hwm, meta }))
                .collect(),
            versions: (0..clusters).map(|_| CachePadded::new(AtomicU64::new(1))).collect(),
            files_created: AtomicU64::new(0),
        }
    }

    /// Registers a file found at open (or created); `active` makes it its cluster's active file.
    pub(crate) fn install(&self, f: Arc<LogFile>, active: bool) {
        let (node, cluster) = (f.info.node, f.info.cluster);
        if active {
            self.actives[self.active_slot(node, cluster, f.info.var)].lock().file =
                Some(Arc::clone(&f));
        }
        self.tables[node].insert(f);
    }

    /// Open: `f` is the newest file of its (node, cluster, kind); the next one doubles its size.
    pub(crate) fn grow_after(&self, f: &LogFile) {
        let pages = f.info.size / self.pool.page_size();
        let next = (pages.saturating_mul(2)).min(u64::from(self.file_pages)) as u32;
        let slot = self.active_slot(f.info.node, f.info.cluster, f.info.var);
        self.actives[slot].lock().next_pages = next.max(self.first_pages);
    }

    fn active_slot(&self, node: usize, cluster: u32, var: bool) -> usize {
        (node * self.clusters as usize + cluster as usize) * 2 + usize::from(var)
    }

    /// Raises cluster `c`'s next version to at least `v`.
    pub(crate) fn bump_version(&self, c: u32, v: u64) {
        // ORDERING: Relaxed; recovery calls this before any writer runs.
        self.versions[c as usize].fetch_max(v, Ordering::Relaxed);
    }

    /// The next version of every cluster (for the snapshot).
    pub(crate) fn version_words(&self) -> Vec<u64> {
        self.versions.iter().map(|v| v.load(Ordering::Acquire)).collect()
    }

    /// The file `id` of `node`, if it exists.
    pub(crate) fn file(&self, node: usize, id: u32) -> Option<Arc<LogFile>> {
        self.tables.get(node)?.get_arc(id)
    }

    /// Every file of `node`.
    pub(crate) fn files_of(&self, node: usize) -> Vec<Arc<LogFile>> {
        self.tables.get(node).map(FileTable::all).unwrap_or_default()
    }

    /// Every file.
    pub(crate) fn all_files(&self) -> Vec<Arc<LogFile>> {
        (0..self.nodes).flat_map(|n| self.files_of(n)).collect()
    }

    /// Removes `f` from the file table (GC, before its pages are freed).
    pub(crate) fn unlink(&self, f: &LogFile) {
        self.tables[f.info.node].remove(f.info.id);
    }

    /// The entry `va` names, or `None` when its file no longer exists (reclaimed by GC; the
    /// caller re-reads the index or stops walking a history chain). The caller keeps an epoch
    /// guard pinned while it uses the entry, so the pages are not freed under it.
    pub(crate) fn locate(&self, va: VAddr) -> Result<Option<&Entry>> {
        let Some(table) = self.tables.get(va.node()) else {
            return Err(layout::corrupted(format!("address {:#x} names node {}", va.0, va.node())));
        };
        let found = {
            // Nested in the caller's guard; only for the borrow of the file.
            let guard = epoch::pin();
            table.get(va.file(), &guard).map(|f| (f.base, f.slots, f.info.var))
        };
        let Some((base, slots, var)) = found else { return Ok(None) };
        if var || va.slot() >= slots || va.words() != ENTRY_WORDS {
            return Err(layout::corrupted(format!("address {:#x} is outside its file", va.0)));
        }
        let off = FILE_HEADER + u64::from(va.slot()) * ENTRY_SIZE;
        let p = base.add(off).ok_or_else(|| layout::corrupted("entry pointer overflows"))?;
        Ok(Some(self.pool.get::<Entry>(p)?))
    }

    /// The variable-length entry `va` names, or `None` when its file no longer exists (as for
    /// [`Nlog::locate`]; the caller keeps an epoch guard pinned while it uses the entry).
    pub(crate) fn locate_var(&self, va: VAddr) -> Result<Option<VarEntry<'_>>> {
        let Some(table) = self.tables.get(va.node()) else {
            return Err(layout::corrupted(format!("address {:#x} names node {}", va.0, va.node())));
        };
        let Some(f) = table.get_arc(va.file()) else { return Ok(None) };
        f.var_entry(&self.pool, va.slot(), va.words()).map(Some)
    }

    /// The cluster of a key hash.
    pub(crate) fn cluster_of(&self, hash: u64) -> u32 {
        ((hash >> 32) % u64::from(self.clusters)) as u32
    }

    /// A fresh file id of `node` (whose allocator `a` is), raising the persistent high-water
    /// mark first when needed.
    fn next_id(pool: &Pool, a: &mut IdAlloc, node: usize) -> Result<u32> {
        if a.next > MAX_FILE_ID {
            return Err(Error::Unsupported(format!(
                "node {node} has used all {MAX_FILE_ID} file ids of this store"
            )));
        }
        if a.next >= a.hwm {
            let hwm = (a.next.saturating_add(ID_BATCH)).min(MAX_FILE_ID + 1);
            let m: &NodeMeta = pool.get(a.meta)?;
            m.id_hwm.store(u64::from(hwm), Ordering::Release);
            // PERSIST: no file (and so no entry stamp) uses an id the durable high-water mark
            // does not cover; after a crash, ids restart above it.
            pool.persist_obj(&m.id_hwm);
            a.hwm = hwm;
        }
        let id = a.next;
        a.next += 1;
        Ok(id)
    }

    /// Allocates, initialises and registers a new file for (`node`, `cluster`) of `want` pages
    /// — fewer (down to one page) when the node has no room for `want` above what `need` must
    /// leave of the GC reserve: a store stays usable up to near its capacity.
    fn new_file(
        &self,
        node: usize,
        cluster: u32,
        var: bool,
        want: u32,
        need: Need,
    ) -> Result<Arc<LogFile>> {
        let mut ids = self.ids[node].lock();
        let (used, total) = self.pool.heap_usage(node)?;
        let free = total.saturating_sub(used);
        let floor = match need {
            Need::Put => self.reserve_pages,
            Need::Delete => self.reserve_pages / 2,
            Need::Gc => 0,
        };
        let mut pages = want.max(1);
        let base = loop {
            if free >= floor + u64::from(pages) {
                match self.pool.alloc_pages(node, u64::from(pages), OWNER_ENGINE, AUX_LOG) {
                    Ok(base) => break base,
                    // Free pages, but no run of `pages` (fragmentation): try a smaller file.
                    Err(PoolError::OutOfSpace { .. }) if pages > 1 => {}
                    Err(e) => return Err(e.into()),
                }
            } else if pages == 1 {
                return Err(PoolError::OutOfSpace { node, requested: self.pool.page_size() }.into());
            }
            pages /= 2;
        };
        // The id is taken only once the extent exists, so refused allocations use no ids.
        let id = match Self::next_id(&self.pool, &mut ids, node) {
            Ok(id) => id,
            Err(e) => {
                let _ = free_file_extent(&self.pool, base);
                return Err(e);
            }
        };
        drop(ids);
        numakv_pmem::pause_point!("nstore.new_file.allocated");
        let size = u64::from(pages) * self.pool.page_size();
        if let Err(e) = self.zero_extent(base, size) {
            let _ = free_file_extent(&self.pool, base);
            return Err(e);
        }
        let info = FileInfo { id, node, cluster, size, var };
        let h: &FileHeader = self.pool.get(base)?;
        info.write(h);
        // PERSIST: the header is durable before any entry of the file can be (entries are
        // written after this returns, by this or later threads, each persisted after it); a
        // crash before this point leaves an extent without a valid header, which recovery frees.
        self.pool.persist_obj(h);
        self.files_created.fetch_add(1, Ordering::Relaxed);
        let f = Arc::new(LogFile::new(info, base, 0, false));
        self.tables[node].insert(Arc::clone(&f));
        Ok(f)
    }

    /// Zeroes the `size` bytes of a new file's extent at `base` durably, before its header is
    /// written (papers/nstore.txt §III-E: "each active file is initialized with 0"). The pages
    /// may hold anything an earlier extent left there — entries of a freed file, the key bytes
    /// of a snapshot, the values clients stored, which can be shaped as entries stamped with
    /// the id this file is about to get (ids are predictable). Zeroed, a slot of this file
    /// holds an entry only if this file wrote one (docs/design.md, "NStore", Nlog files).
    fn zero_extent(&self, base: PPtr, size: u64) -> Result<()> {
        let len = usize::try_from(size).map_err(|_| layout::corrupted("file size overflows"))?;
        let bytes = self.pool.bytes(base, len)?;
        // SAFETY: the extent was just allocated by this thread and nothing refers to it yet (no
        // header, not in the file table): nothing else reads or writes these bytes.
        if !unsafe { bytes.fill(0, len, 0) } {
            return Err(layout::corrupted("file extent out of range"));
        }
        // PERSIST: the zeroed extent is durable before the header that makes it a file, so
        // recovery never reads stale bytes as entries of this file.
        self.pool.persist(bytes.as_ptr(), len);
        Ok(())
    }

    /// Allocates the next file of `active` (its size doubling up to the format's) and makes it
    /// the active file.
    fn replace_active(
        &self,
        active: &mut Active,
        node: usize,
        cluster: u32,
        var: bool,
        need: Need,
    ) -> Result<Arc<LogFile>> {
        let f = self.new_file(node, cluster, var, active.next_pages, need)?;
        let pages = (f.info.size / self.pool.page_size()) as u32;
        active.next_pages = pages.saturating_mul(2).clamp(self.first_pages, self.file_pages);
        active.file = Some(Arc::clone(&f));
        Ok(f)
    }

    /// Seals the active file of `active` (if any) and takes it out of the slot: a sealed file
    /// is never the active file, so no reservation — a write's or GC's — ever lands in a file
    /// that GC may reclaim (or has freed) and no file is written after GC read its tail.
    fn seal_active(active: &mut Active) {
        if let Some(f) = active.file.take() {
            // ORDERING: Release; GC's Acquire load of `sealed` then sees the final tail.
            f.sealed.store(true, Ordering::Release);
        }
    }

    /// Seals `f` if it is still the active file of its (node, cluster, kind) (GC, for an idle
    /// active file whose garbage share passed the threshold); whether it is sealed now. The
    /// next write of the cluster allocates a new file, of the first file's size.
    pub(crate) fn seal_if_active(&self, f: &LogFile) -> bool {
        let slot = self.active_slot(f.info.node, f.info.cluster, f.info.var);
        let mut active = self.actives[slot].lock();
        if active.file.as_ref().is_some_and(|a| std::ptr::eq(Arc::as_ptr(a), f)) {
            Self::seal_active(&mut active);
            active.next_pages = self.first_pages;
        }
        // ORDERING: Acquire; pairs with the Release store in `seal_active`.
        f.sealed.load(Ordering::Acquire)
    }

    /// Reserves a slot in the active file of (`node`, `cluster`), replacing a full file (a new
    /// file as `need` may allocate). The caller must write the slot with [`Nlog::write`], which
    /// releases the reservation.
    pub(crate) fn reserve(
        &self,
        node: usize,
        cluster: u32,
        need: Need,
    ) -> Result<(Arc<LogFile>, u32)> {
        let slot = self.active_slot(node, cluster, false);
        let mut active = self.actives[slot].lock();
        while let Some(f) = active.file.as_ref() {
            // ORDERING: Relaxed under the cluster lock, which orders all reservations of a file
            // (and every store of `sealed` to an active file is made under it too).
            let t = f.tail.load(Ordering::Relaxed);
            if f.sealed.load(Ordering::Relaxed) || t >= f.slots {
                Self::seal_active(&mut active);
                break;
            }
            // ORDERING: Acquire; pairs with the Release decrement in `write`.
            if f.pending.load(Ordering::Acquire) >= MAX_PENDING {
                // Recovery's bound on unwritten slots in a row (`recovery::MAX_GAP`): wait
                // for a writer of this file to finish before reserving another slot.
                drop(active);
                std::thread::yield_now();
                active = self.actives[slot].lock();
                continue;
            }
            f.pending.fetch_add(1, Ordering::AcqRel);
            f.tail.store(t + 1, Ordering::Release);
            return Ok((Arc::clone(f), t));
        }
        // The old file, if any, is sealed and no longer active: on OutOfSpace nothing was
        // reserved and the next write tries to allocate again.
        let f = self.replace_active(&mut active, node, cluster, false, need)?;
        f.pending.fetch_add(1, Ordering::AcqRel);
        f.tail.store(1, Ordering::Release);
        Ok((f, 0))
    }

    /// Reserves `words` words for a variable-length entry in the variable-length active file of
    /// (`node`, `cluster`), replacing a full file; returns the file and the word offset. The
    /// entry's size word is written and persisted here, under the cluster lock: a later
    /// reservation — whose entry may become durable first — can only follow a durable size
    /// word, so recovery can always step from one entry to the next (docs/design.md, "NStore",
    /// variable-length entries). The caller must write it with [`Nlog::write_var`].
    pub(crate) fn reserve_var(
        &self,
        node: usize,
        cluster: u32,
        words: u32,
        need: Need,
    ) -> Result<(Arc<LogFile>, u32)> {
        let mut active = self.actives[self.active_slot(node, cluster, true)].lock();
        let f = match active.file.as_ref() {
            // ORDERING: Relaxed under the cluster lock, which orders all reservations of a file
            // (and every store of `sealed` to an active file is made under it too). A sealed
            // file takes no entry, even one that would fit: GC may be reclaiming it, or may
            // have freed it already (issue 34).
            Some(f)
                if !f.sealed.load(Ordering::Relaxed)
                    && f.tail.load(Ordering::Relaxed) + words <= f.slots =>
            {
                Arc::clone(f)
            }
            _ => {
                Self::seal_active(&mut active);
                let f = self.replace_active(&mut active, node, cluster, true, need)?;
                if words > f.slots {
                    return Err(Error::InvalidOptions(format!(
                        "a {words}-word entry does not fit a {}-word log file",
                        f.slots
                    )));
                }
                f
            }
        };
        let t = f.tail.load(Ordering::Relaxed);
        let at = FILE_HEADER + u64::from(t) * 8 + 24;
        let p = f.base.add(at).ok_or_else(|| layout::corrupted("entry pointer overflows"))?;
        let size = self.pool.get::<numakv_pmem::PmU64>(p)?;
        size.store(var_size_word(words, f.info.id), Ordering::Release);
        // PERSIST: the size word is durable before any later reservation of this file exists,
        // so a torn entry can always be stepped over by recovery.
        self.pool.persist_obj(size);
        f.pending.fetch_add(1, Ordering::AcqRel);
        f.tail.store(t + words, Ordering::Release);
        Ok((f, t))
    }

    /// Writes the variable-length entry reserved at word `off` of `f` and makes it durable: the
    /// body first, then the meta word that validates it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write_var(
        &self,
        f: &LogFile,
        off: u32,
        op: Op,
        version: u64,
        h_addr: u64,
        key: &[u8],
        value: &[u8],
    ) -> Result<VAddr> {
        let words = layout::var_words(key.len(), value.len())
            .ok_or_else(|| Error::InvalidOptions("entry lengths out of range".into()))?;
        let result = f.var_entry(&self.pool, off, words).and_then(|e| {
            e.head.version.store(version, Ordering::Relaxed);
            e.head.h_addr.store(h_addr, Ordering::Relaxed);
            let voff = key.len().next_multiple_of(8);
            // SAFETY: the words were reserved by this thread and are not published yet: nothing
            // else reads or writes them until the meta word below is stored.
            let ok = unsafe { e.body.write(0, key) && e.body.write(voff, value) };
            if !ok {
                return Err(layout::corrupted("variable entry body out of range"));
            }
            // PERSIST: the body (and head words) are durable before the meta word that makes
            // the entry valid.
            self.pool.persist((e.head as *const VarHead).cast(), words as usize * 8);
            e.head
                .meta
                .store(var_meta_word(op, key.len(), value.len(), f.info.id), Ordering::Release);
            // PERSIST: the entry is valid and durable before its address is published.
            self.pool.persist_obj(&e.head.meta);
            Ok(f.var_vaddr(off, words))
        });
        if result.is_err() {
            // The words stay unwritten: garbage of their file (as recovery would count them).
            f.dead.fetch_add(words, Ordering::Relaxed);
        }
        // ORDERING: Release; as in `write`.
        f.pending.fetch_sub(1, Ordering::Release);
        result
    }

    /// Takes the next version of `cluster`. The caller holds the key's lock.
    pub(crate) fn next_version(&self, cluster: u32) -> u64 {
        // ORDERING: Relaxed; uniqueness comes from the RMW, and versions of one key are ordered
        // by the key lock the caller holds.
        self.versions[cluster as usize].fetch_add(1, Ordering::Relaxed)
    }

    /// Writes reserved `slot` of `f` and makes it durable: body first, then the meta word that
    /// validates it (op written last, §III-E "Consistency of write operations").
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write(
        &self,
        f: &LogFile,
        slot: u32,
        op: Op,
        version: u64,
        h_addr: u64,
        key: u64,
        value: u64,
    ) -> Result<VAddr> {
        let result = f.entry(&self.pool, slot).map(|e| {
            e.version.store(version, Ordering::Relaxed);
            e.h_addr.store(h_addr, Ordering::Relaxed);
            e.key.store(key, Ordering::Relaxed);
            e.value.store(value, Ordering::Relaxed);
            // PERSIST: the body is durable before the meta word that makes the entry valid.
            self.pool.persist((e as *const Entry).cast(), ENTRY_SIZE as usize);
            e.meta.store(meta_word(op, f.info.id), Ordering::Release);
            // PERSIST: the entry is valid and durable before its address is published (index)
            // and the operation acknowledged.
            self.pool.persist_obj(&e.meta);
            f.vaddr(slot)
        });
        if result.is_err() {
            // The slot stays unwritten: garbage of its file (as recovery would count it).
            f.dead.fetch_add(1, Ordering::Relaxed);
        }
        // ORDERING: Release; pairs with GC's Acquire load: a file with no pending writer has
        // every reserved entry complete.
        f.pending.fetch_sub(1, Ordering::Release);
        result
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use numakv_index::Engine;
    use numakv_pmem::{Pool, PoolConfig};

    use super::*;
    use crate::{NStore, NStoreOptions};

    /// A file with `MAX_PENDING` reservations in flight takes no more until one is written:
    /// recovery relies on at most that many unwritten slots before a written one.
    #[test]
    fn reservations_in_flight_are_bounded() {
        let pool = Pool::volatile(PoolConfig::new(NStore::engine_id(), 8 << 20)).unwrap();
        let opts = NStoreOptions {
            clusters: 1,
            log_file_size: 64 << 10, // 1637 slots: room beyond the bound
            gc_threads_per_node: 0,
            ..Default::default()
        };
        let s = NStore::create(pool, &opts).unwrap();
        let nlog = &s.inner.nlog;
        let held: Vec<(Arc<LogFile>, u32)> =
            (0..MAX_PENDING).map(|_| nlog.reserve(0, 0, Need::Put).unwrap()).collect();
        assert!(held.iter().all(|(f, _)| Arc::ptr_eq(f, &held[0].0)), "one file");
        assert!(u64::from(held[0].0.slots) > u64::from(MAX_PENDING) + 1);
        std::thread::scope(|t| {
            let (tx, rx) = std::sync::mpsc::channel();
            t.spawn(move || tx.send(nlog.reserve(0, 0, Need::Put).unwrap()).unwrap());
            // It must wait; if the bound were missing it would answer at once.
            assert!(
                rx.recv_timeout(Duration::from_millis(300)).is_err(),
                "a reservation beyond {MAX_PENDING} in flight was granted"
            );
            let (f, slot) = &held[0];
            nlog.write(f, *slot, Op::Ins, 1, 0, 7, 7).unwrap();
            let (g, next) = rx.recv_timeout(Duration::from_secs(60)).expect("still waiting");
            assert!(Arc::ptr_eq(f, &g));
            assert_eq!(next, MAX_PENDING);
            nlog.write(&g, next, Op::Ins, 2, 0, 8, 8).unwrap();
        });
        for (f, slot) in &held[1..] {
            nlog.write(f, *slot, Op::Ins, 3, 0, u64::from(*slot) + 100, 0).unwrap();
        }
    }
}
