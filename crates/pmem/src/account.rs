//! Access accounting and latency emulation.
//!
//! The papers measure "PM lines read/written per operation" and "remote PM accesses" with hardware
//! counters on Optane machines. We have neither, so every PM access goes through an accessor type
//! ([`crate::access`]) that reports the address range here. Per thread and per operation we keep
//! the set of distinct cache lines read and written; at the operation boundary ([`op_end`]) each
//! distinct line counts once, as *local* when the line's node equals the thread's node
//! ([`numakv_numa::current_node`]) and *remote* otherwise. Flushes and fences are counted as issued.
//!
//! # Cost, and the `accounting` cargo feature
//!
//! With the `accounting` feature (on by default) accounting is a runtime switch
//! ([`set_enabled`]); when both it and latency emulation are off, each access pays one relaxed load
//! of a global flag byte and a predicted branch. That is within a few percent of raw atomics when
//! the access itself waits on memory (pointer chasing), but a large share of a loop that does
//! nothing but stream L1/L2-resident loads (see the `accounting` criterion bench and
//! `docs/design.md` §6 for the figures). Building without the feature
//! (`default-features = false`) removes the hooks: the accessors compile to plain atomics,
//! [`COMPILED`] is `false`, [`set_enabled`] and [`set_latency`] are no-ops (so [`enabled`] stays
//! `false` and [`latency`] stays [`LatencyModel::NONE`]), and every counter stays zero.
//!
//! # Cache models
//!
//! Lines touched are what a structure asks of memory; hardware counters see what leaves a
//! socket's cache. [`start_cache_models`] additionally replays every access and flush through
//! [`crate::cachemodel`] models of per-node caches until [`stop_cache_models`] returns their
//! counts (untimed runs only: the models sit behind one global lock).
//!
//! Latency emulation adds a busy-wait on the *first* touch of a line within an operation, with the
//! per-access figures of a [`LatencyModel`] (e.g. [`LatencyModel::OPTANE`]).
//!
//! # Attributing lines to structural modifications
//!
//! An engine marks the code of a structural modification operation (split, copy, merge, and the
//! allocator work it does) with an [`smo_scope`] guard. Lines read or written only while a
//! scope is open on the thread, and flushes issued while one is open, are *also* counted in
//! [`AccessStats::smo_reads`], [`AccessStats::smo_writes`] and [`AccessStats::smo_flushes`]
//! (subsets of the totals): papers that count "PM line writes of an individual insert"
//! (papers/nbtree.txt Table I) count the leaf access, not the amortised split, and a report can
//! then show both, measured. A line the operation also touched (the same way) outside any scope
//! is the operation's own, not the SMO's, so `total − smo` is exactly what the operation
//! touched outside its SMOs.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::cachemodel::{Access, CacheConfig, CacheModel, CacheStats};
use crate::persist::{lines, LINE};

const FLAG_ACCOUNT: u8 = 1;
const FLAG_LATENCY: u8 = 2;
/// Chaos schedules ([`crate::chaos`]): every access is a possible preemption. Decided in the
/// cold path, so the fast path stays one load and one branch.
const FLAG_CHAOS: u8 = 4;
/// A write watch ([`crate::steps`]) counts PM stores (and may crash the pool at the n-th).
const FLAG_STEPS: u8 = 8;
/// The flags that make [`ThreadAcct::touch`] record lines.
const FLAG_TOUCH: u8 = FLAG_ACCOUNT | FLAG_LATENCY;

/// Whether the accounting hooks are compiled in (the `accounting` cargo feature, on by default).
/// When `false`, [`set_enabled`] and [`set_latency`] do nothing and no access is ever counted or
/// delayed.
pub const COMPILED: bool = cfg!(feature = "accounting");

/// Bit set of what the hot path must do: `FLAG_ACCOUNT | FLAG_LATENCY | FLAG_CHAOS |
/// FLAG_STEPS`. Zero means "nothing".
static FLAGS: AtomicU8 = AtomicU8::new(0);

/// Turns accounting on or off for the whole process (all pools, all threads).
///
/// A no-op when the `accounting` feature is off ([`COMPILED`] is `false`): [`enabled`] then stays
/// `false`.
pub fn set_enabled(on: bool) {
    if !COMPILED {
        return;
    }
    // ORDERING: Relaxed; the flag only decides whether statistics are gathered, it guards no data.
    if on {
        FLAGS.fetch_or(FLAG_ACCOUNT, Ordering::Relaxed);
    } else {
        FLAGS.fetch_and(!FLAG_ACCOUNT, Ordering::Relaxed);
    }
}

