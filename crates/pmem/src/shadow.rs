//! ADR shadow mode: power-failure simulation at cache-line granularity.
//!
//! The pool's working memory is a private (copy-on-write) mapping of each node file; the file's
//! shared mapping is the *durable image*. A flush captures the line's current 64 bytes into the
//! flushing thread's pending list; the thread's next fence copies its pending lines into the image.
//! A crash ([`Pool::crash`](crate::Pool::crash)) freezes the image, optionally after
//! - applying each still-pending (flushed, not yet fenced) line with probability
//!   `pending_survival` — such a line may or may not have reached the persistence domain — and
//! - copying each dirty line (working ≠ image) with probability `dirty_eviction` — the cache may
//!   have evicted it on its own;
//!
//! and abandons the working memory. Reopening the store then sees exactly the crashed image.
//! In eADR mode every globally visible store is durable, so a crash copies the whole working memory.
//!
//! Crashes can also be scheduled: [`Pool::crash_after_fences`](crate::Pool::crash_after_fences)
//! crashes *during* the N-th fence from now (its lines still pending), so a test can crash at every
//! persistence point of an operation, on either side of each fence.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::map::Mapping;
use crate::persist::LINE;

/// How a simulated crash treats state that was not yet durable.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrashOptions {
    /// Probability that a flushed but unfenced line reaches the image anyway.
    pub pending_survival: f64,
    /// Probability that a dirty (modified, not persisted) line was evicted to the image.
    pub dirty_eviction: f64,
    /// Seed of the random choices, so a failing crash can be replayed.
    pub seed: u64,
}

impl CrashOptions {
    /// Only fenced lines survive: the strictest ADR power failure.
    pub const STRICT: CrashOptions =
        CrashOptions { pending_survival: 0.0, dirty_eviction: 0.0, seed: 0 };

    /// Random survival of pending lines and random eviction of dirty lines, both with
    /// probability one half, from `seed`.
    pub fn random(seed: u64) -> CrashOptions {
        CrashOptions { pending_survival: 0.5, dirty_eviction: 0.5, seed }
    }
}

impl Default for CrashOptions {
    fn default() -> Self {
        Self::STRICT
    }
}

/// One captured line: node, line offset in the node file, contents at flush time, and the global
/// capture sequence number that orders it against every other capture of the same line.
struct PendingLine {
    node: usize,
    offset: usize,
    data: [u8; LINE],
    seq: u64,
}

/// What a finished crash did, for tests and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashReport {
    /// Flushed-but-unfenced lines that were applied.
    pub pending_applied: usize,
    /// Flushed-but-unfenced lines that were dropped.
    pub pending_dropped: usize,
    /// Dirty lines copied to the image.
    pub dirty_evicted: usize,
    /// Dirty lines lost.
    pub dirty_lost: usize,
}

pub(crate) struct Shadow {
    /// Per node: the shared mapping of the file, i.e. the durable image.
    images: Vec<Mapping>,
    /// Per dense thread id: lines flushed and not yet fenced.
    pending: Box<[Mutex<Vec<PendingLine>>]>,
    /// Serialises image updates against a crash freezing the image, and holds, per line written
    /// to the image, the sequence number of the capture (or eviction) that wrote it.
    ///
    /// Real hardware writes back a line's *current* contents, so a durable line never goes back
    /// in time: once thread B has flushed and fenced its word in a line, thread A's older capture
    /// of the same line (flushed before B's store, fenced after) must not overwrite it. A capture
    /// is therefore applied only if it is newer than what the image line already holds.
    image_lock: Mutex<HashMap<(usize, usize), u64>>,
    /// Source of capture sequence numbers.
    seq: AtomicU64,
    frozen: AtomicBool,
    /// Fences left before a scheduled crash; negative when none is scheduled.
    countdown: AtomicI64,
    scheduled: Mutex<CrashOptions>,
    crashes: AtomicU64,
    /// Fences seen (for [`crate::Pool::fence_count`]).
    fences: AtomicU64,
    eadr: bool,
}

impl std::fmt::Debug for Shadow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shadow")
            .field("nodes", &self.images.len())
            .field("frozen", &self.frozen.load(Ordering::Relaxed))
            .finish()
    }
}

