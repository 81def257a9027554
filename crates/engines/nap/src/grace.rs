//! The access threads' published states and the `(cur_NAL, pre_NAL)` seqlock (papers/nap.txt
//! §4.5): what lets the switch thread know that every thread has seen a new pair of pointers.
//!
//! **Slot word** (one per dense thread id, own cache line):
//!
//! ```text
//! bit 0      running: the thread is inside an index operation
//! bits 1..64 cnt: operations the thread has started (wraps)
//! ```
//!
//! An operation stores `(cnt + 1) << 1 | 1`, then a SeqCst fence, then reads the pointers under
//! the seqlock; it ends by storing `cnt << 1`. The switch publishes new pointers, issues a SeqCst
//! fence, then waits for each slot that shows `running` until its word changes (the operation
//! ended or another began). Dekker argument: for an operation whose `running` store the switch
//! did not see, the fences order the switch's publication before the operation's pointer reads,
//! so it sees the new pointers; an operation the switch did see has ended before the wait ends.

use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use numakv_index::{Error, Result};
use numakv_pmem::numa::{self, MAX_THREADS};

use crate::nal::Nal;

/// The pointer pair an operation works with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Snapshot<'a> {
    pub cur: Option<&'a Nal>,
    pub pre: Option<&'a Nal>,
}

/// Per-thread slots, the seqlock and the two DRAM pointers.
#[derive(Debug)]
pub(crate) struct Grace {
    slots: Box<[CachePadded<AtomicU64>]>,
    seq: CachePadded<AtomicU64>,
    cur: AtomicPtr<Nal>,
    pre: AtomicPtr<Nal>,
    /// The NAL whose first grace period has not passed yet (null: none). Blocked writers wait
    /// on this word rather than on the NAL, which they must not dereference outside an
    /// operation.
    unwritable: AtomicPtr<Nal>,
    /// Global-lock switch mode ([`crate::SwitchMode::GlobalLock`]): set while a switch runs;
    /// operations do not start meanwhile. The per-thread slots are the per-core reader
    /// indicators of the paper's contrast (§6.5), this flag the writer's.
    blocked: CachePadded<AtomicBool>,
}

/// An operation in progress; ends it (clears `running`) when dropped.
#[derive(Debug)]
pub(crate) struct OpGuard<'a> {
    slot: &'a AtomicU64,
    word: u64,
    /// Operations this thread has started (for sampling).
    pub count: u64,
    /// The thread's dense id.
    pub tid: usize,
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        // ORDERING: Release: the operation's reads of the NALs happen before the switch sees it
        // finished (pairs with the Acquire loads in `wait_grace_period`).
        self.slot.store(self.word & !1, Ordering::Release);
    }
}

impl Grace {
    pub fn new() -> Grace {
        Grace {
            slots: (0..MAX_THREADS).map(|_| CachePadded::new(AtomicU64::new(0))).collect(),
            seq: CachePadded::new(AtomicU64::new(0)),
            cur: AtomicPtr::new(std::ptr::null_mut()),
            pre: AtomicPtr::new(std::ptr::null_mut()),
            unwritable: AtomicPtr::new(std::ptr::null_mut()),
            blocked: CachePadded::new(AtomicBool::new(false)),
        }
    }

    /// Starts an operation: publishes `running`, then takes a consistent snapshot of the
    /// pointers. The NALs in the snapshot stay allocated until the guard is dropped.
    #[inline]
    pub fn begin(&self) -> Result<(OpGuard<'_>, Snapshot<'_>)> {
        let tid = numa::try_tid().map_err(|e| Error::Unsupported(format!("nap: {e}")))?;
        let slot = &self.slots[tid];
        // ORDERING: only this thread writes its slot.
        let cnt = (slot.load(Ordering::Relaxed) >> 1).wrapping_add(1);
        let word = (cnt << 1) | 1;
        loop {
            slot.store(word, Ordering::Relaxed);
            // ORDERING: SeqCst fence: the `running` store is ordered before the pointer loads
            // below and the `blocked` load (store→load); pairs with the fence in
            // `wait_grace_period` (see the module docs).
            fence(Ordering::SeqCst);
            // ORDERING: Relaxed after the fence: either the blocking switch sees `running` in
            // its grace period and waits for us, or we see `blocked` here (Dekker, as above).
            if !self.blocked.load(Ordering::Relaxed) {
                break;
            }
            // A global-lock switch runs: step back (so it does not wait for us) until it ends.
            // ORDERING: Release, as in OpGuard::drop.
            slot.store(word & !1, Ordering::Release);
            let mut spins = 0u32;
            // ORDERING: Acquire pairs with the Release in `unblock`: the switch's pointer
            // publication is visible to the operation that follows.
            while self.blocked.load(Ordering::Acquire) {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else if spins < 1_000 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
            }
        }
        let guard = OpGuard { slot, word, count: cnt, tid };
        let snap = self.snapshot();
        Ok((guard, snap))
    }

