//! A crash at every step (DESIGN.md §4, docs/design.md §12.3): an engine's protocol scenario —
//! a split or merge with concurrent writers on the same and neighbouring leaves, a migration, a
//! GC pass, a switch, an evaluation — is run once to count its crash points, then once per crash
//! point, crashed there, recovered and checked against a durably linearizable model.
//!
//! Crash points are the fences of the scenario in ADR shadow mode
//! ([`numakv_pmem::Pool::crash_after_fences`]; odd points crash strictly, even ones with random
//! survival of pending lines and eviction of dirty lines) and its PM stores in eADR shadow mode
//! ([`numakv_pmem::steps::WriteWatch`]: every store is durable the moment it is made, so every
//! store is a point). All points are enumerated when they fit the scenario's budget
//! ([`StepScenario::max_points`], times `NUMAKV_TEST_SCALE`), an evenly spread seeded sample
//! otherwise (replay with `NUMAKV_TEST_SEED`).
//!
//! # The model: [`History`]
//!
//! Threads share keys: every write is an unconditional `upsert` of a value unique to it or a
//! `remove`, stamped with invocation and response ticks of one global clock; every completed
//! `get` is recorded with its answer, *absences included*. After recovery each key's state must
//! be the effect of one write `W` (or the state before the round) such that:
//! - `W` was acknowledged or still pending at the crash;
//! - no *committed* write — acknowledged, or pending but returned by a completed read — was
//!   invoked after `W` responded (it would be linearized after `W`);
//! - every completed `get` invoked after `W` responded returned `W`'s effect (a value or an
//!   absence a read saw is as durable as an acknowledged write: durable linearizability).
//!
//! Reads constrain recovery in eADR always (a store another thread saw is in the persistent
//! cache) and in ADR only when the engine claims it ([`Kit::durable_reads_adr`]), as in the
//! crash oracles.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use numakv_pmem::steps::WriteWatch;
use numakv_pmem::{numa, CrashOptions, PersistMode, SimMode};
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{ensure, fail, open_pool, scratch, seed, Kit, Verdict, Violation};
use crate::api::{Engine, EngineStats, Index};

/// One write of a [`History`].
#[derive(Clone, Copy, Debug)]
struct Write {
    invoke: u64,
    /// `None`: pending (not acknowledged before the crash).
    response: Option<u64>,
    effect: Option<u64>,
}

/// One completed get of a [`History`].
#[derive(Clone, Copy, Debug)]
struct Get {
    invoke: u64,
    result: Option<u64>,
}

#[derive(Debug, Default)]
struct KeyLog {
    initial: Option<u64>,
    writes: Vec<Write>,
    gets: Vec<Get>,
}

/// The shared-key, durably linearizable model of a step scenario (see the module docs).
#[derive(Debug)]
pub struct History {
    clock: AtomicU64,
    keys: Vec<Mutex<KeyLog>>,
}

/// Mixed into written values so engines see high bits set.
const SALT: u64 = 0x5A00_0000_0000_0000;

impl History {
    /// A history of keys `1..=keys`, all absent.
    pub fn new(keys: u64) -> History {
        History {
            clock: AtomicU64::new(1),
            keys: (0..keys).map(|_| Mutex::new(KeyLog::default())).collect(),
        }
    }

    /// Number of keys (`1..=keys`).
    pub fn keys(&self) -> u64 {
        self.keys.len() as u64
    }

    fn log(&self, k: u64) -> &Mutex<KeyLog> {
        &self.keys[(k - 1) as usize]
    }