/// Sets or clears `bit` of [`FLAGS`].
fn set_flag(bit: u8, on: bool) {
    // ORDERING: Relaxed, as in `set_enabled`.
    if on {
        FLAGS.fetch_or(bit, Ordering::Relaxed);
    } else {
        FLAGS.fetch_and(!bit, Ordering::Relaxed);
    }
}

/// Chaos on the accessors, flushes and fences ([`crate::chaos::enable`]). Without the
/// `accounting` feature the accessors have no hook; flushes and fences still take chaos steps.
pub(crate) fn set_chaos(on: bool) {
    CHAOS_ON.store(on, Ordering::Relaxed);
    if COMPILED {
        set_flag(FLAG_CHAOS, on);
    }
}

/// Whether chaos is on, for the persistence hooks (which run even without `accounting`).
static CHAOS_ON: AtomicBool = AtomicBool::new(false);

/// Write counting for [`crate::steps`].
pub(crate) fn set_steps(on: bool) {
    set_flag(FLAG_STEPS, on);
}

/// A chaos step for a flush or fence of [`crate::Pool`]: a relaxed load and a branch.
#[inline]
pub(crate) fn persist_step() {
    // ORDERING: Relaxed; chaos is a test knob, a late view of it skips a few decisions.
    if CHAOS_ON.load(Ordering::Relaxed) {
        crate::chaos::step(crate::chaos::Site::Persist);
    }
}

/// Whether accounting is on.
pub fn enabled() -> bool {
    FLAGS.load(Ordering::Relaxed) & FLAG_ACCOUNT != 0
}

// ---------------------------------------------------------------------------------------------
// Latency model
// ---------------------------------------------------------------------------------------------

/// Extra nanoseconds charged to the first read or write of a PM line within an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LatencyModel {
    /// Read of a line on the thread's own node.
    pub read_local_ns: u32,
    /// Read of a line on another node.
    pub read_remote_ns: u32,
    /// Write of a line on the thread's own node.
    pub write_local_ns: u32,
    /// Write of a line on another node.
    pub write_remote_ns: u32,
}

impl LatencyModel {
    /// No emulated latency (the default).
    pub const NONE: LatencyModel =
        LatencyModel { read_local_ns: 0, read_remote_ns: 0, write_local_ns: 0, write_remote_ns: 0 };
    /// Optane DC PMM per-access latencies measured in papers/nstore.txt §II-A1:
    /// local/remote read 113/181 ns, local/remote write 311/497 ns.
    pub const OPTANE: LatencyModel = LatencyModel {
        read_local_ns: 113,
        read_remote_ns: 181,
        write_local_ns: 311,
        write_remote_ns: 497,
    };

    /// True when every figure is zero.
    pub fn is_none(&self) -> bool {
        *self == Self::NONE
    }

    /// Ratio of remote to local read latency (NStore's RAF weight, papers/nstore.txt eq. 1);
    /// 1.0 for the `none` model.
    pub fn remote_read_ratio(&self) -> f64 {
        if self.read_local_ns == 0 {
            1.0
        } else {
            f64::from(self.read_remote_ns) / f64::from(self.read_local_ns)
        }
    }
}

impl FromStr for LatencyModel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Ok(Self::NONE),
            "optane" => Ok(Self::OPTANE),
            other => Err(format!("unknown latency model {other:?} (choices: none, optane)")),
        }
    }
}

impl fmt::Display for LatencyModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Self::NONE {
            f.write_str("none")
        } else if *self == Self::OPTANE {
            f.write_str("optane")
        } else {
            write!(
                f,
                "read {}/{} ns, write {}/{} ns (local/remote)",
                self.read_local_ns, self.read_remote_ns, self.write_local_ns, self.write_remote_ns
            )
        }
    }
}

static LATENCY: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Installs a latency model for the whole process; [`LatencyModel::NONE`] turns emulation off.
///
/// A no-op when the `accounting` feature is off ([`COMPILED`] is `false`): emulation rides on the
/// accounting hooks, so [`latency`] then stays [`LatencyModel::NONE`].
pub fn set_latency(model: LatencyModel) {
    if !COMPILED {
        return;
    }
    let reads = u64::from(model.read_local_ns) | (u64::from(model.read_remote_ns) << 32);
    let writes = u64::from(model.write_local_ns) | (u64::from(model.write_remote_ns) << 32);
    // ORDERING: Relaxed; a thread that sees the flag before the figures charges a stale
    // latency for a few accesses, which is harmless for an emulation knob.
    LATENCY[0].store(reads, Ordering::Relaxed);
    LATENCY[1].store(writes, Ordering::Relaxed);
    if model.is_none() {
        FLAGS.fetch_and(!FLAG_LATENCY, Ordering::Relaxed);
    } else {
        FLAGS.fetch_or(FLAG_LATENCY, Ordering::Relaxed);
    }
}

