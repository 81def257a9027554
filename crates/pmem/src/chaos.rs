//! Chaos schedules: exploration on the steps, not in time (docs/design.md §12.3).
//!
//! Protocol windows are a few *steps* wide — a CAS, a flush, a fence, a store between two pause
//! points — and a random schedule on a loaded machine almost never stops a thread inside one.
//! With chaos on, every PM access of the accessor types ([`crate::access`]), every flush and
//! fence of a [`crate::Pool`], and every pause point ([`crate::pause_point!`]) is a possible
//! *preemption*: with a small probability the thread yields, spins, or sleeps (microseconds,
//! rarely milliseconds).
//!
//! Each decision is a pure function of the seed, the thread's identity (its name and
//! `ThreadId`) and the thread's own step counter, so a run that fails prints its seed and a
//! rerun with `NUMAKV_CHAOS=<seed>` of the same test alone makes the same decisions at the same
//! steps of each thread. PCT-style priorities ride on the same function: in each epoch of 4096
//! steps a thread is "slow" with probability 1/4 and is then preempted eight times as often, so
//! one thread at a time tends to lag inside its windows.
//!
//! # Cost
//!
//! Chaos adds nothing to the accessors' fast path: it is a bit of the accounting flag byte that
//! the fast path already loads ([`crate::account`]), handled in the cold path behind it, and a
//! bit of the pause points' armed counter ([`crate::failpoint`]), likewise. It needs the
//! `accounting` feature for the accessor hooks (on by default) and is switched on from the
//! environment only in builds with the `failpoints` feature (test builds): a production binary
//! ignores `NUMAKV_CHAOS`.
//!
//! ```
//! numakv_pmem::chaos::enable(42);
//! assert_eq!(numakv_pmem::chaos::seed(), Some(42));
//! numakv_pmem::chaos::disable();
//! assert_eq!(numakv_pmem::chaos::seed(), None);
//! ```

use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;
use std::time::Duration;

/// The environment variable that turns chaos on: a seed (decimal or `0x` hex), or `random`.
pub const CHAOS_ENV: &str = "NUMAKV_CHAOS";

static ON: AtomicBool = AtomicBool::new(false);
static SEED: AtomicU64 = AtomicU64::new(0);
static PREEMPTIONS: AtomicU64 = AtomicU64::new(0);
static STEPS: AtomicU64 = AtomicU64::new(0);
static FROM_ENV: Once = Once::new();

/// Where a chaos step was taken (pause points, which mark protocol windows, preempt more often).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Site {
    /// A PM load, store or read-modify-write of an accessor type.
    Access,
    /// A flush or a fence.
    Persist,
    /// A named pause point (only built with the `failpoints` feature, which has them).
    #[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
    Pause,
}

/// Switches chaos on when [`CHAOS_ENV`] holds a seed (once per process; later calls do nothing).
/// Called by [`crate::Pool::create`] and [`crate::Pool::open`] in builds with the `failpoints`
/// feature, so every test that opens a pool honours the variable; tests may call it directly.
/// Installs a panic hook that prints the seed, so a failing test names what replays it.
pub fn init_from_env() {
    FROM_ENV.call_once(|| {
        let Ok(v) = std::env::var(CHAOS_ENV) else { return };
        let v = v.trim();
        let seed = if v.eq_ignore_ascii_case("random") {
            rand::random()
        } else if let Some(hex) = v.strip_prefix("0x") {
            match u64::from_str_radix(hex, 16) {
                Ok(s) => s,
                Err(_) => return,
            }
        } else {
            match v.parse() {
                Ok(s) => s,
                Err(_) => return,
            }
        };
        eprintln!("chaos: {CHAOS_ENV}={seed}");
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(seed) = self::seed() {
                eprintln!(
                    "chaos: this run preempted at {} of {} steps; replay with {CHAOS_ENV}={seed} \
                     (run the failing test alone)",
                    preemptions(),
                    steps()
                );
            }
            previous(info)
        }));
        enable(seed);
    });
}

/// Turns chaos on for the whole process with `seed`.
pub fn enable(seed: u64) {
    SEED.store(seed, Ordering::Relaxed);
    // ORDERING: Release; pairs with the Acquire in `seed()` (the seed is stored first). The
    // steps themselves read the seed Relaxed: a thread that sees the flag a little late only
    // skips a few chaos decisions.
    ON.store(true, Ordering::Release);
    crate::account::set_chaos(true);
    #[cfg(feature = "failpoints")]
    crate::failpoint::set_chaos(true);
}

