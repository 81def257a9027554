//! Process-wide dense thread ids and the calling thread's NUMA node.
//!
//! Per-thread arrays (epoch slots, per-thread logs, statistics) are indexed by a small dense id
//! instead of `std::thread::ThreadId`, which is neither small nor reusable. An id is taken on a
//! thread's first [`tid`]/[`try_tid`] call — always the lowest free one — and given back by a
//! thread-local destructor when the thread exits, so a benchmark that spawns thousands of
//! short-lived threads still sees ids below its peak concurrency.

use std::cell::Cell;

use parking_lot::Mutex;

use crate::error::NumaError;

/// How many threads may hold a dense id at once; per-thread arrays can be sized by it.
pub const MAX_THREADS: usize = 1024;

/// The calling thread's identity as far as numakv cares: who it is and where it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadCtx {
    /// Dense thread id, below [`MAX_THREADS`].
    pub tid: usize,
    /// Dense node index the thread was placed on (0 if never placed).
    pub node: usize,
}

const WORDS: usize = MAX_THREADS.div_ceil(64);

/// Bitmap of the ids in use. A mutex is fine: it is taken once per thread lifetime, twice.
static USED: Mutex<[u64; WORDS]> = Mutex::new([0; WORDS]);

/// Takes the lowest free id.
fn allocate() -> Result<usize, NumaError> {
    let mut used = USED.lock();
    for (w, word) in used.iter_mut().enumerate() {
        if *word != u64::MAX {
            let bit = (!*word).trailing_zeros() as usize;
            let id = w * 64 + bit;
            if id >= MAX_THREADS {
                break;
            }
            *word |= 1 << bit;
            return Ok(id);
        }
    }
    Err(NumaError::TooManyThreads { max: MAX_THREADS })
}

/// Gives `id` back.
fn release(id: usize) {
    let mut used = USED.lock();
    if let Some(word) = used.get_mut(id / 64) {
        *word &= !(1u64 << (id % 64));
    }
}

/// Holds the thread's id and returns it to the pool when the thread's locals are destroyed.
struct TidSlot(Cell<Option<usize>>);

impl Drop for TidSlot {
    fn drop(&mut self) {
        if let Some(id) = self.0.take() {
            release(id);
            clear_exit_key();
        }
    }
}

/// A pthread key whose value is non-null while the thread holds an id: the second way an id
/// goes back. A thread whose first call is made from a pthread key destructor (at thread exit,
/// after the thread-locals' destructors ran) registers `TID`'s destructor too late for it to
/// ever run; glibc runs key destructors again, up to `PTHREAD_DESTRUCTOR_ITERATIONS` rounds,
/// while keys still have values, so setting this key there makes the next round release it.
static EXIT_KEY: std::sync::OnceLock<Option<libc::pthread_key_t>> = std::sync::OnceLock::new();

extern "C" fn exit_key_dtor(_value: *mut libc::c_void) {
    // The slot is still readable when its own destructor has not run (that is the case this
    // key exists for); if it has run, it released the id and cleared this key already.
    if let Ok(Some(id)) = TID.try_with(|slot| slot.0.take()) {
        release(id);
    }
}

fn exit_key() -> Option<libc::pthread_key_t> {
    *EXIT_KEY.get_or_init(|| {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: `key` is a valid out-pointer; the destructor is an `extern "C"` fn that never
        // unwinds (it only touches a thread-local with try_with and a mutex).
        (unsafe { libc::pthread_key_create(&mut key, Some(exit_key_dtor)) } == 0).then_some(key)
    })
}

fn set_exit_key() {
    if let Some(key) = exit_key() {
        // SAFETY: a key created by exit_key; the value is only a non-null marker.
        unsafe {
            libc::pthread_setspecific(key, std::ptr::NonNull::<u8>::dangling().as_ptr().cast())
        };
    }
}

fn clear_exit_key() {
    if let Some(Some(key)) = EXIT_KEY.get() {
        // SAFETY: a key created by exit_key.
        unsafe { libc::pthread_setspecific(*key, std::ptr::null()) };
    }
}

thread_local! {
    static TID: TidSlot = const { TidSlot(Cell::new(None)) };
    // No destructor, so reads compile to a plain TLS load.
    static NODE: Cell<usize> = const { Cell::new(0) };
}

/// The calling thread's dense id, allocating it (lowest free id) on first use.
///
/// The id is released automatically when the thread exits, also when the thread's first call
/// is made from a pthread key destructor at its exit (a pthread key of this module releases
/// it then). The main thread's id is never released (its thread-locals are not destroyed),
/// which is harmless.
///
/// # Errors
///
/// [`NumaError::TooManyThreads`] if [`MAX_THREADS`] other threads hold ids;
/// [`NumaError::ThreadExiting`] if called from another thread-local's destructor after this
/// thread's id slot was torn down.
pub fn try_tid() -> Result<usize, NumaError> {
    TID.try_with(|slot| match slot.0.get() {
        Some(id) => Ok(id),
        None => {
            let id = allocate()?;
            slot.0.set(Some(id));
            set_exit_key();
            Ok(id)
        }
    })
    .map_err(|_| NumaError::ThreadExiting)?
}

