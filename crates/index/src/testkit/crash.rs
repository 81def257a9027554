//! Crash oracles (DESIGN.md §4): ADR power failures simulated in shadow mode, and eADR crashes by
//! SIGKILL of a child process whose pools are `MAP_SHARED`.
//!
//! Writers own disjoint keys and record each mutating operation in the [`Model`] before issuing
//! it (pending) and after it returns (acknowledged); a reader thread records the values it saw.
//! After every crash the store is recovered — sometimes crashing again during recovery — and each
//! key is checked: acknowledged operations exact, a pending one all-or-nothing, no resurrected
//! delete, no lost value that a read returned (always in eADR, where a visible store is durable;
//! in ADR only when the engine claims it). Then `check()`, a full scan against the model, the
//! leak invariant, and the next round continues on the recovered store.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use numakv_pmem::crash::{child_role, KillHarness, KillOutcome, SideFile};
use numakv_pmem::{numa, CrashOptions, PersistMode, SimMode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::differential::check_entries;
use super::model::{encode, Kind, Model};
use super::{ensure, fail, open_pool, scratch, seed, Kit, Verdict, Violation};
use crate::api::{Engine, Index};

/// Writer threads per crash round (plus one reader).
const WRITERS: usize = 2;
/// Keys of the crash oracles: enough for several levels of a B+-tree with 512-byte nodes.
const KEYS_PER_SCALE: u64 = 3_000;

/// What a crash round's threads share.
struct Round<'a> {
    model: &'a Model,
    round: u64,
    /// True once the machine "died" (shadow crash fired); results after that are not
    /// acknowledged.
    crashed: &'a (dyn Fn() -> bool + Sync),
    durable_reads: bool,
}

impl Round<'_> {
    /// Writer `w`: mutating operations (and own-key gets) on keys `≡ w (mod WRITERS)`, each
    /// pending before and acknowledged after; `budget` operations or until the crash.
    fn writer(&self, e: &dyn Index, w: usize, budget: u64, seed: u64) -> Verdict {
        let mut rng = SmallRng::seed_from_u64(seed);
        let keys = self.model.keys();
        for i in 0..budget {
            if (self.crashed)() {
                return Ok(());
            }
            let k = rng.gen_range(0..keys / WRITERS as u64) * WRITERS as u64 + w as u64 + 1;
            let before = self.model.acked(k);
            // Unique per key across rounds and processes: the round is part of the sequence.
            let arg = encode(k, (self.round << 28) | (i & 0x0FFF_FFFF));
            let kind = match rng.gen_range(0..10) {
                0..=3 => Kind::Insert,
                4 => Kind::Upsert,
                5..=6 => Kind::Update,
                7..=8 => Kind::Remove,
                _ => {
                    let got = e.get(k);
                    if (self.crashed)() {
                        return Ok(());
                    }
                    match got {
                        Ok(got) => ensure!(
                            got == before,
                            "writer {w}: get({k}) returned {got:x?}, acknowledged state {before:x?}"
                        ),
                        Err(err) => return fail(format!("writer {w}: get({k})"), err),
                    }
                    continue;
                }
            };
            self.model.begin(k, kind, arg);
            let result = match kind {
                Kind::Insert => e.insert(k, arg).map(Some),
                Kind::Upsert => e.upsert(k, arg).map(|()| None),
                Kind::Update => e.update(k, arg).map(Some),
                Kind::Remove => e.remove(k).map(Some),
            };
            if (self.crashed)() {
                // The operation may have returned after the power failure: it stays pending.
                return Ok(());
            }
            let result = match result {
                Ok(r) => r,
                Err(err) => return fail(format!("writer {w}: {kind:?}({k})"), err),
            };
            ensure!(
                result == kind.expected_result(before),
                "writer {w}: {kind:?}({k}) returned {result:?} with acknowledged state {before:x?}"
            );
            self.model.ack(k, kind.apply(before, arg), arg);
        }
        Ok(())
    }

    /// The reader: gets of random keys owned by writers; every value seen is recorded so that
    /// recovery can be held to it.
    fn reader(&self, e: &dyn Index, done: &AtomicBool, seed: u64) -> Verdict {
        let mut rng = SmallRng::seed_from_u64(seed);
        // ORDERING: Relaxed; `done` only ends the loop, it guards no data.
        while !done.load(Ordering::Relaxed) && !(self.crashed)() {
            let k = rng.gen_range(1..=self.model.keys());
            let floor = self.model.last_acked_seq(k);
            let got = e.get(k);
            if (self.crashed)() {
                break;
            }
            match got {
                Ok(Some(v)) if self.durable_reads => self.model.observed(k, v),
                Ok(None) if self.durable_reads => self.model.observed_absent(k, floor),
                Ok(_) => {}
                Err(err) => return fail(format!("reader: get({k})"), err),
            }
        }
        Ok(())
    }

    /// Runs the writers and the reader to completion (or the crash).
    fn run(&self, e: &dyn Index, nodes: usize, budget: u64, seed: u64) -> Verdict {
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                numa::set_current_node(nodes - 1);
                self.reader(e, &done, seed ^ 0xEAD)
            });
            let writers: Vec<_> = (0..WRITERS)
                .map(|w| {
                    s.spawn(move || {
                        numa::set_current_node(w % nodes);
                        self.writer(e, w, budget, seed ^ ((w as u64 + 1) << 40))
                    })
                })
                .collect();
            let mut verdict = Ok(());
            for h in writers {
                let r = h.join().unwrap_or_else(|_| Err(Violation("a writer panicked".into())));
                verdict = verdict.and(r);
            }
            done.store(true, Ordering::Relaxed);
            let r = reader.join().unwrap_or_else(|_| Err(Violation("the reader panicked".into())));
            verdict.and(r)
        })
    }
}

