//! Nlog (papers/nstore.txt §III-C–E): per node and per hash cluster an active log file in that
//! node's pool; every write appends one entry to the active file of its cluster on the writer's
//! own node — a single local PM write — under a per-(node, cluster) lock held only to reserve the
//! slot.
//!
//! - Files are page-heap extents (owner `OWNER_ENGINE`, aux `AUX_LOG`). The page heap's
//!   descriptor table is the persistent file table: recovery finds every file by listing the
//!   extents, and allocation/free are its failure-atomic commit points.
//! - A full active file is sealed (read-only from then on) and a new one is allocated at once.
//! - The DRAM file table maps (node, file id) → [`LogFile`]; an address resolves through it, so a
//!   `v_addr`/`h_addr` naming a reclaimed file is recognised as dangling (ids are never reused).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use numakv_index::{Error, Result};
use numakv_pmem::{PPtr, Pool};
use parking_lot::Mutex;

use crate::layout::{
    self, meta_word, Entry, FileHeader, FileInfo, NodeMeta, Op, VAddr, AUX_LOG, ENTRY_SIZE,
    ENTRY_WORDS, FILE_HEADER, ID_BATCH, MAX_FILE_ID, OWNER_ENGINE,
};

/// DRAM state of one Nlog file.
#[derive(Debug)]
pub(crate) struct LogFile {
    pub info: FileInfo,
    pub base: PPtr,
    /// Entry slots.
    pub slots: u32,
    /// Slots handed out (reserved); only grows, only while the file is active.
    pub tail: AtomicU32,
    /// Reserved slots whose entry is not yet durable. GC takes only sealed files with none.
    pub pending: AtomicU32,
    /// No more reservations (full, or not the active file of its (node, cluster)).
    pub sealed: AtomicBool,
    /// Entries known to be garbage: superseded, deleted, or delete entries themselves.
    pub dead: AtomicU32,
    /// Taken by the GC pass that reclaims the file, so that two passes (a GC thread and
    /// [`crate::NStore::collect_garbage`]) never reclaim — and free — the same file twice.
    pub claimed: AtomicBool,
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
        FILE_HEADER + u64::from(self.tail.load(Ordering::Acquire)) * ENTRY_SIZE
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
    pub file_pages: u32,
    /// Per node: file id → file.
    tables: Vec<scc::HashMap<u32, Arc<LogFile>>>,
    /// `node * clusters + cluster` → the active file; the mutex is the per-cluster write lock of
    /// §III-E, held only to reserve a slot (and to replace a full file).
    actives: Box<[Mutex<Option<Arc<LogFile>>>]>,
    ids: Vec<Mutex<IdAlloc>>,
    /// Per cluster: the next version (shared by the cluster's files on every node, so the
    /// entries of one key — always in one cluster — are totally ordered).
    versions: Box<[AtomicU64]>,
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
        Nlog {
            pool,
            nodes,
            clusters,
            file_pages,
            tables: (0..nodes).map(|_| scc::HashMap::new()).collect(),
            actives: (0..nodes * clusters as usize).map(|_| Mutex::new(None)).collect(),
            ids: metas
                .into_iter()
                .map(|(meta, hwm)| Mutex::new(IdAlloc { next: hwm.max(1), hwm, meta }))
                .collect(),
            versions: (0..clusters).map(|_| AtomicU64::new(1)).collect(),
            files_created: AtomicU64::new(0),
        }
    }

    /// Registers a file found at open (or created); `active` makes it its cluster's active file.
    pub(crate) fn install(&self, f: Arc<LogFile>, active: bool) {
        let (node, cluster) = (f.info.node, f.info.cluster);
        if active {
            *self.actives[node * self.clusters as usize + cluster as usize].lock() =
                Some(Arc::clone(&f));
        }
        let _ = self.tables[node].insert_sync(f.info.id, f);
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
        self.tables.get(node)?.read_sync(&id, |_, f| Arc::clone(f))
    }

    /// Every file of `node`.
    pub(crate) fn files_of(&self, node: usize) -> Vec<Arc<LogFile>> {
        let mut out = Vec::new();
        if let Some(t) = self.tables.get(node) {
            t.iter_sync(|_, f| {
                out.push(Arc::clone(f));
                true
            });
        }
        out.sort_by_key(|f| f.info.id);
        out
    }

    /// Every file.
    pub(crate) fn all_files(&self) -> Vec<Arc<LogFile>> {
        (0..self.nodes).flat_map(|n| self.files_of(n)).collect()
    }

    /// Removes `f` from the file table (GC, before its pages are freed).
    pub(crate) fn unlink(&self, f: &LogFile) {
        self.tables[f.info.node].remove_sync(&f.info.id);
    }

    /// The entry `va` names, or `None` when its file no longer exists (reclaimed by GC; the
    /// caller re-reads the index or stops walking a history chain). The caller keeps an epoch
    /// guard pinned while it uses the entry, so the pages are not freed under it.
    pub(crate) fn locate(&self, va: VAddr) -> Result<Option<&Entry>> {
        let Some(table) = self.tables.get(va.node()) else {
            return Err(layout::corrupted(format!("address {:#x} names node {}", va.0, va.node())));
        };
        let Some((base, slots)) = table.read_sync(&va.file(), |_, f| (f.base, f.slots)) else {
            return Ok(None);
        };
        if va.slot() >= slots || va.words() != ENTRY_WORDS {
            return Err(layout::corrupted(format!("address {:#x} is outside its file", va.0)));
        }
        let off = FILE_HEADER + u64::from(va.slot()) * ENTRY_SIZE;
        let p = base.add(off).ok_or_else(|| layout::corrupted("entry pointer overflows"))?;
        Ok(Some(self.pool.get::<Entry>(p)?))
    }

    /// The cluster of a key hash.
    pub(crate) fn cluster_of(&self, hash: u64) -> u32 {
        ((hash >> 32) % u64::from(self.clusters)) as u32
    }

    /// A fresh file id of `node`, raising the persistent high-water mark first when needed.
    fn next_id(&self, node: usize) -> Result<u32> {
        let mut a = self.ids[node].lock();
        if a.next > MAX_FILE_ID {
            return Err(Error::Unsupported(format!(
                "node {node} has used all {MAX_FILE_ID} file ids of this store"
            )));
        }
        if a.next >= a.hwm {
            let hwm = (a.next.saturating_add(ID_BATCH)).min(MAX_FILE_ID + 1);
            let m: &NodeMeta = self.pool.get(a.meta)?;
            m.id_hwm.store(u64::from(hwm), Ordering::Release);
            // PERSIST: no file (and so no entry stamp) uses an id the durable high-water mark
            // does not cover; after a crash, ids restart above it.
            self.pool.persist_obj(&m.id_hwm);
            a.hwm = hwm;
        }
        let id = a.next;
        a.next += 1;
        Ok(id)
    }

    /// Allocates, initialises and registers a new file for (`node`, `cluster`).
    fn new_file(&self, node: usize, cluster: u32) -> Result<Arc<LogFile>> {
        let id = self.next_id(node)?;
        let base =
            self.pool.alloc_pages(node, u64::from(self.file_pages), OWNER_ENGINE, AUX_LOG)?;
        let info = FileInfo {
            id,
            node,
            cluster,
            size: u64::from(self.file_pages) * self.pool.page_size(),
        };
        let h: &FileHeader = self.pool.get(base)?;
        info.write(h);
        // PERSIST: the header is durable before any entry of the file can be (entries are
        // written after this returns, by this or later threads, each persisted after it); a
        // crash before this point leaves an extent without a valid header, which recovery frees.
        self.pool.persist_obj(h);
        self.files_created.fetch_add(1, Ordering::Relaxed);
        let f = Arc::new(LogFile::new(info, base, 0, false));
        let _ = self.tables[node].insert_sync(id, Arc::clone(&f));
        Ok(f)
    }

    /// Reserves a slot in the active file of (`node`, `cluster`), replacing a full file. The
    /// caller must write the slot with [`Nlog::write`], which releases the reservation.
    pub(crate) fn reserve(&self, node: usize, cluster: u32) -> Result<(Arc<LogFile>, u32)> {
        let mut active = self.actives[node * self.clusters as usize + cluster as usize].lock();
        if let Some(f) = active.as_ref() {
            // ORDERING: Relaxed under the cluster lock, which orders all reservations of a file.
            let t = f.tail.load(Ordering::Relaxed);
            if t < f.slots {
                f.pending.fetch_add(1, Ordering::AcqRel);
                f.tail.store(t + 1, Ordering::Release);
                return Ok((Arc::clone(f), t));
            }
            // ORDERING: Release; GC's Acquire load of `sealed` then sees the final tail.
            f.sealed.store(true, Ordering::Release);
        }
        // On OutOfSpace nothing was reserved and the old (full, sealed) file stays.
        let f = self.new_file(node, cluster)?;
        f.pending.fetch_add(1, Ordering::AcqRel);
        f.tail.store(1, Ordering::Release);
        *active = Some(Arc::clone(&f));
        Ok((f, 0))
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
        // ORDERING: Release; pairs with GC's Acquire load: a file with no pending writer has
        // every reserved entry complete.
        f.pending.fetch_sub(1, Ordering::Release);
        result
    }
}
