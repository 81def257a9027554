//! A crash at every step of an NStore GC pass (§III-F) run while three writers append to the
//! same keys' clusters, in ADR (crash at each fence) and eADR (crash before each PM store); see
//! `numakv_index::testkit::steps` and docs/design.md §12.3. One cluster, small files:
//! the preload's rewrites leave sealed files mostly garbage, so the pass reclaims and rewrites.

use numakv_index::testkit::steps::{History, StepScenario, Writers};
use numakv_index::testkit::{Kit, Verdict, Violation};
use numakv_nstore::{NStore, NStoreOptions};
use numakv_pmem::PersistMode;

fn kit() -> Kit<NStore> {
    let opts = NStoreOptions {
        clusters: 1,
        log_file_size: 16 << 10,
        gc_threads_per_node: 0,
        recovery_threads: 2,
        // A small DRAM cache: allocating the default 64 MiB took 100 ms per store.
        cache_bytes: 1 << 20,
        ..Default::default()
    };
    let mut kit = Kit::new(opts);
    kit.page_size = 4 << 10;
    kit.capacity_per_node = 4 << 20;
    kit
}

/// Every key written six times from node 0 into one cluster: the first (64 KiB) file is
/// sealed and mostly garbage.
fn setup(e: &NStore, h: &History) -> Verdict {
    numakv_pmem::numa::set_current_node(0);
    for round in 0..6u64 {
        for k in 1..=h.keys() {
            h.preload(e, k, k << 8 | round)?;
        }
    }
    Ok(())
}

fn gc(e: &NStore, h: &History, crashed: &(dyn Fn() -> bool + Sync)) -> Verdict {
    let writers = Writers { threads: 3, ops: 30, keys: 1..=32, nodes: 2, seed: 0x5eed_0034 };
    writers.run_with(e, h, crashed, || {
        for _ in 0..2 {
            if crashed() {
                break;
            }
            if let Err(err) = e.collect_garbage() {
                if !crashed() {
                    return Err(Violation(format!("collect_garbage: {err}")));
                }
            }
        }
        Ok(())
    })
}

fn scenario() -> StepScenario<'static, NStore> {
    StepScenario {
        name: "nstore GC pass, 3 writers on shared keys",
        keys: 400,
        setup: &setup,
        run: &gc,
        gates: &["gc_files_reclaimed", "gc_entries_rewritten"],
        max_points: 200,
    }
}

#[test]
fn gc_every_fence_adr() {
    kit().step_crash(&scenario(), PersistMode::Adr).unwrap();
}

#[test]
fn gc_every_store_eadr() {
    kit().step_crash(&scenario(), PersistMode::Eadr).unwrap();
}