/// Checks every key of the recovered index against the model (resolving pending operations),
/// then `check()`, a full scan and the leak invariant.
fn verify<E: Engine>(e: &E, model: &Model, durable_reads: bool) -> Verdict<Tally> {
    let mut tally = Tally::default();
    for k in 1..=model.keys() {
        let actual = match e.get(k) {
            Ok(v) => v,
            Err(err) => return fail(format!("get({k}) after recovery"), err),
        };
        match model.verify(k, actual, durable_reads)? {
            Some(true) => tally.pending_new += 1,
            Some(false) => tally.pending_old += 1,
            None => {}
        }
    }
    check_entries(e, &model.snapshot())?;
    let report = e.check().or_else(|err| fail("check() after recovery", err))?;
    ensure!(
        report.reachable_blocks == report.allocated_blocks,
        "leak check after recovery: {} PM blocks reachable but {} allocated",
        report.reachable_blocks,
        report.allocated_blocks
    );
    tally.entries = report.entries;
    Ok(tally)
}

/// What the crash rounds exercised, so that a run that exercised nothing is not a pass.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    /// Operations interrupted by the crash whose effect survived.
    pending_new: u64,
    /// Operations interrupted by the crash whose effect was lost (allowed: never acknowledged).
    pending_old: u64,
    /// Entries after the last recovery.
    entries: u64,
}

impl Tally {
    fn add(&mut self, t: Tally) {
        self.pending_new += t.pending_new;
        self.pending_old += t.pending_old;
        self.entries = t.entries;
    }

    /// Fails a run that never interrupted an operation or never stored anything.
    fn require_coverage(&self, what: &str) -> Verdict {
        eprintln!(
            "{what}: interrupted operations recovered new {} / old {}, {} entries at the end",
            self.pending_new, self.pending_old, self.entries
        );
        ensure!(
            self.pending_new + self.pending_old > 0 && self.entries > 0,
            "{what} exercised nothing: no crash interrupted an operation ({self:?})"
        );
        Ok(())
    }
}

