//! A crash at every step of NOBtree's protocols with three writers on shared keys of the same
//! and neighbouring leaves: splits and merges, and migrations of leaves, inner nodes and
//! subindex roots (§III-D) run by a fourth thread meanwhile; ADR (crash at each fence) and eADR
//! (crash before each PM store). See `numakv_index::testkit::steps`, docs/design.md §12.3.

use numakv_index::testkit::steps::{preload_every, History, StepScenario, Writers};
use numakv_index::testkit::{Kit, Verdict, Violation};
use numakv_nobtree::{Nobtree, NobtreeOptions};
use numakv_pmem::PersistMode;

/// Height 3 (leaves, inner nodes, subindex roots); the coordinator exists (it keeps the
/// counters) but never queues anything on its own: the scenario migrates explicitly.
fn kit() -> Kit<Nobtree> {
    let mut opts = NobtreeOptions { height: 3, ..Default::default() };
    opts.migration.sample_every = u32::MAX;
    let mut kit = Kit::new(opts);
    kit.capacity_per_node = 32 << 20;
    kit
}

fn setup(e: &Nobtree, h: &History) -> Verdict {
    preload_every(e, h, 1)
}

fn writers(h: &History) -> Writers {
    Writers { threads: 3, ops: 40, keys: 1..=h.keys().min(48), nodes: 2, seed: 0x5eed_0036 }
}

fn smo(e: &Nobtree, h: &History, crashed: &(dyn Fn() -> bool + Sync)) -> Verdict {
    writers(h).run(e, h, crashed)
}

/// Leaves of the writers' keys, then their level-1 inner node and subindex root, each to the
/// other node, while the writers run.
fn migrate(e: &Nobtree, h: &History, crashed: &(dyn Fn() -> bool + Sync)) -> Verdict {
    writers(h).run_with(e, h, crashed, || {
        let steps = [(6, 0), (18, 0), (30, 0), (42, 0), (20, 1), (600, 1), (20, 2), (600, 2)];
        for (k, level) in steps {
            // To whichever node does not hold it (`Ok(false)` for the one that does, or when
            // the node changed meanwhile); an error only after a crash.
            for target in [0, 1] {
                if crashed() {
                    return Ok(());
                }
                let r = e.migrate_node_of(k, level, target);
                if r.is_err() && !crashed() {
                    return Err(Violation(format!("migrate_node_of({k}, {level}): {r:?}")));
                }
            }
        }
        Ok(())
    })
}

fn smo_scenario() -> StepScenario<'static, Nobtree> {
    StepScenario {
        name: "nobtree split/merge, 3 writers on shared keys",
        keys: 48,
        setup: &|e, h| {
            // Every third key: the writers' inserts split, their removes merge.
            for k in (1..=h.keys()).step_by(3) {
                h.preload(e, k, k | 1 << 40)?;
            }
            Ok(())
        },
        run: &smo,
        gates: &["splits"],
        max_points: 200,
    }
}

fn migration_scenario() -> StepScenario<'static, Nobtree> {
    StepScenario {
        name: "nobtree migrations (leaf, inner, root), 3 writers on shared keys",
        keys: 1200,
        setup: &setup,
        run: &migrate,
        gates: &["leaf_migrations", "inner_migrations", "root_migrations"],
        max_points: 200,
    }
}

#[test]
fn smo_every_fence_adr() {
    kit().step_crash(&smo_scenario(), PersistMode::Adr).unwrap();
}

#[test]
fn smo_every_store_eadr() {
    kit().step_crash(&smo_scenario(), PersistMode::Eadr).unwrap();
}

#[test]
fn migration_every_fence_adr() {
    kit().step_crash(&migration_scenario(), PersistMode::Adr).unwrap();
}

#[test]
fn migration_every_store_eadr() {
    kit().step_crash(&migration_scenario(), PersistMode::Eadr).unwrap();
}
