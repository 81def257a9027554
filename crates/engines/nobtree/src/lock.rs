//! The node version as a seqlock: writers lock a node, readers validate (Algorithms 2 and 4).
//!
//! The 48-bit `version` of a node's `state` word (bits 16..64) is the whole concurrency
//! control; its low bit is the lock:
//!
//! ```text
//!   even v   free        --CAS(v -> v+1), Acquire-->  odd v+1  held by one writer
//!   odd v+1  held        --store(v+2), Release----->  even v+2 free, contents changed
//! ```
//!
//! While holding a node the writer alone stores to `state` (counter and sib_ver bytes, version
//! kept odd). A reader takes a snapshot of `state` (retrying while it is odd), reads, and
//! validates that `state` is unchanged: any write in between moved the version. The version
//! reaches PM with the header line whenever a writer persists it, so a crash may leave an odd
//! version behind; recovery (which visits every node for NSM's garbage collection anyway)
//! unlocks them — a crash never leaves a node locked for the next session.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::Instant;

use crate::layout::{st_locked, Node, VERSION_ONE};

/// Writers that found their node frozen by a migration and waited for it: how many waits,
/// their nanoseconds together, the longest. Process-wide (a lock knows no tree); a tree
/// reports them since its creation (`Tree::frozen_waits`). Touched only on the waiting path.
pub(crate) static FROZEN_WAITS: AtomicU64 = AtomicU64::new(0);
pub(crate) static FROZEN_WAIT_NS: AtomicU64 = AtomicU64::new(0);
pub(crate) static FROZEN_WAIT_MAX_NS: AtomicU64 = AtomicU64::new(0);

/// Counts one writer's wait for a frozen node that began at `since`.
#[cold]
fn waited(since: Instant) {
    let ns = since.elapsed().as_nanos() as u64;
    FROZEN_WAITS.fetch_add(1, Ordering::Relaxed);
    FROZEN_WAIT_NS.fetch_add(ns, Ordering::Relaxed);
    FROZEN_WAIT_MAX_NS.fetch_max(ns, Ordering::Relaxed);
}

/// A held node lock; released on drop (version + 1), so it cannot be forgotten.
#[derive(Debug)]
pub struct WriteGuard<'a> {
    node: Node<'a>,
}

impl<'a> WriteGuard<'a> {
    /// Spins (then yields) until this thread holds `node` and no migration has it frozen
    /// (a frozen node's lock is released at once and waited for again: a migration copying
    /// it must see it unchanged). Callers hold no other node lock that a migration could need
    /// (see [`WriteGuard::lock_unless_frozen`] for those that do).
    pub fn lock(node: Node<'a>) -> WriteGuard<'a> {
        let mut spins = 0u32;
        let mut frozen_since = None;
        loop {
            // A frozen node is not even locked while it stays frozen: every lock and unlock
            // moves its version and would send its readers (which a freeze lets through) back
            // to retry.
            if !node.is_frozen() {
                if let Some(g) = Self::try_lock(node) {
                    if !node.is_frozen() {
                        if let Some(t) = frozen_since {
                            waited(t);
                        }
                        return g;
                    }
                    drop(g);
                }
            }
            if frozen_since.is_none() && node.is_frozen() {
                frozen_since = Some(Instant::now());
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// As [`WriteGuard::lock`], but `None` when a migration has the node frozen: for a
    /// thread that already holds a node the migration may need (a merge holding the left
    /// node — the migrated node's previous sibling — must not wait for it).
    pub fn lock_unless_frozen(node: Node<'a>) -> Option<WriteGuard<'a>> {
        let mut spins = 0u32;
        loop {
            if node.is_frozen() {
                return None;
            }
            if let Some(g) = Self::try_lock(node) {
                return (!node.is_frozen()).then_some(g);
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// One attempt.
    pub fn try_lock(node: Node<'a>) -> Option<WriteGuard<'a>> {
        let s = node.hdr.state.load(Ordering::Relaxed);
        if st_locked(s) {
            return None;
        }
        // ORDERING: Acquire on success; pairs with the Release of the previous unlock, so the
        // previous holder's stores are visible.
        node.hdr
            .state
            .compare_exchange(s, s + VERSION_ONE, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        // ORDERING: Release fence; orders the odd version before every store this writer makes
        // to the node, pairing with the Acquire fence in `ReadSnapshot::validate` (seqlock).
        fence(Ordering::Release);
        Some(WriteGuard { node })
    }

    /// The locked node.
    #[inline]
    pub fn node(&self) -> Node<'a> {
        self.node
    }

    /// Stores a new state word (counter / sib_ver changed; the version stays odd).
    pub fn set_state(&self, s: u64) {
        debug_assert!(st_locked(s));
        // ORDERING: Release; a reader that sees the new sib_ver sees the sibling pointer stored
        // before it.
        self.node.hdr.state.store(s, Ordering::Release);
    }

    /// The current state word (odd version).
    pub fn state(&self) -> u64 {
        self.node.hdr.state.load(Ordering::Relaxed)
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        let s = self.node.hdr.state.load(Ordering::Relaxed);
        // ORDERING: Release; pairs with the Acquire of readers' snapshots and the next lock.
        self.node.hdr.state.store(s.wrapping_add(VERSION_ONE), Ordering::Release);
    }
}

/// An optimistic read of a node: the state snapshot it must still match.
#[derive(Clone, Copy, Debug)]
pub struct ReadSnapshot {
    /// The state word at the start (even version).
    pub state: u64,
}

impl ReadSnapshot {
    /// Waits until the node is unlocked and snapshots its state.
    #[inline]
    pub fn begin(node: &Node<'_>) -> ReadSnapshot {
        let mut spins = 0u32;
        loop {
            let s = node.state();
            if !st_locked(s) {
                return ReadSnapshot { state: s };
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// True when nothing was written to the node since [`ReadSnapshot::begin`].
    #[inline]
    #[must_use]
    pub fn validate(&self, node: &Node<'_>) -> bool {
        // ORDERING: Acquire fence; the reads of the node happen before the re-read of the
        // state (seqlock; pairs with the Release fence after locking).
        fence(Ordering::Acquire);
        node.hdr.state.load(Ordering::Relaxed) == self.state
    }
}
