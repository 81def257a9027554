//! The PM figures of a run count the background threads' work of the counted phase (F3-tree's
//! evaluators, NStore's GC, NOBtree's migration coordinator, Nap's switch), beside the
//! foreground-only figures and the background share (docs/design.md §11).

use std::sync::{Arc, Mutex};

use numakv::EngineKind;
use numakv_bench::engines::EngineTarget;
use numakv_bench::{run, BenchConfig, LatencyModel, Progress, RunResult, Target};

/// One run at a time: the accounting and its per-thread totals are process-wide.
static SERIAL: Mutex<()> = Mutex::new(());

fn run_target(target: EngineTarget, config: BenchConfig) -> RunResult {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let scratch = tempfile::tempdir().unwrap();
    let name = target.name().to_owned();
    let config = BenchConfig {
        engines: vec![name.clone()],
        threads: vec![2],
        nodes: 2,
        scratch: Some(scratch.path().to_path_buf()),
        ..config
    };
    let targets: Vec<Arc<dyn Target>> = vec![Arc::new(target)];
    let report = run(&config, &targets, Progress::Hidden).unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let r = report.runs.into_iter().next().unwrap();
    assert_eq!(r.pending, None, "{name}: the runner waited for the background work");
    r
}

fn counter(r: &RunResult, name: &str) -> u64 {
    r.counters.get(name).copied().unwrap_or_else(|| panic!("{}: no counter {name}", r.engine))
}

/// The background figures are the total less the workers' own, and are above zero.
fn assert_background_counted(r: &RunResult) {
    let (all, fg) = (r.pm_writes_per_op.unwrap(), r.fg_pm_writes_per_op.unwrap());
    let (all_rd, fg_rd) = (r.pm_reads_per_op.unwrap(), r.fg_pm_reads_per_op.unwrap());
    let bg = r.bg_share.unwrap();
    assert!(bg > 0.0 && bg < 1.0, "{}: background share {bg}", r.engine);
    assert!(all + all_rd > fg + fg_rd, "{}: {all}+{all_rd} lines vs {fg}+{fg_rd}", r.engine);
    let want = 1.0 - (fg + fg_rd) / (all + all_rd);
    assert!((bg - want).abs() < 1e-9, "{}: share {bg} vs {want}", r.engine);
    assert!(r.flushes_per_op.unwrap() >= r.fg_flushes_per_op.unwrap(), "{}", r.engine);
}

fn small(workload: &str) -> BenchConfig {
    BenchConfig {
        workload: workload.into(),
        keys: Some(20_000),
        ops: Some(40_000),
        ..BenchConfig::default()
    }
}

#[test]
fn f3tree_counts_its_evaluators_writes() {
    let r = run_target(EngineTarget::new(EngineKind::F3Tree), small("nobtree-write-heavy"));
    assert_background_counted(&r);
    // The evaluators write the tree: most of the written lines are theirs.
    let (all, fg) = (r.pm_writes_per_op.unwrap(), r.fg_pm_writes_per_op.unwrap());
    assert!(all > 2.0 * fg, "f3tree writes {all} lines/op, its producers {fg}");
}

#[test]
fn nstore_counts_its_gc() {
    // Small files and a low threshold, so sealed files fill with garbage and GC reclaims them
    // during the counted phase (or in the runner's wait for it at the end).
    let target = EngineTarget::variant(
        "nstore-gc",
        "nstore with small files and eager GC",
        EngineKind::NStore,
        &[("clusters", "2"), ("log_file_size", "64KiB"), ("gc_threshold", "0.1")],
    )
    .unwrap();
    let r = run_target(
        target,
        BenchConfig { mix: Some("update:1".parse().unwrap()), ..small("ycsb-a") },
    );
    assert!(counter(&r, "gc_files_reclaimed") > 0, "{:?}", r.counters);
    assert_background_counted(&r);
}

#[test]
fn nobtree_counts_its_migrations() {
    // Every operation sampled and a low hot threshold: the coordinator migrates nodes that the
    // other node's worker uses.
    let target = EngineTarget::variant(
        "nobtree-eager",
        "nobtree with eager migration",
        EngineKind::Nobtree,
        &[("migration_sample_every", "1"), ("migration_hot_threshold", "2")],
    )
    .unwrap();
    let r = run_target(target, small("nobtree-write-heavy"));
    assert!(counter(&r, "migrations") > 0, "{:?}", r.counters);
    assert_background_counted(&r);
}

#[test]
fn nap_counts_its_switches() {
    // With latency emulation the timed phase is the counted one; the hot spot (200 equally hot
    // keys, Nap's hot-set size) moves half-way through it, and a fast check of every access
    // switches to the new hot set within the phase (as `repro nap-shift` does, faster).
    let target = EngineTarget::variant(
        "nap-fastfair-fast",
        "nap-fastfair with a 5 ms hot-set check",
        EngineKind::NapFastFair,
        &[("hot", "200"), ("sample", "1"), ("check_period_ms", "5")],
    )
    .unwrap();
    let config = BenchConfig {
        latency: LatencyModel::OPTANE,
        dist: Some("hotspot:0.01:0.9@50%".parse().unwrap()),
        ops: Some(200_000),
        ..small("ycsb-a")
    };
    let r = run_target(target, config);
    assert!(counter(&r, "nap_switches") > 0, "{:?}", r.counters);
    assert_background_counted(&r);
}
