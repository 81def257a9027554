//! NStore: the NUMA-aware key-value store of papers/nstore.txt for PM-DRAM hybrid memory.
//!
//! - **Nlog** ([`nlog`](crate::nlog)): per NUMA node and per hash cluster an active log file in
//!   that node's pool; every put, update and delete appends one entry to the active file of its
//!   cluster on the writer's own node — one local PM write, no remote PM write. Besides the
//!   u64 keys of the [`Index`] API, [`NStore::put_bytes`] / [`NStore::get_bytes`] store
//!   variable-length keys and values (the `k_len`/`v_len` entry format).
//! - **Volatile index** ([`vindex`]): key → packed entry address in DRAM, behind the
//!   [`VolatileIndex`] trait (scc's `TreeIndex` here; a learned index can be added).
//! - **RAF cache** ([`cache`](crate::cache)): a DRAM hash cache whose replacement weighs each
//!   access by the latency ratio of the reading node to the owning node (eq. 1–2), sampled every
//!   32 gets, switched off and on by three workload signals; plain LFU and no-cache variants.
//! - **GC** ([`gc`](crate::gc)): per-node threads walk `h_addr` history chains to mark history
//!   entries invalid, then reclaim files whose garbage share exceeds `gc_threshold` by rewriting
//!   their live entries into the local active file; an active file left idle with garbage above
//!   the threshold is sealed and reclaimed too.
//! - **Scans** ([`scan`](crate::scan)): addresses from the index, values read by per-node local
//!   read threads.
//! - **Recovery** ([`recovery`](crate::recovery), [`snapshot`](crate::snapshot)): a clean
//!   shutdown persists a snapshot of the index and a flag; after a crash, one scanning thread per
//!   group of clusters rebuilds the index keeping each key's highest version.
//!
//! Formats, the crash states and the GC protocol: docs/design.md, section "NStore".
//!
//! Pause and fail points (`numakv_pmem::failpoint`, compiled in only with its `failpoints`
//! feature, which this crate turns on in its dev-dependencies):
//!
//! - `nstore.get_bytes.located` (pause): `get_bytes` read the index and located the entry, and
//!   has not read it yet.
//! - `nstore.gc.rewritten` (fail): a GC reclaim just rewrote a live entry and pointed the index at
//!   the copy; failing stops the reclaim as if the next rewrite found no space.
//! - `nstore.new_file.allocated` (pause): a new log file's extent is allocated (durably) and its
//!   header is not written yet — the window in which a power failure leaves an extent whose
//!   header is whatever its pages held before.
//! - `nstore.gc.tail_read` (pause): a GC reclaim read the tail of the sealed file it reclaims
//!   and has not read its entries yet (nothing may be reserved in the file from here on).
//! - `nstore.scan.listed` (pause): a scan read its window of addresses from the index and has
//!   not read the values yet.
//! - `nstore.vindex.scan_min_read` (pause): a volatile-index scan read the smallest key and has
//!   not iterated yet (a smaller key inserted now must not be returned by a scan from above it).
//!
//! ```
//! use numakv_index::{Engine, Index};
//! use numakv_nstore::{NStore, NStoreOptions};
//! use numakv_pmem::{Pool, PoolConfig};
//!
//! let pool = Pool::volatile(PoolConfig::new(NStore::engine_id(), 32 << 20))?;
//! let opts = NStoreOptions { clusters: 4, log_file_size: 256 << 10, ..Default::default() };
//! let store = NStore::create(pool, &opts)?;
//! assert!(store.insert(7, 0)?);
//! store.upsert(7, 70)?;
//! assert_eq!(store.get(7)?, Some(70));
//! let mut out = Vec::new();
//! store.scan(1, 10, &mut out)?;
//! assert_eq!(out, vec![(7, 70)]);
//! assert!(store.remove(7)?);
//! store.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod cache;
mod check;
mod filetable;
mod gc;
pub mod layout;
mod nlog;
mod recovery;
mod scan;
mod snapshot;
pub mod vindex;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_utils::CachePadded;
use numakv_index::{
    check_key, Backlog, CheckReport, Engine, EngineStats, Error, Index, RecoveryReport, Result,
};
use numakv_pmem::alloc::epoch;
use numakv_pmem::{LatencyModel, Pool};
use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

