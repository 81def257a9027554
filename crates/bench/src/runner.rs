//! The benchmark runner: for every workload × target × thread count, a fresh instance, a parallel
//! load, a warm-up, then a measured phase with per-thread PM accounting and sampled latencies.
//!
//! Workers are placed on (real or emulated) NUMA nodes by a [`Registry`] with the configured
//! [`Placement`], which also makes each worker's node its `current_node()` — the node PM
//! accounting compares line homes against. Every operation ends with [`account::op_end`].

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use numakv_index::Index;
use numakv_numa::{Placement, Registry, Topology};
use numakv_pmem::account::{self, AccessStats};
use numakv_pmem::{LatencyModel, PersistMode};
use serde::{Deserialize, Serialize};

use crate::dist::{Dist, Shift};
use crate::error::{BenchError, Result};
use crate::presets;
use crate::report::{Report, RunFailure, RunResult};
use crate::target::{Reopen, Target, TargetEnv};
use crate::workload::{mix_seed, Mix, OpKind, OpStream, Workload};

/// Serde through `Display` / `FromStr`, for the substrate's enums.
mod as_string {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<T: Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        String::deserialize(d)?.parse().map_err(de::Error::custom)
    }
}

/// Like `as_string`, for optional values.
mod opt_as_string {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<T: Display, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        match Option::<String>::deserialize(d)? {
            Some(s) => s.parse().map(Some).map_err(de::Error::custom),
            None => Ok(None),
        }
    }
}

/// Everything `numakv bench` takes; field names follow the flags of issue 4 (`--engines`,
/// `--workload`, `--keys`, ...). Serde-friendly (JSON/TOML config files) with defaults for
/// every field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BenchConfig {
    /// `--engines a,b|all`: target names (resolved by [`crate::target::resolve`]).
    pub engines: Vec<String>,
    /// `--workload NAME[,NAME...]`: preset names ([`presets::by_name`]); default
    /// [`presets::DEFAULT_COMPARISON`].
    pub workload: String,
    /// `--keys N`: keys loaded before the run (default: the preset's).
    pub keys: Option<u64>,
    /// `--ops N`: measured operations, all threads together (default: the preset's).
    pub ops: Option<u64>,
    /// `--duration SECONDS`: run for a time instead of an operation count.
    pub duration: Option<f64>,
    /// `--budget SECONDS`: measured time spread evenly over all runs, so a comparison of many
    /// targets takes a known time (each run lasts `budget / runs`, clamped to
    /// [`BUDGET_RUN_SECONDS`]). Ignored when `ops` or `duration` is set.
    pub budget: Option<f64>,
    /// `--threads 1,2,4`: worker thread counts, one run each.
    pub threads: Vec<usize>,
    /// `--nodes K`: NUMA nodes, emulated if the machine has fewer.
    pub nodes: usize,
    /// `--placement fill|interleave`.
    #[serde(with = "as_string")]
    pub placement: Placement,
    /// `--persist adr|eadr`.
    #[serde(with = "as_string")]
    pub persist: PersistMode,
    /// `--latency none|optane`: emulated PM latency during the measured phase.
    #[serde(with = "as_string")]
    pub latency: LatencyModel,
    /// `--dist uniform|zipf:0.99|...`: overrides the preset's distribution ([`Dist::SYNTAX`]).
    #[serde(with = "opt_as_string")]
    pub dist: Option<Dist>,
    /// `--mix get:50,update:50`: overrides the preset's operation mix.
    #[serde(with = "opt_as_string")]
    pub mix: Option<Mix>,
    /// `--seed N`.
    pub seed: u64,
    /// `--warmup F`: share of the operations (or of the duration) run before measuring.
    pub warmup: f64,
    /// `--latency-sample N`: time every N-th operation (1 = all).
    pub latency_sample: u32,
    /// Count PM lines, flushes and fences (`--no-accounting` turns it off).
    pub accounting: bool,
    /// `--reopen`: time a clean close + open after the run.
    pub reopen: bool,
    /// `--crash`: time a crash + recovery after the run.
    pub crash: bool,
    /// `--check`: run the structural check after the run (and after recovery).
    pub check: bool,
    /// `--pin true|false`: pin workers to CPUs (default: only on real multi-node machines).
    pub pin: Option<bool>,
    /// `--load-threads N`: loader threads (default: the run's thread count).
    pub load_threads: Option<usize>,
    /// `--scratch DIR`: where stores are created (default: [`default_scratch`]).
    pub scratch: Option<PathBuf>,
    /// `--json PATH`.
    pub json: Option<PathBuf>,
    /// `--csv PATH`.
    pub csv: Option<PathBuf>,
    /// `--plot PATH.svg`.
    pub plot: Option<PathBuf>,
    /// `--out DIR`: writes `results.json`, `results.csv`, `results.txt`, `throughput.svg` there.
    pub out: Option<PathBuf>,
    /// `--quiet`: no progress bars.
    pub quiet: bool,
}