    fn tick(&self) -> u64 {
        // ORDERING: SeqCst on one counter: a response tick below another operation's invocation
        // tick means the first returned before the second was invoked (real-time order).
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    /// Preloads `k = v` outside any round (an acknowledged state, not a write of the round).
    pub fn preload(&self, e: &dyn Index, k: u64, v: u64) -> Verdict {
        e.upsert(k, v).or_else(|err| fail(format!("preload upsert({k})"), err))?;
        self.log(k).lock().initial = Some(v);
        Ok(())
    }

    /// Records a write of `effect` (chosen under the key's lock by `choose`) as pending, issues
    /// it, and acknowledges it if it returned before the crash.
    fn write(
        &self,
        e: &dyn Index,
        k: u64,
        choose: impl FnOnce(&KeyLog) -> Option<u64>,
        crashed: &dyn Fn() -> bool,
    ) -> Verdict {
        let invoke = self.tick();
        let (i, effect) = {
            let mut log = self.log(k).lock();
            let effect = choose(&log);
            log.writes.push(Write { invoke, response: None, effect });
            (log.writes.len() - 1, effect)
        };
        let r = match effect {
            Some(v) => e.upsert(k, v),
            None => e.remove(k).map(|_| ()),
        };
        if crashed() {
            return Ok(()); // it may have returned after the power failure: pending
        }
        if let Err(err) = r {
            let op = if effect.is_some() { "upsert" } else { "remove" };
            return fail(format!("{op}({k})"), err);
        }
        let response = self.tick();
        self.log(k).lock().writes[i].response = Some(response);
        Ok(())
    }

    /// Upserts a value unique to this write into `k`, recording it.
    pub fn upsert(&self, e: &dyn Index, k: u64, crashed: &dyn Fn() -> bool) -> Verdict {
        let base = SALT ^ (self.clock.load(Ordering::Relaxed) << 20) ^ (k & 0xF_FFFF);
        let choose = |log: &KeyLog| {
            let mut v = base;
            while log.writes.iter().any(|w| w.effect == Some(v)) || log.initial == Some(v) {
                v = v.wrapping_add(1 << 20);
            }
            Some(v)
        };
        self.write(e, k, choose, crashed)
    }

    /// Removes `k`, recording it.
    pub fn remove(&self, e: &dyn Index, k: u64, crashed: &dyn Fn() -> bool) -> Verdict {
        self.write(e, k, |_| None, crashed)
    }

    /// Reads `k`, recording the answer (values and absences) when it completed before the crash.
    pub fn get(&self, e: &dyn Index, k: u64, crashed: &dyn Fn() -> bool) -> Verdict {
        let invoke = self.tick();
        let r = e.get(k);
        if crashed() {
            return Ok(());
        }
        let result = r.or_else(|err| fail(format!("get({k})"), err))?;
        let mut log = self.log(k).lock();
        ensure!(
            result == log.initial || log.writes.iter().any(|w| w.effect == result),
            "get({k}) returned {result:x?}, which no write of the key produced"
        );
        log.gets.push(Get { invoke, result });
        Ok(())
    }

    /// Checks the recovered state of every key (module docs) and starts a new round from it.
    /// Without `durable_reads` (ADR engines whose readers may see a store before it is
    /// persisted, [`Kit::durable_reads_adr`] false) completed gets constrain nothing: only
    /// acknowledged writes are committed.
    pub fn verify(&self, e: &dyn Index, durable_reads: bool) -> Verdict {
        for k in 1..=self.keys() {
            let actual = e.get(k).or_else(|err| fail(format!("get({k}) after recovery"), err))?;
            let mut log = self.log(k).lock();
            let start = Write { invoke: 0, response: Some(0), effect: log.initial };
            let committed = |w: &Write| {
                w.response.is_some()
                    || (durable_reads
                        && w.effect.is_some()
                        && log.gets.iter().any(|g| g.result == w.effect))
            };
            let explains = |w: &Write| {
                if w.effect != actual {
                    return false;
                }
                let Some(end) = w.response else { return true };
                !log.writes.iter().any(|w2| w2.invoke > end && committed(w2))
                    && (!durable_reads
                        || log.gets.iter().all(|g| g.invoke <= end || g.result == actual))
            };
            if !(explains(&start) || log.writes.iter().any(explains)) {
                let writes: Vec<String> = log
                    .writes
                    .iter()
                    .map(|w| format!("{:x?}@{}..{:?}", w.effect, w.invoke, w.response))
                    .collect();
                let gets: Vec<String> =
                    log.gets.iter().map(|g| format!("{:x?}@{}", g.result, g.invoke)).collect();
                return Err(Violation(format!(
                    "key {k}: recovered {actual:x?}, which no durable linearization explains \
                     (state before the round {:x?}; writes [effect@invoke..response] {writes:?}; \
                     completed gets [result@invoke] {gets:?})",
                    log.initial
                )));
            }
            *log = KeyLog { initial: actual, ..KeyLog::default() };
        }
        Ok(())
    }

    /// Writers acknowledged and gets completed this round (coverage of the oracle itself).
    pub fn counts(&self) -> (usize, usize) {
        self.keys.iter().fold((0, 0), |(w, g), l| {
            let l = l.lock();
            (w + l.writes.iter().filter(|x| x.response.is_some()).count(), g + l.gets.len())
        })
    }
}

/// Writer threads on shared keys for a step scenario: `threads` threads of `ops` random
/// operations each (upsert 50%, remove 20%, get 30%) on `keys` (shared by all threads), thread
/// `t` on node `t % nodes` and called `"kit-writer-{t}"` (for
/// [`numakv_pmem::failpoint::Scenario::pause_thread`]); each stops at the crash. The same
/// `seed` gives each thread the same operations in every run of a scenario.
#[derive(Clone, Debug)]
pub struct Writers {
    /// Writer threads.
    pub threads: usize,
    /// Operations per thread.
    pub ops: usize,
    /// The shared keys.
    pub keys: std::ops::RangeInclusive<u64>,
    /// NUMA nodes the threads are spread over.
    pub nodes: usize,
    /// Seed of the threads' operations.
    pub seed: u64,
}

impl Writers {
    /// Runs the writers until done or `crashed()`.
    pub fn run(
        &self,
        e: &(dyn Index + Sync),
        h: &History,
        crashed: &(dyn Fn() -> bool + Sync),
    ) -> Verdict {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.threads)
                .map(|t| {
                    std::thread::Builder::new()
                        .name(format!("kit-writer-{t}"))
                        .spawn_scoped(s, move || self.writer(t, e, h, crashed))
                        .expect("spawning a kit writer")
                })
                .collect();
            let mut verdict = Ok(());
            for hd in handles {
                let r =
                    hd.join().unwrap_or_else(|_| Err(Violation("a kit writer panicked".into())));
                verdict = verdict.and(r);
            }
            verdict
        })
    }

    fn writer(
        &self,
        t: usize,
        e: &(dyn Index + Sync),
        h: &History,
        crashed: &(dyn Fn() -> bool + Sync),
    ) -> Verdict {
        numa::set_current_node(t % self.nodes.max(1));
        let mut rng = SmallRng::seed_from_u64(self.seed ^ ((t as u64 + 1) << 32));
        for _ in 0..self.ops {
            if crashed() {
                break;
            }
            let k = rng.gen_range(self.keys.clone());
            match rng.gen_range(0..10) {
                0..=4 => h.upsert(e, k, crashed)?,
                5..=6 => h.remove(e, k, crashed)?,
                _ => h.get(e, k, crashed)?,
            }
        }
        Ok(())
    }

    /// Runs the writers and `extra` (an engine action — a migration, a GC pass, a switch, … —
    /// which should stop early once `crashed()`) side by side; `extra` runs in a thread called
    /// `"kit-action"`.
    pub fn run_with(
        &self,
        e: &(dyn Index + Sync),
        h: &History,
        crashed: &(dyn Fn() -> bool + Sync),
        extra: impl FnOnce() -> Verdict + Send,
    ) -> Verdict {
        std::thread::scope(|s| {
            let x = std::thread::Builder::new()
                .name("kit-action".into())
                .spawn_scoped(s, extra)
                .expect("spawning the kit's action thread");
            let w = self.run(e, h, crashed);
            let x = x.join().unwrap_or_else(|_| Err(Violation("the kit's action panicked".into())));
            w.and(x)
        })
    }
}