pub use crate::cache::CacheMode;
use crate::cache::{Cache, Probe};
use crate::layout::{
    NodeMeta, Op, VAddr, AUX_META, ENGINE, MAX_CLUSTERS, MAX_NODES, MAX_SLOTS, META_MAGIC,
    OWNER_ENGINE, SLOT_FORMAT,
};
pub use crate::nlog::FIRST_FILE_BYTES;
use crate::nlog::{Need, Nlog};
use crate::scan::ScanPool;
pub use crate::vindex::{SccBytesIndex, SccIndex, VolatileBytesIndex, VolatileIndex};

/// Key-lock stripes (DRAM mutexes serialising the writers — and GC — of one key).
const KEY_STRIPES: usize = 4096;

/// Options of an NStore. `clusters` and `log_file_size` shape the format (recorded at create,
/// the stored values win at open); the rest apply per session.
#[derive(Clone, Debug)]
pub struct NStoreOptions {
    /// Hash clusters (default 256, §V-A). Each has an active file on every node it is written
    /// from.
    pub clusters: u32,
    /// Bytes an Nlog file grows to (default 8 MiB, §III-C), rounded up to the pool's page size.
    /// A (node, cluster)'s first file is smaller ([`FIRST_FILE_BYTES`]) and
    /// each next one doubles up to this size, so that the files of idle clusters hold little
    /// PM (docs/design.md, "NStore", Space).
    pub log_file_size: u64,
    /// GC reclaims a sealed file once more than this share of its entries is garbage
    /// (default 0.5, §V-F). In `0.0..1.0`.
    pub gc_threshold: f64,
    /// GC threads per node (default 1, §III-F); 0 turns GC off.
    pub gc_threads_per_node: usize,
    /// How often an idle GC thread looks for work.
    pub gc_interval: Duration,
    /// The DRAM cache in front of the log (default RAF).
    pub cache: CacheMode,
    /// DRAM bytes of the cache (default 64 MiB, §V-A).
    pub cache_bytes: u64,
    /// Gets between two cache samples (TF update or admission; default 32, §III-B).
    pub cache_sample: u32,
    /// Latency model the RAF weights come from; `None`: the process's installed model, or the
    /// paper's Optane figures when none is installed (an emulated machine has no real gap).
    pub raf_latency: Option<LatencyModel>,
    /// Recovery scanning threads (default 0: one per available core, at most one per cluster).
    pub recovery_threads: usize,
    /// Local read threads per node for scans (default 1); 0 reads from the calling thread.
    pub scan_threads_per_node: usize,
    /// Write a snapshot of the index at clean shutdown (default true, §III-G).
    pub snapshot_on_close: bool,
}

impl Default for NStoreOptions {
    fn default() -> Self {
        NStoreOptions {
            clusters: 256,
            log_file_size: 8 << 20,
            gc_threshold: 0.5,
            gc_threads_per_node: 1,
            gc_interval: Duration::from_millis(20),
            cache: CacheMode::Raf,
            cache_bytes: 64 << 20,
            cache_sample: 32,
            raf_latency: None,
            recovery_threads: 0,
            scan_threads_per_node: 1,
            snapshot_on_close: true,
        }
    }
}

impl NStoreOptions {
    /// Checks the session options.
    fn validate(&self) -> Result<()> {
        if !(0.0..1.0).contains(&self.gc_threshold) {
            return Err(Error::InvalidOptions(format!(
                "gc_threshold {} must be in 0.0..1.0",
                self.gc_threshold
            )));
        }
        if self.cache_sample == 0 {
            return Err(Error::InvalidOptions("cache_sample must be ≥ 1".into()));
        }
        Ok(())
    }

