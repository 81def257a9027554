//! Nap: the black-box NUMA-aware layer of Wang et al., OSDI'21 (papers/nap.txt), over any numakv
//! engine.
//!
//! [`Nap<I>`] wraps a raw engine `I` in the same pool and steers the hot keys to a NUMA-aware
//! layer (NAL):
//! - a **GV-view** in DRAM ([`nal`]): an immutable ordered map of the hot keys, each entry with a
//!   readers-writer lock, the latest value, its version and whether it is resolved yet (lazy
//!   initialisation); lookups of hot keys never touch PM;
//! - per-node **PC-views** in PM ([`layout`], [`nal`]): a read-only key array and a value array of
//!   cache-line entries with two `(value, version)` incarnations; a write persists into the
//!   caller's node's view with one flush and one fence, never remotely;
//! - **hot-set identification** ([`hot`]): sampled record buffers, a count-min sketch and a
//!   min-heap on a switch thread, with uniform-workload detection;
//! - the **three-phase switch** ([`switch`]) with grace periods ([`grace`]) and the NAL pointers
//!   in PM under an undo log;
//! - **recovery** ([`recovery`]): the raw index first, then the PC-views of `pre` and `cur` by
//!   highest version, then their PM is freed.
//!
//! Formats, the switch protocol and the crash states: docs/design.md, section "Nap".
//!
//! Pause points (docs/design.md §12; `tests/interleavings.rs`):
//! - `nap.write.raw_routed` — a write's snapshot routed its key to the raw index, the raw write
//!   has not started (a switch's first grace period waits for it);
//! - `nap.write.nal_resolved` — a write into `cur` resolved an unresolved entry (from `pre` or
//!   the raw index) under the entry's lock, nothing persisted yet (grace period 2 waits for it);
//! - `nap.scan.raw_chunk` — a scan read one raw chunk, the NALs' values not merged yet (its
//!   snapshot may hold `pre`: grace period 2 waits for it);
//! - `nap.switch.pre_flush` — phase 2: grace period 1 passed, `cur` writable, `pre` not flushed
//!   (writers of keys only in `pre` wait).
//!
//! Fail point: `nap.switch.flush` — the phase-2 flush fails as if the raw index were out of
//! space (`OutOfSpace`): the switch stalls, writers blocked on `pre` get the error.
//!
//! ```
//! use numakv_fastfair::FastFair;
//! use numakv_index::{Engine, Index};
//! use numakv_nap::{Nap, NapOptions};
//! use numakv_pmem::{Pool, PoolConfig};
//!
//! let mut cfg = PoolConfig::new(Nap::<FastFair>::engine_id(), 16 << 20);
//! cfg.nodes = 2;
//! let pool = Pool::volatile(cfg)?;
//! let nap = Nap::<FastFair>::create(pool, &NapOptions::default())?;
//! nap.upsert(7, 70)?;
//! nap.switch_to(&[7, 8])?; // keys 7 and 8 are now served by the NAL
//! assert_eq!(nap.get(7)?, Some(70));
//! assert!(nap.insert(8, 80)?);
//! let mut out = Vec::new();
//! nap.scan(1, 10, &mut out)?;
//! assert_eq!(out, vec![(7, 70), (8, 80)]);
//! nap.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod check;
pub mod grace;
pub mod hot;
pub mod layout;
pub mod nal;
mod ops;
mod recovery;
pub mod switch;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use numakv_f3tree::F3Tree;
use numakv_fastfair::FastFair;
use numakv_index::{
    Backlog, CheckReport, Engine, EngineStats, Error, Index, RecoveryReport, Result,
};
use numakv_nbtree::NbTree;
use numakv_nobtree::Nobtree;
use numakv_nstore::NStore;
use numakv_pmem::Pool;
use parking_lot::Mutex;

use crate::grace::Grace;
use crate::hot::{DetectorConfig, Recorder};
use crate::ops::Write;
pub use crate::switch::{phase, SwitchReport};

/// A raw engine Nap can wrap: any [`Engine`], plus the name of the layered engine recorded in
/// store headers (`nap-<engine>`; a `const` because [`Engine::NAME`] is one).
pub trait Inner: Engine {
    /// `"nap-" + Self::NAME`.
    const NAP_NAME: &'static str;
}

impl Inner for FastFair {
    const NAP_NAME: &'static str = "nap-fastfair";
}

impl Inner for NbTree {
    const NAP_NAME: &'static str = "nap-nbtree";
}