/// Turns chaos off.
pub fn disable() {
    ON.store(false, Ordering::Release);
    crate::account::set_chaos(false);
    #[cfg(feature = "failpoints")]
    crate::failpoint::set_chaos(false);
}

/// The seed while chaos is on.
pub fn seed() -> Option<u64> {
    // ORDERING: Acquire; pairs with the Release in `enable`.
    ON.load(Ordering::Acquire).then(|| SEED.load(Ordering::Relaxed))
}

/// `" [NUMAKV_CHAOS=<seed>]"` while chaos is on, else empty: for violation messages.
pub fn note() -> String {
    seed().map(|s| format!(" [{CHAOS_ENV}={s}]")).unwrap_or_default()
}

/// Preemptions made so far in this process (a chaos run that made none explored nothing).
pub fn preemptions() -> u64 {
    PREEMPTIONS.load(Ordering::Relaxed)
}

/// Chaos steps taken so far in this process.
pub fn steps() -> u64 {
    STEPS.load(Ordering::Relaxed)
}

thread_local! {
    /// (identity hash, steps taken); identity 0 = not yet computed.
    static THREAD: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// splitmix64's finaliser: a well-mixed 64-bit function of `x`.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn thread_identity() -> u64 {
    let t = std::thread::current();
    // DefaultHasher::new() has fixed keys: the same name and ThreadId hash the same in every run.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    t.name().hash(&mut h);
    t.id().hash(&mut h);
    h.finish() | 1
}

/// The decision at step `n` of the thread with identity `id`: `None` (go on) or the random word
/// that picks the preemption. A pure function: the replay guarantee.
fn decide(seed: u64, id: u64, n: u64, site: Site) -> Option<u64> {
    let slow =
        mix(seed ^ id.rotate_left(17) ^ (n >> 12).wrapping_mul(0x9e37_79b9_7f4a_7c15)) % 4 == 0;
    let h = mix(seed ^ id ^ n.wrapping_mul(0xd1b5_4a32_d192_ed03));
    // One in 256 steps, eight times that for a slow thread; pause points 16 times as often.
    let shift = match (site, slow) {
        (Site::Pause, _) => 4,
        (_, true) => 5,
        (_, false) => 8,
    };
    (h & ((1 << shift) - 1) == 0).then_some(h >> 16)
}

/// The decision for the calling thread's next step, and the preemption it makes.
#[cold]
#[inline(never)]
pub(crate) fn step(site: Site) {
    // ORDERING: Relaxed; see `enable`.
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    let Ok((id, n)) = THREAD.try_with(|c| {
        let (mut id, n) = c.get();
        if id == 0 {
            id = thread_identity();
        }
        c.set((id, n + 1));
        (id, n)
    }) else {
        return; // thread teardown
    };
    STEPS.fetch_add(1, Ordering::Relaxed);
    let Some(r) = decide(SEED.load(Ordering::Relaxed), id, n, site) else { return };
    PREEMPTIONS.fetch_add(1, Ordering::Relaxed);
    match r % 100 {
        0..=59 => std::thread::yield_now(),
        60..=84 => {
            for _ in 0..(r >> 8) % 4096 {
                std::hint::spin_loop();
            }
        }
        85..=98 => std::thread::sleep(Duration::from_micros(1 + (r >> 8) % 200)),
        _ => std::thread::sleep(Duration::from_micros(1_000 + (r >> 8) % 2_000)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_replay_from_seed_thread_and_counter() {
        let run = |seed, id| -> Vec<Option<u64>> {
            (0..100_000).map(|n| decide(seed, id, n, Site::Access)).collect()
        };
        let a = run(7, 11);
        assert_eq!(a, run(7, 11), "the same seed and thread make the same decisions");
        assert_ne!(a, run(8, 11), "another seed decides differently");
        assert_ne!(a, run(7, 12), "another thread decides differently");
        let n = a.iter().filter(|d| d.is_some()).count();
        // 1/256 normally, 1/32 in a quarter of the epochs: about 1.2% of the steps.
        assert!((500..3_000).contains(&n), "{n} preemptions in 100 000 steps");
        let pauses = (0..10_000).filter(|&n| decide(7, 11, n, Site::Pause).is_some()).count();
        assert!((400..900).contains(&pauses), "pause points preempt 1 in 16: {pauses}");
        // A thread's identity is fixed for its life (name and ThreadId).
        assert_eq!(thread_identity(), thread_identity());
    }
}
