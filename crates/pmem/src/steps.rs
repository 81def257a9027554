//! A crash at every step: PM stores as crash points (docs/design.md §12.3).
//!
//! In ADR shadow mode the natural crash points are the fences
//! ([`Pool::crash_after_fences`]): between two fences nothing new becomes durable except by
//! random eviction. In eADR every globally visible store is durable, so every PM store is a
//! crash point, and an eADR protocol may issue no fence at all. A [`WriteWatch`] counts the
//! stores (and read-modify-writes, CAS included) that the accessor types make into one pool, by
//! any thread, and can crash the pool (shadow mode) just *before* the n-th: the store that
//! would have been the n-th is lost with everything after it.
//!
//! The watch rides on the accessors' flag byte ([`crate::account`]): while one is live, every
//! store of every pool in the process takes the cold path (so a watch slows the whole test
//! process a little); stores outside the watched pool are ignored there. One watch at a time
//! per process: [`WriteWatch::new`] waits for the previous one to be dropped. Without the
//! `accounting` feature the accessors have no hook and a watch counts nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, MutexGuard};

use crate::shadow::CrashOptions;
use crate::Pool;

/// The live watch's state.
struct Target {
    pool: Weak<Pool>,
    /// Crash just before store number `crash_at` (1-based); 0 = count only.
    crash_at: u64,
    opts: CrashOptions,
}

static SERIAL: Mutex<()> = Mutex::new(());
static TARGET: Mutex<Option<Target>> = Mutex::new(None);
static WRITES: AtomicU64 = AtomicU64::new(0);

/// Counts the PM stores into a pool and optionally crashes it at one of them. Dropping the watch
/// ends it.
pub struct WriteWatch {
    _serial: MutexGuard<'static, ()>,
}

impl std::fmt::Debug for WriteWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteWatch").field("writes", &self.writes()).finish()
    }
}

impl WriteWatch {
    /// Starts counting the stores into `pool`; with `crash_at = Some(n)` (n ≥ 1), crashes the
    /// pool with `opts` just before the n-th store ([`Pool::crash`]; shadow mode only — in
    /// direct mode the watch only counts).
    pub fn new(pool: &Arc<Pool>, crash_at: Option<u64>, opts: CrashOptions) -> WriteWatch {
        let serial = SERIAL.lock();
        WRITES.store(0, Ordering::Relaxed);
        *TARGET.lock() =
            Some(Target { pool: Arc::downgrade(pool), crash_at: crash_at.unwrap_or(0), opts });
        crate::account::set_steps(true);
        WriteWatch { _serial: serial }
    }

    /// Stores into the pool counted so far (including the one a crash stopped).
    pub fn writes(&self) -> u64 {
        WRITES.load(Ordering::Relaxed)
    }
}

impl Drop for WriteWatch {
    fn drop(&mut self) {
        crate::account::set_steps(false);
        *TARGET.lock() = None;
    }
}

/// Called from the accessors' cold path for every store while a watch is live.
#[cold]
pub(crate) fn on_write(addr: usize) {
    let mut crash = None;
    {
        let t = TARGET.lock();
        let Some(t) = t.as_ref() else { return };
        let Some(pool) = t.pool.upgrade() else { return };
        if pool.has_crashed() || pool.pptr_of(addr as *const u8).is_none() {
            return;
        }
        // ORDERING: Relaxed; the counter is read by the test thread after joining the writers.
        let n = WRITES.fetch_add(1, Ordering::Relaxed) + 1;
        if n == t.crash_at {
            crash = Some((pool, t.opts));
        }
    }
    if let Some((pool, opts)) = crash {
        let _ = pool.crash(opts);
    }
}