/// The installed latency model.
pub fn latency() -> LatencyModel {
    let r = LATENCY[0].load(Ordering::Relaxed);
    let w = LATENCY[1].load(Ordering::Relaxed);
    LatencyModel {
        read_local_ns: r as u32,
        read_remote_ns: (r >> 32) as u32,
        write_local_ns: w as u32,
        write_remote_ns: (w >> 32) as u32,
    }
}

thread_local! {
    /// Nanoseconds of emulated latency charged to this thread so far.
    static EMULATED_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Nanoseconds of emulated PM latency charged to the calling thread so far (what the latency
/// model asked for, independent of how long the busy-waits actually took on a loaded machine).
pub fn thread_emulated_ns() -> u64 {
    EMULATED_NS.with(|c| c.get())
}

fn spin_for(ns: u64) {
    if ns == 0 {
        return;
    }
    EMULATED_NS.with(|c| c.set(c.get() + ns));
    let until = Instant::now() + Duration::from_nanos(ns);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

// ---------------------------------------------------------------------------------------------
// Address → node map of the mapped pools
// ---------------------------------------------------------------------------------------------

/// One mapped node file: `[start, end)` belongs to `node`.
#[derive(Clone, Copy, Debug)]
struct Region {
    start: usize,
    end: usize,
    node: usize,
}

static REGIONS: Mutex<Vec<(u64, Region)>> = Mutex::new(Vec::new());
/// Bumped whenever `REGIONS` changes, so per-thread caches of the last region found notice.
static REGION_GEN: AtomicUsize = AtomicUsize::new(1);
static NEXT_REGION_ID: AtomicU64 = AtomicU64::new(1);

/// Registration of a mapped range; dropping it unregisters the range.
#[derive(Debug)]
pub(crate) struct RegionGuard(u64);

pub(crate) fn register_region(start: usize, len: usize, node: usize) -> RegionGuard {
    let id = NEXT_REGION_ID.fetch_add(1, Ordering::Relaxed);
    REGIONS.lock().push((id, Region { start, end: start + len, node }));
    // ORDERING: Release; pairs with the Acquire in `node_of`, so a thread that sees the new
    // generation also sees the region list it belongs to (taken under the mutex anyway).
    REGION_GEN.fetch_add(1, Ordering::Release);
    RegionGuard(id)
}

/// The ranges of every open pool's working memory, as `(start, len)`.
pub(crate) fn registered_regions() -> Vec<(usize, usize)> {
    REGIONS.lock().iter().map(|(_, r)| (r.start, r.end - r.start)).collect()
}

impl Drop for RegionGuard {
    fn drop(&mut self) {
        REGIONS.lock().retain(|(id, _)| *id != self.0);
        REGION_GEN.fetch_add(1, Ordering::Release);
    }
}

/// The node whose pool contains `addr`, or `None` for memory outside every pool.
fn node_of(addr: usize, cache: &mut RegionCache) -> Option<usize> {
    // ORDERING: Acquire; pairs with the Release bumps in `register_region` / `RegionGuard::drop`
    // (the copy below is taken under the mutex anyway).
    let gen = REGION_GEN.load(Ordering::Acquire);
    if cache.gen != gen {
        // Every region, not just the last one found: an operation alternating between two
        // nodes' files (a replica on each node, a pool per node) must not take the global
        // mutex on every other line — that made accounting threads queue on it.
        cache.regions.clear();
        cache.regions.extend(REGIONS.lock().iter().map(|(_, r)| *r));
        cache.gen = gen;
        cache.last = 0;
    }
    if let Some(r) = cache.regions.get(cache.last) {
        if r.start <= addr && addr < r.end {
            return Some(r.node);
        }
    }
    let i = cache.regions.iter().position(|r| r.start <= addr && addr < r.end)?;
    cache.last = i;
    Some(cache.regions[i].node)
}

/// A thread's copy of [`REGIONS`] as of generation `gen`, with the index of the region found last.
#[derive(Debug, Default)]
struct RegionCache {
    gen: usize,
    regions: Vec<Region>,
    last: usize,
}

// ---------------------------------------------------------------------------------------------
// Per-thread statistics
// ---------------------------------------------------------------------------------------------

/// Totals of accounted PM activity. All figures are counts; lines are distinct per operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessStats {
    /// Operations closed with [`op_end`].
    pub ops: u64,
    /// Distinct lines read on the thread's own node.
    pub reads_local: u64,
    /// Distinct lines read on another node.
    pub reads_remote: u64,
    /// Distinct lines written on the thread's own node.
    pub writes_local: u64,
    /// Distinct lines written on another node.
    pub writes_remote: u64,
    /// Cache-line flushes issued.
    pub flushes: u64,
    /// Fences issued.
    pub fences: u64,
    /// Of the distinct lines read, those read only inside an [`smo_scope`] (local and remote).
    pub smo_reads: u64,
    /// Of the distinct lines written, those written only inside an [`smo_scope`].
    pub smo_writes: u64,
    /// Of the flushes, those issued inside an [`smo_scope`].
    pub smo_flushes: u64,
}

impl AccessStats {
    /// All line reads.
    pub fn reads(&self) -> u64 {
        self.reads_local + self.reads_remote
    }
    /// All line writes.
    pub fn writes(&self) -> u64 {
        self.writes_local + self.writes_remote
    }
    /// Share of line accesses (reads and writes) that were remote, 0 when there were none.
    pub fn remote_share(&self) -> f64 {
        let all = self.reads() + self.writes();
        if all == 0 {
            0.0
        } else {
            (self.reads_remote + self.writes_remote) as f64 / all as f64
        }
    }
    /// `self - earlier`, field by field (saturating), for "what happened between two snapshots".
    pub fn since(&self, earlier: &AccessStats) -> AccessStats {
        AccessStats {
            ops: self.ops.saturating_sub(earlier.ops),
            reads_local: self.reads_local.saturating_sub(earlier.reads_local),
            reads_remote: self.reads_remote.saturating_sub(earlier.reads_remote),
            writes_local: self.writes_local.saturating_sub(earlier.writes_local),
            writes_remote: self.writes_remote.saturating_sub(earlier.writes_remote),
            flushes: self.flushes.saturating_sub(earlier.flushes),
            fences: self.fences.saturating_sub(earlier.fences),
            smo_reads: self.smo_reads.saturating_sub(earlier.smo_reads),
            smo_writes: self.smo_writes.saturating_sub(earlier.smo_writes),
            smo_flushes: self.smo_flushes.saturating_sub(earlier.smo_flushes),
        }
    }
    /// Adds `o` field by field (aggregating threads or runs).
    pub fn add(&mut self, o: &AccessStats) {
        self.ops += o.ops;
        self.reads_local += o.reads_local;
        self.reads_remote += o.reads_remote;
        self.writes_local += o.writes_local;
        self.writes_remote += o.writes_remote;
        self.flushes += o.flushes;
        self.fences += o.fences;
        self.smo_reads += o.smo_reads;
        self.smo_writes += o.smo_writes;
        self.smo_flushes += o.smo_flushes;
    }
}

/// A thread's published totals: written only by the owning thread, read by aggregators.
#[derive(Debug, Default)]
struct SharedCounters([AtomicU64; 10]);

impl SharedCounters {
    fn load(&self) -> AccessStats {
        // ORDERING: Relaxed; each counter is monotonic and independently meaningful, and
        // aggregation is a statistic, not a synchronisation point.
        let v: [u64; 10] = std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed));
        AccessStats {
            ops: v[0],
            reads_local: v[1],
            reads_remote: v[2],
            writes_local: v[3],
            writes_remote: v[4],
            flushes: v[5],
            fences: v[6],
            smo_reads: v[7],
            smo_writes: v[8],
            smo_flushes: v[9],
        }
    }
    fn add(&self, s: &AccessStats) {
        let v = [
            s.ops,
            s.reads_local,
            s.reads_remote,
            s.writes_local,
            s.writes_remote,
            s.flushes,
            s.fences,
            s.smo_reads,
            s.smo_writes,
            s.smo_flushes,
        ];
        for (c, x) in self.0.iter().zip(v) {
            if x != 0 {
                c.fetch_add(x, Ordering::Relaxed);
            }
        }
    }
}

