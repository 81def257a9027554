//! Per-node writer locks, stored in the node header and tagged with the pool generation.
//!
//! Lock word (`NodeHeader::lock`, 64 bits, one state machine):
//!
//! ```text
//!   value == pool.generation()   held by a thread of this session
//!   any other value              free (0 after a release; an older generation after a crash:
//!                                 a crash never leaves a node locked, nothing to clean up)
//!
//!   free --CAS(v -> gen), Acquire--> held --store(0), Release--> free
//! ```
//!
//! The word is never flushed on purpose; when it reaches PM with another store of the header
//! line, the generation makes it stale at the next open. Readers never take locks.
//!
//! Lock order (deadlock freedom): by level ascending, and within a level left to right. A split
//! holds the node and then locks its parent (and so on up); a merge, at any level, holds the left
//! node, then its right sibling, then their parent, and its cascade continues with the parent
//! (the lower locks released) or, holding the left node, with the parents' level; a root shrink
//! holds the root, releases it and then locks the new root. Moving right at one level releases
//! before locking the next. The one exception, a thread that holds the right sibling of a root
//! whose split it needs installed, only *try*-locks the root; merges therefore never lock the
//! right sibling of a node on the root's level (a pending root split), and the root cannot
//! shrink to the level of a locked node that has a sibling.

use std::sync::atomic::Ordering;

use crate::layout::Node;

/// A held node lock; released on drop, so it cannot be forgotten.
#[derive(Debug)]
pub struct WriteGuard<'a> {
    node: Node<'a>,
}

impl<'a> WriteGuard<'a> {
    /// Spins (then yields) until the lock of `node` is held by this thread.
    pub fn lock(node: Node<'a>, generation: u64) -> WriteGuard<'a> {
        let mut spins = 0u32;
        loop {
            let cur = node.hdr.lock.load(Ordering::Relaxed);
            // ORDERING: Acquire on success; pairs with the Release in `drop`, so the previous
            // holder's stores to the node are visible to this holder.
            if cur != generation
                && node
                    .hdr
                    .lock
                    .compare_exchange(cur, generation, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return WriteGuard { node };
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// One attempt: the guard if the lock was free.
    pub fn try_lock(node: Node<'a>, generation: u64) -> Option<WriteGuard<'a>> {
        let cur = node.hdr.lock.load(Ordering::Relaxed);
        // ORDERING: Acquire on success, as in `lock`.
        (cur != generation
            && node
                .hdr
                .lock
                .compare_exchange(cur, generation, Ordering::Acquire, Ordering::Relaxed)
                .is_ok())
        .then_some(WriteGuard { node })
    }

    /// The locked node.
    #[inline]
    pub fn node(&self) -> Node<'a> {
        self.node
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        // ORDERING: Release; pairs with the Acquire of the next `lock`.
        self.node.hdr.lock.store(0, Ordering::Release);
    }
}
