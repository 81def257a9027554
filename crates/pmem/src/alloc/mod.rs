//! Allocators built on the page heap ([`crate::heap`]):
//!
//! - [`nsm`]: NOBtree's NUMA-aware NVM storage manager (papers/nobtree.txt §III-E, Algorithm 1);
//! - [`calloc`]: NBTree's cache-crafty persistent allocator (papers/nbtree.txt §III-C);
//! - [`naive`]: a bump allocator without crash consistency or reuse, the performance ceiling of
//!   papers/nbtree.txt Fig. 15.
//!
//! Freed blocks are never handed out while a reader may still hold them: engines free through
//! [`retire`], which defers the free until an epoch grace period (crossbeam-epoch) has passed.

pub mod calloc;
pub mod naive;
pub mod nsm;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use crossbeam_epoch as epoch;

use crate::error::Result;
use crate::pool::Pool;
use crate::pptr::PPtr;

/// What every PM allocator offers engines.
pub trait PmAllocator: Send + Sync + 'static {
    /// Allocates a block of at least `size` bytes, 64-byte aligned when `size ≥ 64`, placed as
    /// the allocator's policy says. Contents are unspecified (may be stale after a crash).
    fn alloc(&self, size: usize) -> Result<PPtr>;

    /// Returns a block now.
    ///
    /// # Safety
    /// `p` must have come from this allocator's `alloc`, not be freed twice, and no thread may
    /// access it any more — use [`retire`] when lock-free readers might.
    unsafe fn free(&self, p: PPtr) -> Result<()>;

    /// Called by [`retire`] when `p` is retired, before its free is deferred, on the retiring
    /// thread (still pinned). Allocators whose recovery runs concurrently with the engine
    /// (NSM's deferred collection) record it; the default does nothing.
    fn retiring(&self, _p: PPtr) {}

    /// The pool the allocator lives in.
    fn pool(&self) -> &Arc<Pool>;
}

/// Frees `p` once every thread pinned now has unpinned: a lock-free reader that found `p`
/// before it was unlinked can finish reading it, and the block is not reused under it.
///
/// # Safety
/// `p` must have been allocated by `alloc`, already be unreachable for new readers, and not be
/// retired or freed again.
///
/// The deferred function holds only a `Weak` reference: a pending free must not keep the
/// allocator — and through it the pool and its store lock — alive after the engine is dropped
/// (e.g. after a simulated crash, when the test reopens the store). If the allocator is gone when
/// the grace period ends, the free is skipped and the block is reclaimed by the next recovery.
pub unsafe fn retire<A: PmAllocator>(alloc: &Arc<A>, guard: &epoch::Guard, p: PPtr) {
    alloc.retiring(p);
    let alloc = Arc::downgrade(alloc);
    // SAFETY: the closure is 'static and Send (Weak + Copy data); crossbeam runs it after the
    // grace period, when, per the caller's contract, nobody can reach `p`.
    guard.defer(move || {
        if let Some(alloc) = alloc.upgrade() {
            // SAFETY: the caller's contract makes this the one free of `p`, after all readers
            // left. A failing free (e.g. the pool crashed meanwhile) is dropped: a deferred
            // function has nobody to report to, and recovery reclaims the block.
            let _ = unsafe { alloc.free(p) };
        }
    });
}

/// For quiescent checks: lets deferred frees (blocks [`retire`]d by operations that just
/// finished) run until `count()` returns `want` or `timeout` passes, and returns the last count.
/// A block retired moments before a `check()` is still allocated until its grace period passes;
/// a true leak stays above `want` after the timeout. The caller must not be pinned.
pub fn settle_deferred_frees(
    want: u64,
    timeout: std::time::Duration,
    mut count: impl FnMut() -> u64,
) -> u64 {
    let t0 = std::time::Instant::now();
    let mut n = count();
    while n != want && t0.elapsed() < timeout {
        // Each pin + flush lets this thread advance the epoch and run expired bags.
        epoch::pin().flush();
        std::thread::sleep(std::time::Duration::from_millis(1));
        n = count();
    }
    n
}

/// Waits for an epoch grace period: returns once every thread that was pinned (in the default
/// collector) when this was called has unpinned, or `false` as soon as `cancel` is true.
/// The caller must not be pinned itself (it would wait for itself).
///
/// Used by deferred recovery: a thread that unlinked a block while pinned has, once it
/// unpinned, also announced it through [`retire`].
pub fn wait_for_unpin(cancel: &AtomicBool) -> bool {
    let passed = Arc::new(AtomicBool::new(false));
    {
        let guard = epoch::pin();
        let flag = Arc::clone(&passed);
        // ORDERING: Release; pairs with the Acquire below. crossbeam runs this only after the
        // global epoch advanced twice past the bag's epoch, i.e. after every thread pinned now
        // unpinned (each unpin is ordered before the epoch advance that observes it).
        guard.defer(move || flag.store(true, Ordering::Release));
        // Seal the bag into the global queue now, not when the thread-local bag fills up.
        guard.flush();
    }
    let mut rounds = 0u32;
    // ORDERING: Acquire, see above; Relaxed for `cancel`, which only ends the wait.
    while !passed.load(Ordering::Acquire) {
        if cancel.load(Ordering::Relaxed) {
            return false;
        }
        // Each pin + flush lets this thread try to advance the epoch and run expired bags.
        epoch::pin().flush();
        rounds += 1;
        if rounds < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
    true
}
