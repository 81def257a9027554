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
//!
//! **Asymmetric fences.** Operations are many and switches rare, so where Linux offers
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` the operation's fence is only a compiler fence
//! and the switch's fence is the system call, which makes every running thread of the process
//! execute a full barrier: the Dekker argument above holds with the heavy barrier on one side
//! (as in liburcu and Folly's asymmetric fences). This saved the one full fence Nap added to
//! every operation (~2% of a uniform YCSB-A run's cycles). Elsewhere both sides use a SeqCst
//! fence, as before.

use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use numakv_index::{Error, Result};
use numakv_pmem::numa::{self, MAX_THREADS};

use crate::nal::Nal;

/// Asymmetric fences (module docs): `light` on the operations' side, `heavy` on the switch's.
mod barrier {
    use std::sync::atomic::{compiler_fence, fence, Ordering};
    use std::sync::OnceLock;

    /// From linux/membarrier.h.
    #[cfg(target_os = "linux")]
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    #[cfg(target_os = "linux")]
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    /// Whether this process registered for private expedited membarriers (decided once,
    /// before any `Grace` exists, and never changed: a `light` fence is only a compiler fence
    /// if every `heavy` one is the system call).
    pub(super) fn asymmetric() -> bool {
        static REGISTERED: OnceLock<bool> = OnceLock::new();
        *REGISTERED.get_or_init(|| {
            #[cfg(target_os = "linux")]
            {
                // SAFETY: membarrier takes two integers and touches no memory of ours; failure
                // (old kernel, seccomp) leaves nothing to undo.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_membarrier,
                        MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
                        0,
                    )
                };
                r == 0
            }
            #[cfg(not(target_os = "linux"))]
            {
                false
            }
        })
    }

    /// The operations' side: orders their `running` store before their later loads.
    #[inline(always)]
    pub(super) fn light(asymmetric: bool) {
        if asymmetric {
            // ORDERING: the switch's membarrier supplies the hardware barrier (module docs);
            // the compiler must still not move the accesses across this point.
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
    }

    /// The switch's side: a barrier on every running thread of the process.
    pub(super) fn heavy(asymmetric: bool) {
        // ORDERING: our own earlier stores before the barrier, our later loads after it.
        fence(Ordering::SeqCst);
        #[cfg(target_os = "linux")]
        if asymmetric {
            // SAFETY: as in `asymmetric`.
            let r =
                unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) };
            // Registered (asymmetric is true): the only documented failures are for an
            // unregistered process or an unknown command, neither of which can happen here;
            // carrying on would leave the operations without their barrier.
            assert_eq!(
                r,
                0,
                "membarrier failed after registration: {}",
                std::io::Error::last_os_error()
            );
            fence(Ordering::SeqCst);
        }
        #[cfg(not(target_os = "linux"))]
        let _ = asymmetric;
    }
}

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
    /// Whether the fences are asymmetric ([`barrier::asymmetric`], fixed for the process).
    asymmetric: bool,
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
            asymmetric: barrier::asymmetric(),
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
            // ORDERING: SeqCst fence (or its light half): the `running` store is ordered before
            // the pointer loads below and the `blocked` load (store→load); pairs with the
            // (heavy) fence in `wait_grace_period` (see the module docs).
            barrier::light(self.asymmetric);
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
        // ORDERING: SeqCst (heavy) fence pairs with the one in `begin` (module docs).
        barrier::heavy(self.asymmetric);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::barrier;

    /// Store buffering (Dekker) litmus: the operation side stores `x` then loads `y` across
    /// `op_fence`, the switch side stores `y` then loads `x` across `switch_fence`. Both loads
    /// missing the other side's store would let an operation miss a switch that also missed
    /// it. Returns the rounds where that happened. The sides start each round by spinning on
    /// one counter, so their accesses overlap (the reordering shows up with no fences).
    fn store_buffering(op_fence: impl Fn() + Sync, switch_fence: impl Fn(), rounds: u64) -> u64 {
        let (x, y) = (AtomicU64::new(0), AtomicU64::new(0));
        let (go, seen) = (AtomicU64::new(0), AtomicU64::new(0));
        let mut both_missed = 0;
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 1..=rounds {
                    while go.load(Ordering::Acquire) != i {
                        std::hint::spin_loop();
                    }
                    x.store(i, Ordering::Relaxed);
                    op_fence();
                    let r1 = y.load(Ordering::Relaxed);
                    // ORDERING: Release; hands r1 (packed with the round) to the main side.
                    seen.store(i << 1 | u64::from(r1 < i), Ordering::Release);
                }
            });
            for i in 1..=rounds {
                go.store(i, Ordering::Release);
                y.store(i, Ordering::Relaxed);
                switch_fence();
                let r2_missed = x.load(Ordering::Relaxed) < i;
                let r1_missed = loop {
                    let v = seen.load(Ordering::Acquire);
                    if v >> 1 == i {
                        break v & 1 == 1;
                    }
                    std::hint::spin_loop();
                };
                both_missed += u64::from(r1_missed && r2_missed);
            }
        });
        both_missed
    }

    #[test]
    fn light_and_heavy_fences_forbid_store_buffering() {
        let asym = barrier::asymmetric();
        // Whichever mode this process got (the membarrier system call, or SeqCst fences where
        // it is unavailable), and the fallback mode explicitly.
        assert_eq!(store_buffering(|| barrier::light(asym), || barrier::heavy(asym), 20_000), 0);
        assert_eq!(store_buffering(|| barrier::light(false), || barrier::heavy(false), 100_000), 0);
    }

    #[test]
    fn the_litmus_sees_store_buffering_without_fences() {
        // The check above can fail: with compiler fences alone the hardware reorders. (x86 and
        // ARM both allow store buffering; a few of 200K rounds is typical here. Where a machine
        // happens to show none, this only asks for one round in 200K, and retries.)
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return; // one CPU: the two sides never overlap, there is nothing to see
        }
        let none = || std::sync::atomic::compiler_fence(Ordering::SeqCst);
        let seen = (0..5).map(|_| store_buffering(none, none, 200_000)).find(|&n| n > 0);
        eprintln!("store buffering without fences: {seen:?} of 200000 rounds");
        assert!(seen.is_some(), "no store buffering seen without fences");
    }
}