impl Default for BenchConfig {
    fn default() -> BenchConfig {
        BenchConfig {
            engines: vec!["all".into()],
            workload: presets::DEFAULT_COMPARISON.into(),
            keys: None,
            ops: None,
            duration: None,
            budget: None,
            threads: vec![1, 2],
            nodes: 2,
            placement: Placement::Fill,
            persist: PersistMode::Adr,
            latency: LatencyModel::NONE,
            dist: None,
            mix: None,
            seed: 42,
            warmup: 0.1,
            latency_sample: 1,
            accounting: true,
            reopen: false,
            crash: false,
            check: false,
            pin: None,
            load_threads: None,
            scratch: None,
            json: None,
            csv: None,
            plot: None,
            out: None,
            quiet: false,
        }
    }
}

impl BenchConfig {
    /// The workloads named by `workload`, with the `dist` / `mix` overrides applied.
    ///
    /// # Errors
    ///
    /// [`BenchError::UnknownWorkload`] or [`BenchError::Config`].
    pub fn workloads(&self) -> Result<Vec<Workload>> {
        let mut out = Vec::new();
        for name in self.workload.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let mut w = presets::by_name(name)?;
            if let Some(d) = &self.dist {
                w.dist = d.clone();
            }
            if let Some(m) = &self.mix {
                w.mix = m.clone();
            }
            w.validate()?;
            out.push(w);
        }
        if out.is_empty() {
            return Err(BenchError::Config("no workload given".into()));
        }
        Ok(out)
    }

    /// Checks the sizes and counts.
    ///
    /// # Errors
    ///
    /// [`BenchError::Config`] naming the bad value.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(BenchError::Config(m));
        if self.threads.is_empty() || self.threads.contains(&0) {
            return bad("--threads needs positive thread counts".into());
        }
        if let Some(&t) = self.threads.iter().find(|&&t| t > numakv_numa::MAX_THREADS / 2) {
            return bad(format!("--threads {t} exceeds {}", numakv_numa::MAX_THREADS / 2));
        }
        if self.nodes == 0 {
            return bad("--nodes must be at least 1".into());
        }
        if !(0.0..=10.0).contains(&self.warmup) {
            return bad(format!("--warmup {} outside 0..=10", self.warmup));
        }
        if self.latency_sample == 0 {
            return bad("--latency-sample must be at least 1".into());
        }
        if let Some(d) = self.duration {
            if !(d > 0.0 && d.is_finite()) {
                return bad(format!("--duration {d} must be positive"));
            }
        }
        if let Some(b) = self.budget {
            if !(b > 0.0 && b.is_finite()) {
                return bad(format!("--budget {b} must be positive"));
            }
        }
        if self.load_threads == Some(0) {
            return bad("--load-threads must be at least 1".into());
        }
        Ok(())
    }
}

/// The shortest and longest measured run, in seconds, that [`BenchConfig::budget`] gives.
pub const BUDGET_RUN_SECONDS: (f64, f64) = (0.25, 5.0);

/// Where stores are created without `--scratch`: `/dev/shm` when it exists and is writable
/// (memory, as PM would be; a disk-backed temp directory adds page write-back noise), else the
/// system temp directory.
pub fn default_scratch() -> PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() && tempfile::tempdir_in(shm).is_ok() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Whether to draw progress bars.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Progress {
    /// Bars on stderr when it is a terminal and the configuration is not `quiet`.
    #[default]
    Auto,
    /// Never.
    Hidden,
}

/// The progress display of a whole benchmark.
struct Ui {
    multi: Option<MultiProgress>,
}

impl Ui {
    fn new(progress: Progress, quiet: bool) -> Ui {
        let visible = progress == Progress::Auto && !quiet && std::io::stderr().is_terminal();
        let multi = visible.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
        Ui { multi }
    }

    fn bar(&self, len: Option<u64>, prefix: String) -> ProgressBar {
        let Some(multi) = &self.multi else {
            return ProgressBar::hidden();
        };
        let (bar, template) = match len {
            Some(n) => (
                ProgressBar::new(n),
                "{prefix:>40.bold} [{bar:30}] {human_pos}/{human_len} {per_sec} eta {eta} {msg}",
            ),
            None => (
                ProgressBar::new_spinner(),
                "{prefix:>40.bold} {spinner} {human_pos} {per_sec} {msg}",
            ),
        };
        let style = ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        let bar = multi.add(bar.with_style(style).with_prefix(prefix));
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    }

    fn println(&self, line: &str) {
        if let Some(m) = &self.multi {
            let _ = m.println(line);
        }
    }
}

/// Runs the workloads named in `config` on `targets` at every thread count.
///
/// A run that fails (the target refuses the configuration, an operation errors, a check fails)
/// becomes a [`RunFailure`] in the report; the other runs go on.
///
/// # Errors
///
/// A bad configuration ([`BenchError::Config`], [`BenchError::UnknownWorkload`]).
///
/// ```
/// use numakv_bench::{peers, run, BenchConfig, Progress};
///
/// let config = BenchConfig {
///     workload: "ycsb-b".into(),
///     keys: Some(1_000),
///     ops: Some(2_000),
///     threads: vec![2],
///     ..BenchConfig::default()
/// };
/// let report = run(&config, &peers::all(), Progress::Hidden).unwrap();
/// assert_eq!(report.runs.len(), 3);
/// assert!(report.runs.iter().all(|r| r.ops == 2_000 && r.throughput_mops > 0.0));
/// ```
pub fn run(
    config: &BenchConfig,
    targets: &[Arc<dyn Target>],
    progress: Progress,
) -> Result<Report> {
    let workloads = config.workloads()?;
    run_workloads(config, &workloads, targets, progress)
}

