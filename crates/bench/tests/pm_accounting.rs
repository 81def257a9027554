//! The runner's PM accounting end to end: a toy target that touches one line of a two-node
//! volatile pool per operation. Alone in its test binary because accounting is process-global
//! (and the tests here take `SERIAL`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use numakv_bench::peers::Peer;
use numakv_bench::report::RunResult;
use numakv_bench::target::{Target, TargetEnv, TargetInstance};
use numakv_bench::{run, BenchConfig, Progress};
use numakv_index::{CheckReport, EngineStats, Index, Result};
use numakv_numa::Placement;
use numakv_pmem::{account, EngineId, PPtr, Pool, PoolConfig};

/// Operations the toy ran while accounting was on.
static COUNTED: AtomicU64 = AtomicU64::new(0);
/// Serialises the tests (accounting is process-global).
static SERIAL: Mutex<()> = Mutex::new(());

fn note_accounting() {
    if account::enabled() {
        COUNTED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Gets read a line of node 1; updates write and persist a line of node 0 (offset 1 MiB +
/// 64·(key % 64)).
struct Toy {
    pool: Arc<Pool>,
    inner: Arc<dyn Index>,
}

impl Toy {
    fn line(&self, node: usize, key: u64) -> usize {
        let p = PPtr::new(node, (1 << 20) + 64 * (key % 64)).expect("valid pptr");
        self.pool.resolve(p) as usize
    }
}

impl Index for Toy {
    fn name(&self) -> &'static str {
        "pm-toy"
    }
    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        self.inner.insert(key, value)
    }
    fn upsert(&self, key: u64, value: u64) -> Result<()> {
        self.inner.upsert(key, value)
    }
    fn update(&self, key: u64, value: u64) -> Result<bool> {
        note_accounting();
        let line = self.line(0, key);
        account::record_write(line, 8);
        self.pool.persist(line as *const u8, 8);
        self.inner.update(key, value)
    }
    fn get(&self, key: u64) -> Result<Option<u64>> {
        note_accounting();
        account::record_read(self.line(1, key), 8);
        self.inner.get(key)
    }
    fn remove(&self, key: u64) -> Result<bool> {
        self.inner.remove(key)
    }
    fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, u64)>) -> Result<usize> {
        self.inner.scan(start, max, out)
    }
    fn stats(&self) -> EngineStats {
        EngineStats { pm_bytes_per_node: vec![4096, 8192], ..self.inner.stats() }
    }
    fn check(&self) -> Result<CheckReport> {
        self.inner.check()
    }
}

struct ToyTarget;

impl Target for ToyTarget {
    fn name(&self) -> String {
        "pm-toy".into()
    }
    fn description(&self) -> String {
        "one PM line per get/update".into()
    }
    fn persistent(&self) -> bool {
        true
    }
    fn open(&self, env: &TargetEnv) -> numakv_bench::Result<Box<dyn TargetInstance>> {
        let mut cfg = PoolConfig::new(EngineId::new("pm-toy", 1), 4 << 20);
        cfg.nodes = env.topology.node_count();
        cfg.mode = env.persist;
        let pool = Pool::volatile(cfg).map_err(numakv_index::Error::from)?;
        Ok(Box::new(ToyInstance(Arc::new(Toy { pool, inner: Peer::RwLockBTree.new_index() }))))
    }
}

struct ToyInstance(Arc<Toy>);

impl TargetInstance for ToyInstance {
    fn index(&self) -> Arc<dyn Index> {
        self.0.clone()
    }
}

fn toy_config() -> BenchConfig {
    BenchConfig {
        workload: "ycsb-a".into(),
        dist: Some("uniform".parse().unwrap()),
        keys: Some(2_000),
        ops: Some(20_000),
        threads: vec![2],
        nodes: 2,
        placement: Placement::Interleave,
        quiet: true,
        ..BenchConfig::default()
    }
}

/// Runs the toy; returns its result and the operations it ran with accounting on.
fn run_toy(config: &BenchConfig) -> (RunResult, u64) {
    COUNTED.store(0, Ordering::Relaxed);
    let targets: Vec<Arc<dyn Target>> = vec![Arc::new(ToyTarget)];
    let report = run(config, &targets, Progress::Hidden).unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert!(!account::enabled(), "the runner turns accounting off after the run");
    (report.runs[0].clone(), COUNTED.load(Ordering::Relaxed))
}

#[test]
fn runner_reports_pm_lines_remote_share_flushes_and_space() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let config = toy_config();
    let (r, counted) = run_toy(&config);
    let r = &r;
    let near = |x: Option<f64>, want: f64| x.is_some_and(|x| (x - want).abs() < 0.03);
    // ycsb-a: half gets (one line read), half updates (one line written, flushed, fenced).
    assert!(near(r.pm_reads_per_op, 0.5), "reads {:?}", r.pm_reads_per_op);
    assert!(near(r.pm_writes_per_op, 0.5), "writes {:?}", r.pm_writes_per_op);
    assert!(near(r.flushes_per_op, 0.5), "flushes {:?}", r.flushes_per_op);
    assert!(near(r.fences_per_op, 0.5), "fences {:?}", r.fences_per_op);
    // The two workers sit on nodes 0 and 1 and do half the operations each: worker 0's reads
    // (of node 1) and worker 1's writes (of node 0) are remote.
    assert!(near(r.remote_reads_per_op, 0.25), "remote reads {:?}", r.remote_reads_per_op);
    assert!(near(r.remote_writes_per_op, 0.25), "remote writes {:?}", r.remote_writes_per_op);
    assert!(near(r.remote_share, 0.5), "remote share {:?}", r.remote_share);
    // The toy has no background threads: everything counted is the workers' own.
    assert_eq!(r.fg_pm_writes_per_op, r.pm_writes_per_op);
    assert_eq!((r.bg_share, r.pending.as_deref()), (Some(0.0), None));
    assert_eq!((r.pm_bytes, r.pm_bytes_per_node.clone()), (12_288, vec![4096, 8192]));
    // The figures come from a separate accounting phase: the timed operations (and the
    // warm-up) ran with accounting off, then a quarter as many ran counted.
    assert_eq!(r.ops, 20_000);
    let share = (20_000.0 * numakv_bench::runner::ACCOUNTED_SHARE) as u64;
    assert_eq!(r.accounted_ops, share);
    assert_eq!(counted, r.accounted_ops, "operations that ran with accounting on");
}

