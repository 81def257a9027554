//! Concurrency oracles: threads on disjoint keys (every result exact) and on shared keys (every
//! result explained by a per-key linearization, checked by [`super::linearize`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use numakv_pmem::numa;
use numakv_pmem::{PersistMode, SimMode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::differential::{check_entries, step, Op};
use super::linearize::{self, Event, Op as LinOp, Outcome};
use super::scans::check_scan_shape;
use super::{ensure, fail, scratch, seed, Kit, Verdict, Violation};
use crate::api::{Engine, Index};

/// Worker threads of the concurrency oracles (more than this machine's 2 cores on purpose:
/// preemption inside critical sections is what finds races).
const THREADS: usize = 4;

impl<E: Engine> Kit<E> {
    /// `THREADS` threads, each owning the keys `≡ t (mod THREADS)`, run mixed operations and
    /// scans. Every point result must equal the thread's own model; every scan must be ordered
    /// and show exactly the scanning thread's own keys in the range it covered. Afterwards the
    /// index equals the union of the models, `check()` passes, and so it does after a reopen.
    pub fn concurrent_disjoint(&self) -> Verdict {
        let seed = seed();
        self.disjoint_seeded(seed).map_err(|v| {
            Violation(format!(
                "concurrent_disjoint (NUMAKV_TEST_SEED={seed}){}: {v}",
                numakv_pmem::chaos::note()
            ))
        })
    }

    fn disjoint_seeded(&self, seed: u64) -> Verdict {
        let dir = scratch()?;
        let path = dir.path().join("store");
        let e = self.create_in(&path, PersistMode::Adr, SimMode::Direct)?;
        let keys = 4_000 * self.scale as u64;
        let ops = 15_000 * self.scale;
        let models: Vec<Verdict<BTreeMap<u64, u64>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let e = &e;
                    s.spawn(move || {
                        numa::set_current_node(t % self.nodes);
                        let mut rng = SmallRng::seed_from_u64(seed ^ t as u64);
                        let mut model = BTreeMap::new();
                        let own = |k: u64| k % THREADS as u64 == t as u64;
                        for i in 0..ops {
                            let k = rng.gen_range(0..keys / THREADS as u64) * THREADS as u64
                                + t as u64
                                + if t == 0 { THREADS as u64 } else { 0 };
                            let op = match rng.gen_range(0..20) {
                                0..=5 => Op::Insert(k, rng.gen()),
                                6..=7 => Op::Upsert(k, rng.gen()),
                                8..=9 => Op::Update(k, rng.gen()),
                                10..=13 => Op::Get(k),
                                14..=17 => Op::Remove(k),
                                _ => {
                                    let start = rng.gen_range(0..keys);
                                    let max = rng.gen_range(1..40);
                                    scan_own(e, &model, start, max, own).map_err(|v| {
                                        Violation(format!("thread {t} op {i}: {v}"))
                                    })?;
                                    continue;
                                }
                            };
                            step(e, &mut model, &op)
                                .map_err(|v| Violation(format!("thread {t} op {i}: {v}")))?;
                        }
                        Ok(model)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(panicked()))).collect()
        });
        let mut all = BTreeMap::new();
        for m in models {
            all.extend(m?);
        }
        check_entries(&e, &all)?;
        e.close().or_else(|err| fail("close()", err))?;
        let e = self.open_in(&path, SimMode::Direct)?;
        check_entries(&e, &all)?;
        e.close().or_else(|err| fail("close()", err))
    }

    /// `THREADS` threads run mixed operations and short scans on a small shared key space with
    /// unique values; every outcome, and the final state, must be explained by a linearization
    /// of each key's history (scans count as one atomic observation per key they cover).
    pub fn concurrent_shared(&self) -> Verdict {
        let seed = seed();
        self.shared_seeded(seed).map_err(|v| {
            Violation(format!(
                "concurrent_shared (NUMAKV_TEST_SEED={seed}){}: {v}",
                numakv_pmem::chaos::note()
            ))
        })
    }

    fn shared_seeded(&self, seed: u64) -> Verdict {
        let dir = scratch()?;
        let path = dir.path().join("store");
        let e = self.create_in(&path, PersistMode::Adr, SimMode::Direct)?;
        let keys = 48 * self.scale as u64;
        let ops = 4_000 * self.scale;
        // Preload half the keys so removes and updates find something from the start.
        let mut initial = BTreeMap::new();
        for k in (1..=keys).step_by(2) {
            match e.insert(k, k) {
                Ok(true) => {
                    initial.insert(k, k);
                }
                Ok(false) => return Err(Violation(format!("preload insert({k}) returned false"))),
                Err(err) => return fail(format!("preload insert({k})"), err),
            }
        }
        let clock = AtomicU64::new(0);
        // ORDERING: AcqRel on one counter: an operation whose response tick precedes another's
        // invocation tick happened before it, which is what real-time order means.
        let tick = || clock.fetch_add(1, Ordering::AcqRel);
        let histories: Vec<Verdict<Vec<(u64, Event)>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let e = &e;
                    let tick = &tick;
                    s.spawn(move || {
                        numa::set_current_node(t % self.nodes);
                        let mut rng = SmallRng::seed_from_u64(seed ^ (t as u64) << 32);
                        let mut events = Vec::with_capacity(ops * 2);
                        for i in 0..ops as u64 {
                            let k = rng.gen_range(1..=keys);
                            // Unique per thread and step: never equal to a preloaded value.
                            let v = ((t as u64 + 1) << 48) | (i + 1);
                            let kind = rng.gen_range(0..16);
                            let invoke = tick();
                            let (op, outcome) = match kind {
                                0..=3 => (LinOp::Insert(v), e.insert(k, v).map(Outcome::Bool)),
                                4..=5 => (LinOp::Upsert(v), e.upsert(k, v).map(|()| Outcome::Unit)),
                                6..=7 => (LinOp::Update(v), e.update(k, v).map(Outcome::Bool)),
                                8..=10 => (LinOp::Get, e.get(k).map(Outcome::Value)),
                                11..=13 => (LinOp::Remove, e.remove(k).map(Outcome::Bool)),
                                _ => {
                                    let max = rng.gen_range(1..12);
                                    let mut out = Vec::new();
                                    if let Err(err) = e.scan(k, max, &mut out) {
                                        return fail(format!("thread {t}: scan({k}, {max})"), err);
                                    }
                                    let response = tick();
                                    check_scan_shape(&out, k, max)?;
                                    let end = if out.len() == max {
                                        out.last().map_or(k, |p| p.0)
                                    } else {
                                        keys
                                    };
                                    let mut found = out.iter().peekable();
                                    for key in k..=end.min(keys) {
                                        let seen = match found.peek() {
                                            Some(&&(fk, fv)) if fk == key => {
                                                found.next();
                                                Some(fv)
                                            }
                                            _ => None,
                                        };
                                        events.push((
                                            key,
                                            Event {
                                                thread: t,
                                                op: LinOp::Observe,
                                                outcome: Outcome::Value(seen),
                                                invoke,
                                                response,
                                            },
                                        ));
                                    }
                                    ensure!(
                                        found.next().is_none(),
                                        "thread {t}: scan({k}, {max}) returned a key never inserted: {out:?}"
                                    );
                                    continue;
                                }
                            };
                            let response = tick();
                            let outcome = match outcome {
                                Ok(o) => o,
                                Err(err) => return fail(format!("thread {t}: op {i} on key {k}"), err),
                            };
                            events.push((k, Event { thread: t, op, outcome, invoke, response }));
                        }
                        Ok(events)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(panicked()))).collect()
        });
        let mut events = Vec::new();
        for h in histories {
            events.extend(h?);
        }
        let mut out = Vec::new();
        if let Err(err) = e.scan(0, usize::MAX, &mut out) {
            return fail("final scan", err);
        }
        let last: BTreeMap<u64, u64> = out.into_iter().collect();
        ensure!(
            last.keys().all(|k| (1..=keys).contains(k)),
            "the final scan holds keys nobody inserted"
        );
        linearize::check_history(&initial, events, &last, 1..=keys).map_err(Violation)?;
        check_entries(&e, &last)?;
        self.check_gates("concurrent_shared", &[e.stats()])?;
        e.close().or_else(|err| fail("close()", err))
    }
}

/// A scan by the thread owning the keys `own(k)`: ordered, and exactly its own model on its own
/// keys over the range the scan covered.
fn scan_own(
    e: &dyn Index,
    model: &BTreeMap<u64, u64>,
    start: u64,
    max: usize,
    own: impl Fn(u64) -> bool,
) -> Verdict {
    let mut out = Vec::new();
    if let Err(err) = e.scan(start, max, &mut out) {
        return fail(format!("scan({start}, {max})"), err);
    }
    check_scan_shape(&out, start, max)?;
    let end = if out.len() == max { out.last().map_or(start, |p| p.0) } else { u64::MAX };
    let mine: Vec<(u64, u64)> = out.iter().copied().filter(|&(k, _)| own(k)).collect();
    let want: Vec<(u64, u64)> = model.range(start..=end).map(|(&k, &v)| (k, v)).collect();
    ensure!(
        mine == want,
        "scan({start}, {max}) shows this thread's keys as {mine:x?}, its model has {want:x?}"
    );
    Ok(())
}

fn panicked() -> Violation {
    Violation("a worker thread panicked (see its message above)".into())
}