/// Copies one line from `src` to `dst` with 8-byte atomic loads, so that reading a line another
/// thread is writing is not a data race (all PM writers use atomics or guarded byte views).
///
/// # Safety
/// Both pointers must be 64-byte aligned and valid for 64 bytes.
unsafe fn copy_line(src: *const u8, dst: *mut u8) {
    // SAFETY: per the caller's contract.
    let line = unsafe { read_line_stable(src) };
    for (w, chunk) in line.chunks_exact(8).enumerate() {
        let v = u64::from_ne_bytes(chunk.try_into().expect("8-byte chunk"));
        // SAFETY: aligned, in-bounds words per the caller's contract; AtomicU64 has the layout
        // of u64.
        unsafe { (*(dst.add(w * 8) as *const AtomicU64)).store(v, Ordering::Relaxed) };
    }
}

/// Reads a line that other threads may be writing as one consistent snapshot, as the hardware
/// writes a line back at one instant: word-by-word reads racing a writer could combine a later
/// store with a missing earlier one (a state that never existed, e.g. a FAST slot's new value
/// beside its old key). Re-reads until two consecutive reads agree (bounded; a line rewritten
/// that fast is taken as last read).
///
/// # Safety
/// `src` must be 64-byte aligned and valid for 64 bytes.
unsafe fn read_line_stable(src: *const u8) -> [u8; LINE] {
    // SAFETY: per the caller's contract.
    let mut last = unsafe { read_line(src) };
    for _ in 0..1_000 {
        // SAFETY: per the caller's contract.
        let again = unsafe { read_line(src) };
        if again == last {
            break;
        }
        last = again;
    }
    last
}

/// Reads one line into a buffer, as `copy_line`.
///
/// # Safety
/// `src` must be 64-byte aligned and valid for 64 bytes.
unsafe fn read_line(src: *const u8) -> [u8; LINE] {
    let mut out = [0u8; LINE];
    for w in 0..LINE / 8 {
        // SAFETY: per the caller's contract.
        let v = unsafe { (*(src.add(w * 8) as *const AtomicU64)).load(Ordering::Relaxed) };
        out[w * 8..w * 8 + 8].copy_from_slice(&v.to_ne_bytes());
    }
    out
}

impl Shadow {
    pub(crate) fn new(images: Vec<Mapping>, eadr: bool) -> Shadow {
        // One list per dense thread id, plus one for threads without an id (see `slot`).
        let pending = (0..=numakv_numa::MAX_THREADS).map(|_| Mutex::new(Vec::new())).collect();
        Shadow {
            images,
            pending,
            image_lock: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(1),
            frozen: AtomicBool::new(false),
            countdown: AtomicI64::new(-1),
            scheduled: Mutex::new(CrashOptions::STRICT),
            crashes: AtomicU64::new(0),
            fences: AtomicU64::new(0),
            eadr,
        }
    }