#[test]
fn with_latency_emulation_the_timed_operations_are_the_counted_ones() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let config = BenchConfig { latency: numakv_pmem::LatencyModel::OPTANE, ..toy_config() };
    let (r, counted) = run_toy(&config);
    assert_eq!(r.accounted_ops, 0);
    // Warm-up and timed phase both counted (the warm-up's lines are discarded).
    assert_eq!(counted, r.ops + 2_000, "operations that ran with accounting on");
    assert!(r.pm_reads_per_op.is_some_and(|x| (x - 0.5).abs() < 0.03), "{:?}", r.pm_reads_per_op);
    assert!(r.flushes_per_op.is_some_and(|x| (x - 0.5).abs() < 0.03), "{:?}", r.flushes_per_op);
}

#[test]
fn latency_emulation_without_accounting_measures_lines_but_not_flushes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let config = BenchConfig {
        accounting: false,
        latency: numakv_pmem::LatencyModel::OPTANE,
        ..toy_config()
    };
    let (r, _) = run_toy(&config);
    // The emulation's bookkeeping counts lines (it charges each line's first touch) ...
    assert!(r.pm_reads_per_op.is_some_and(|x| (x - 0.5).abs() < 0.03), "{:?}", r.pm_reads_per_op);
    assert!(r.remote_share.is_some());
    // ... but not flushes or fences: those were not measured, and say so.
    assert_eq!((r.flushes_per_op, r.fences_per_op, r.smo_flushes_per_op), (None, None, None));
    assert_eq!(r.fg_flushes_per_op, None);
}

#[test]
fn without_accounting_nothing_is_counted() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let config = BenchConfig { accounting: false, ..toy_config() };
    let (r, counted) = run_toy(&config);
    assert_eq!((r.accounted_ops, counted), (0, 0));
    // Not measured is not zero: every PM figure is absent.
    let figures = [
        r.pm_reads_per_op,
        r.pm_writes_per_op,
        r.remote_reads_per_op,
        r.remote_writes_per_op,
        r.remote_share,
        r.flushes_per_op,
        r.fences_per_op,
        r.smo_reads_per_op,
        r.smo_writes_per_op,
        r.smo_flushes_per_op,
        r.fg_pm_reads_per_op,
        r.fg_pm_writes_per_op,
        r.fg_flushes_per_op,
        r.bg_share,
    ];
    assert_eq!(figures, [None; 14]);
}

// Accounting must count exactly what it counted before it was made cheap (issue 40): every PM
// figure of `numakv repro pm-lines` (scale 0.2, seed 42) equals the one recorded on the code
// before the change (`tests/data/pm_lines_before_issue40.json`; figures that differ between
// runs of that code, e.g. a background thread's share, are not in the file).
//
// An engine change that legitimately changes what an operation touches updates the file in
// the same commit, and says why.

#[test]
fn pm_lines_figures_equal_the_recorded_ones() {
    use numakv_bench::repro::{self, ReproOptions};
    use serde_json::Value;

    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let golden: Value =
        serde_json::from_str(include_str!("data/pm_lines_before_issue40.json")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = ReproOptions {
        out_dir: dir.path().to_path_buf(),
        scale: 0.2,
        seed: 42,
        quiet: true,
        ..ReproOptions::default()
    };
    let targets = numakv_bench::engines::select(&["default".to_owned()]).unwrap();
    let out = repro::run("pm-lines", &targets, &opts, Progress::Hidden).unwrap();
    assert!(out.report.failures.is_empty(), "{:?}", out.report.failures);
    let measured: Value = serde_json::from_str(&out.report.to_json().unwrap()).unwrap();
    let runs = measured["runs"].as_array().unwrap();
    let mut compared = 0;
    let mut wrong = Vec::new();
    for g in golden["runs"].as_array().unwrap() {
        let (engine, workload) = (g["engine"].as_str().unwrap(), g["workload"].as_str().unwrap());
        let run = runs
            .iter()
            .find(|r| r["engine"] == engine && r["workload"] == workload)
            .unwrap_or_else(|| panic!("no {engine} {workload} run in the measurement"));
        for (field, want) in g["figures"].as_object().unwrap() {
            let (want, got) = (want.as_f64().unwrap(), run[field].as_f64().unwrap());
            compared += 1;
            if (want - got).abs() > 1e-9 {
                wrong.push(format!("{engine} {workload} {field}: recorded {want}, now {got}"));
            }
        }
    }
    assert!(compared > 250, "only {compared} figures compared");
    assert!(wrong.is_empty(), "PM figures changed:\n{}", wrong.join("\n"));
}