    /// Reads `(cur, pre)` under the seqlock.
    #[inline]
    fn snapshot(&self) -> Snapshot<'_> {
        loop {
            // ORDERING: Acquire pairs with the Release that closes a write section.
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            // ORDERING: Acquire: the NAL behind a pointer is fully built before it is read.
            let cur = self.cur.load(Ordering::Acquire);
            let pre = self.pre.load(Ordering::Acquire);
            // ORDERING: the pointer loads complete before the second sequence read.
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                // SAFETY: the caller holds an OpGuard with `running` published before these
                // loads; a NAL is freed only after it was unpublished and a grace period passed,
                // which waits for this operation to end.
                return Snapshot { cur: unsafe { cur.as_ref() }, pre: unsafe { pre.as_ref() } };
            }
        }
    }

    /// The current raw pointers (switch thread only).
    pub fn pointers(&self) -> (*mut Nal, *mut Nal) {
        // ORDERING: only the switch thread writes them; it reads its own stores.
        (self.cur.load(Ordering::Acquire), self.pre.load(Ordering::Acquire))
    }

    /// Whether `pre` is still `p` (a blocked writer's wake-up test).
    pub fn pre_is(&self, p: *const Nal) -> bool {
        // ORDERING: Acquire pairs with the Release publication in `publish`.
        std::ptr::eq(self.pre.load(Ordering::Acquire), p)
    }

    /// Marks `nal` as not writable yet (before it is published) or, with null, every NAL as
    /// writable (after the first grace period).
    pub fn set_unwritable(&self, nal: *mut Nal) {
        // ORDERING: Release pairs with the Acquire in `is_unwritable`: the NAL's `writable`
        // flag, set before this store clears the word, is seen by a waiter that sees null.
        self.unwritable.store(nal, Ordering::Release);
    }

    /// Whether `nal` still waits for its first grace period.
    pub fn is_unwritable(&self, nal: *const Nal) -> bool {
        // ORDERING: Acquire; see `set_unwritable`.
        std::ptr::eq(self.unwritable.load(Ordering::Acquire), nal)
    }

    /// Publishes a new pair under the seqlock (switch thread only; switches are serialised).
    pub fn publish(&self, cur: *mut Nal, pre: *mut Nal) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s + 1, Ordering::Relaxed);
        // ORDERING: the odd sequence is visible before the pointer stores (writer side of the
        // seqlock).
        fence(Ordering::Release);
        self.cur.store(cur, Ordering::Release);
        self.pre.store(pre, Ordering::Release);
        // ORDERING: Release: a reader that sees the even sequence sees both pointers.
        self.seq.store(s + 2, Ordering::Release);
    }

    /// Global-lock mode: stops new operations and waits until every running one has ended (the
    /// writer side of the global readers-writer lock). Switch thread only, under the switch lock.
    pub fn block(&self) {
        // ORDERING: the store is ordered before the slot loads by the SeqCst fence at the start
        // of `wait_grace_period` (Dekker with `begin`).
        self.blocked.store(true, Ordering::Relaxed);
        self.wait_grace_period();
    }

    /// Lets operations run again after [`Grace::block`].
    pub fn unblock(&self) {
        // ORDERING: Release: everything the switch did is visible to operations that see the
        // flag cleared (Acquire in `begin`).
        self.blocked.store(false, Ordering::Release);
    }

    /// Waits until every operation that might have read the pointers before the last `publish`
    /// has ended (the grace period of §4.5).
    pub fn wait_grace_period(&self) {
        // ORDERING: SeqCst fence pairs with the one in `begin` (module docs).
        fence(Ordering::SeqCst);
        let busy: Vec<(usize, u64)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let w = s.load(Ordering::Acquire);
                (w & 1 == 1).then_some((i, w))
            })
            .collect();
        for (i, w) in busy {
            let mut spins = 0u32;
            // ORDERING: Acquire pairs with the Release in OpGuard::drop.
            while self.slots[i].load(Ordering::Acquire) == w {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }
}

impl Drop for Grace {
    fn drop(&mut self) {
        let (cur, pre) = (*self.cur.get_mut(), *self.pre.get_mut());
        for p in [cur, pre] {
            if !p.is_null() {
                // SAFETY: the handle is gone (`&mut self`): no operation or switch can hold the
                // NALs; each was installed with Box::into_raw and cur ≠ pre.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}
