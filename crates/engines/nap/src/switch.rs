//! The three-phase NAL switch (papers/nap.txt §4.5, Listing 1), the persistent NAL pointers with
//! their undo log, and the switch thread that drives it from the hot-set detector.
//!
//! ```text
//! phase 1  build NAL_new (PC-views persisted)           log: CUR, PRE := new, cur
//!          publish (cur, pre) := (new, cur) under the seqlock
//! phase 2  grace period 1; NAL_new becomes writable     (writes to pre-only keys block)
//!          flush NAL_old's written entries into the raw index
//! phase 3  log: GC, PRE := pre, 0; publish pre := 0
//!          grace period 2; free NAL_old's PM and DRAM; GC := 0 (one 8-byte store)
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use numakv_index::{check_key, Error, Result};
use numakv_pmem::{PPtr, Pool, PoolError};

use crate::hot::{Decision, Detector, DetectorConfig};
use crate::layout::{SLOT_CUR, SLOT_GC, SLOT_PRE, SLOT_UNDO, SLOT_UNDO_STATE};
use crate::nal::Nal;
use crate::{Inner, Shared, SwitchMode};

/// Phase of the switch in progress (0: none), for tests and stats.
pub mod phase {
    /// No switch in progress.
    pub const IDLE: u8 = 0;
    /// Building and installing the new NAL.
    pub const INSTALL: u8 = 1;
    /// Grace period and flush of the previous NAL.
    pub const FLUSH: u8 = 2;
    /// Recycling the previous NAL.
    pub const RECYCLE: u8 = 3;
}

/// Why a switch stalled (its flush failed); writers blocked on it get this error.
#[derive(Clone, Debug)]
pub(crate) struct Stall {
    out_of_space: Option<(usize, u64)>,
    message: String,
}

impl Stall {
    fn of(e: &Error) -> Stall {
        let out_of_space = match e {
            Error::Pool(PoolError::OutOfSpace { node, requested }) => Some((*node, *requested)),
            _ => None,
        };
        Stall { out_of_space, message: e.to_string() }
    }

    pub fn error(&self) -> Error {
        match self.out_of_space {
            Some((node, requested)) => Error::Pool(PoolError::OutOfSpace { node, requested }),
            None => Error::Unsupported(format!(
                "nap: a NAL switch stalled flushing the previous NAL: {}",
                self.message
            )),
        }
    }
}

/// Writes the three NAL pointers failure-atomically through the undo record (§4.5 "Failure
/// atomicity"). All eight Nap slots share one cache line, so each step is one flush + fence.
pub(crate) fn log_pointers(pool: &Pool, cur: PPtr, pre: PPtr, gc: PPtr) -> Result<()> {
    let slot = |i| pool.root(i);
    for (k, s) in [SLOT_CUR, SLOT_PRE, SLOT_GC].into_iter().enumerate() {
        slot(SLOT_UNDO + k)?.store(slot(s)?.load(Ordering::Acquire), Ordering::Release);
    }
    // PERSIST: the undo record is durable before it is declared valid.
    pool.persist_obj(slot(SLOT_UNDO)?);
    slot(SLOT_UNDO_STATE)?.store(1, Ordering::Release);
    // PERSIST: the record is valid before any pointer changes.
    pool.persist_obj(slot(SLOT_UNDO_STATE)?);
    slot(SLOT_CUR)?.store(cur.raw(), Ordering::Release);
    slot(SLOT_PRE)?.store(pre.raw(), Ordering::Release);
    slot(SLOT_GC)?.store(gc.raw(), Ordering::Release);
    // PERSIST: all three new pointers are durable before the record is retired.
    pool.persist_obj(slot(SLOT_CUR)?);
    slot(SLOT_UNDO_STATE)?.store(0, Ordering::Release);
    // PERSIST: the update is committed; recovery no longer rolls it back.
    pool.persist_obj(slot(SLOT_UNDO_STATE)?);
    Ok(())
}

fn root_of(p: *mut Nal) -> PPtr {
    // SAFETY: only the switch thread (holding the switch lock) calls this, on pointers it
    // installed and has not freed.
    unsafe { p.as_ref() }.map_or(PPtr::NULL, Nal::root)
}

/// What a switch did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwitchReport {
    /// Keys of the new NAL.
    pub keys: usize,
    /// Entries of the previous NAL flushed into the raw index.
    pub flushed: u64,
    /// Wall time of the whole switch.
    pub elapsed: Duration,
    /// Nothing to do: the requested hot set is the current one.
    pub unchanged: bool,
}