/// Counters of threads that have exited, plus every live thread's counters.
static ALL_THREADS: Mutex<Vec<Arc<SharedCounters>>> = Mutex::new(Vec::new());

const TOUCH_READ: u8 = 1;
const TOUCH_WRITE: u8 = 2;
/// `TOUCH_* << SMO_SHIFT`: the same access, inside an [`smo_scope`].
const SMO_SHIFT: u8 = 2;
/// `TOUCH_* << OWN_SHIFT`: the same access, outside every [`smo_scope`].
const OWN_SHIFT: u8 = 4;
/// An operation touching more distinct lines than this is closed early (its lines counted, no op
/// counted), bounding the memory of the de-duplication below.
const MAX_LINES_PER_OP: usize = 4096;
/// Up to this many distinct lines an operation's lines are searched linearly (an index
/// operation touches a handful); beyond it a hash index keeps each access O(1), so a thread
/// that touches thousands of lines in one go (a background migration, rebuild or GC pass) does
/// not pay a quadratic search, which made such threads spend most of their time in accounting.
const LINEAR_SEARCH_LINES: usize = 32;

/// Hash of a line address for `ThreadAcct::by_line`: the line number times a 64-bit odd constant
/// (Fibonacci hashing), the high half folded onto the low half, which the table indexes by. The
/// default SipHash was a visible share of an SMO's accounting cost, and the keys are our own
/// addresses, not chosen by an adversary.
#[derive(Default)]
pub(crate) struct LineHasher(u64);