/// Preloads every `stride`-th key of the history (`1, 1 + stride, …`) with a value naming it.
pub fn preload_every(e: &dyn Index, h: &History, stride: u64) -> Verdict {
    for k in (1..=h.keys()).step_by(stride.max(1) as usize) {
        h.preload(e, k, k.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)?;
    }
    Ok(())
}

/// The scenario's preparation: runs on a fresh store before the counting starts.
pub type Setup<'a, E> = &'a (dyn Fn(&E, &History) -> Verdict + Sync);
/// The scenario's steps: runs until done or until `crashed()` (then it must return soon).
pub type Run<'a, E> = &'a (dyn Fn(&E, &History, &(dyn Fn() -> bool + Sync)) -> Verdict + Sync);

/// One protocol scenario for [`Kit::step_crash`].
pub struct StepScenario<'a, E: Engine> {
    /// Its name in reports and violations.
    pub name: &'static str,
    /// Keys of its [`History`] (`1..=keys`).
    pub keys: u64,
    /// Preparation (preload, a first split, …), not crashed.
    pub setup: Setup<'a, E>,
    /// The steps that are crashed.
    pub run: Run<'a, E>,
    /// Engine counters ([`EngineStats::counters`]) the steps must raise in the counting run:
    /// the mechanisms the scenario is about (a coverage gate; a run that reaches none of one
    /// fails naming it).
    pub gates: &'a [&'static str],
    /// Crash points enumerated at scale 1 (all of them when the scenario has no more).
    pub max_points: usize,
}