    pub(crate) fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::Acquire)
    }

    /// The calling thread's pending list. A thread whose dense id is gone — one running
    /// deferred frees from crossbeam-epoch's handle destructor as it exits, after its id slot
    /// was torn down — shares the extra last list (`tid()` would panic there, and a panic in a
    /// thread-local destructor aborts the process).
    fn slot() -> usize {
        numakv_numa::try_tid().unwrap_or(numakv_numa::MAX_THREADS)
    }

    /// Captures the lines of `[offset, offset+len)` of `node`'s working memory at `work_base`.
    pub(crate) fn capture(&self, node: usize, work_base: *const u8, offset: usize, len: usize) {
        if self.is_frozen() {
            return;
        }
        let mut pending = self.pending[Self::slot()].lock();
        for line in crate::persist::lines(offset, len) {
            // SAFETY: the pool checked that the range lies inside node `node`'s mapping, whose
            // base is 4 KiB aligned, so `line` is a 64-byte aligned in-bounds line.
            let data = unsafe { read_line(work_base.add(line)) };
            // ORDERING: Relaxed; the number only has to be unique and increase along each
            // line's capture history, which the atomic RMW order on one counter gives.
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            pending.push(PendingLine { node, offset: line, data, seq });
        }
    }

    /// The calling thread's fence: its pending lines reach the image. Returns true when this
    /// fence triggered a scheduled crash.
    pub(crate) fn fence(&self, work: &[*const u8]) -> bool {
        // ORDERING: Relaxed; a statistic read after the fencing threads were joined.
        self.fences.fetch_add(1, Ordering::Relaxed);
        // A scheduled crash fires *during* the fence that brings the countdown from 1 to 0: the
        // power fails while this fence waits, so its lines are still pending and reach the image
        // only with probability `pending_survival` — the crash lands between a flush and its
        // fence, the window ADR protocols must tolerate.
        // ORDERING: AcqRel on the countdown so exactly one thread observes the 1 → 0 step.
        if self.countdown.load(Ordering::Relaxed) > 0
            && self.countdown.fetch_sub(1, Ordering::AcqRel) == 1
        {
            let opts = *self.scheduled.lock();
            self.crash(work, opts);
            return true;
        }
        if self.is_frozen() {
            // Another thread is simulating the power failure, evicting dirty lines while it
            // holds the image lock. On a real machine everything stops at that instant; here
            // other threads keep running, so a fence must not complete until the image is
            // final — else the thread would go on to store lines it believes are ordered after
            // durable ones, and the eviction could capture those later stores without the earlier
            // ones (a state no power failure produces).
            drop(self.image_lock.lock());
            return false;
        }
        let lines = std::mem::take(&mut *self.pending[Self::slot()].lock());
        if !lines.is_empty() {
            let mut written = self.image_lock.lock();
            if !self.is_frozen() {
                for l in &lines {
                    self.apply(&mut written, l);
                }
            }
        }
        false
    }

    /// Writes a captured line to the image unless the image already holds a newer capture of it.
    fn apply(&self, written: &mut HashMap<(usize, usize), u64>, l: &PendingLine) -> bool {
        let last = written.entry((l.node, l.offset)).or_insert(0);
        if *last > l.seq {
            return false;
        }
        *last = l.seq;
        // SAFETY: `l.offset` is an aligned line inside the node file, which both mappings
        // cover entirely; the caller holds the image lock, excluding a concurrent crash.
        unsafe {
            std::ptr::copy_nonoverlapping(
                l.data.as_ptr(),
                self.images[l.node].ptr().add(l.offset),
                LINE,
            )
        };
        true
    }

    pub(crate) fn schedule(&self, fences: u64, opts: CrashOptions) {
        *self.scheduled.lock() = opts;
        self.countdown.store(fences.min(i64::MAX as u64) as i64, Ordering::Release);
    }

    /// Cancels a scheduled crash; false when it has fired or is firing (the countdown reached
    /// 0 in some thread's fence: that thread is freezing the image now) or the image is frozen.
    pub(crate) fn cancel_scheduled(&self) -> bool {
        // ORDERING: AcqRel, as the fence's decrement: either the swap sees the 1 → 0 step of a
        // firing fence, or that fence's decrement sees -1 and does not fire.
        let old = self.countdown.swap(-1, Ordering::AcqRel);
        old != 0 && !self.is_frozen()
    }

    pub(crate) fn fences(&self) -> u64 {
        self.fences.load(Ordering::Relaxed)
    }

    pub(crate) fn crashes(&self) -> u64 {
        self.crashes.load(Ordering::Relaxed)
    }

    /// Freezes the image as a power failure would leave it. Idempotent: later calls report
    /// nothing.
    pub(crate) fn crash(&self, work: &[*const u8], opts: CrashOptions) -> CrashReport {
        let mut written = self.image_lock.lock();
        if self.frozen.swap(true, Ordering::AcqRel) {
            return CrashReport::default();
        }
        self.countdown.store(-1, Ordering::Release);
        let mut rng = SmallRng::seed_from_u64(opts.seed);
        let mut report = CrashReport::default();
        let (pending_p, dirty_p) =
            if self.eadr { (1.0, 1.0) } else { (opts.pending_survival, opts.dirty_eviction) };
        // Pending lines of all threads, oldest capture first, so a surviving newer capture is
        // never overwritten by a surviving older one.
        let mut pending: Vec<PendingLine> =
            self.pending.iter().flat_map(|slot| std::mem::take(&mut *slot.lock())).collect();
        pending.sort_by_key(|l| l.seq);
        for l in &pending {
            if rng.gen_bool(pending_p) && self.apply(&mut written, l) {
                report.pending_applied += 1;
            } else {
                report.pending_dropped += 1;
            }
        }
        for (node, img) in self.images.iter().enumerate() {
            for_each_dirty_line(work[node], img, |off| {
                if rng.gen_bool(dirty_p) {
                    // SAFETY: aligned line inside both mappings, under the image lock.
                    unsafe { copy_line(work[node].add(off), img.ptr().add(off)) };
                    report.dirty_evicted += 1;
                } else {
                    report.dirty_lost += 1;
                }
            });
        }
        for img in &self.images {
            let _ = img.sync();
        }
        self.crashes.fetch_add(1, Ordering::Relaxed);
        report
    }

    /// Clean shutdown: the machine keeps running, so every modified line is eventually written
    /// back. Copies the whole working memory into the image.
    pub(crate) fn write_back_all(&self, work: &[*const u8]) -> std::io::Result<()> {
        let _written = self.image_lock.lock();
        if self.is_frozen() {
            return Ok(());
        }
        for slot in self.pending.iter() {
            slot.lock().clear();
        }
        for (node, img) in self.images.iter().enumerate() {
            for_each_dirty_line(work[node], img, |off| {
                // SAFETY: aligned line inside both mappings, under the image lock.
                unsafe { copy_line(work[node].add(off), img.ptr().add(off)) };
            });
            img.sync()?;
        }
        Ok(())
    }
}