/// Like [`run`], for workloads built by the caller (the `workload`, `dist` and `mix` fields of
/// `config` are ignored).
///
/// # Errors
///
/// A bad configuration ([`BenchError::Config`]).
pub fn run_workloads(
    config: &BenchConfig,
    workloads: &[Workload],
    targets: &[Arc<dyn Target>],
    progress: Progress,
) -> Result<Report> {
    config.validate()?;
    for w in workloads {
        w.validate()?;
    }
    let total = (workloads.len() * targets.len() * config.threads.len()) as u64;
    let timed = workloads.iter().filter(|w| !w.consumes_keys).count() * targets.len();
    let timed = (timed * config.threads.len()) as u64;
    let mut config = config.clone();
    if let (Some(budget), None, None) = (config.budget, config.ops, config.duration) {
        let (lo, hi) = BUDGET_RUN_SECONDS;
        config.duration = Some((budget / timed.max(1) as f64).clamp(lo, hi));
    }
    let config = &config;
    let ui = Ui::new(progress, config.quiet);
    let overall = ui.bar(Some(total), "runs".into());
    let mut report = Report::default();
    for w in workloads {
        for t in targets {
            for &threads in &config.threads {
                overall.set_message(format!("{} {} t={threads}", t.name(), w.name));
                match run_one(config, w, t.as_ref(), threads, &ui) {
                    Ok(r) => {
                        ui.println(&format!(
                            "{:>20} {:<22} t={:<3} {:>9.3} Mops/s  p99 {:>7} ns",
                            r.engine, r.workload, r.threads, r.throughput_mops, r.p99_ns
                        ));
                        report.runs.push(r);
                    }
                    Err(e) => {
                        ui.println(&format!("{} {} t={threads}: FAILED: {e}", t.name(), w.name));
                        report.failures.push(RunFailure {
                            engine: t.name(),
                            workload: w.name.clone(),
                            threads,
                            error: e.to_string(),
                        });
                    }
                }
                overall.inc(1);
            }
        }
    }
    overall.finish_and_clear();
    Ok(report)
}

/// Writes the report where `config` asks (`json`, `csv`, `plot`, and the `out` directory's
/// `results.{json,csv,txt}` + `throughput.svg`); returns the paths written.
///
/// # Errors
///
/// [`BenchError::Io`], [`BenchError::Json`], [`BenchError::Plot`].
pub fn write_outputs(report: &Report, config: &BenchConfig) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    if let Some(p) = &config.json {
        report.write_json(p)?;
        written.push(p.clone());
    }
    if let Some(p) = &config.csv {
        report.write_csv(p)?;
        written.push(p.clone());
    }
    if let Some(p) = &config.plot {
        report.plot_svg(p)?;
        written.push(p.clone());
    }
    if let Some(dir) = &config.out {
        let json = dir.join("results.json");
        report.write_json(&json)?;
        let csv = dir.join("results.csv");
        report.write_csv(&csv)?;
        let txt = dir.join("results.txt");
        crate::report::write_file(&txt, &report.to_table())?;
        let svg = dir.join("throughput.svg");
        report.plot_svg(&svg)?;
        written.extend([json, csv, txt, svg]);
    }
    Ok(written)
}

/// How long each phase lasts.
#[derive(Clone, Copy, Debug)]
enum Plan {
    /// Operation counts per worker: warm-up, measured (timed), accounted (PM lines counted).
    Ops { warm: u64, measured: u64, accounted: u64 },
    /// Durations of the same phases.
    Time { warm: Duration, measured: Duration, accounted: Duration },
}

impl Plan {
    /// Whether the run has a separate accounting phase after the timed one.
    fn split(&self) -> bool {
        match *self {
            Plan::Ops { accounted, .. } => accounted > 0,
            Plan::Time { accounted, .. } => !accounted.is_zero(),
        }
    }
}

/// The accounting phase of a run, as a share of its timed phase (operations or seconds).
///
/// Counting PM lines costs what it counts: every access to a new line takes the accounting's slow
/// path, so with accounting on a line-heavy engine runs far slower than a line-light one
/// (FAST&FAIR 1.7× slower, NBTree 1.08×, on the default write-heavy workload), and throughput
/// ratios measured that way are skewed. So a run times its operations with accounting off, then
/// counts PM lines over a further `ACCOUNTED_SHARE` of operations with accounting on, untimed.
/// With latency emulation on there is one phase, accounted and timed: the emulation charges the
/// first touch of each line, which is the same bookkeeping.
pub const ACCOUNTED_SHARE: f64 = 0.25;