impl<E: Engine> std::fmt::Debug for StepScenario<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepScenario").field("name", &self.name).field("keys", &self.keys).finish()
    }
}

/// What [`Kit::step_crash`] covered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Crash points (fences in ADR, PM stores in eADR) of the counting run.
    pub points: u64,
    /// Points crashed and recovered.
    pub crashed: u64,
    /// Of those, points the steps reached (the others crashed after the steps ended, because a
    /// run with threads takes a different number of steps each time).
    pub inside: u64,
    /// The gates' counter increases in the counting run.
    pub gates: Vec<(&'static str, u64)>,
}

fn counter(s: &EngineStats, name: &str) -> u64 {
    s.counter(name).unwrap_or(0)
}

impl<E: Engine + Sync> Kit<E> {
    /// Enumerates the crash points of `sc` in `mode` (module docs): counts them in one run,
    /// checks the gates, then crashes a fresh store at each point (or a seeded sample), recovers
    /// it — crashing again during recovery at some points — and checks the [`History`],
    /// `check()`, the leak invariant and a few more operations.
    pub fn step_crash(&self, sc: &StepScenario<'_, E>, mode: PersistMode) -> Verdict<StepReport> {
        let seed = seed();
        self.step_crash_seeded(sc, mode, seed).map_err(|v| {
            Violation(format!(
                "step_crash {} {mode} (NUMAKV_TEST_SEED={seed}){}: {v}",
                sc.name,
                numakv_pmem::chaos::note()
            ))
        })
    }