impl Inner for Nobtree {
    const NAP_NAME: &'static str = "nap-nobtree";
}

impl Inner for NStore {
    const NAP_NAME: &'static str = "nap-nstore";
}

impl Inner for F3Tree {
    const NAP_NAME: &'static str = "nap-f3tree";
}

/// Options of a Nap layer: the raw engine's options and the paper's tuning (§6.1 defaults).
/// None shapes the persistent format.
#[derive(Clone, Debug)]
pub struct NapOptions<O> {
    /// Options of the raw engine.
    pub inner: O,
    /// Size of the hot set (100K in the paper).
    pub hot: usize,
    /// Each access thread records one operation in `sample` (32); 0 disables recording.
    pub sample: u32,
    /// Period of the switch thread's check (0.2 s).
    pub check_period: Duration,
    /// Switch when more than this share of the hot keys differ (0.25).
    pub switch_threshold: f64,
    /// Count-min sketch rows (3) and counters per row (850,000).
    pub sketch_depth: usize,
    /// Counters per sketch row.
    pub sketch_width: usize,
    /// Records per thread buffer (300 KB / 16 B in the paper).
    pub record_buffer: usize,
    /// Records older than this are skipped (100 ms).
    pub stale: Duration,
    /// Install the empty NAL under uniform workloads (§4.4).
    pub detect_uniform: bool,
    /// Keys estimated below this count in a period are not hot (noise filter; 2).
    pub min_count: u32,
    /// Run the switch thread (hot-set identification); without it switches happen only
    /// through [`Nap::switch_to`].
    pub background: bool,
    /// How a switch keeps operations consistent: the paper's three-phase switch (default) or,
    /// for the contrast of Fig. 15, one global readers-writer lock.
    pub switch_mode: SwitchMode,
    /// Called on the switching thread as a switch enters each [`phase`] (tests: crash points).
    pub phase_hook: PhaseHook,
}

/// How a NAL switch is synchronised with the index operations (papers/nap.txt §4.5, §6.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SwitchMode {
    /// Listing 1: operations keep running; only writes to keys of the previous NAL (phase 2)
    /// and, briefly, to keys of the new one (until the first grace period) wait.
    #[default]
    ThreePhase,
    /// The paper's "conservative mechanism that uses a global readers-writer lock: the switch is
    /// protected by the write lock, and every index operation is protected by the read lock",
    /// with per-core reader indicators (each thread's slot): no operation runs while a switch
    /// builds, installs, flushes and recycles. The persistent protocol (undo log, crash states,
    /// recovery) is the same; only availability differs. For the comparison of Fig. 15.
    GlobalLock,
}

/// A callback run as a switch enters each [`phase`]; none by default.
#[derive(Clone, Default)]
pub struct PhaseHook(pub Option<Arc<dyn Fn(u8) + Send + Sync>>);

impl fmt::Debug for PhaseHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "PhaseHook(set)" } else { "PhaseHook(none)" })
    }
}

impl<O: Default> Default for NapOptions<O> {
    fn default() -> Self {
        NapOptions {
            inner: O::default(),
            hot: 100_000,
            sample: 32,
            check_period: Duration::from_millis(200),
            switch_threshold: 0.25,
            sketch_depth: 3,
            sketch_width: 850_000,
            record_buffer: 300 * 1024 / 16,
            stale: Duration::from_millis(100),
            detect_uniform: true,
            min_count: 2,
            background: true,
            switch_mode: SwitchMode::ThreePhase,
            phase_hook: PhaseHook::default(),
        }
    }
}

impl<O> NapOptions<O> {
    fn validate(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.switch_threshold) {
            return Err(Error::InvalidOptions(format!(
                "switch_threshold {} is not in 0..=1",
                self.switch_threshold
            )));
        }
        if self.check_period.is_zero() {
            return Err(Error::InvalidOptions("check_period must be positive".into()));
        }
        if self.hot > 1 << 26 {
            return Err(Error::InvalidOptions(format!("hot {} exceeds 2^26 keys", self.hot)));
        }
        if self.sketch_width == 0 || self.sketch_width > 1 << 28 {
            return Err(Error::InvalidOptions("sketch_width must be in 1..=2^28".into()));
        }
        Ok(())
    }
}