/// Calls `f(offset)` for every line whose working contents differ from the image. Only pages
/// the process has written can differ: the working memory is a private mapping of the file the
/// image maps shared, and a private page not yet copied on write shows the file's page, i.e.
/// the image. Those pages are found in `/proc/self/pagemap` (present and not file-backed);
/// where it cannot be read, every page is compared. Whole 4 KiB pages are compared first so
/// that clean pages cost one `memcmp`.
fn for_each_dirty_line(work: *const u8, img: &Mapping, mut f: impl FnMut(usize)) {
    const PAGE: usize = 4096;
    let written = written_pages(work, img.len());
    for (i, page) in (0..img.len()).step_by(PAGE).enumerate() {
        if written.as_ref().is_some_and(|w| !w[i]) {
            continue;
        }
        let chunk = PAGE.min(img.len() - page);
        // SAFETY: both mappings cover the whole file. A racing writer can only make this coarse
        // filter report "different", after which lines are re-read with atomic words.
        let same =
            unsafe { libc::memcmp(work.add(page).cast(), img.ptr().add(page).cast(), chunk) == 0 };
        if same {
            continue;
        }
        for off in (page..page + chunk).step_by(LINE) {
            // SAFETY: aligned lines inside both mappings.
            let (cur, old) =
                unsafe { (read_line_stable(work.add(off)), read_line(img.ptr().add(off))) };
            if cur != old {
                f(off);
            }
        }
    }
}

/// Per 4 KiB page of `[work, work + len)`: whether it is present and anonymous (a private page
/// copied on write) or swapped, from `/proc/self/pagemap` (bit 63 present, bit 62 swapped, bit
/// 61 file-page or shared anonymous; linux/Documentation/admin-guide/mm/pagemap.rst). `None` when the file cannot be
/// read or the page size is not 4 KiB.
fn written_pages(work: *const u8, len: usize) -> Option<Vec<bool>> {
    use std::os::unix::fs::FileExt;
    // SAFETY: sysconf has no memory effects.
    if unsafe { libc::sysconf(libc::_SC_PAGESIZE) } != 4096 {
        return None;
    }
    let pages = len.div_ceil(4096);
    let file = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut buf = vec![0u8; pages * 8];
    file.read_exact_at(&mut buf, (work as usize / 4096 * 8) as u64).ok()?;
    Some(
        buf.chunks_exact(8)
            .map(|e| {
                let v = u64::from_le_bytes(e.try_into().expect("8-byte entry"));
                // Present and anonymous, or swapped out (only anonymous pages are swapped).
                (v & (1 << 63) != 0 && v & (1 << 61) == 0) || v & (1 << 62) != 0
            })
            .collect(),
    )
}