impl<I: Inner> Shared<I> {
    /// Switches to a NAL over `keys` (any order; duplicates and reserved keys are dropped; an
    /// empty set installs the empty NAL).
    pub(crate) fn switch_to(&self, keys: &[u64]) -> Result<SwitchReport> {
        let t0 = Instant::now();
        let mut seq = self.switch_lock.lock();
        let r = if self.switch_mode == SwitchMode::GlobalLock {
            // The write side of the global lock for the whole switch: no operation runs, so
            // the grace periods inside return at once and no write ever waits on a NAL.
            self.grace.block();
            let r = self.switch_locked(&mut seq, keys, t0);
            self.grace.unblock();
            r
        } else {
            self.switch_locked(&mut seq, keys, t0)
        };
        // What `stats()` reports during the next switch.
        *self.nal_figures.lock() = self.nal_figures_locked();
        r
    }

    /// The switch proper; the caller holds the switch lock (`seq`).
    fn switch_locked(&self, seq: &mut u64, keys: &[u64], t0: Instant) -> Result<SwitchReport> {
        // A previous switch that stalled in phase 2 is finished first: one switch at a time.
        let mut flushed = self.finish_pending()?;
        let mut keys: Vec<u64> = keys.iter().copied().filter(|&k| check_key(k).is_ok()).collect();
        keys.sort_unstable();
        keys.dedup();
        let (old, _) = self.grace.pointers();
        // SAFETY: `old` is the installed current NAL; only this thread (under the switch lock)
        // frees NALs.
        let old_keys = unsafe { old.as_ref() }.map_or(&[][..], |n| &n.keys[..]);
        if old_keys == &keys[..] {
            return Ok(SwitchReport {
                keys: keys.len(),
                flushed,
                unchanged: true,
                ..Default::default()
            });
        }
        // Phase 1: build, log, publish.
        self.enter(phase::INSTALL);
        *seq += 1;
        let n = keys.len();
        let new: *mut Nal = if keys.is_empty() {
            std::ptr::null_mut()
        } else {
            match Nal::build(&self.pool, keys, *seq) {
                Ok(nal) => Box::into_raw(Box::new(nal)),
                Err(e) => {
                    self.enter(phase::IDLE);
                    return Err(e);
                }
            }
        };
        let gc = PPtr::from_raw(self.pool.root(SLOT_GC)?.load(Ordering::Acquire));
        if let Err(e) = log_pointers(&self.pool, root_of(new), root_of(old), gc) {
            if !new.is_null() {
                // SAFETY: `new` was never published.
                let nal = unsafe { Box::from_raw(new) };
                let _ = nal.free_pm();
            }
            self.enter(phase::IDLE);
            return Err(e);
        }
        self.grace.set_unwritable(new);
        self.grace.publish(new, old);
        // Phase 2 begins with the first grace period: afterwards every operation sees NAL_new,
        // so NAL_old and (for NAL_new's keys) the raw index are no longer written.
        self.enter(phase::FLUSH);
        self.grace.wait_grace_period();
        // SAFETY: `new` is installed; only this thread frees it, in a later switch.
        if let Some(nal) = unsafe { new.as_ref() } {
            // ORDERING: Release pairs with the Acquire in route_write (and, through
            // set_unwritable's Release, with blocked writers).
            nal.writable.store(true, Ordering::Release);
        }
        self.grace.set_unwritable(std::ptr::null_mut());
        flushed += self.finish_pending()?;
        if self.phase.load(Ordering::Relaxed) != phase::IDLE {
            self.enter(phase::IDLE); // there was no previous NAL to flush
        }
        self.counters.switches.fetch_add(1, Ordering::Relaxed);
        if !old.is_null() {
            self.counters.switches_with_previous.fetch_add(1, Ordering::Relaxed);
        }
        let elapsed = t0.elapsed();
        let us = elapsed.as_micros() as u64;
        self.counters.switch_us_total.fetch_add(us, Ordering::Relaxed);
        self.counters.switch_us_max.fetch_max(us, Ordering::Relaxed);
        Ok(SwitchReport { keys: n, flushed, elapsed, unchanged: false })
    }

    /// Phases 2 (flush) and 3 (recycle) for the installed `pre`, if any. Caller holds the
    /// switch lock and the first grace period after `pre`'s replacement has passed.
    fn finish_pending(&self) -> Result<u64> {
        let (cur, pre) = self.grace.pointers();
        // SAFETY: installed pointers, freed only below by this thread.
        let Some(pre_nal) = (unsafe { pre.as_ref() }) else {
            return Ok(0);
        };
        self.enter(phase::FLUSH);
        // Grace period 1 has passed and `cur` is writable; `pre` is not flushed yet: writers of
        // keys only in `pre` wait, writes into `cur` resolve from `pre` (tests/interleavings.rs).
        numakv_pmem::pause_point!("nap.switch.pre_flush");
        let flushed = match self.flush_nal(pre_nal) {
            Ok(n) => n,
            Err(e) => {
                // Writers of pre-only keys stay blocked; they now fail instead of waiting for a
                // flush that may never succeed. The next tick retries.
                *self.stall.lock() = Some(Stall::of(&e));
                self.stalled.store(true, Ordering::Release);
                return Err(e);
            }
        };
        // Phase 3.
        self.enter(phase::RECYCLE);
        log_pointers(&self.pool, root_of(cur), PPtr::NULL, pre_nal.root())?;
        self.grace.publish(cur, std::ptr::null_mut());
        self.stalled.store(false, Ordering::Release);
        *self.stall.lock() = None;
        self.grace.wait_grace_period();
        // Nobody can reach NAL_old any more. A failed free leaves the extent to the next
        // recovery's sweep (GC still names it).
        let freed = pre_nal.free_pm();
        if freed.is_ok() {
            let gc = self.pool.root(SLOT_GC)?;
            gc.store(0, Ordering::Release);
            // PERSIST: one 8-byte store retires gc_NAL (Listing 1 line 15).
            self.pool.persist_obj(gc);
        }
        // SAFETY: unpublished, and the grace period above waited out every operation that
        // could hold it; this thread installed it with Box::into_raw.
        drop(unsafe { Box::from_raw(pre) });
        self.enter(phase::IDLE);
        freed.map(|()| flushed)
    }

