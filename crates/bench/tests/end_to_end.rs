//! A tiny benchmark over the DRAM peers that writes JSON, CSV and SVG and checks them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use numakv_bench::peers::{self, Peer};
use numakv_bench::report::COLUMNS;
use numakv_bench::target::{self, Reopen, Target, TargetEnv, TargetInstance};
use numakv_bench::{repro, run, write_outputs, BenchConfig, BenchError, Progress, Report};
use numakv_index::Index;

fn small(workload: &str, threads: Vec<usize>) -> BenchConfig {
    BenchConfig {
        engines: vec!["all".into()],
        workload: workload.into(),
        keys: Some(1_000),
        ops: Some(4_000),
        threads,
        nodes: 2,
        check: true,
        quiet: true,
        ..BenchConfig::default()
    }
}

#[test]
fn peers_end_to_end_writes_json_csv_svg() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small("ycsb-a,nobtree-scan", vec![1, 2]);
    config.json = Some(dir.path().join("a/bench.json"));
    config.csv = Some(dir.path().join("bench.csv"));
    config.plot = Some(dir.path().join("bench.svg"));
    config.out = Some(dir.path().join("out"));
    let targets = target::resolve(&config.engines, &peers::all()).unwrap();
    let report = run(&config, &targets, Progress::Auto).unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.runs.len(), 3 * 2 * 2);
    for r in &report.runs {
        assert_eq!(r.ops, 4_000, "{r:?}");
        assert!(r.throughput_mops > 0.0 && r.seconds > 0.0);
        assert!(
            r.p50_ns > 0 && r.p50_ns <= r.p99_ns && r.p99_ns <= r.p999_ns && r.p999_ns <= r.max_ns
        );
        assert_eq!((r.keys, r.nodes), (1_000, 2));
        assert_eq!(r.pm_reads_per_op, Some(0.0), "DRAM peers touch no PM");
        assert!(r.dram_bytes > 0);
        assert!(r.miss_ratio < 0.5, "{}: {}", r.engine, r.miss_ratio);
    }
    let files = write_outputs(&report, &config).unwrap();
    assert_eq!(files.len(), 7);

    // JSON: {"runs":[...]} with the field names.
    let text = std::fs::read_to_string(dir.path().join("a/bench.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 12);
    for field in [
        "engine",
        "workload",
        "threads",
        "nodes",
        "persist",
        "ops",
        "seconds",
        "throughput_mops",
        "p50_ns",
        "p99_ns",
        "p999_ns",
        "pm_reads_per_op",
        "pm_writes_per_op",
        "remote_reads_per_op",
        "remote_writes_per_op",
        "flushes_per_op",
        "fences_per_op",
        "pm_bytes",
        "dram_bytes",
    ] {
        assert!(runs.iter().all(|r| r.get(field).is_some()), "missing {field}");
    }
    assert_eq!(runs[0]["persist"], "adr");
    let back = Report::read_json(&dir.path().join("out/results.json")).unwrap();
    assert_eq!(back.runs.len(), report.runs.len());
    for (a, b) in back.runs.iter().zip(&report.runs) {
        assert_eq!(
            (&a.engine, &a.workload, a.threads, a.ops),
            (&b.engine, &b.workload, b.threads, b.ops)
        );
        assert!((a.throughput_mops - b.throughput_mops).abs() <= 1e-9 * b.throughput_mops);
    }

    // CSV: a header with the columns, one row per run.
    let csv = std::fs::read_to_string(dir.path().join("bench.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next().unwrap(), COLUMNS.join(","));
    assert_eq!(lines.filter(|l| l.split(',').count() == COLUMNS.len()).count(), 12);

    // SVG: labelled axes, units, a legend naming every engine, one panel per workload.
    let svg = std::fs::read_to_string(dir.path().join("bench.svg")).unwrap();
    assert!(svg.starts_with("<svg") || svg.contains("<svg"));
    for needle in ["worker threads", "throughput (million ops/s)", "ycsb-a", "nobtree-scan"] {
        assert!(svg.contains(needle), "plot lacks {needle:?}");
    }
    for p in peers::all() {
        assert!(svg.contains(&p.name()), "legend lacks {}", p.name());
    }
    assert!(
        dir.path().join("out/results.txt").exists()
            && dir.path().join("out/throughput.svg").exists()
    );
}

#[test]
fn one_thread_count_draws_bars() {
    let dir = tempfile::tempdir().unwrap();
    let config = small("nstore-put100", vec![2]);
    let report = run(&config, &peers::all(), Progress::Hidden).unwrap();
    assert_eq!(report.runs.len(), 3);
    // put100 starts empty and inserts fresh keys only.
    assert!(report.runs.iter().all(|r| r.keys == 0 && r.miss_ratio == 0.0));
    let path = dir.path().join("bars.svg");
    report.plot_svg(&path).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.contains("throughput at 2 threads") && svg.contains("engine"));
    assert!(svg.contains("<rect"));
}

#[test]
fn same_seed_same_run() {
    let mut config = small("nbtree-upsert:80", vec![1]);
    config.engines = vec!["rwlock-btreemap".into()];
    config.keys = Some(500);
    let t = target::resolve(&config.engines, &peers::all()).unwrap();
    let a = run(&config, &t, Progress::Hidden).unwrap();
    let b = run(&config, &t, Progress::Hidden).unwrap();
    assert_eq!(a.runs[0].miss_ratio, b.runs[0].miss_ratio);
    config.workload = "nstore-delete100".into();
    config.ops = Some(450);
    config.warmup = 0.1; // 45 warm-up deletes + 450 measured ≤ 500 keys
    let d = run(&config, &t, Progress::Hidden).unwrap();
    assert_eq!(d.runs[0].miss_ratio, 0.0, "each loaded key deleted exactly once");
}

/// A pretend persistent target: a DRAM peer whose reopen rebuilds the map from a copy.
struct Reopening {
    opened: Arc<AtomicUsize>,
}

struct ReopeningInstance {
    index: Arc<dyn Index>,
    opened: Arc<AtomicUsize>,
}

impl Target for Reopening {
    fn name(&self) -> String {
        "reopening".into()
    }
    fn description(&self) -> String {
        "test target".into()
    }
    fn persistent(&self) -> bool {
        true
    }
    fn open(&self, env: &TargetEnv) -> numakv_bench::Result<Box<dyn TargetInstance>> {
        assert!(env.dir.is_dir());
        assert!(env.topology.node_count() >= 1 && env.threads >= 1);
        Ok(Box::new(ReopeningInstance {
            index: Peer::RwLockBTree.new_index(),
            opened: Arc::clone(&self.opened),
        }))
    }
}

impl TargetInstance for ReopeningInstance {
    fn index(&self) -> Arc<dyn Index> {
        Arc::clone(&self.index)
    }
    fn reopen(&mut self, how: Reopen) -> numakv_bench::Result<Option<Duration>> {
        assert_eq!(Arc::strong_count(&self.index), 1, "the runner dropped its clones");
        let t = Instant::now();
        let fresh = Peer::RwLockBTree.new_index();
        let mut out = Vec::new();
        self.index.scan(1, usize::MAX, &mut out)?;
        for (k, v) in out {
            fresh.insert(k, v)?;
        }
        self.index = fresh;
        self.opened.fetch_add(1 + usize::from(how == Reopen::Crash), Ordering::Relaxed);
        Ok(Some(t.elapsed()))
    }
}

struct Refusing;

impl Target for Refusing {
    fn name(&self) -> String {
        "refusing".into()
    }
    fn description(&self) -> String {
        "fails to open".into()
    }
    fn persistent(&self) -> bool {
        true
    }
    fn open(&self, _: &TargetEnv) -> numakv_bench::Result<Box<dyn TargetInstance>> {
        Err(BenchError::Target { target: "refusing".into(), message: "no pool today".into() })
    }
}

#[test]
fn reopen_and_crash_are_timed_and_failures_recorded() {
    let opened = Arc::new(AtomicUsize::new(0));
    let targets: Vec<Arc<dyn Target>> =
        vec![Arc::new(Reopening { opened: Arc::clone(&opened) }), Arc::new(Refusing)];
    let mut config = small("ycsb-b", vec![2]);
    config.reopen = true;
    config.crash = true;
    let report = run(&config, &targets, Progress::Hidden).unwrap();
    assert_eq!(report.runs.len(), 1);
    let r = &report.runs[0];
    assert!(r.reopen_ms.is_some() && r.recover_ms.is_some());
    assert_eq!(opened.load(Ordering::Relaxed), 3);
    assert_eq!(report.failures.len(), 1);
    assert!(report.failures[0].error.contains("no pool today"));
    assert!(report.to_table().contains("FAILED refusing"));
}

#[test]
fn timed_runs_and_hotspot_shift() {
    let mut config = small("ycsb-c", vec![2]);
    config.engines = vec!["scc-treeindex".into()];
    config.ops = None;
    config.duration = Some(0.3);
    config.dist = Some("hotspot:0.1:0.9@0.1s".parse().unwrap());
    let t = target::resolve(&config.engines, &peers::all()).unwrap();
    let report = run(&config, &t, Progress::Hidden).unwrap();
    let r = &report.runs[0];
    assert!(r.seconds >= 0.29 && r.seconds < 2.0, "{}", r.seconds);
    assert!(r.ops > 1000);
    assert_eq!(r.dist, "hotspot:0.1:0.9@0.1s");
}

#[test]
fn workloads_that_use_up_their_keys_run_by_count_under_a_time_budget() {
    let mut config = small("nstore-delete100", vec![2]);
    config.engines = vec!["scc-treeindex".into()];
    config.keys = Some(5_000);
    config.ops = None;
    config.budget = Some(0.5);
    let t = target::resolve(&config.engines, &peers::all()).unwrap();
    let report = run(&config, &t, Progress::Hidden).unwrap();
    let r = &report.runs[0];
    // As many deletes as the keys allow after the warm-up, every one a hit — not half a second
    // of deletes of keys already gone.
    assert!(r.ops > 4_000 && r.ops < 5_000, "{}", r.ops);
    assert_eq!(r.miss_ratio, 0.0);
}

#[test]
fn unknown_engines_are_named() {
    let err = target::resolve(&["scc-treeindex,btrfs".into()], &peers::all()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("btrfs") && msg.contains("crossbeam-skiplist"), "{msg}");
}

#[test]
fn repros_run_on_peers() {
    let dir = tempfile::tempdir().unwrap();
    let opts = repro::ReproOptions {
        out_dir: dir.path().to_path_buf(),
        scale: 0.05,
        quiet: true,
        ..repro::ReproOptions::default()
    };
    let targets: Vec<Arc<dyn Target>> = vec![
        Arc::new(peers::PeerTarget(Peer::SccTree)),
        Arc::new(Reopening { opened: Arc::new(AtomicUsize::new(0)) }),
    ];
    // `redis` drives redis-server and `numakv serve` processes, not targets (crates/cli's tests).
    for info in repro::list().iter().filter(|r| r.name != "redis") {
        let out = repro::run(info.name, &targets, &opts, Progress::Hidden).unwrap();
        assert!(out.report.failures.is_empty(), "{}: {:?}", info.name, out.report.failures);
        assert!(out.files.iter().all(|f| f.exists()));
        let md = std::fs::read_to_string(dir.path().join(format!("{}.md", info.name))).unwrap();
        // nobtree-migration is engine-specific (nobtree with and without its coordinator).
        // nap-shift too (nap-fastfair with each switch mode), and value-size (the byte twins
        // of nstore and fastfair).
        let named = match info.name {
            "nobtree-migration" => "nobtree-nomigrate",
            "nap-shift" => "global-lock",
            "value-size" => "| nstore | 4096 |",
            _ => "scc-treeindex",
        };
        assert!(md.contains("## Our measurement") && md.contains(named), "{}", info.name);
        assert!(md.contains("claim"));
    }
    let md = std::fs::read_to_string(dir.path().join("pm-lines.md")).unwrap();
    assert!(md.contains("| NBTree | 1/1/1 | 1/1/1 | 1 |"), "{md}");
    assert!(md.contains("| scc-treeindex | delete |"));
    let md = std::fs::read_to_string(dir.path().join("recovery.md")).unwrap();
    assert!(md.contains("0.32 s") && md.contains("recovery.svg"));
    assert!(dir.path().join("recovery.svg").exists());
}
