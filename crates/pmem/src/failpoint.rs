//! Named pause and failure points, for tests that force an interleaving (docs/design.md §12).
//!
//! A protocol window a few instructions wide (an SMO phase, a migration step, a GC reclaim) is
//! almost never hit by random schedules; it is found by *forcing* it: one thread is parked at a
//! named step, another is let through the window, and the first is released. Engines mark their
//! steps with [`pause_point!`](crate::pause_point) and their injectable failures with
//! [`fail_point!`](crate::fail_point):
//!
//! ```text
//! leaf.direct_store(&blk, i, v);
//! numakv_pmem::pause_point!("nbtree.update.stored");
//! if numakv_pmem::fail_point!("nobtree.grow_root") {
//!     return Err(PoolError::OutOfSpace { .. }.into());
//! }
//! ```
//!
//! Both macros compile to nothing (`pause_point!`) and to `false` (`fail_point!`) unless the
//! `failpoints` feature of `numakv-pmem` is on; engines turn it on only in their
//! dev-dependencies, so release builds carry no trace of them. With the feature on, a point that
//! no test armed costs one relaxed load of a global counter (the same idea as the `fail` crate
//! that TiKV uses, whose every hit takes a registry `RwLock` and a map lookup even when nothing
//! is configured — a shared cache line that would itself perturb the schedules under test).
//!
//! In a test, a [`Scenario`] serialises the tests of one process that arm points (a point is
//! global) and disarms everything when dropped, releasing any parked thread:
//!
//! ```
//! use numakv_pmem::failpoint::Scenario;
//! use std::thread;
//!
//! fn step() -> u32 {
//!     numakv_pmem::pause_point!("doc.step");
//!     7
//! }
//!
//! let sc = Scenario::setup();
//! let p = sc.pause("doc.step");
//! let worker = thread::spawn(step);
//! p.wait_parked(); // the worker stands at "doc.step"
//! // ... let another thread move through the window here ...
//! p.release(); // the worker continues; the point is disarmed
//! assert_eq!(worker.join().unwrap(), 7);
//! ```
//!
//! Points are named `engine.place.step` (e.g. `nbtree.update.stored`); each engine lists its
//! points in its crate docs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

/// Parks the calling thread here while a test holds the named point armed with
/// [`Scenario::pause`] (or runs the test's callback, or does nothing). Compiles to nothing
/// without the `failpoints` feature.
#[cfg(feature = "failpoints")]
#[macro_export]
macro_rules! pause_point {
    ($name:literal) => {{
        let _ = $crate::failpoint::hit($name);
    }};
}

/// `true` when a test armed the named point with [`Scenario::fail`]: the caller then fails the
/// way the point's documentation says (typically as if the pool were out of space). A pause or
/// callback armed on the same name runs first. Always `false` without the `failpoints` feature.
#[cfg(feature = "failpoints")]
#[macro_export]
macro_rules! fail_point {
    ($name:literal) => {
        $crate::failpoint::hit($name)
    };
}

/// How long [`Pause::wait_parked`] waits before it fails the test (a schedule that never
/// reaches its point is a broken test, not a pass).
pub const PARK_TIMEOUT: Duration = Duration::from_secs(20);

/// Points armed now, plus [`CHAOS_BIT`] while chaos is on: the fast path's only load.
static ARMED: AtomicUsize = AtomicUsize::new(0);
/// Set in [`ARMED`] while chaos schedules run ([`crate::chaos`]): every point is then a possible
/// preemption, decided in the cold path.
const CHAOS_BIT: usize = 1 << (usize::BITS - 1);

/// Chaos at the pause points ([`crate::chaos::enable`]).
pub(crate) fn set_chaos(on: bool) {
    // ORDERING: Relaxed, as in `arm`.
    if on {
        ARMED.fetch_or(CHAOS_BIT, Ordering::Relaxed);
    } else {
        ARMED.fetch_and(!CHAOS_BIT, Ordering::Relaxed);
    }
}
/// The armed points.
static POINTS: Mutex<Vec<Arc<Point>>> = Mutex::new(Vec::new());
/// Held by the live [`Scenario`].
static SCENARIO: Mutex<()> = Mutex::new(());

type Filter = Box<dyn Fn() -> bool + Send + Sync>;