/// Event counters (DRAM, per session).
#[derive(Debug)]
pub(crate) struct Counters {
    pub switches: AtomicU64,
    /// Completed switches that replaced a non-empty NAL (phase 2 had a previous NAL to flush):
    /// the kit's coverage gate for lazy resolution and writes waiting on a previous NAL.
    pub switches_with_previous: AtomicU64,
    pub switch_errors: AtomicU64,
    /// Per dense thread id (own cache line each): a shared counter bumped by every NAL hit
    /// would bounce one line between all cores on exactly the skewed workloads Nap serves.
    pub nal_hits: Box<[crossbeam_utils::CachePadded<AtomicU64>]>,
    pub blocked_writes: AtomicU64,
    pub sketch_bytes: AtomicU64,
    pub heap_bytes: AtomicU64,
    /// Wall time of completed switches (sum and longest), in microseconds: under
    /// [`SwitchMode::GlobalLock`], how long operations stood still.
    pub switch_us_total: AtomicU64,
    pub switch_us_max: AtomicU64,
}

impl Default for Counters {
    fn default() -> Counters {
        Counters {
            switches: AtomicU64::new(0),
            switches_with_previous: AtomicU64::new(0),
            switch_errors: AtomicU64::new(0),
            nal_hits: (0..numakv_pmem::numa::MAX_THREADS)
                .map(|_| crossbeam_utils::CachePadded::new(AtomicU64::new(0)))
                .collect(),
            blocked_writes: AtomicU64::new(0),
            sketch_bytes: AtomicU64::new(0),
            heap_bytes: AtomicU64::new(0),
            switch_us_total: AtomicU64::new(0),
            switch_us_max: AtomicU64::new(0),
        }
    }
}