impl<E: Engine> Kit<E> {
    /// ADR power failures: each round schedules a crash at a random fence (random survival of
    /// pending lines and eviction of dirty lines), runs writers and a reader until it fires,
    /// recovers — crashing again during recovery in some rounds — and verifies.
    pub fn crash_shadow(&self) -> Verdict {
        let seed = seed();
        self.crash_shadow_seeded(seed).map_err(|v| {
            Violation(format!(
                "crash_shadow (NUMAKV_TEST_SEED={seed}){}: {v}",
                numakv_pmem::chaos::note()
            ))
        })
    }

    fn crash_shadow_seeded(&self, seed: u64) -> Verdict {
        let mut rng = SmallRng::seed_from_u64(seed);
        let dir = scratch()?;
        let path = dir.path().join("store");
        let model = Model::in_memory(KEYS_PER_SCALE * self.scale as u64);
        let mut engine = self.create_in(&path, PersistMode::Adr, SimMode::Shadow)?;
        let rounds = 10 * self.scale as u64;
        let mut tally = Tally::default();
        let mut round_stats = Vec::new();
        for round in 1..=rounds {
            let ctx = |v: Violation| Violation(format!("round {round}: {v}"));
            let pool = engine.pool().clone();
            let opts = if rng.gen_bool(0.25) {
                CrashOptions { seed: rng.gen(), ..CrashOptions::STRICT }
            } else {
                CrashOptions::random(rng.gen())
            };
            let fences = rng.gen_range(1..=4_000 * self.scale as u64);
            pool.crash_after_fences(fences, opts).or_else(|e| fail("scheduling a crash", e))?;
            let crashed = || pool.has_crashed();
            let r = Round {
                model: &model,
                round,
                crashed: &crashed,
                durable_reads: self.durable_reads_adr,
            };
            r.run(&engine, self.nodes, 2_000 * self.scale as u64, rng.gen()).map_err(ctx)?;
            round_stats.push(engine.stats());
            if !pool.has_crashed() {
                pool.crash(opts).or_else(|e| fail("crashing", e))?;
            }
            drop(engine);
            drop(pool);
            engine = self.recover_shadow(&path, &mut rng).map_err(ctx)?;
            tally.add(verify(&engine, &model, self.durable_reads_adr).map_err(ctx)?);
        }
        tally.require_coverage("crash_shadow")?;
        self.check_gates("crash_shadow", &round_stats)?;
        engine.close().or_else(|e| fail("close()", e))?;
        let engine = self.open_in(&path, SimMode::Shadow)?;
        verify(&engine, &model, false)?;
        engine.close().or_else(|e| fail("final close()", e))
    }

    /// Opens the crashed store; in some attempts a crash is scheduled during recovery itself.
    fn recover_shadow(&self, path: &Path, rng: &mut SmallRng) -> Verdict<E> {
        for attempt in 0.. {
            let pool = open_pool::<E>(path, SimMode::Shadow)?;
            let crash_again = attempt < 2 && rng.gen_bool(0.3);
            if crash_again {
                let fences = rng.gen_range(1..=64);
                pool.crash_after_fences(fences, CrashOptions::random(rng.gen()))
                    .or_else(|e| fail("scheduling a crash", e))?;
            }
            match E::open(pool.clone(), &self.opts) {
                Ok(_) | Err(_) if pool.has_crashed() => continue, // crashed during recovery
                Ok((e, _)) => {
                    // An engine that recovers in the background may have crashed between the
                    // check above and the cancel (a crash during its background recovery), or
                    // be crashing in one of its threads now.
                    if !pool.cancel_crash() {
                        continue;
                    }
                    return Ok(e);
                }
                Err(err) => return fail(format!("{}::open after a crash", E::NAME), err),
            }
        }
        unreachable!("the loop returns")
    }