impl Hasher for LineHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, line: usize) {
        let h = ((line / LINE) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

struct ThreadAcct {
    /// Lines touched by the current operation: (line address, node or usize::MAX, TOUCH_* bits).
    touched: Vec<(usize, usize, u8)>,
    /// Line address → index in `touched`, kept only while `touched` holds more than
    /// [`LINEAR_SEARCH_LINES`] lines (empty otherwise).
    by_line: HashMap<usize, usize, BuildHasherDefault<LineHasher>>,
    /// Index in `touched` of the line touched last (may be stale: checked before use).
    last: usize,
    flushes: u64,
    fences: u64,
    smo_flushes: u64,
    cache: RegionCache,
    shared: Arc<SharedCounters>,
}

impl ThreadAcct {
    fn new() -> ThreadAcct {
        let shared = Arc::new(SharedCounters::default());
        ALL_THREADS.lock().push(Arc::clone(&shared));
        ThreadAcct {
            touched: Vec::with_capacity(64),
            by_line: HashMap::default(),
            last: 0,
            flushes: 0,
            fences: 0,
            smo_flushes: 0,
            cache: RegionCache::default(),
            shared,
        }
    }

    fn touch(&mut self, addr: usize, len: usize, kind: u8, flags: u8) {
        let smo =
            if SMO_DEPTH.with(|d| d.get()) > 0 { kind << SMO_SHIFT } else { kind << OWN_SHIFT };
        for line in lines(addr, len) {
            // Consecutive accesses mostly stay in one line (a node's keys read one by one), so
            // the line touched last is checked first, then the others from the most recent: the
            // cost of accounting is what the benchmark's throughput pays for it.
            let found = match self.touched.get(self.last) {
                Some(e) if e.0 == line => Some(self.last),
                _ if self.touched.len() <= LINEAR_SEARCH_LINES => {
                    self.touched.iter().rposition(|e| e.0 == line)
                }
                _ => self.by_line.get(&line).copied(),
            };
            let (fresh, node) = match found {
                Some(i) => {
                    self.last = i;
                    let entry = &mut self.touched[i];
                    let fresh = entry.2 & kind == 0;
                    entry.2 |= kind | smo;
                    (fresh, entry.1)
                }
                None => {
                    let Some(node) = node_of(line, &mut self.cache) else {
                        continue; // DRAM or an unmapped address: not PM, not accounted.
                    };
                    self.last = self.touched.len();
                    self.touched.push((line, node, kind | smo));
                    self.index_new_line();
                    (true, node)
                }
            };
            if CACHE_MODELS_ON.load(Ordering::Relaxed) {
                let access = if kind == TOUCH_WRITE { Access::Write } else { Access::Read };
                replay(line, node, access);
            }
            if fresh && flags & FLAG_LATENCY != 0 {
                let remote = node != numakv_numa::current_node();
                let word = LATENCY[usize::from(kind == TOUCH_WRITE)].load(Ordering::Relaxed);
                let ns = if remote { word >> 32 } else { word & 0xffff_ffff };
                spin_for(ns);
            }
            // Recorded as `kind` at the current SMO depth: repeats may take the fast path.
            LAST_LINE.with(|l| l[usize::from(kind == TOUCH_WRITE)].set(line));
        }
        if self.touched.len() > MAX_LINES_PER_OP {
            self.close(false);
        }
    }

    /// Keeps `by_line` in step after a push to `touched`: built from every line when the
    /// operation outgrows the linear search, extended by one line after that.
    fn index_new_line(&mut self) {
        let n = self.touched.len();
        if n == LINEAR_SEARCH_LINES + 1 {
            self.by_line.extend(self.touched.iter().enumerate().map(|(i, e)| (e.0, i)));
        } else if n > LINEAR_SEARCH_LINES + 1 {
            self.by_line.insert(self.touched[n - 1].0, n - 1);
        }
    }

    /// Forgets the current operation's lines.
    fn clear_lines(&mut self) {
        self.touched.clear();
        if !self.by_line.is_empty() {
            // (clear() rewrites the whole table even when empty: skip it for small operations.)
            self.by_line.clear();
        }
        reset_last_lines();
    }

    fn close(&mut self, count_op: bool) {
        let my_node = numakv_numa::current_node();
        let mut s = AccessStats { ops: u64::from(count_op), ..AccessStats::default() };
        for &(_, node, kinds) in &self.touched {
            let remote = node != my_node;
            if kinds & TOUCH_READ != 0 {
                if remote {
                    s.reads_remote += 1
                } else {
                    s.reads_local += 1
                }
            }
            if kinds & TOUCH_WRITE != 0 {
                if remote {
                    s.writes_remote += 1
                } else {
                    s.writes_local += 1
                }
            }
            let only_smo = |k: u8| kinds & (k << SMO_SHIFT) != 0 && kinds & (k << OWN_SHIFT) == 0;
            s.smo_reads += u64::from(only_smo(TOUCH_READ));
            s.smo_writes += u64::from(only_smo(TOUCH_WRITE));
        }
        s.flushes = std::mem::take(&mut self.flushes);
        s.smo_flushes = std::mem::take(&mut self.smo_flushes);
        s.fences = std::mem::take(&mut self.fences);
        self.clear_lines();
        self.shared.add(&s);
    }
}

thread_local! {
    static ACCT: RefCell<ThreadAcct> = RefCell::new(ThreadAcct::new());
    /// Open [`smo_scope`] guards of the thread (they nest: helping another SMO inside one).
    static SMO_DEPTH: Cell<u32> = const { Cell::new(0) };
    /// The line the thread's current operation last read / wrote, already recorded as such
    /// under the current SMO depth, or `NO_LINE`: a repeated access to it returns before
    /// [`slow_touch`] (an engine reading a node's keys one by one calls the hooks many times
    /// per line). Reset whenever the operation's lines or the SMO depth change.
    static LAST_LINE: [Cell<usize>; 2] = const { [Cell::new(NO_LINE), Cell::new(NO_LINE)] };
}

/// Never a line address (those are multiples of [`LINE`]).
const NO_LINE: usize = usize::MAX;

/// Forgets the fast path's lines (see `LAST_LINE`).
#[inline]
fn reset_last_lines() {
    LAST_LINE.with(|l| {
        l[0].set(NO_LINE);
        l[1].set(NO_LINE);
    });
}

/// Whether `[addr, addr + len)` is within the line the operation last touched as `kind`.
#[inline(always)]
fn same_line_again(addr: usize, len: usize, kind: u8) -> bool {
    let line = addr & !(LINE - 1);
    addr - line + len <= LINE
        && LAST_LINE.with(|l| l[usize::from(kind == TOUCH_WRITE)].get()) == line
}

/// Marks the calling thread as inside a structural modification operation until the guard is
/// dropped: what it touches and flushes meanwhile is also counted in the `smo_*` fields of
/// [`AccessStats`] (see the module docs). Scopes nest. Costs two thread-local updates; counts
/// nothing unless accounting is on.
#[must_use = "the scope ends when the guard is dropped"]
pub fn smo_scope() -> SmoScope {
    SMO_DEPTH.with(|d| d.set(d.get() + 1));
    reset_last_lines();
    SmoScope { _not_send: std::marker::PhantomData }
}

/// Guard of [`smo_scope`] (not `Send`: the scope belongs to the thread that opened it).
#[derive(Debug)]
pub struct SmoScope {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for SmoScope {
    fn drop(&mut self) {
        let _ = SMO_DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
        let _ = LAST_LINE.try_with(|l| l.iter().for_each(|c| c.set(NO_LINE)));
    }
}

/// The hooks' whole work when a flag is on, out of line: the accessors' inlined fast path is one
/// relaxed load of [`FLAGS`] and a branch, with nothing else of accounting in the caller's code
/// (no thread-local access, no spilled registers), so a loop of accessor loads compiles to what
/// the same loop of plain atomic loads does plus that load and branch (issue 40). `#[cold]`
/// lays the call out of the hot path; a repeat of the line touched last returns here before the
/// thread's line set is looked at.
#[cold]
#[inline(never)]
fn hooked_touch(addr: usize, len: usize, kind: u8, flags: u8) {
    if !same_line_again(addr, len, kind) {
        slow_touch(addr, len, kind, flags);
    }
}

#[inline(never)]
fn slow_touch(addr: usize, len: usize, kind: u8, flags: u8) {
    if flags & FLAG_STEPS != 0 && kind == TOUCH_WRITE {
        crate::steps::on_write(addr);
    }
    if flags & FLAG_CHAOS != 0 {
        crate::chaos::step(crate::chaos::Site::Access);
    }
    if flags & FLAG_TOUCH == 0 {
        return;
    }
    // try_with: accesses during thread teardown (after the TLS is gone) are simply not counted.
    let _ = ACCT.try_with(|a| {
        if let Ok(mut a) = a.try_borrow_mut() {
            a.touch(addr, len, kind, flags)
        }
    });
}

/// Records a read of `[addr, addr + len)`. Called by the accessor types, and by hot loops that
/// read a range with unaccounted loads and record it once (e.g. a node's scanned slots); near
/// free when off (one relaxed load and a predicted branch), nothing at all without the
/// `accounting` feature.
#[inline(always)]
pub fn record_read(addr: usize, len: usize) {
    if !COMPILED {
        return;
    }
    let flags = FLAGS.load(Ordering::Relaxed);
    if flags != 0 {
        hooked_touch(addr, len, TOUCH_READ, flags);
    }
}

/// Records a write of `[addr, addr + len)`. Called by the accessor types; near free when off
/// (one relaxed load and a predicted branch), nothing at all without the `accounting` feature.
#[inline(always)]
pub fn record_write(addr: usize, len: usize) {
    if !COMPILED {
        return;
    }
    let flags = FLAGS.load(Ordering::Relaxed);
    if flags != 0 {
        hooked_touch(addr, len, TOUCH_WRITE, flags);
    }
}

/// Counts the flushes of the lines of `[addr, addr + len)`, all on `node` (called by
/// [`crate::Pool::flush`]), and replays them through the cache models when they run.
#[inline]
pub(crate) fn record_flushes(addr: usize, len: usize, node: usize) {
    if !COMPILED {
        return;
    }
    if FLAGS.load(Ordering::Relaxed) & FLAG_ACCOUNT != 0 {
        if CACHE_MODELS_ON.load(Ordering::Relaxed) {
            for line in lines(addr, len) {
                replay(line, node, Access::Flush);
            }
        }
        let n = crate::persist::line_count(addr, len);
        let _ = ACCT.try_with(|a| {
            if let Ok(mut a) = a.try_borrow_mut() {
                a.flushes += n as u64;
                if SMO_DEPTH.with(|d| d.get()) > 0 {
                    a.smo_flushes += n as u64;
                }
            }
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Cache models
// ---------------------------------------------------------------------------------------------

/// The cache models fed while accounting is on (empty: none).
static CACHE_MODELS: Mutex<Vec<CacheModel>> = Mutex::new(Vec::new());
/// Whether [`CACHE_MODELS`] is non-empty: the hooks' only cost when no model runs.
static CACHE_MODELS_ON: AtomicBool = AtomicBool::new(false);

/// Starts one [`CacheModel`] per configuration, empty, replacing any running: while accounting is
/// on, every PM line access and flush of every thread is replayed through them (by the thread's
/// node, [`numakv_numa::current_node`]) until [`stop_cache_models`].
///
/// Costs a global lock per access while it runs: for untimed counting runs (the accounting phase
/// of a benchmark, a reproduction's line count), not for timed ones. Accesses the hot path skips
/// as repeats (the line the thread's operation touched last, the same way) are not replayed;
/// they would hit unless another node wrote the line in between. A no-op without the
/// `accounting` feature.
pub fn start_cache_models(configs: &[CacheConfig]) {
    if !COMPILED {
        return;
    }
    let mut models = CACHE_MODELS.lock();
    *models = configs.iter().map(|&c| CacheModel::new(c)).collect();
    CACHE_MODELS_ON.store(!models.is_empty(), Ordering::Relaxed);
}

/// Stops the cache models and returns what each counted, in the order they were started.
pub fn stop_cache_models() -> Vec<(CacheConfig, CacheStats)> {
    let mut models = CACHE_MODELS.lock();
    CACHE_MODELS_ON.store(false, Ordering::Relaxed);
    std::mem::take(&mut *models).iter().map(|m| (m.config(), m.stats())).collect()
}

#[cold]
fn replay(line: usize, home: usize, access: Access) {
    let node = numakv_numa::current_node();
    for m in CACHE_MODELS.lock().iter_mut() {
        m.access(line, home, node, access);
    }
}

/// Counts a fence (called by [`crate::Pool::fence`]).
#[inline]
pub(crate) fn record_fence() {
    if !COMPILED {
        return;
    }
    if FLAGS.load(Ordering::Relaxed) & FLAG_ACCOUNT != 0 {
        let _ = ACCT.try_with(|a| {
            if let Ok(mut a) = a.try_borrow_mut() {
                a.fences += 1
            }
        });
    }
}

/// Closes the calling thread's current operation: its distinct lines are added to the thread's
/// totals and one operation is counted. Engines' callers (the benchmark runner, the facade) call
/// this once per index operation.
#[inline]
pub fn op_end() {
    if !COMPILED {
        return;
    }
    if FLAGS.load(Ordering::Relaxed) != 0 {
        let _ = ACCT.try_with(|a| {
            if let Ok(mut a) = a.try_borrow_mut() {
                a.close(true)
            }
        });
    }
}

/// Closes the calling thread's current *segment* without counting an operation: its distinct
/// lines are added to the thread's totals (so [`thread_stats`] deltas around it attribute them
/// to a phase of an operation), and de-duplication starts afresh. A line touched again after
/// the split counts again.
#[inline]
pub fn op_split() {
    if !COMPILED {
        return;
    }
    if FLAGS.load(Ordering::Relaxed) != 0 {
        let _ = ACCT.try_with(|a| {
            if let Ok(mut a) = a.try_borrow_mut() {
                a.close(false)
            }
        });
    }
}

/// Forgets the lines touched so far by the calling thread's open operation (e.g. set-up work
/// that should not count), without counting an operation.
pub fn op_discard() {
    let _ = ACCT.try_with(|a| {
        if let Ok(mut a) = a.try_borrow_mut() {
            a.clear_lines();
            a.flushes = 0;
            a.fences = 0;
            a.smo_flushes = 0;
        }
    });
}

/// The calling thread's totals (closed operations only).
pub fn thread_stats() -> AccessStats {
    ACCT.try_with(|a| a.borrow().shared.load()).unwrap_or_default()
}

/// The totals of every thread that ever accounted, live or exited (closed operations only).
pub fn global_stats() -> AccessStats {
    let mut total = AccessStats::default();
    for c in ALL_THREADS.lock().iter() {
        total.add(&c.load());
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_arithmetic() {
        let a = AccessStats {
            ops: 2,
            reads_local: 3,
            reads_remote: 1,
            writes_local: 2,
            writes_remote: 2,
            flushes: 1,
            fences: 1,
            smo_reads: 1,
            smo_writes: 2,
            smo_flushes: 1,
        };
        assert_eq!(a.reads(), 4);
        assert_eq!(a.writes(), 4);
        assert!((a.remote_share() - 3.0 / 8.0).abs() < 1e-9);
        assert_eq!(a.since(&a), AccessStats::default());
        let mut b = a;
        b.add(&a);
        assert_eq!((b.smo_reads, b.smo_writes, b.smo_flushes), (2, 4, 2));
        assert_eq!(b.since(&a), a);
        assert_eq!(AccessStats::default().remote_share(), 0.0);
    }

    #[test]
    fn latency_models_parse_and_print() {
        assert_eq!("optane".parse::<LatencyModel>(), Ok(LatencyModel::OPTANE));
        assert_eq!("none".parse::<LatencyModel>(), Ok(LatencyModel::NONE));
        assert!("dram".parse::<LatencyModel>().is_err());
        assert_eq!(LatencyModel::OPTANE.to_string(), "optane");
        assert!((LatencyModel::OPTANE.remote_read_ratio() - 181.0 / 113.0).abs() < 1e-9);
    }
}
