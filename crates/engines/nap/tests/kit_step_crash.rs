//! A crash at every step of Nap's switches (§4.5: build, log, publish, flush the previous NAL,
//! recycle) while three writers and readers use the keys the NALs cover, in ADR (crash at each
//! fence) and eADR (crash before each PM store); three switches, two of them with a previous
//! NAL. See `numakv_index::testkit::steps` and docs/design.md §12.3.

use numakv_fastfair::FastFair;
use numakv_index::testkit::steps::{preload_every, History, StepScenario, Writers};
use numakv_index::testkit::{Kit, Verdict, Violation};
use numakv_nap::{Nap, NapOptions};
use numakv_pmem::PersistMode;

fn kit() -> Kit<Nap<FastFair>> {
    let opts = NapOptions {
        background: false,
        sketch_width: 1024,
        record_buffer: 64,
        ..Default::default()
    };
    let mut kit = Kit::new(opts);
    kit.capacity_per_node = 32 << 20;
    kit
}

fn setup(e: &Nap<FastFair>, h: &History) -> Verdict {
    preload_every(e, h, 2)
}

fn switches(e: &Nap<FastFair>, h: &History, crashed: &(dyn Fn() -> bool + Sync)) -> Verdict {
    let writers = Writers { threads: 3, ops: 40, keys: 1..=32, nodes: 2, seed: 0x5eed_0035 };
    writers.run_with(e, h, crashed, || {
        let sets: [Vec<u64>; 3] =
            [(1..=16).collect(), (9..=24).collect(), (17..=32).step_by(2).collect()];
        for set in &sets {
            if crashed() {
                break;
            }
            if let Err(err) = e.switch_to(set) {
                if !crashed() {
                    return Err(Violation(format!("switch_to: {err}")));
                }
            }
        }
        Ok(())
    })
}

fn scenario() -> StepScenario<'static, Nap<FastFair>> {
    StepScenario {
        name: "nap switches, 3 writers on the NALs' keys",
        keys: 32,
        setup: &setup,
        run: &switches,
        gates: &["nap_switches", "nap_switches_with_previous"],
        max_points: 200,
    }
}

#[test]
fn switch_every_fence_adr() {
    kit().step_crash(&scenario(), PersistMode::Adr).unwrap();
}

#[test]
fn switch_every_store_eadr() {
    kit().step_crash(&scenario(), PersistMode::Eadr).unwrap();
}