    /// eADR crashes: a child process opens (recovers) the store and runs writers and a reader
    /// until it is SIGKILLed at a random moment — sometimes during its recovery. The parent then
    /// recovers the store itself and verifies. `test_name` is the name of the `#[test]` calling
    /// this (the child re-executes the test binary filtered to it).
    pub fn crash_kill(&self, test_name: &str) -> Verdict {
        if let Some(dir) = child_role() {
            let dir = PathBuf::from(dir);
            let err = match self.kill_child(&dir) {
                Ok(()) => "the child's workload ended without being killed".to_string(),
                Err(v) => v.0,
            };
            // The parent discards the child's output; leave the reason in a file it reads.
            if let Ok(mut f) = std::fs::File::create(dir.join("child-error.txt")) {
                let _ = f.write_all(err.as_bytes());
            }
            std::process::exit(3);
        }
        let seed = seed();
        self.crash_kill_seeded(test_name, seed).map_err(|v| {
            Violation(format!(
                "crash_kill (NUMAKV_TEST_SEED={seed}){}: {v}",
                numakv_pmem::chaos::note()
            ))
        })
    }

    fn crash_kill_seeded(&self, test_name: &str, seed: u64) -> Verdict {
        let mut rng = SmallRng::seed_from_u64(seed);
        let dir = scratch()?;
        let store = dir.path().join("store");
        self.create_in(&store, PersistMode::Eadr, SimMode::Direct)?
            .close()
            .or_else(|e| fail("close()", e))?;
        let keys = KEYS_PER_SCALE * self.scale as u64;
        let side = SideFile::create(&dir.path().join("side"), Model::words_for(keys))
            .or_else(|e| fail("creating the side file", e))?;
        Model::init_file(&side, keys);
        let model = Model::in_file(side)?;
        let harness = KillHarness::new(test_name);
        let mut tally = Tally::default();
        let arg = dir.path().to_str().ok_or_else(|| Violation("non-UTF-8 temp path".into()))?;
        for round in 1..=8 * self.scale as u64 {
            let ctx = |v: Violation| Violation(format!("round {round}: {v}"));
            model.header(0).store(round, Ordering::Release);
            let before = model.header(1).load(Ordering::Acquire);
            let outcome = if rng.gen_bool(0.25) {
                // Early kill: often during the child's open, i.e. a crash during recovery.
                harness.run(arg, Duration::from_micros(rng.gen_range(0..30_000)))
            } else {
                let want = rng.gen_range(50..2_000);
                harness.run_until(
                    arg,
                    || model.header(1).load(Ordering::Acquire) >= before + want,
                    Duration::from_micros(rng.gen_range(0..5_000)),
                    Duration::from_secs(60),
                )
            };
            match outcome {
                Ok(KillOutcome::Killed(_)) => {}
                Ok(KillOutcome::Exited(status)) => {
                    let why = std::fs::read_to_string(dir.path().join("child-error.txt"))
                        .unwrap_or_else(|_| "no reason recorded (did it start?)".into());
                    return Err(ctx(Violation(format!("the child exited ({status}): {why}"))));
                }
                Err(e) => return fail("running the child", e),
            }
            let e = self.open_in(&store, SimMode::Direct).map_err(ctx)?;
            tally.add(verify(&e, &model, true).map_err(ctx)?);
            if rng.gen_bool(0.5) {
                e.close().or_else(|err| fail("close()", err)).map_err(ctx)?;
            } else {
                drop(e); // an unclean shutdown on top of the kill
            }
        }
        let progress = model.header(1).load(Ordering::Acquire);
        ensure!(progress > 0, "the children acknowledged no operation in any round");
        tally.require_coverage("crash_kill")
    }

    /// The child: recover, then run the workload until killed.
    fn kill_child(&self, dir: &Path) -> Verdict {
        let side =
            SideFile::open(&dir.join("side")).or_else(|e| fail("opening the side file", e))?;
        let model = Model::in_file(side)?;
        let round = model.header(0).load(Ordering::Acquire);
        let e = self.open_in(&dir.join("store"), SimMode::Direct)?;
        let never = || false;
        let r = Round { model: &model, round, crashed: &never, durable_reads: true };
        // The budget outlasts any kill delay; finishing it is reported as a failure.
        r.run(&e, self.nodes, 1 << 28, rand::random())
    }
}