enum Action {
    /// Park until released.
    Pause,
    /// Make `fail_point!` return true, `times` more times (`None`: every time).
    Fail { times: Option<u64> },
    /// Run a callback in the hitting thread.
    Call(Box<dyn Fn() + Send + Sync>),
}

struct Point {
    name: &'static str,
    action: Action,
    /// Only threads for which this returns true meet the point.
    filter: Option<Filter>,
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    /// Threads that met the point (filter passed).
    hits: usize,
    /// Threads parked now.
    parked: usize,
    /// Set by release: parked threads leave, later hits pass.
    released: bool,
    /// Failures still to inject ([`Action::Fail`] with a count).
    fails_left: Option<u64>,
}

/// The hook behind [`pause_point!`](crate::pause_point) and
/// [`fail_point!`](crate::fail_point): returns whether the caller must fail.
#[inline]
pub fn hit(name: &'static str) -> bool {
    // ORDERING: Relaxed; a test arms a point before it starts (or signals) the threads meant to
    // meet it, and that hand-off (spawn, channel, barrier) orders the arming before their loads.
    if ARMED.load(Ordering::Relaxed) == 0 {
        return false;
    }
    slow_hit(name)
}

#[cold]
#[inline(never)]
fn slow_hit(name: &'static str) -> bool {
    // ORDERING: Relaxed; see `hit`.
    let armed = ARMED.load(Ordering::Relaxed);
    if armed & CHAOS_BIT != 0 {
        crate::chaos::step(crate::chaos::Site::Pause);
    }
    if armed & !CHAOS_BIT == 0 {
        return false;
    }
    let point = POINTS.lock().iter().find(|p| p.name == name).cloned();
    let Some(p) = point else { return false };
    if p.filter.as_ref().is_some_and(|f| !f()) {
        return false;
    }
    match &p.action {
        Action::Pause => {
            let mut s = p.state.lock();
            s.hits += 1;
            if s.released {
                return false;
            }
            s.parked += 1;
            p.cv.notify_all();
            while !s.released {
                p.cv.wait(&mut s);
            }
            s.parked -= 1;
            p.cv.notify_all();
            false
        }
        Action::Fail { .. } => {
            let mut s = p.state.lock();
            if s.released {
                return false;
            }
            s.hits += 1;
            match &mut s.fails_left {
                None => true,
                Some(0) => false,
                Some(n) => {
                    *n -= 1;
                    true
                }
            }
        }
        Action::Call(f) => {
            p.state.lock().hits += 1;
            f();
            false
        }
    }
}

fn arm(name: &'static str, action: Action, filter: Option<Filter>) -> Arc<Point> {
    let fails_left = match action {
        Action::Fail { times } => times,
        _ => None,
    };
    let p = Arc::new(Point {
        name,
        action,
        filter,
        state: Mutex::new(State { fails_left, ..State::default() }),
        cv: Condvar::new(),
    });
    let mut points = POINTS.lock();
    assert!(
        points.iter().all(|q| q.name != name),
        "failpoint {name:?} is armed twice in one scenario"
    );
    points.push(Arc::clone(&p));
    // ORDERING: Relaxed; see `hit` (the registry mutex orders the point itself).
    ARMED.fetch_add(1, Ordering::Relaxed);
    p
}

/// Releases `p`'s parked threads and removes it from the registry (idempotent).
fn disarm(p: &Arc<Point>) {
    {
        let mut s = p.state.lock();
        s.released = true;
        p.cv.notify_all();
    }
    let mut points = POINTS.lock();
    if let Some(i) = points.iter().position(|q| Arc::ptr_eq(q, p)) {
        points.swap_remove(i);
        // ORDERING: Relaxed, as in `arm`.
        ARMED.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A test's hold on the failpoint registry: one scenario at a time per process. Dropping it
/// disarms every point it armed and releases their parked threads (so a failing test does not
/// leave threads parked for the next one).
pub struct Scenario {
    _serial: MutexGuard<'static, ()>,
    armed: Mutex<Vec<Arc<Point>>>,
}

impl std::fmt::Debug for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.armed.lock().iter().map(|p| p.name).collect();
        f.debug_struct("Scenario").field("armed", &names).finish()
    }
}

