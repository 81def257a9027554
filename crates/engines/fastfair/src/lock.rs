//! Per-node writer locks, stored in the node header and tagged with the pool generation.
//!
//! Lock word (`NodeHeader::lock`, 64 bits, one state machine):
//!
//! ```text
//!   bit 63      RELEASED: set by a release in this generation
//!   bits 0..63  a pool generation (bit 63 of a generation is ignored)
//!
//!   value == gen               held by a thread of this session (gen = pool.generation())
//!   value == gen | RELEASED    free, and released by a writer of this session: the node holds
//!                              no crash residue (see below)
//!   any other value            free (0: a new node, or released by a panicking holder; an
//!                              older generation, with or without RELEASED, after a crash or a
//!                              reopen: a crash never leaves a node locked, nothing to clean up)
//!
//!   free --CAS(v -> gen), Acquire--> held --store(gen | RELEASED), Release--> free (clean)
//! ```
//!
//! Why RELEASED means clean: writers repair a node they lock ([`FastFair::repair_entries`]:
//! hidden slots, duplicates and entries past the high key that a crash left); within a session
//! those states exist only under the lock of the writer whose shift or split makes them, and are
//! gone when it releases. So a node released in this generation needs no repair scan, and
//! `repair_entries` skips the scan (a whole-node pass, ~16% of an insert's instructions) when
//! the guard found the word at `gen | RELEASED`. A holder that unwinds from a panic may leave a
//! shift half done: its guard releases to 0, so the next writer repairs.
//!
//! The word is never flushed on purpose; when it reaches PM with another store of the header
//! line, the generation makes it stale at the next open. Readers never take locks.
//!
//! [`FastFair::repair_entries`]: crate::FastFair
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

/// Bit 63 of the lock word: released by a writer of the generation in bits 0..63.
const RELEASED: u64 = 1 << 63;

/// A held node lock; released on drop, so it cannot be forgotten.
#[derive(Debug)]
pub struct WriteGuard<'a> {
    node: Node<'a>,
    generation: u64,
    /// The word was `generation | RELEASED` when taken: no crash residue in the node.
    released_clean: bool,
}

impl<'a> WriteGuard<'a> {
    /// Spins (then yields) until the lock of `node` is held by this thread.
    pub fn lock(node: Node<'a>, generation: u64) -> WriteGuard<'a> {
        // A (corrupted) generation with bit 63 set is used without it: held must differ from
        // released.
        let generation = generation & !RELEASED;
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
                return WriteGuard {
                    node,
                    generation,
                    released_clean: cur == generation | RELEASED,
                };
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
        let generation = generation & !RELEASED;
        let cur = node.hdr.lock.load(Ordering::Relaxed);
        // ORDERING: Acquire on success, as in `lock`.
        (cur != generation
            && node
                .hdr
                .lock
                .compare_exchange(cur, generation, Ordering::Acquire, Ordering::Relaxed)
                .is_ok())
        .then(|| WriteGuard { node, generation, released_clean: cur == generation | RELEASED })
    }

    /// The locked node.
    #[inline]
    pub fn node(&self) -> Node<'a> {
        self.node
    }

    /// Whether the node was last released by a writer of this session (so it holds no crash
    /// residue: see the module docs).
    #[inline]
    pub fn released_clean(&self) -> bool {
        self.released_clean
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        // A panic may have interrupted a shift: release without the clean mark.
        let word = if std::thread::panicking() { 0 } else { self.generation | RELEASED };
        // ORDERING: Release; pairs with the Acquire of the next `lock`.
        self.node.hdr.lock.store(word, Ordering::Release);
    }
}