    /// Flushes the entries `nal` wrote into the raw index (phase 2). `nal` is no longer written.
    fn flush_nal(&self, nal: &Nal) -> Result<u64> {
        if numakv_pmem::fail_point!("nap.switch.flush") {
            // Test hook: the flush fails as on a raw index out of space (a stalled switch).
            return Err(numakv_pmem::PoolError::OutOfSpace { node: 0, requested: 0 }.into());
        }
        let mut n = 0;
        for (i, &key) in nal.keys.iter().enumerate() {
            let st = *nal.entries[i].state.read();
            if st.version == 0 {
                continue; // never written in this NAL: the raw index (or an older NAL) has it
            }
            match st.value {
                Some(v) => self.raw.upsert(key, v)?,
                None => {
                    self.raw.remove(key)?;
                }
            }
            // Each flushed key is one raw-index write for the accounting: its lines are counted
            // (and latency-emulated) apart from the previous key's, like a foreground write's.
            numakv_pmem::account::op_split();
            n += 1;
        }
        Ok(n)
    }

    pub(crate) fn stall_error(&self) -> Option<Error> {
        // ORDERING: Acquire pairs with the Release that sets it after recording the stall.
        if !self.stalled.load(Ordering::Acquire) {
            return None;
        }
        self.stall.lock().as_ref().map(Stall::error)
    }

    /// Keys of the current NAL.
    pub(crate) fn current_keys(&self) -> Vec<u64> {
        let _g = self.switch_lock.lock();
        let (cur, _) = self.grace.pointers();
        // SAFETY: the switch lock keeps the current NAL installed while we copy.
        unsafe { cur.as_ref() }.map_or(Vec::new(), |n| n.keys.to_vec())
    }
}

/// Tuning of the switch thread.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ThreadConfig {
    pub period: Duration,
    pub depth: usize,
    pub width: usize,
    pub hot: usize,
    pub detector: DetectorConfig,
}

/// The switch thread: digests record buffers, decides every `period`, switches; returns when
/// `stop` is set.
pub(crate) fn run<I: Inner>(shared: Arc<Shared<I>>, stop: Arc<AtomicBool>, cfg: ThreadConfig) {
    let mut det = Detector::new(cfg.depth, cfg.width, cfg.hot, cfg.detector);
    let (sk, heap) = det.dram_bytes();
    shared.counters.sketch_bytes.store(sk, Ordering::Relaxed);
    shared.counters.heap_bytes.store(heap, Ordering::Relaxed);
    let tick = (cfg.period / 8).clamp(Duration::from_micros(200), Duration::from_millis(5));
    let mut last = Instant::now();
    // ORDERING: Relaxed; the flag only ends the loop.
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(tick);
        det.digest(&shared.hot);
        if shared.stalled.load(Ordering::Acquire) {
            let _g = shared.switch_lock.lock();
            let global = shared.switch_mode == SwitchMode::GlobalLock;
            if global {
                shared.grace.block();
            }
            let _ = shared.finish_pending();
            if global {
                shared.grace.unblock();
            }
            numakv_pmem::account::op_split();
        }
        if last.elapsed() < cfg.period {
            continue;
        }
        let current = shared.current_keys();
        if let Decision::Switch(keys) = det.decide(&current) {
            if shared.switch_to(&keys).is_err() {
                shared.counters.switch_errors.fetch_add(1, Ordering::Relaxed);
            }
            // The switch's remaining PM lines (the new NAL, the retired one's frees) go into
            // the thread's published totals (docs/design.md §11).
            numakv_pmem::account::op_split();
        }
        // The next period starts when this decision (and its switch) is over: a switch can
        // outlast a period (a large hot set's flush on a busy machine), and a decision right
        // after it would see only the few samples digested since, whose top keys are a
        // fraction of the hot set; switching to them evicts most of it.
        last = Instant::now();
    }
}