/// Spawns a thread called `name`, for [`Scenario::pause_thread`] (which parks only the thread
/// of that name).
pub fn spawn_named<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::Builder::new().name(name.to_string()).spawn(f).expect("spawning a test thread")
}

impl Scenario {
    /// Waits for any other scenario of this process to end, then starts one.
    pub fn setup() -> Scenario {
        Scenario { _serial: SCENARIO.lock(), armed: Mutex::new(Vec::new()) }
    }

    fn keep(&self, p: Arc<Point>) -> Arc<Point> {
        self.armed.lock().push(Arc::clone(&p));
        p
    }

    /// Arms `name` to park every thread that reaches it until [`Pause::release`].
    pub fn pause(&self, name: &'static str) -> Pause {
        Pause(self.keep(arm(name, Action::Pause, None)))
    }

    /// Arms `name` to park only the thread called `thread` (`std::thread::Builder::name`);
    /// other threads pass. The usual choice when the point lies on a path every thread takes.
    pub fn pause_thread(&self, name: &'static str, thread: &'static str) -> Pause {
        self.pause_when(name, move || std::thread::current().name() == Some(thread))
    }

    /// Arms `name` to park the threads for which `when` (evaluated in the hitting thread)
    /// returns true.
    pub fn pause_when(
        &self,
        name: &'static str,
        when: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Pause {
        Pause(self.keep(arm(name, Action::Pause, Some(Box::new(when)))))
    }

    /// Arms `name` so that `fail_point!(name)` returns true `times` times (`None`: until the
    /// scenario ends or [`Armed::disarm`]).
    pub fn fail(&self, name: &'static str, times: Option<u64>) -> Armed {
        Armed(self.keep(arm(name, Action::Fail { times }, None)))
    }

    /// Arms `name` to crash `pool` (shadow mode, [`crate::Pool::crash`] with `opts`) when it is
    /// reached for the `nth` time (1-based) — by the thread called `thread` only, when given:
    /// a crash at a protocol *step*. The thread that reaches it goes on, but nothing it (or any
    /// thread) stores afterwards is durable. [`Armed::hits`] counts the hits so far, so a first
    /// run with `nth = usize::MAX` measures how many steps a scenario has.
    pub fn crash_at(
        &self,
        name: &'static str,
        nth: usize,
        thread: Option<&'static str>,
        pool: Arc<crate::Pool>,
        opts: crate::CrashOptions,
    ) -> Armed {
        let seen = AtomicUsize::new(0);
        let f = move || {
            // ORDERING: Relaxed; only the count matters, and it is exact under any order.
            if seen.fetch_add(1, Ordering::Relaxed) + 1 == nth {
                let _ = pool.crash(opts);
            }
        };
        let filter: Option<Filter> =
            thread.map(|t| Box::new(move || std::thread::current().name() == Some(t)) as Filter);
        Armed(self.keep(arm(name, Action::Call(Box::new(f)), filter)))
    }

    /// Arms `name` to run `f` in every thread that reaches it.
    pub fn call(&self, name: &'static str, f: impl Fn() + Send + Sync + 'static) -> Armed {
        Armed(self.keep(arm(name, Action::Call(Box::new(f)), None)))
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        for p in self.armed.lock().drain(..) {
            disarm(&p);
        }
    }
}

/// An armed pause point ([`Scenario::pause`]). Dropping it releases and disarms it.
#[must_use = "dropping a Pause releases and disarms the point at once"]
pub struct Pause(Arc<Point>);

impl std::fmt::Debug for Pause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Pause").field(&self.0.name).finish()
    }
}

impl Pause {
    /// Blocks until at least one thread is parked here. Panics after [`PARK_TIMEOUT`]: the
    /// schedule the test meant to force did not happen.
    pub fn wait_parked(&self) {
        self.wait_parked_n(1);
    }

    /// Blocks until `n` threads are parked here at once; panics after [`PARK_TIMEOUT`].
    pub fn wait_parked_n(&self, n: usize) {
        self.wait_parked_within(n, PARK_TIMEOUT);
    }

    /// Blocks until `n` threads are parked here at once; panics after `timeout`.
    pub fn wait_parked_within(&self, n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut s = self.0.state.lock();
        while s.parked < n {
            if self.0.cv.wait_until(&mut s, deadline).timed_out() && s.parked < n {
                panic!(
                    "failpoint {:?}: {} of {n} thread(s) parked after {timeout:?}",
                    self.0.name, s.parked
                );
            }
        }
    }