impl Counters {
    /// Counts a NAL hit of thread `tid`.
    #[inline]
    pub fn hit(&self, tid: usize) {
        if let Some(c) = self.nal_hits.get(tid) {
            // ORDERING: Relaxed; a statistic, only this thread writes its counter.
            c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }
}

/// What the engine handle and the switch thread share.
pub(crate) struct Shared<I> {
    pub raw: I,
    pub pool: Arc<Pool>,
    pub grace: Grace,
    pub hot: Recorder,
    /// Serialises switches; holds the NAL sequence number.
    pub switch_lock: Mutex<u64>,
    /// The NALs' sizes when last seen (end of a switch, or a `stats()` that got the switch
    /// lock): what `stats()` reports while a switch runs.
    pub nal_figures: Mutex<check::NalFigures>,
    pub stall: Mutex<Option<switch::Stall>>,
    pub stalled: AtomicBool,
    pub phase: AtomicU8,
    pub phase_hook: PhaseHook,
    pub switch_mode: SwitchMode,
    pub counters: Counters,
}

impl<I> Shared<I> {
    /// Records the switch's phase (and tells the hook).
    pub(crate) fn enter(&self, p: u8) {
        self.phase.store(p, Ordering::Relaxed);
        if let Some(h) = &self.phase_hook.0 {
            h(p);
        }
    }
}

/// A raw engine `I` made NUMA-aware; see the [crate docs](crate).
pub struct Nap<I: Inner> {
    shared: Arc<Shared<I>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl<I: Inner> fmt::Debug for Nap<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nap")
            .field("raw", &I::NAME)
            .field("phase", &self.shared.phase.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<I: Inner> Nap<I> {
    /// Wraps an opened raw engine and starts the switch thread.
    fn start(raw: I, opts: &NapOptions<I::Options>) -> Nap<I> {
        let pool = Arc::clone(raw.pool());
        let shared = Arc::new(Shared {
            raw,
            pool,
            grace: Grace::new(),
            hot: Recorder::new(opts.record_buffer, if opts.background { opts.sample } else { 0 }),
            switch_lock: Mutex::new(0),
            nal_figures: Mutex::new(check::NalFigures::default()),
            stall: Mutex::new(None),
            stalled: AtomicBool::new(false),
            phase: AtomicU8::new(phase::IDLE),
            phase_hook: opts.phase_hook.clone(),
            switch_mode: opts.switch_mode,
            counters: Counters::default(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let thread = opts.background.then(|| {
            let (s, st) = (Arc::clone(&shared), Arc::clone(&stop));
            let cfg = switch::ThreadConfig {
                period: opts.check_period,
                depth: opts.sketch_depth,
                width: opts.sketch_width,
                hot: opts.hot,
                detector: DetectorConfig {
                    batch: 8,
                    stale_ns: opts.stale.as_nanos() as u64,
                    threshold: opts.switch_threshold,
                    detect_uniform: opts.detect_uniform,
                    min_count: opts.min_count,
                    min_samples: 64,
                },
            };
            std::thread::Builder::new()
                .name("nap-switch".into())
                .spawn(move || switch::run(s, st, cfg))
                .ok()
        });
        Nap { shared, stop, thread: thread.flatten() }
    }

    /// Switches to a NAL over `keys` now (the three-phase switch of §4.5), as the switch thread
    /// does when the hot set changes. Reserved keys are dropped; an empty set installs the empty
    /// NAL.
    pub fn switch_to(&self, keys: &[u64]) -> Result<SwitchReport> {
        self.shared.switch_to(keys)
    }

    /// Keys of the current NAL, ascending.
    pub fn hot_keys(&self) -> Vec<u64> {
        self.shared.current_keys()
    }

    /// The phase of the switch in progress ([`phase`]).
    pub fn switch_phase(&self) -> u8 {
        self.shared.phase.load(Ordering::Relaxed)
    }

    /// The raw engine underneath.
    pub fn raw(&self) -> &I {
        &self.shared.raw
    }

    fn stop_thread(&mut self) {
        // ORDERING: Relaxed; the thread polls it.
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // A panicked switch thread has nothing left to clean up.
            let _ = t.join();
        }
    }
}

impl<I: Inner> Drop for Nap<I> {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

impl<I: Inner> Index for Nap<I> {
    fn name(&self) -> &'static str {
        I::NAP_NAME
    }

    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        self.shared.write(key, Write::Insert(value))
    }

    fn upsert(&self, key: u64, value: u64) -> Result<()> {
        self.shared.write(key, Write::Upsert(value)).map(|_| ())
    }

    fn update(&self, key: u64, value: u64) -> Result<bool> {
        self.shared.write(key, Write::Update(value))
    }

    fn get(&self, key: u64) -> Result<Option<u64>> {
        self.shared.get(key)
    }

    fn remove(&self, key: u64) -> Result<bool> {
        self.shared.write(key, Write::Remove)
    }

    fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, u64)>) -> Result<usize> {
        self.shared.scan(start, max, out)
    }

    fn stats(&self) -> EngineStats {
        self.shared.stats()
    }

    fn check(&self) -> Result<CheckReport> {
        self.shared.check()
    }

    /// Waits for a switch in progress (or a stalled one's completion) to finish, then for the
    /// raw index's own background work. A switch the switch thread has not decided yet is not
    /// waited for: it is the next period's work.
    fn quiesce(&self, limit: Duration) -> Result<Vec<Backlog>> {
        let t0 = std::time::Instant::now();
        let switching = numakv_index::wait_for_background(limit, || {
            let busy = self.shared.switch_lock.is_locked()
                // ORDERING: Acquire; pairs with the Release that records a stall.
                || self.shared.stalled.load(Ordering::Acquire);
            if busy {
                vec![Backlog { what: "switch in progress", count: 1 }]
            } else {
                Vec::new()
            }
        });
        let mut pending = self.shared.raw.quiesce(limit.saturating_sub(t0.elapsed()))?;
        pending.extend(switching);
        Ok(pending)
    }
}

impl<I: Inner> Engine for Nap<I> {
    type Options = NapOptions<I::Options>;

    const NAME: &'static str = I::NAP_NAME;
    /// Nap's format in the high half, the raw engine's in the low half: a change of either
    /// refuses the store.
    const FORMAT_VERSION: u32 = (layout::NAP_FORMAT << 16) | (I::FORMAT_VERSION & 0xFFFF);

    fn create(pool: Arc<Pool>, opts: &Self::Options) -> Result<Self> {
        opts.validate()?;
        recovery::create::<I>(&pool, opts)?;
        let raw = I::create(pool, &opts.inner)?;
        recovery::init_slots(raw.pool())?;
        Ok(Nap::start(raw, opts))
    }

    fn open(pool: Arc<Pool>, opts: &Self::Options) -> Result<(Self, RecoveryReport)> {
        opts.validate()?;
        let (raw, report) = recovery::open::<I>(pool, opts)?;
        Ok((Nap::start(raw, opts), report))
    }

    fn close(mut self) -> Result<()> {
        self.stop_thread();
        let shared = Arc::clone(&self.shared);
        drop(self);
        let shared = Arc::try_unwrap(shared)
            .map_err(|_| Error::Unsupported("nap: close while the layer is still shared".into()))?;
        let Shared { raw, .. } = shared;
        raw.close()
    }

    fn pool(&self) -> &Arc<Pool> {
        &self.shared.pool
    }
}