/// The calling thread's dense id; see [`try_tid`].
///
/// # Panics
///
/// If more than [`MAX_THREADS`] threads would hold an id at once, or if called while this
/// thread's thread-locals are being destroyed. Both are programming errors in a program that
/// sizes its thread pool; use [`try_tid`] to handle them.
pub fn tid() -> usize {
    match try_tid() {
        Ok(id) => id,
        Err(e) => panic!("numakv: cannot give this thread a dense id: {e}"),
    }
}

/// The dense node index this thread was placed on, or 0 if it never was.
///
/// A single thread-local read; meant for hot paths choosing a per-node structure.
#[inline]
pub fn current_node() -> usize {
    NODE.with(Cell::get)
}

/// Overrides the calling thread's node, for tests and emulation;
/// [`Registry::register`](crate::Registry::register) normally sets it.
#[inline]
pub fn set_current_node(node: usize) {
    NODE.with(|n| n.set(node));
}

/// The calling thread's id and node in one value; allocates the id like [`tid`] (and panics like
/// it).
pub fn current() -> ThreadCtx {
    ThreadCtx { tid: tid(), node: current_node() }
}

/// How many ids are currently held, i.e. live threads that have asked for one.
pub fn live_threads() -> usize {
    USED.lock().iter().map(|w| w.count_ones() as usize).sum()
}

/// Serialises the tests that allocate ids, so that their counts of live threads are exact. Tests
/// holding it allocate ids only in threads they join before releasing it.
#[cfg(test)]
pub(crate) static TEST_LOCK: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};
    use std::thread;

    #[test]
    fn ids_are_dense_and_reused() {
        let _guard = TEST_LOCK.lock();
        let before = live_threads();

        // Eight concurrent threads get eight distinct ids.
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let barrier = Arc::clone(&barrier);
                thread::spawn(move || {
                    let id = tid();
                    assert_eq!(try_tid().unwrap(), id, "stable within a thread");
                    barrier.wait();
                    let live = live_threads();
                    barrier.wait();
                    (id, live)
                })
            })
            .collect();
        let mut ids = Vec::new();
        for h in handles {
            let (id, live) = h.join().unwrap();
            assert_eq!(live, before + 8);
            ids.push(id);
        }
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 8);
        assert!(ids.iter().all(|&id| id < before + 8), "dense: {ids:?}");
        assert_eq!(live_threads(), before, "ids released at thread exit");

        // Many short-lived threads in sequence all reuse the same lowest id.
        let first = thread::spawn(tid).join().unwrap();
        for _ in 0..200 {
            assert_eq!(thread::spawn(tid).join().unwrap(), first);
        }
        assert_eq!(live_threads(), before);
    }

    /// A pthread key destructor that makes the thread's first `try_tid` call (at thread exit,
    /// after the thread-locals' destructors ran) must not keep the id for ever.
    #[test]
    fn an_id_first_taken_in_a_key_destructor_is_given_back() {
        extern "C" fn first_call_at_exit(_value: *mut libc::c_void) {
            assert!(try_tid().is_ok());
        }
        let _guard = TEST_LOCK.lock();
        let before = live_threads();
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: a valid out-pointer and an extern "C" destructor.
        assert_eq!(unsafe { libc::pthread_key_create(&mut key, Some(first_call_at_exit)) }, 0);
        for _ in 0..50 {
            thread::spawn(move || {
                // SAFETY: a key created above; the value is only a non-null marker.
                unsafe { libc::pthread_setspecific(key, 8 as *const libc::c_void) };
            })
            .join()
            .unwrap();
        }
        // SAFETY: the key created above, no longer set by any live thread.
        unsafe { libc::pthread_key_delete(key) };
        assert_eq!(live_threads(), before, "ids taken in key destructors were never given back");
    }

    #[test]
    fn current_node_is_per_thread() {
        thread::spawn(|| {
            assert_eq!(current_node(), 0);
            set_current_node(3);
            assert_eq!(current_node(), 3);
            thread::spawn(|| assert_eq!(current_node(), 0)).join().unwrap();
            let _guard = TEST_LOCK.lock();
            let ctx = current();
            assert_eq!(ctx, ThreadCtx { tid: tid(), node: 3 });
        })
        .join()
        .unwrap();
    }

    #[test]
    fn allocator_exhaustion_and_release() {
        // Exercise the bitmap directly: fill every free id, see the error, give them back.
        let _guard = TEST_LOCK.lock();
        let before = live_threads();
        let mut taken = Vec::new();
        while let Ok(id) = allocate() {
            taken.push(id);
        }
        assert_eq!(taken.len() + before, MAX_THREADS);
        assert!(matches!(allocate(), Err(NumaError::TooManyThreads { max: MAX_THREADS })));
        let full = thread::spawn(try_tid).join();
        for id in taken {
            release(id);
        }
        assert!(matches!(full, Ok(Err(NumaError::TooManyThreads { .. }))), "{full:?}");
        assert_eq!(live_threads(), before);
    }
}