    /// Threads parked here now.
    pub fn parked(&self) -> usize {
        self.0.state.lock().parked
    }

    /// Threads that have reached the point so far (parked or passed after release).
    pub fn hits(&self) -> usize {
        self.0.state.lock().hits
    }

    /// Lets the parked threads go on and disarms the point: later arrivals pass.
    pub fn release(&self) {
        disarm(&self.0);
    }
}

impl Drop for Pause {
    fn drop(&mut self) {
        disarm(&self.0);
    }
}

/// An armed failure or callback point ([`Scenario::fail`], [`Scenario::call`]).
#[must_use = "dropping an Armed disarms the point at once"]
pub struct Armed(Arc<Point>);

impl std::fmt::Debug for Armed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Armed").field(&self.0.name).finish()
    }
}

impl Armed {
    /// How often the point was met (and failed or called back).
    pub fn hits(&self) -> usize {
        self.0.state.lock().hits
    }

    /// Disarms the point now (otherwise when dropped).
    pub fn disarm(&self) {
        disarm(&self.0);
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        disarm(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::thread;

    fn stepper(flag: Arc<AtomicBool>) -> impl FnOnce() -> bool {
        move || {
            crate::pause_point!("test.step");
            flag.store(true, Ordering::SeqCst);
            crate::fail_point!("test.fail")
        }
    }

    #[test]
    fn a_paused_thread_waits_for_release() {
        let sc = Scenario::setup();
        let p = sc.pause("test.step");
        let flag = Arc::new(AtomicBool::new(false));
        let t = thread::spawn(stepper(Arc::clone(&flag)));
        p.wait_parked();
        thread::sleep(Duration::from_millis(50));
        assert!(!flag.load(Ordering::SeqCst), "the parked thread ran on");
        assert_eq!(p.parked(), 1);
        p.release();
        assert!(!t.join().unwrap());
        assert!(flag.load(Ordering::SeqCst));
        assert_eq!(p.hits(), 1);
        // Released: later arrivals pass.
        assert!(!stepper(Arc::new(AtomicBool::new(false)))());
    }

    #[test]
    fn thread_filters_let_other_threads_pass() {
        let sc = Scenario::setup();
        let p = sc.pause_thread("test.step", "parked-one");
        // This thread is not called "parked-one": it passes.
        let flag = Arc::new(AtomicBool::new(false));
        stepper(Arc::clone(&flag))();
        assert!(flag.load(Ordering::SeqCst));
        let flag = Arc::new(AtomicBool::new(false));
        let t = thread::Builder::new()
            .name("parked-one".into())
            .spawn(stepper(Arc::clone(&flag)))
            .unwrap();
        p.wait_parked();
        assert!(!flag.load(Ordering::SeqCst));
        drop(sc); // the scenario's end releases it too
        t.join().unwrap();
        assert!(flag.load(Ordering::SeqCst));
    }

    #[test]
    fn failures_are_counted_and_bounded() {
        let sc = Scenario::setup();
        let f = sc.fail("test.fail", Some(2));
        let run = || stepper(Arc::new(AtomicBool::new(false)))();
        assert!(run());
        assert!(run());
        assert!(!run());
        assert_eq!(f.hits(), 3);
        f.disarm();
        assert!(!run());
        let always = sc.fail("test.fail", None);
        assert!(run() && run());
        drop(always);
        drop(sc);
        assert!(!run(), "the scenario's end disarms every point");
    }

    #[test]
    fn callbacks_run_in_the_hitting_thread() {
        let sc = Scenario::setup();
        let seen = Arc::new(AtomicUsize::new(0));
        let s2 = Arc::clone(&seen);
        let c = sc.call("test.step", move || {
            s2.fetch_add(1, Ordering::SeqCst);
        });
        stepper(Arc::new(AtomicBool::new(false)))();
        assert_eq!((seen.load(Ordering::SeqCst), c.hits()), (1, 1));
    }

    #[test]
    #[should_panic(expected = "parked after")]
    fn waiting_for_a_point_nobody_reaches_fails_the_test() {
        let sc = Scenario::setup();
        let p = sc.pause("test.never");
        p.wait_parked_within(1, Duration::from_millis(100));
    }
}