    /// Checks the format options against `pool`; returns the file size in pages.
    fn file_pages(&self, pool: &Pool) -> Result<u32> {
        if self.clusters == 0 || self.clusters > MAX_CLUSTERS {
            return Err(Error::InvalidOptions(format!(
                "clusters {} must be in 1..={MAX_CLUSTERS}",
                self.clusters
            )));
        }
        let pages = self.log_file_size.div_ceil(pool.page_size()).max(1);
        let slots = (pages * pool.page_size() - layout::FILE_HEADER) / layout::ENTRY_SIZE;
        if pages >= 1 << 24 || slots > MAX_SLOTS {
            return Err(Error::InvalidOptions(format!(
                "log_file_size {} is too large (at most {} entries per file)",
                self.log_file_size, MAX_SLOTS
            )));
        }
        Ok(pages as u32)
    }

    /// The smallest node-file capacity (bytes) a store with these options works in with pages
    /// of `page_size` bytes: the node meta page, every cluster's first file and the GC reserve
    /// (docs/design.md, "NStore", Space). `create` refuses a smaller pool.
    pub fn min_capacity_per_node(&self, page_size: u64) -> u64 {
        let page_size = page_size.max(4096);
        let file_pages = self.log_file_size.div_ceil(page_size).clamp(1, u64::from(u32::MAX));
        let pages = Self::min_pages(self.clusters, page_size, file_pages as u32);
        // The node file also holds the pool's header and page descriptors: grow until the heap
        // has the pages.
        let mut cap = pages * page_size;
        while numakv_pmem::layout::geometry(cap, page_size).is_none_or(|(n, _)| n < pages) {
            cap += page_size;
        }
        cap
    }

    /// Heap pages per node a store needs before any data: the meta page, one first file per
    /// cluster and the GC reserve.
    fn min_pages(clusters: u32, page_size: u64, file_pages: u32) -> u64 {
        1 + u64::from(clusters) * u64::from(nlog::first_pages(page_size, file_pages))
            + nlog::reserve_pages(file_pages)
    }
}

/// Event counters (DRAM, per session).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub gc_files: AtomicU64,
    pub gc_rewritten: AtomicU64,
    pub gc_invalidated: AtomicU64,
    pub gc_errors: AtomicU64,
    /// Reclaims in progress (for [`NStore::gc_quiesce`]).
    pub gc_busy: AtomicU64,
    pub read_retries: AtomicU64,
}

/// Shared by the handle and its background threads.
#[derive(Debug)]
pub(crate) struct Inner {
    pub pool: Arc<Pool>,
    pub nlog: Nlog,
    pub index: Box<dyn VolatileIndex>,
    /// The index of the variable-length keys (their own key space).
    pub bindex: Box<dyn VolatileBytesIndex>,
    /// Key-lock stripes, one cache line each (no false sharing between writers of different
    /// stripes).
    locks: Box<[CachePadded<Mutex<()>>]>,
    pub cache: Option<Cache>,
    pub opts: NStoreOptions,
    /// Set when the handle shuts down: background threads stop.
    pub stop: AtomicBool,
    pub wake: (Mutex<bool>, Condvar),
    pub counters: Counters,
    /// Held shared by every GC reclaim (claim to retire) and exclusively by `check()`: the
    /// check sees no file being reclaimed, so an index entry never names a file a reclaim
    /// retired between the check's scan and its lookup.
    pub gc_gate: RwLock<()>,
    /// Files GC retired and not yet freed, in retire order ([`gc::drain_retired`]).
    pub retired: Mutex<std::collections::VecDeque<gc::Retired>>,
}