/// How long a run waits for the background work of a phase (evaluation, GC, migrations, a
/// switch) before it closes the phase anyway and reports what was pending.
pub const BACKGROUND_LIMIT: Duration = Duration::from_secs(120);

/// Waits for the index's background work (at most [`BACKGROUND_LIMIT`]) without counting what
/// the wait itself does on this thread.
fn settle(index: &dyn Index) {
    let _ = index.quiesce(BACKGROUND_LIMIT);
    account::op_discard();
}

/// Which PM columns a configuration measures: line counts come from accounting or from the
/// latency emulation's bookkeeping; flushes and fences from accounting only. Neither without
/// the substrate's `accounting` feature.
#[derive(Clone, Copy, Debug)]
struct Measured {
    lines: bool,
    flushes: bool,
}

impl Measured {
    fn of(config: &BenchConfig) -> Measured {
        Measured {
            lines: account::COMPILED && (config.accounting || !config.latency.is_none()),
            flushes: account::COMPILED && config.accounting,
        }
    }
}

/// What one worker measured.
struct WorkerOut {
    /// Operations of the timed phase.
    ops: u64,
    /// Operations of the accounting phase (0 when the timed phase was accounted itself).
    accounted_ops: u64,
    misses: u64,
    stats: AccessStats,
    hist: Histogram<u64>,
    start: Instant,
    end: Instant,
    error: Option<String>,
}

/// State shared by the workers of one run.
struct Shared {
    index: Arc<dyn Index>,
    space: crate::workload::KeySpace,
    /// Set by the main thread when a timed phase ends, or by a worker that failed.
    stop: AtomicBool,
    /// Set by a worker that failed: the others skip the accounting phase.
    failed: AtomicBool,
    /// Workers done with the timed phase (the main thread switches accounting on when all are).
    arrived: AtomicUsize,
    /// Set by the main thread once accounting is on: the accounting phase may start.
    counting: AtomicBool,
    /// Set by the main thread when a timed accounting phase ends.
    stop_counting: AtomicBool,
    /// Set by the main thread when a time-based hotspot shift happens.
    shifted: AtomicBool,
    /// Operations done, for the progress bar (updated every [`PROGRESS_BATCH`] operations).
    done: AtomicU64,
    /// All workers and the main thread meet here between warm-up and measurement.
    barrier: Barrier,
}

const PROGRESS_BATCH: u64 = 1024;

fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 100 s with 3 significant digits; constant bounds that hdrhistogram accepts.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid constant histogram bounds")
}

/// Runs one operation; `Ok(true)` if it found what it acted on.
#[inline]
fn execute(
    index: &dyn Index,
    op: &crate::workload::Op,
    buf: &mut Vec<(u64, u64)>,
) -> numakv_index::Result<bool> {
    let hit = match op.kind {
        OpKind::Get => index.get(op.key)?.is_some(),
        OpKind::Insert => index.insert(op.key, op.value)?,
        OpKind::Upsert => {
            index.upsert(op.key, op.value)?;
            true
        }
        OpKind::Update => index.update(op.key, op.value)?,
        OpKind::Remove => index.remove(op.key)?,
        OpKind::Scan => {
            buf.clear();
            index.scan(op.key, op.scan_len, buf)? > 0
        }
        OpKind::Rmw => match index.get(op.key)? {
            Some(v) => index.update(op.key, v.wrapping_add(1))?,
            None => false,
        },
    };
    account::op_end();
    Ok(hit)
}

struct WorkerArgs<'a> {
    shared: &'a Shared,
    registry: &'a Registry,
    workload: &'a Workload,
    proto: &'a crate::dist::KeyChooser,
    worker: usize,
    workers: usize,
    seed: u64,
    plan: Plan,
    sample: u64,
}

