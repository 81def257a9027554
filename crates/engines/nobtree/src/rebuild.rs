//! The dedicated upper-layer rebuild thread (papers/nobtree.txt §IV-B: "If reconstruction is
//! necessary, it is executed in the background (lines 11–13)"; §IV-C).
//!
//! An insert whose walk along the root list pushes Algorithm 3's `average_goes_step` over the
//! threshold only *requests* a rebuild (one atomic swap, then a condvar notify for the first
//! requester); it does not build anything itself. The rebuild thread builds fresh replicas
//! from a snapshot of the current layer and the temporary list without holding the
//! upper-layer mutex, applies the writes made to the layer meanwhile (logged under the mutex),
//! publishes the new descriptor with one pointer swap and retires the old replicas under the
//! epoch ([`Tree::rebuild_snapshot`]). Readers are never blocked: until the swap they search
//! the old replicas, which stay valid (they are freed only after every reader pinned before
//! the swap has left), and anything the old layer misses is found by walking the root list.
//! Writers that insert a new subindex root (or migrate one) during the build write the old
//! layer, as at any time, and wait only for the brief swap.
//!
//! With `NobtreeOptions::background_rebuild = false` the inserting thread that wins `try_lock`
//! rebuilds inline instead (the behaviour before this thread existed; kept for comparison).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use numakv_index::{Error, Result};
use parking_lot::{Condvar, Mutex};

use crate::Tree;

/// The rebuild thread's handle.
#[derive(Debug, Default)]
pub(crate) struct Rebuilder {
    /// Set by a requester, cleared by the thread when it takes the request.
    requested: AtomicBool,
    /// Set while the thread works on a request (for [`Rebuilder::drain`]).
    busy: AtomicBool,
    stop: AtomicBool,
    /// Requests taken (a request with an empty temporary list resets the average instead).
    pub(crate) taken: AtomicU64,
    lock: Mutex<()>,
    wake: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Rebuilder {
    /// Starts the thread (it holds only a weak reference: dropping the tree ends it).
    pub(crate) fn start(&self, tree: &Arc<Tree>) -> Result<()> {
        let weak: Weak<Tree> = Arc::downgrade(tree);
        let h = std::thread::Builder::new()
            .name("nobtree-rebuild".into())
            .spawn(move || run(weak))
            .map_err(|e| Error::Unsupported(format!("cannot start the rebuild thread: {e}")))?;
        *self.thread.lock() = Some(h);
        Ok(())
    }

    /// Asks for a rebuild; cheap when one is already requested.
    #[inline]
    pub(crate) fn request(&self) {
        // ORDERING: AcqRel; the first requester since the thread took the last request wakes
        // it, later ones see `true` and return.
        if !self.requested.swap(true, Ordering::AcqRel) {
            let _g = self.lock.lock();
            self.wake.notify_one();
        }
    }

    /// Stops and joins the thread; idempotent.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        {
            let _g = self.lock.lock();
            self.wake.notify_all();
        }
        let h = self.thread.lock().take();
        if let Some(h) = h {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    /// Whether a rebuild is requested or running (false once the thread is stopped or gone).
    pub(crate) fn pending(&self) -> bool {
        // ORDERING: Acquire; pairs with the Release clearing `busy` (see `drain`).
        let busy = self.requested.load(Ordering::Acquire) || self.busy.load(Ordering::Acquire);
        busy && !self.stop.load(Ordering::Acquire) && self.thread.lock().is_some()
    }

    /// Waits until no rebuild is requested or running (tests, tools).
    pub(crate) fn drain(&self) {
        loop {
            // ORDERING: Acquire; pairs with the Release clearing `busy`, so the rebuild's
            // publication is visible to the caller.
            let idle =
                !self.requested.load(Ordering::Acquire) && !self.busy.load(Ordering::Acquire);
            if idle || self.stop.load(Ordering::Acquire) || self.thread.lock().is_none() {
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// The thread's loop.
fn run(tree: Weak<Tree>) {
    loop {
        let Some(t) = tree.upgrade() else { return };
        let Some(r) = t.rebuilder.as_ref() else { return };
        if r.stop.load(Ordering::Acquire) {
            return;
        }
        {
            let mut g = r.lock.lock();
            if !r.requested.load(Ordering::Acquire) && !r.stop.load(Ordering::Acquire) {
                r.wake.wait_for(&mut g, Duration::from_millis(50));
            }
        }
        // ORDERING: `busy` is set before the request is taken, so `drain` never sees both clear
        // while a request is pending or being served.
        r.busy.store(true, Ordering::Release);
        if r.requested.swap(false, Ordering::AcqRel) && !r.stop.load(Ordering::Acquire) {
            r.taken.fetch_add(1, Ordering::Relaxed);
            // An empty temporary list: nothing the current layer lacks (the walks came from
            // roots between their commit and their upper insert); the average restarts.
            // Out of space: skipped; the old layer and the temporary list stay.
            let _ = t.rebuild_upper(false);
        }
        // The rebuild's PM lines go into the thread's published totals before `busy` clears
        // (docs/design.md §11).
        numakv_pmem::account::op_split();
        r.busy.store(false, Ordering::Release);
        drop(t);
    }
}