    fn step_crash_seeded(
        &self,
        sc: &StepScenario<'_, E>,
        mode: PersistMode,
        seed: u64,
    ) -> Verdict<StepReport> {
        let mut rng = SmallRng::seed_from_u64(seed);
        // eADR: a store another thread saw is durable; ADR: only when the engine claims it.
        let durable_reads = mode == PersistMode::Eadr || self.durable_reads_adr;
        let dir = scratch()?;
        // The counting run.
        let path = dir.path().join("count");
        let e = self.create_in(&path, mode, SimMode::Shadow)?;
        let h = History::new(sc.keys);
        (sc.setup)(&e, &h)?;
        let before = e.stats();
        let pool = e.pool().clone();
        let fences = pool.fence_count();
        let watch =
            (mode == PersistMode::Eadr).then(|| WriteWatch::new(&pool, None, CrashOptions::STRICT));
        let never = || false;
        (sc.run)(&e, &h, &never)?;
        let points = match &watch {
            Some(w) => w.writes(),
            None => pool.fence_count() - fences,
        };
        drop(watch);
        let after = e.stats();
        let mut report = StepReport { points, ..StepReport::default() };
        for &g in sc.gates {
            let d = counter(&after, g).saturating_sub(counter(&before, g));
            report.gates.push((g, d));
        }
        let missed: Vec<_> = report.gates.iter().filter(|g| g.1 == 0).map(|g| g.0).collect();
        ensure!(
            missed.is_empty(),
            "coverage gate: the scenario reached none of {missed:?} (counters after: {:?})",
            after.counters
        );
        h.verify(&e, true).map_err(|v| Violation(format!("without a crash: {v}")))?;
        e.check().or_else(|err| fail("check() after the counting run", err))?;
        e.close().or_else(|err| fail("close()", err))?;
        drop(pool);
        ensure!(points > 0, "the scenario has no crash point (no fence / PM store)");
        // The points.
        let budget = (sc.max_points * self.scale) as u64;
        let chosen: Vec<u64> = if points <= budget {
            (1..=points).collect()
        } else {
            let stride = points as f64 / budget as f64;
            (0..budget)
                .map(|i| 1 + (i as f64 * stride + rng.gen_range(0.0..stride)) as u64)
                .map(|p| p.min(points))
                .collect()
        };
        for (i, &p) in chosen.iter().enumerate() {
            let ctx = |v: Violation| Violation(format!("crash point {p} of {points}: {v}"));
            let path = dir.path().join(format!("p{i}"));
            let e = self.create_in(&path, mode, SimMode::Shadow).map_err(ctx)?;
            let h = History::new(sc.keys);
            (sc.setup)(&e, &h).map_err(ctx)?;
            let pool = e.pool().clone();
            let opts = if p % 2 == 1 {
                CrashOptions { seed: rng.gen(), ..CrashOptions::STRICT }
            } else {
                CrashOptions::random(rng.gen())
            };
            let watch = match mode {
                PersistMode::Eadr => Some(WriteWatch::new(&pool, Some(p), opts)),
                PersistMode::Adr => {
                    pool.crash_after_fences(p, opts).or_else(|err| fail("scheduling", err))?;
                    None
                }
            };
            let crashed = || pool.has_crashed();
            (sc.run)(&e, &h, &crashed).map_err(ctx)?;
            drop(watch);
            report.inside += u64::from(pool.has_crashed());
            if !pool.has_crashed() {
                pool.crash(opts).or_else(|err| fail("crashing", err))?;
            }
            drop(e);
            drop(pool);
            let e = self.recover_at_step(&path, &mut rng, i % 4 == 3).map_err(ctx)?;
            h.verify(&e, durable_reads).map_err(ctx)?;
            let r = e.check().or_else(|err| fail("check() after recovery", err)).map_err(ctx)?;
            ensure!(
                r.reachable_blocks == r.allocated_blocks,
                "crash point {p} of {points}: leak check after recovery: {} PM blocks reachable \
                 but {} allocated",
                r.reachable_blocks,
                r.allocated_blocks
            );
            // The recovered store keeps working.
            for k in 1..=sc.keys.min(16) {
                h.upsert(&e, k, &never).map_err(ctx)?;
                h.get(&e, k, &never).map_err(ctx)?;
            }
            h.verify(&e, true).map_err(ctx)?;
            e.close().or_else(|err| fail("close() after recovery", err)).map_err(ctx)?;
            let _ = std::fs::remove_dir_all(&path);
            report.crashed += 1;
        }
        eprintln!(
            "step_crash {} {mode}: {} crash points, {} crashed ({} inside the steps), gates {:?}{}",
            sc.name,
            report.points,
            report.crashed,
            report.inside,
            report.gates,
            numakv_pmem::chaos::note()
        );
        ensure!(report.inside > 0, "no crash point fell inside the steps");
        Ok(report)
    }

    /// Opens a crashed store; with `again`, first crashes once during recovery.
    fn recover_at_step(&self, path: &Path, rng: &mut SmallRng, again: bool) -> Verdict<E> {
        if again {
            let pool = open_pool::<E>(path, SimMode::Shadow)?;
            pool.crash_after_fences(rng.gen_range(1..=16), CrashOptions::random(rng.gen()))
                .or_else(|e| fail("scheduling a crash", e))?;
            match E::open(pool.clone(), &self.opts) {
                Ok(_) | Err(_) if pool.has_crashed() => {}
                Ok((e, _)) => {
                    if pool.cancel_crash() {
                        return Ok(e);
                    }
                }
                Err(err) => return fail(format!("{}::open after a crash", E::NAME), err),
            }
        }
        let pool = open_pool::<E>(path, SimMode::Shadow)?;
        match E::open(pool, &self.opts) {
            Ok((e, _)) => Ok(e),
            Err(err) => fail(format!("{}::open after a crash", E::NAME), err),
        }
    }
}