fn worker(a: WorkerArgs<'_>) -> WorkerOut {
    let shared = a.shared;
    let index = &*shared.index;
    let mut error: Option<String> = None;
    let registration = match a.registry.register() {
        Ok(r) => Some(r),
        Err(e) => {
            error = Some(format!("placing worker {}: {e}", a.worker));
            None
        }
    };
    let planned = match a.plan {
        Plan::Ops { measured, .. } => measured,
        Plan::Time { .. } => 0,
    };
    let n = shared.space.count();
    let mut stream = OpStream::new(a.workload, a.proto, n, a.worker, a.workers, a.seed, planned);
    let mut buf = Vec::with_capacity(128);
    let fail = |e: String, error: &mut Option<String>| {
        *error = Some(e);
        // ORDERING: Relaxed; stop requests carry no data.
        shared.failed.store(true, Ordering::Relaxed);
        shared.stop.store(true, Ordering::Relaxed);
        shared.stop_counting.store(true, Ordering::Relaxed);
    };

    // Warm-up (also run when registration failed? no: skip straight to the barrier).
    if error.is_none() {
        let warm =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<(), String> {
                let started = Instant::now();
                let mut i = 0u64;
                loop {
                    let more = match a.plan {
                        Plan::Ops { warm, .. } => i < warm,
                        Plan::Time { warm, .. } => i % 64 != 0 || started.elapsed() < warm,
                    };
                    if !more || shared.stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    let op = stream.next_op(&shared.space, false);
                    execute(index, &op, &mut buf)
                        .map_err(|e| format!("{} {:#x}: {e}", op.kind, op.key))?;
                    i += 1;
                }
            }));
        match warm {
            Ok(Ok(())) => {}
            Ok(Err(e)) => fail(format!("warm-up: {e}"), &mut error),
            Err(_) => fail("warm-up panicked".into(), &mut error),
        }
    }
    account::op_discard();
    let before = account::thread_stats();
    // Two meetings: between them the main thread waits for the warm-up's background work and
    // takes the global snapshot the background figures start from.
    shared.barrier.wait();
    shared.barrier.wait();

    let mut hist = new_histogram();
    let mut ops = 0u64;
    let mut misses = 0u64;
    stream.reset_count();
    let start = Instant::now();
    if error.is_none() {
        let measured =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<(), String> {
                loop {
                    let more = match a.plan {
                        Plan::Ops { measured, .. } => ops < measured,
                        // ORDERING: Relaxed; the main thread's stop flag only ends the loop.
                        Plan::Time { .. } => !shared.stop.load(Ordering::Relaxed),
                    };
                    if !more {
                        return Ok(());
                    }
                    let op = stream.next_op(&shared.space, shared.shifted.load(Ordering::Relaxed));
                    let hit = if ops % a.sample == 0 {
                        let t = Instant::now();
                        let hit = execute(index, &op, &mut buf);
                        hist.saturating_record(t.elapsed().as_nanos().max(1) as u64);
                        hit
                    } else {
                        execute(index, &op, &mut buf)
                    }
                    .map_err(|e| format!("{} {:#x}: {e}", op.kind, op.key))?;
                    misses += u64::from(!hit);
                    ops += 1;
                    if ops % PROGRESS_BATCH == 0 {
                        shared.done.fetch_add(PROGRESS_BATCH, Ordering::Relaxed);
                    }
                }
            }));
        match measured {
            Ok(Ok(())) => {}
            Ok(Err(e)) => fail(e, &mut error),
            Err(_) => fail("worker panicked".into(), &mut error),
        }
    }
    let end = Instant::now();
    shared.done.fetch_add(ops % PROGRESS_BATCH, Ordering::Relaxed);
    let mut stats = account::thread_stats().since(&before);
    let mut accounted_ops = 0u64;
    if a.plan.split() {
        // ORDERING: Release; pairs with the main thread's Acquire count before it switches
        // accounting on (this worker's timed operations are over).
        shared.arrived.fetch_add(1, Ordering::Release);
        // ORDERING: Acquire; pairs with the Release store after `account::set_enabled(true)`.
        while !shared.counting.load(Ordering::Acquire) && !shared.failed.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_micros(50));
        }
        if error.is_none() && !shared.failed.load(Ordering::Relaxed) {
            account::op_discard();
            let before = account::thread_stats();
            let counted =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<(), String> {
                    loop {
                        let more = match a.plan {
                            Plan::Ops { accounted, .. } => accounted_ops < accounted,
                            Plan::Time { .. } => !shared.stop_counting.load(Ordering::Relaxed),
                        };
                        if !more {
                            return Ok(());
                        }
                        let op =
                            stream.next_op(&shared.space, shared.shifted.load(Ordering::Relaxed));
                        execute(index, &op, &mut buf)
                            .map_err(|e| format!("{} {:#x}: {e}", op.kind, op.key))?;
                        accounted_ops += 1;
                    }
                }));
            match counted {
                Ok(Ok(())) => {}
                Ok(Err(e)) => fail(e, &mut error),
                Err(_) => fail("worker panicked".into(), &mut error),
            }
            stats = account::thread_stats().since(&before);
        }
    }
    drop(registration);
    WorkerOut { ops, accounted_ops, misses, stats, hist, start, end, error }
}