/// splitmix64's finaliser: the key hash that picks the cluster (high half), the key-lock
/// stripe and the cache bucket (low half).
#[inline]
pub(crate) fn hash(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The hash of a variable-length key: FNV-1a over its bytes, then [`hash`]'s finaliser.
#[inline]
pub(crate) fn hash_bytes(key: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in key {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    hash(h)
}

/// The calling thread's node, as an index into this store's nodes.
#[inline]
pub(crate) fn my_node(nodes: usize) -> usize {
    numakv_numa::current_node() % nodes.max(1)
}

/// The error of an index entry that still names `va` after its file was found gone. GC points
/// the index at a moved entry's copy before it unlinks the old file (and a reader that finds the
/// file gone has synchronised with the unlink), and addresses are never reused, so a second
/// index read that still returns `va` means the index names a file that no longer exists — a
/// broken store, not a race: report it instead of retrying forever.
fn dangling(va: VAddr) -> Error {
    layout::corrupted(format!(
        "the index names {:#x}, whose file {} of node {} no longer exists",
        va.0,
        va.file(),
        va.node()
    ))
}

/// What a write does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteKind {
    Insert,
    Upsert,
    Update,
    Remove,
}

impl Inner {
    pub(crate) fn new(
        pool: Arc<Pool>,
        nlog: Nlog,
        index: Box<dyn VolatileIndex>,
        bindex: Box<dyn VolatileBytesIndex>,
        opts: NStoreOptions,
    ) -> Inner {
        let cache = Cache::new(&opts, pool.nodes());
        Inner {
            pool,
            nlog,
            index,
            bindex,
            locks: (0..KEY_STRIPES).map(|_| CachePadded::new(Mutex::new(()))).collect(),
            cache,
            opts,
            stop: AtomicBool::new(false),
            wake: (Mutex::new(false), Condvar::new()),
            counters: Counters::default(),
            gc_gate: RwLock::new(()),
            retired: Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// The lock of `key`'s stripe.
    pub(crate) fn lock_key(&self, key: u64) -> MutexGuard<'_, ()> {
        self.locks[(hash(key) as usize) % KEY_STRIPES].lock()
    }

    /// The lock of the stripe of the variable-length key with hash `h` ([`hash_bytes`]).
    pub(crate) fn lock_hash(&self, h: u64) -> MutexGuard<'_, ()> {
        self.locks[(h as usize) % KEY_STRIPES].lock()
    }

    /// Counts the entry at `va` as garbage in its file (a variable-length entry: its words).
    pub(crate) fn mark_dead(&self, va: VAddr) {
        if let Some(f) = self.nlog.file(va.node(), va.file()) {
            f.dead.fetch_add(f.weight(va), Ordering::Relaxed);
        }
    }

    /// Put (`Some(value)`) or delete (`None`) of a variable-length key: one entry appended to
    /// the local variable-length active file of the key's cluster, as for u64 keys.
    fn write_bytes(&self, key: &[u8], value: Option<&[u8]>) -> Result<bool> {
        let words =
            layout::var_words(key.len(), value.map_or(0, <[u8]>::len)).ok_or_else(|| {
                Error::InvalidOptions(format!(
                "a {}-byte key with a {}-byte value does not fit one entry (keys 1..={} bytes, \
                 values up to {} bytes, at most {} bytes together with the 32-byte head)",
                key.len(),
                value.map_or(0, <[u8]>::len),
                layout::MAX_VAR_LEN,
                layout::MAX_VAR_LEN,
                layout::MAX_ENTRY_WORDS * 8
            ))
            })?;
        let h = hash_bytes(key);
        let _key = self.lock_hash(h);
        let old = self.bindex.get(key);
        let op = match (value, old) {
            (None, None) => return Ok(false),
            (None, Some(_)) => Op::Del,
            (Some(_), Some(_)) => Op::Upd,
            (Some(_), None) => Op::Ins,
        };
        let node = my_node(self.nlog.nodes);
        let cluster = self.nlog.cluster_of(h);
        let need = if op == Op::Del { Need::Delete } else { Need::Put };
        let (file, off) = self.nlog.reserve_var(node, cluster, words, need)?;
        let version = self.nlog.next_version(cluster);
        let h_addr = old.map_or(0, |v| v.0);
        let va =
            self.nlog.write_var(&file, off, op, version, h_addr, key, value.unwrap_or_default())?;
        if op == Op::Del {
            self.bindex.remove(key);
            file.dead.fetch_add(words, Ordering::Relaxed);
        } else {
            self.bindex.set(key, va);
        }
        if let Some(o) = old {
            self.mark_dead(o);
        }
        Ok(true)
    }

    /// The value of variable-length key `key`.
    fn get_bytes(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let _guard = epoch::pin();
        loop {
            let Some(va) = self.bindex.get(key) else { return Ok(None) };
            let Some(e) = self.nlog.locate_var(va)? else {
                // Reclaimed by GC after the index was read: read the index again.
                self.counters.read_retries.fetch_add(1, Ordering::Relaxed);
                if self.bindex.get(key) == Some(va) {
                    return Err(dangling(va));
                }
                continue;
            };
            numakv_pmem::pause_point!("nstore.get_bytes.located");
            match e.read(va.file()) {
                Some((Op::Ins | Op::Upd, k, v)) if k == key => return Ok(Some(v)),
                // Not (any more) a valid entry of the key. After the index was read, the key
                // may have been written again and GC may have marked this entry `inv` as
                // history of the newer one: the entry moved, read the index again. Only if the
                // index still names this address is the entry really not the key's.
                other if self.bindex.get(key) == Some(va) => {
                    return Err(layout::corrupted(format!(
                        "index maps a {}-byte key to {:#x}, which holds {:?}",
                        key.len(),
                        va.0,
                        other.map(|o| (o.0, o.1.len()))
                    )))
                }
                _ => {
                    self.counters.read_retries.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Put, update, upsert, delete: §III-E "Write".
    fn write(&self, key: u64, value: u64, kind: WriteKind) -> Result<bool> {
        let h = hash(key);
        let _key = self.lock_key(key);
        let old = self.index.get(key);
        let op = match (kind, old) {
            (WriteKind::Insert, Some(_)) | (WriteKind::Update | WriteKind::Remove, None) => {
                return Ok(false)
            }
            (WriteKind::Remove, Some(_)) => Op::Del,
            (_, Some(_)) => Op::Upd,
            (_, None) => Op::Ins,
        };
        let node = my_node(self.nlog.nodes);
        let cluster = self.nlog.cluster_of(h);
        let need = if op == Op::Del { Need::Delete } else { Need::Put };
        let (file, slot) = self.nlog.reserve(node, cluster, need)?;
        let version = self.nlog.next_version(cluster);
        let h_addr = old.map_or(0, |v| v.0);
        let va = self.nlog.write(&file, slot, op, version, h_addr, key, value)?;
        if op == Op::Del {
            self.index.remove(key);
            // A delete entry is garbage from birth; GC keeps it only until its history is
            // invalidated (docs/design.md, "NStore", GC).
            file.dead.fetch_add(1, Ordering::Relaxed);
        } else {
            self.index.set(key, va);
        }
        if let Some(o) = old {
            self.mark_dead(o);
        }
        if let Some(c) = &self.cache {
            if old.is_some() {
                c.on_write(key, (op != Op::Del).then_some((value, node)));
            }
            c.tick_write();
        }
        Ok(true)
    }

    /// Reads the value of the entry at `va` for `key`; `None` when the file is gone (reclaimed
    /// after the address was read — the caller re-reads the index). Needs a pinned epoch guard.
    pub(crate) fn read_at(&self, key: u64, va: VAddr) -> Result<Option<u64>> {
        let Some(e) = self.nlog.locate(va)? else {
            self.counters.read_retries.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        };
        let k = e.key.load(Ordering::Acquire);
        if k != key {
            return Err(layout::corrupted(format!(
                "index maps key {key} to {:#x}, which holds key {k}",
                va.0
            )));
        }
        Ok(Some(e.value.load(Ordering::Acquire)))
    }

    /// Index + Nlog read, retrying when GC moved the entry meanwhile.
    pub(crate) fn lookup(&self, key: u64) -> Result<Option<(u64, VAddr)>> {
        loop {
            let Some(va) = self.index.get(key) else { return Ok(None) };
            if let Some(v) = self.read_at(key, va)? {
                return Ok(Some((v, va)));
            }
            if self.index.get(key) == Some(va) {
                return Err(dangling(va));
            }
        }
    }

    fn get(&self, key: u64) -> Result<Option<u64>> {
        let _guard = epoch::pin();
        let Some(cache) = &self.cache else {
            return Ok(self.lookup(key)?.map(|(v, _)| v));
        };
        let reader = my_node(self.nlog.nodes);
        match cache.probe(key, reader) {
            Probe::Hit(v) => Ok(Some(v)),
            Probe::Miss { epoch, admit } => {
                let found = self.lookup(key)?;
                if let (Some((v, va)), true) = (found, admit) {
                    cache.admit(key, v, va.node(), reader, epoch);
                }
                Ok(found.map(|(v, _)| v))
            }
            Probe::Off => Ok(self.lookup(key)?.map(|(v, _)| v)),
        }
    }

    /// Wakes the background threads (shutdown).
    pub(crate) fn wake_all(&self) {
        let mut w = self.wake.0.lock();
        *w = true;
        self.wake.1.notify_all();
    }
}

/// An NStore in a pool; see the [crate docs](crate).
#[derive(Debug)]
pub struct NStore {
    inner: Arc<Inner>,
    scan: Option<ScanPool>,
    workers: Vec<JoinHandle<()>>,
}

impl NStore {
    /// Builds the handle and starts the GC and scan threads.
    pub(crate) fn start(inner: Inner) -> NStore {
        let inner = Arc::new(inner);
        let mut workers = Vec::new();
        let per_node = inner.opts.gc_threads_per_node;
        for node in 0..inner.nlog.nodes {
            for i in 0..per_node {
                let inner = Arc::clone(&inner);
                let spawned = std::thread::Builder::new()
                    .name(format!("nstore-gc-{node}.{i}"))
                    .spawn(move || gc::run(&inner, node, i, per_node));
                // A GC thread that cannot be spawned leaves garbage uncollected, nothing worse.
                if let Ok(h) = spawned {
                    workers.push(h);
                }
            }
        }
        let scan = ScanPool::start(&inner);
        NStore { inner, scan, workers }
    }

    /// Stops the background threads (idempotent).
    fn shutdown(&mut self) {
        // ORDERING: Release; the threads' Acquire loads see it and exit.
        self.inner.stop.store(true, Ordering::Release);
        self.inner.wake_all();
        if let Some(s) = self.scan.take() {
            s.stop();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }

    /// Runs one GC pass over every node's files now (from the calling thread), as the GC threads
    /// do in the background; returns the files reclaimed. For tests and benchmarks.
    pub fn collect_garbage(&self) -> Result<u64> {
        let mut n = 0;
        for node in 0..self.inner.nlog.nodes {
            let prev = numakv_numa::current_node();
            numakv_numa::set_current_node(node);
            let r = gc::collect(&self.inner, node, 0, 1);
            numakv_numa::set_current_node(prev);
            n += r?;
        }
        Ok(n)
    }

    /// Drives GC until it has settled: runs passes from the calling thread (beside the GC
    /// threads; a file is reclaimed by one pass only) until a pass reclaims nothing, no reclaim
    /// is in progress and no file is eligible any more, then runs the deferred frees. Returns
    /// whether it settled within `timeout`. For benchmarks that measure space after GC (Fig. 15).
    pub fn gc_quiesce(&self, timeout: Duration) -> Result<bool> {
        let t0 = std::time::Instant::now();
        loop {
            let n = match self.collect_garbage() {
                Ok(n) => n,
                // No room for a reclaim's rewrites (yet): the files retired before it are freed
                // only after their grace period, which other threads' pins may delay. Not an
                // error of the quiesce: it waits for those frees like for everything else.
                Err(e) if e.is_out_of_space() => 0,
                Err(e) => return Err(e),
            };
            let inner = &self.inner;
            epoch::pin().flush();
            gc::drain_retired(inner);
            // ORDERING: Acquire; pairs with the AcqRel decrement after a reclaim.
            let idle = inner.counters.gc_busy.load(Ordering::Acquire) == 0
                && !inner.nlog.all_files().iter().any(|f| gc::eligible(inner, f));
            if n == 0 && idle && inner.retired.lock().is_empty() {
                return Ok(true);
            }
            if t0.elapsed() >= timeout {
                return Ok(false);
            }
            if n == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Stores `value` under the variable-length key `key` (upsert), in the entry format with
    /// `k_len`/`v_len` (docs/design.md, "NStore", variable-length entries). Byte keys are a key
    /// space of their own, beside the [`Index`] API's u64 keys, and are not cached. Keys are 1 to
    /// 4095 bytes, values up to 4095 bytes, and key + value at most 2008 bytes (one entry of at
    /// most 255 words, the v_addr length field).
    pub fn put_bytes(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.inner.write_bytes(key, Some(value)).map(|_| ())
    }

    /// The value stored under the variable-length key `key`.
    pub fn get_bytes(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.get_bytes(key)
    }

    /// Deletes the variable-length key `key`; whether it was present.
    pub fn delete_bytes(&self, key: &[u8]) -> Result<bool> {
        self.inner.write_bytes(key, None)
    }

    /// Variable-length keys present.
    pub fn bytes_len(&self) -> usize {
        self.inner.bindex.len()
    }

    /// Whether the cache currently serves gets (the three signals of §III-B switch it).
    pub fn cache_enabled(&self) -> bool {
        self.inner.cache.as_ref().is_some_and(Cache::enabled)
    }

    /// The options of this session (format options as stored).
    pub fn options(&self) -> &NStoreOptions {
        &self.inner.opts
    }
}

impl Drop for NStore {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Index for NStore {
    fn name(&self) -> &'static str {
        ENGINE
    }

    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        check_key(key)?;
        self.inner.write(key, value, WriteKind::Insert)
    }

    fn upsert(&self, key: u64, value: u64) -> Result<()> {
        check_key(key)?;
        self.inner.write(key, value, WriteKind::Upsert).map(|_| ())
    }

    fn update(&self, key: u64, value: u64) -> Result<bool> {
        check_key(key)?;
        self.inner.write(key, value, WriteKind::Update)
    }

    fn get(&self, key: u64) -> Result<Option<u64>> {
        check_key(key)?;
        self.inner.get(key)
    }

    fn remove(&self, key: u64) -> Result<bool> {
        check_key(key)?;
        self.inner.write(key, 0, WriteKind::Remove)
    }

    fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, u64)>) -> Result<usize> {
        if max == 0 || start == u64::MAX {
            return Ok(0);
        }
        scan::scan(&self.inner, self.scan.as_ref(), start.max(1), max, out)
    }

    fn stats(&self) -> EngineStats {
        let inner = &self.inner;
        let pool = &inner.pool;
        let page = pool.page_size();
        // PM in use (papers/nstore.txt §V-F's space figures): per node its meta page and, per
        // log file in the file table, the header and the entries written so far. The unwritten
        // tail of an active file is reserved but untouched (the node file is sparse), so it is
        // not counted; it is reported as `pm_reserved_bytes`. (docs/design.md, "NStore", Space.)
        let mut pm_bytes_per_node = vec![page; pool.nodes()];
        let mut reserved = page * pool.nodes() as u64;
        for f in inner.nlog.all_files() {
            if let Some(b) = pm_bytes_per_node.get_mut(f.info.node) {
                *b += f.used_bytes();
            }
            reserved += f.info.size;
        }
        let c = &inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut counters = vec![
            ("pm_reserved_bytes", reserved),
            ("files_created", get(&inner.nlog.files_created)),
            ("gc_files_reclaimed", get(&c.gc_files)),
            ("gc_entries_rewritten", get(&c.gc_rewritten)),
            ("gc_history_invalidated", get(&c.gc_invalidated)),
            ("gc_errors", get(&c.gc_errors)),
            ("read_retries", get(&c.read_retries)),
        ];
        let mut dram = inner.index.dram_bytes() + inner.bindex.dram_bytes();
        if let Some(cache) = &inner.cache {
            counters.extend(cache.counters());
            dram += cache.dram_bytes();
        }
        EngineStats { pm_bytes_per_node, dram_bytes: dram, counters }
    }

    fn check(&self) -> Result<CheckReport> {
        check::check(&self.inner)
    }

    /// With background GC on, settles it ([`NStore::gc_quiesce`]: passes run on the calling
    /// thread too, each on the node of the file it reclaims); a pass that fails (e.g. no space
    /// left to rewrite into) leaves its files pending.
    fn quiesce(&self, limit: Duration) -> Result<Vec<Backlog>> {
        if self.inner.opts.gc_threads_per_node == 0 || matches!(self.gc_quiesce(limit), Ok(true)) {
            return Ok(Vec::new());
        }
        let inner = &self.inner;
        let eligible = inner.nlog.all_files().iter().filter(|f| gc::eligible(inner, f)).count();
        Ok(vec![Backlog { what: "log files eligible for GC", count: eligible as u64 }])
    }
}

impl Engine for NStore {
    type Options = NStoreOptions;

    const NAME: &'static str = "nstore";
    const FORMAT_VERSION: u32 = 1;

    fn create(pool: Arc<Pool>, opts: &NStoreOptions) -> Result<NStore> {
        opts.validate()?;
        let file_pages = opts.file_pages(&pool)?;
        numakv_index::check_pool_engine(&pool, Self::NAME)?;
        if pool.nodes() > MAX_NODES {
            return Err(Error::InvalidOptions(format!(
                "nstore addresses at most {MAX_NODES} nodes, the pool has {}",
                pool.nodes()
            )));
        }
        let format = pool.root(SLOT_FORMAT)?;
        if format.load(Ordering::Acquire) != 0 {
            return Err(Error::InvalidOptions("pool already holds an nstore".into()));
        }
        let need = NStoreOptions::min_pages(opts.clusters, pool.page_size(), file_pages);
        let (_, heap_pages) = pool.heap_usage(0)?;
        if heap_pages < need {
            return Err(Error::InvalidOptions(format!(
                "a capacity of {} bytes per node is too small for nstore with {} clusters and \
                 log_file_size {}: it needs at least {} bytes per node (the first file of \
                 every cluster and the GC reserve); use a larger capacity, fewer clusters or a \
                 smaller log_file_size",
                pool.capacity(),
                opts.clusters,
                u64::from(file_pages) * pool.page_size(),
                opts.min_capacity_per_node(pool.page_size())
            )));
        }
        let mut metas = Vec::new();
        for node in 0..pool.nodes() {
            let p = pool.alloc_pages(node, 1, OWNER_ENGINE, AUX_META)?;
            let m: &NodeMeta = pool.get(p)?;
            m.node.store(node as u64, Ordering::Relaxed);
            m.id_hwm.store(1, Ordering::Relaxed);
            m.magic.store(META_MAGIC, Ordering::Relaxed);
            // PERSIST: the meta page is complete before the format word makes the store exist.
            pool.persist_obj(m);
            metas.push((p, 1));
        }
        format.store(layout::format_word(opts.clusters, file_pages), Ordering::Release);
        // PERSIST: the format word is the commit point of create; a crash before it leaves a
        // store that open refuses as never initialised.
        pool.persist_obj(format);
        let nlog = Nlog::new(Arc::clone(&pool), opts.clusters, file_pages, metas);
        let inner = Inner::new(
            pool,
            nlog,
            Box::new(SccIndex::new()),
            Box::new(SccBytesIndex::new()),
            opts.clone(),
        );
        Ok(NStore::start(inner))
    }

    fn open(pool: Arc<Pool>, opts: &NStoreOptions) -> Result<(NStore, RecoveryReport)> {
        opts.validate()?;
        recovery::open(pool, opts)
    }

    fn close(mut self) -> Result<()> {
        self.shutdown();
        // The background threads are stopped and the handle is consumed, so no reader can hold
        // an address of a retired file: free them all now, in order, so that the file table
        // the snapshot lists is exactly the files in PM (else the next open would reject the
        // snapshot and scan the log).
        gc::free_all_retired(&self.inner)?;
        if self.inner.opts.snapshot_on_close {
            snapshot::write(&self.inner)?;
        }
        self.inner.pool.close()?;
        Ok(())
    }

    fn pool(&self) -> &Arc<Pool> {
        &self.inner.pool
    }
}