/// Loads `keys` keys (indices `0..keys`) with `loaders` threads placed by `registry`.
fn load(
    index: &Arc<dyn Index>,
    workload: &Workload,
    keys: u64,
    loaders: usize,
    registry: &Registry,
    seed: u64,
    bar: &ProgressBar,
) -> Result<()> {
    let done = AtomicU64::new(0);
    let loaders = loaders.max(1) as u64;
    let order = workload.key_order;
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..loaders)
            .map(|l| {
                let done = &done;
                s.spawn(move || -> Result<()> {
                    let _reg = registry.register()?;
                    let (lo, hi) = (keys * l / loaders, keys * (l + 1) / loaders);
                    for i in lo..hi {
                        let key = order.key(i);
                        if !index.insert(key, mix_seed(seed, i))? {
                            return Err(BenchError::Target {
                                target: index.name().to_owned(),
                                message: format!("load: insert of fresh key {key:#x} said present"),
                            });
                        }
                        if (i - lo) % PROGRESS_BATCH == PROGRESS_BATCH - 1 {
                            done.fetch_add(PROGRESS_BATCH, Ordering::Relaxed);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        while !handles.iter().all(|h| h.is_finished()) {
            bar.set_position(done.load(Ordering::Relaxed));
            std::thread::sleep(Duration::from_millis(20));
        }
        for h in handles {
            h.join().map_err(|_| BenchError::Panic("loader".into()))??;
        }
        Ok(())
    })
}

/// One (workload, target, threads) run.
fn run_one(
    config: &BenchConfig,
    workload: &Workload,
    target: &dyn Target,
    threads: usize,
    ui: &Ui,
) -> Result<RunResult> {
    let keys = config.keys.unwrap_or(workload.default_keys);
    let measured = Measured::of(config);
    // A separate accounting phase (see ACCOUNTED_SHARE) unless nothing is counted, latency
    // emulation makes the timed phase do the bookkeeping anyway, or the target is a DRAM peer
    // (no PM to count).
    let split = config.accounting && config.latency.is_none() && target.persistent();
    let share = if split { ACCOUNTED_SHARE } else { 0.0 };
    let accounted_total = |ops: u64| (ops as f64 * share).ceil() as u64;
    let total_ops = match config.ops {
        Some(n) => n,
        // Warm-up, measured and accounted operations must not outnumber the keys they use up.
        None if workload.consumes_keys => {
            // (Less one per worker: each rounds its warm-up and accounted shares up.)
            let room = (keys as f64 / (1.0 + config.warmup + share)) as u64;
            let room = room.saturating_sub(2 * threads as u64);
            workload.default_ops.min(room)
        }
        None => workload.default_ops,
    };
    let plan_for = |n: u64| n.div_ceil(threads as u64);
    let plan = match config.duration.filter(|_| !workload.consumes_keys) {
        Some(d) => Plan::Time {
            warm: Duration::from_secs_f64(d * config.warmup),
            measured: Duration::from_secs_f64(d),
            accounted: Duration::from_secs_f64(d * share),
        },
        None => Plan::Ops {
            warm: plan_for((total_ops as f64 * config.warmup) as u64),
            measured: 0,  // per worker, set below
            accounted: 0, // likewise
        },
    };
    let preloaded = if workload.preload { keys } else { 0 };
    let max_keys = match plan {
        Plan::Ops { warm, .. } => {
            let accounted = plan_for(accounted_total(total_ops)) * threads as u64;
            let all = (warm * threads as u64 + total_ops + accounted) as f64;
            preloaded + (all * workload.mix.share(OpKind::Insert)).ceil() as u64 + 1
        }
        Plan::Time { .. } => preloaded.max(1) * 4 + 1_000_000,
    };

    let topology = Arc::new(Topology::with_nodes(config.nodes)?);
    let registry = |placement| {
        let r = Registry::new(Arc::clone(&topology), placement);
        match config.pin {
            Some(p) => r.with_pinning(p),
            None => r,
        }
    };
    let scratch = config.scratch.clone().unwrap_or_else(default_scratch);
    std::fs::create_dir_all(&scratch).map_err(|e| BenchError::io(&scratch, e))?;
    let dir = tempfile::Builder::new()
        .prefix("numakv-bench-")
        .tempdir_in(&scratch)
        .map_err(|e| BenchError::io(&scratch, e))?;
    let env = TargetEnv {
        dir: dir.path().to_path_buf(),
        topology: Arc::clone(&topology),
        persist: config.persist,
        max_keys,
        threads,
    };
    let label = format!("{} {} t={threads}", target.name(), workload.name);

    account::set_enabled(false);
    account::set_latency(LatencyModel::NONE);
    let mut instance = target.open(&env)?;
    let index = instance.index();

    // Load.
    let load_bar = ui.bar(Some(preloaded), format!("load {label}"));
    let load_start = Instant::now();
    if preloaded > 0 {
        let loaders = config.load_threads.unwrap_or(threads);
        load(
            &index,
            workload,
            preloaded,
            loaders,
            &registry(config.placement),
            config.seed,
            &load_bar,
        )?;
    }
    let load_seconds = load_start.elapsed().as_secs_f64();
    load_bar.finish_and_clear();

    // Run.
    let dist_proto = workload.dist.chooser(workload.key_space(preloaded), 0, threads)?;
    let shared = Shared {
        index,
        space: crate::workload::KeySpace::new(preloaded),
        stop: AtomicBool::new(false),
        failed: AtomicBool::new(false),
        arrived: AtomicUsize::new(0),
        counting: AtomicBool::new(false),
        stop_counting: AtomicBool::new(false),
        shifted: AtomicBool::new(false),
        done: AtomicU64::new(0),
        barrier: Barrier::new(threads + 1),
    };
    let run_registry = registry(config.placement);
    let sample = u64::from(config.latency_sample.max(1));
    let time_shift = match workload.dist {
        Dist::Hotspot { shift: Some(Shift::AfterSeconds(s)), .. } => {
            Some(Duration::from_secs_f64(s))
        }
        _ => None,
    };
    let run_bar = match plan {
        Plan::Ops { .. } => ui.bar(Some(total_ops), label.clone()),
        Plan::Time { .. } => ui.bar(None, label.clone()),
    };
    account::set_latency(config.latency);
    // Split runs switch accounting on for their accounting phase only (below).
    account::set_enabled(config.accounting && !split);
    // Whether the timed phase is itself counted (latency emulation, or a DRAM peer).
    let counts_inline = !split && measured.lines;
    let mut global_before = AccessStats::default();
    let accounted = accounted_total(total_ops);
    let outs: Vec<WorkerOut> = std::thread::scope(|s| -> Result<Vec<WorkerOut>> {
        let handles: Vec<_> = (0..threads)
            .map(|w| {
                let share_of =
                    |n: u64| n / threads as u64 + u64::from((w as u64) < n % threads as u64);
                let measured = match plan {
                    Plan::Ops { warm, .. } => Plan::Ops {
                        warm,
                        measured: share_of(total_ops),
                        accounted: share_of(accounted),
                    },
                    p @ Plan::Time { .. } => p,
                };
                let args = WorkerArgs {
                    shared: &shared,
                    registry: &run_registry,
                    workload,
                    proto: &dist_proto,
                    worker: w,
                    workers: threads,
                    seed: mix_seed(config.seed, 0x5EED),
                    plan: measured,
                    sample,
                };
                s.spawn(move || worker(args))
            })
            .collect();
        shared.barrier.wait();
        if counts_inline {
            // The timed phase is the counted one: start it with the warm-up's background work
            // done, and count from here.
            settle(&*shared.index);
            global_before = account::global_stats();
        }
        shared.barrier.wait();
        let t0 = Instant::now();
        let mut counting_since: Option<Instant> = None;
        while !handles.iter().all(|h| h.is_finished()) {
            let elapsed = t0.elapsed();
            if let Plan::Time { measured, .. } = plan {
                if elapsed >= measured {
                    shared.stop.store(true, Ordering::Relaxed);
                }
            }
            // ORDERING: Acquire; pairs with the workers' Release increments: every timed
            // operation is over before accounting goes on.
            if split
                && counting_since.is_none()
                && shared.arrived.load(Ordering::Acquire) == threads
            {
                // The timed phase's background work is not the counted phase's: let it finish
                // uncounted, then count from a global snapshot.
                if !shared.failed.load(Ordering::Relaxed) {
                    settle(&*shared.index);
                }
                global_before = account::global_stats();
                account::set_enabled(true);
                counting_since = Some(Instant::now());
                // ORDERING: Release; pairs with the workers' Acquire wait.
                shared.counting.store(true, Ordering::Release);
            }
            if let (Plan::Time { accounted, .. }, Some(since)) = (plan, counting_since) {
                if since.elapsed() >= accounted {
                    shared.stop_counting.store(true, Ordering::Relaxed);
                }
            }
            if time_shift.is_some_and(|t| elapsed >= t) {
                shared.shifted.store(true, Ordering::Relaxed);
            }
            run_bar.set_position(shared.done.load(Ordering::Relaxed));
            std::thread::sleep(Duration::from_millis(5));
        }
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| BenchError::Panic(label.clone())))
            .collect()
    })?;
    // The counted phase closes once the background work its operations caused is done, with
    // counting still on (docs/design.md §11).
    let mut pending = Vec::new();
    if (split || counts_inline) && !shared.failed.load(Ordering::Relaxed) {
        run_bar.set_message(format!("{label}: waiting for background work"));
        account::op_discard();
        pending = shared.index.quiesce(BACKGROUND_LIMIT)?;
        // What the wait did on this thread (an engine may work there) is background work too.
        account::op_split();
    }
    let global = account::global_stats().since(&global_before);
    account::set_enabled(false);
    account::set_latency(LatencyModel::NONE);
    run_bar.finish_and_clear();

    if let Some(e) = outs.iter().find_map(|o| o.error.clone()) {
        return Err(BenchError::Target { target: target.name(), message: e });
    }
    let index = shared.index;
    let stats = index.stats();
    // Which pages the pools got (issue 40): they ask for transparent huge pages; the kernel's
    // settings decide. Over every pool of the process, i.e. this run's (runs are sequential).
    let pool_pages = numakv_pmem::huge_pages_in_pools();
    if config.check {
        index.check()?;
    }
    drop(index);

    let mut reopen_ms = None;
    let mut recover_ms = None;
    if config.reopen {
        reopen_ms = instance.reopen(Reopen::Clean)?.map(|d| d.as_secs_f64() * 1e3);
    }
    if config.crash {
        recover_ms = instance.reopen(Reopen::Crash)?.map(|d| d.as_secs_f64() * 1e3);
        if config.check && recover_ms.is_some() {
            instance.index().check()?;
        }
    }
    drop(instance);
    drop(dir);

    let ops: u64 = outs.iter().map(|o| o.ops).sum();
    let accounted_ops: u64 = outs.iter().map(|o| o.accounted_ops).sum();
    let misses: u64 = outs.iter().map(|o| o.misses).sum();
    let start = outs.iter().map(|o| o.start).min();
    let end = outs.iter().map(|o| o.end).max();
    let seconds = match (start, end) {
        (Some(s), Some(e)) => e.duration_since(s).as_secs_f64(),
        _ => 0.0,
    };
    let mut hist = new_histogram();
    let mut fg = AccessStats::default();
    for o in &outs {
        let _ = hist.add(&o.hist);
        fg.add(&o.stats);
    }
    // Everything every thread published during the counted phase, background threads included;
    // the workers' share of it is `fg` (the workers published nothing else meanwhile).
    let mut acc = fg;
    acc.add(&global.since(&fg));
    let per_op = |x: u64| if ops == 0 { 0.0 } else { x as f64 / ops as f64 };
    // PM figures are per operation of the phase that counted them.
    let counted_ops = if split { accounted_ops } else { ops };
    let per_counted = |x: u64| if counted_ops == 0 { 0.0 } else { x as f64 / counted_ops as f64 };
    let lines = |x: u64| measured.lines.then(|| per_counted(x));
    let flushes = |x: u64| measured.flushes.then(|| per_counted(x));
    let all_lines = acc.reads() + acc.writes();
    let bg_lines = all_lines - (fg.reads() + fg.writes());
    let (p50, p99, p999, max) = if hist.is_empty() {
        (0, 0, 0, 0)
    } else {
        (
            hist.value_at_quantile(0.5),
            hist.value_at_quantile(0.99),
            hist.value_at_quantile(0.999),
            hist.max(),
        )
    };
    Ok(RunResult {
        engine: target.name(),
        workload: workload.name.clone(),
        threads,
        nodes: config.nodes,
        placement: config.placement.to_string(),
        persist: config.persist.to_string(),
        latency: config.latency.to_string(),
        dist: workload.dist.to_string(),
        keys: preloaded,
        ops,
        seconds,
        throughput_mops: if seconds > 0.0 { ops as f64 / seconds / 1e6 } else { 0.0 },
        p50_ns: p50,
        p99_ns: p99,
        p999_ns: p999,
        max_ns: max,
        pm_reads_per_op: lines(acc.reads()),
        pm_writes_per_op: lines(acc.writes()),
        remote_reads_per_op: lines(acc.reads_remote),
        remote_writes_per_op: lines(acc.writes_remote),
        remote_share: measured.lines.then(|| acc.remote_share()),
        flushes_per_op: flushes(acc.flushes),
        fences_per_op: flushes(acc.fences),
        smo_reads_per_op: lines(acc.smo_reads),
        smo_writes_per_op: lines(acc.smo_writes),
        smo_flushes_per_op: flushes(acc.smo_flushes),
        fg_pm_reads_per_op: lines(fg.reads()),
        fg_pm_writes_per_op: lines(fg.writes()),
        fg_flushes_per_op: flushes(fg.flushes),
        bg_share: measured.lines.then(|| {
            if all_lines == 0 {
                0.0
            } else {
                bg_lines as f64 / all_lines as f64
            }
        }),
        pending: (!pending.is_empty()).then(|| {
            let what: Vec<String> = pending.iter().map(ToString::to_string).collect();
            format!("after {} s: {}", BACKGROUND_LIMIT.as_secs(), what.join(", "))
        }),
        pm_bytes: stats.pm_bytes(),
        pm_bytes_per_node: stats.pm_bytes_per_node.clone(),
        dram_bytes: stats.dram_bytes,
        load_seconds,
        miss_ratio: per_op(misses),
        accounted_ops,
        reopen_ms,
        recover_ms,
        seed: config.seed,
        counters: stats.counters.iter().map(|&(k, v)| (k.to_owned(), v)).collect(),
        pool_huge_bytes: pool_pages.map(|p| p.0),
        pool_resident_bytes: pool_pages.map(|p| p.1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips_through_json() {
        let c = BenchConfig {
            dist: Some("hotspot:0.2:0.8@50%".parse().unwrap()),
            mix: Some("get:1,scan:2".parse().unwrap()),
            placement: Placement::Interleave,
            persist: PersistMode::Eadr,
            latency: LatencyModel::OPTANE,
            ..BenchConfig::default()
        };
        let text = serde_json::to_string(&c).unwrap();
        assert!(
            text.contains("\"placement\":\"interleave\"")
                && text.contains("\"latency\":\"optane\"")
        );
        let back: BenchConfig = serde_json::from_str(&text).unwrap();
        assert_eq!(back, c);
        let partial: BenchConfig = serde_json::from_str(r#"{"nodes":4}"#).unwrap();
        assert_eq!(partial.nodes, 4);
        assert_eq!(partial.threads, BenchConfig::default().threads);
    }

    #[test]
    fn bad_configurations_are_refused() {
        for c in [
            BenchConfig { threads: vec![], ..BenchConfig::default() },
            BenchConfig { threads: vec![0], ..BenchConfig::default() },
            BenchConfig { nodes: 0, ..BenchConfig::default() },
            BenchConfig { latency_sample: 0, ..BenchConfig::default() },
            BenchConfig { duration: Some(-1.0), ..BenchConfig::default() },
        ] {
            assert!(matches!(c.validate(), Err(BenchError::Config(_))), "{c:?}");
        }
        let c = BenchConfig { workload: "ycsb-a,nope".into(), ..BenchConfig::default() };
        assert!(matches!(c.workloads(), Err(BenchError::UnknownWorkload { .. })));
    }
}
