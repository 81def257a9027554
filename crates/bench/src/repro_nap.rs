//! Nap's reproductions (issue 8):
//!
//! - `nap-remote`: papers/nap.txt §6.2 Fig. 13 — remote PM accesses and throughput of
//!   nap-fastfair beside fastfair on the write-intensive workload (zipf 0.99, 2 emulated nodes,
//!   4 threads), measured after Nap's first switch; plus Nap's memory as in Table 1 (§6.7).
//! - `nap-shift`: §6.5 Fig. 15 — throughput per 10 ms across a hotspot change, with the
//!   three-phase switch and with the global-lock switch.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use numakv::{EngineKind, Index, Options, Store};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::dist::Dist;
use crate::engines::EngineTarget;
use crate::error::{BenchError, Result};
use crate::plot::{lines_svg, Series};
use crate::presets;
use crate::report::figure;
use crate::report::{write_file, Report};
use crate::repro::{base_config, failures_md, header, scaled, ReproOptions};
use crate::runner::{default_scratch, run_workloads, BenchConfig, Progress};
use crate::target::Target;
use crate::workload::KeyOrder;

/// Nap's detector settings for our scale (see the report text): a hot set of `hot` keys,
/// denser sampling and a longer check so the detector sees as many samples per hot key as at
/// the paper's throughput.
fn scaled_nap(hot: u64, sample: u32, check_ms: u32) -> Vec<(&'static str, String)> {
    let hot = hot.max(16);
    vec![
        ("hot", hot.to_string()),
        ("sample", sample.to_string()),
        ("check_period_ms", check_ms.to_string()),
    ]
}

/// §6.1: 100K hot keys of 16M loaded.
const PAPER_HOT_SHARE: f64 = 100_000.0 / 16_000_000.0;
/// §6.1: the hot set (100K) and the key space (200M) the zipf 0.99 draws come from.
const PAPER_HOT: u64 = 100_000;
const PAPER_KEY_SPACE: u64 = 200_000_000;

/// Σ_{k=1..n} k^-θ: exact up to 10⁶ terms, Euler–Maclaurin (integral and end correction)
/// beyond, which is far below 10⁻⁶ relative error there.
fn harmonic(n: u64, theta: f64) -> f64 {
    let m = n.min(1_000_000);
    let head: f64 = (1..=m).map(|k| (k as f64).powf(-theta)).sum();
    if n == m {
        return head;
    }
    let (n, m) = (n as f64, m as f64);
    head + (n.powf(1.0 - theta) - m.powf(1.0 - theta)) / (1.0 - theta)
        + (n.powf(-theta) - m.powf(-theta)) / 2.0
}

/// The smallest hot set that draws, under zipf `theta` over `key_space` keys, the share of all
/// accesses the paper's hot set drew (its 100K hottest of 200M: ≈ 59% at 0.99). Keeping the
/// hot set's *share of the keys* instead (0.625%) would draw far fewer accesses at our key
/// counts (≈ 46% for 625 of 1.25M), since zipf mass grows like a power of the count.
fn coverage_hot(key_space: u64, theta: f64) -> u64 {
    let want = harmonic(PAPER_HOT, theta) / harmonic(PAPER_KEY_SPACE, theta);
    let total = harmonic(key_space, theta);
    let (mut lo, mut hi) = (1u64, key_space.max(1));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if harmonic(mid, theta) / total >= want {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

fn counter(r: &crate::report::RunResult, name: &str) -> u64 {
    r.counters.get(name).copied().unwrap_or(0)
}

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / (1 << 20) as f64)
}

/// `numakv repro nap-remote`.
pub(crate) fn remote(
    targets: &[Arc<dyn Target>],
    opts: &ReproOptions,
    progress: Progress,
) -> Result<(String, Report, Vec<PathBuf>)> {
    let keys = scaled(100_000, opts.scale, 5_000);
    let mut workload = presets::by_name("nap-write-intensive")?;
    let settings = scaled_nap((keys as f64 * PAPER_HOT_SHARE).round() as u64, 8, 500);
    let wide = scaled_nap(coverage_hot(workload.key_space(keys), 0.99), 2, 1000);
    let variant = |name: &str, desc: &str, s: &[(&'static str, String)]| {
        let pairs: Vec<(&str, &str)> = s.iter().map(|(k, v)| (*k, v.as_str())).collect();
        EngineTarget::variant(name, desc, EngineKind::NapFastFair, &pairs)
            .map(|t| Arc::new(t) as Arc<dyn Target>)
    };
    // fastfair and the two Nap settings always; the requested targets beside them.
    let mut chosen: Vec<Arc<dyn Target>> = crate::engines::all()
        .into_iter()
        .filter(|t| t.name() == "fastfair")
        .chain([
            variant(
                "nap-fastfair",
                "nap-fastfair, hot = 0.625% of the keys (the paper's)",
                &settings,
            )?,
            variant(
                "nap-fastfair-cov",
                "nap-fastfair, hot set drawing the paper's share of accesses (≈ 59%), sample 4",
                &wide,
            )?,
        ])
        .collect();
    let ours = ["fastfair", "nap-fastfair", "nap-fastfair-cov"];
    chosen.extend(targets.iter().filter(|t| !ours.contains(&t.name().as_str())).cloned());
    // YCSB's ZipfianGenerator over the loaded keys (hot keys scattered by the hashed key order).
    workload.dist = Dist::Zipf { theta: 0.99, scrambled: false };
    let measured = (3.0 * opts.scale).clamp(0.3, 12.0);
    // Five check periods, so the first switch lands in the warm-up (below scale 0.5, a smoke
    // run: two).
    let warm = if opts.scale >= 0.5 { 2.5 } else { 1.0 };
    let config = BenchConfig {
        keys: Some(keys),
        threads: vec![4],
        nodes: opts.nodes.max(2),
        duration: Some(measured),
        warmup: warm / measured,
        ..base_config(opts)
    };
    let report = run_workloads(&config, std::slice::from_ref(&workload), &chosen, progress)?;

    let mut md = String::new();
    header(
        &mut md,
        "nap-remote",
        opts,
        &format!(
            "{keys} keys loaded, nap-write-intensive (50% lookup, 50% upsert) with \
             zipf-unscrambled 0.99 over {} keys (the paper's 12.5x the loaded keys), 4 threads \
             over {} emulated nodes (fill \
             placement), {warm} s warm-up then {measured} s measured; nap-fastfair options {}; \
             nap-fastfair-cov the same with hot={} and sample={}",
            workload.key_space(keys),
            config.nodes,
            settings.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", "),
            wide[0].1,
            wide[1].1
        ),
    );
    md.push_str(
        "## The paper's claim\n\n\
         papers/nap.txt §6.2, Fig. 13 (P-CLHT, write-intensive, Intel PCM): \"NAP reduces \
         remote PM accesses by 45% to 51%, enabling its high performance.\" §6.1: hot set 100K, \
         switch period 0.2 s, sampling interval 32, 16M keys loaded, zipf 0.99.\n\n\
         Scaling: the paper's hot set is 0.625% of the loaded keys, so ours is too; the paper's \
         detector digests 1/32 of some 10M ops/s, ours sees 1/8 of a few hundred thousand \
         (emulated accounting on a small machine), with a 0.5 s check (§4.4's example is 1 s), \
         so that a check still holds a couple of samples per hot key. `nap-fastfair-cov` runs \
         beside it with the hot set that draws the share of accesses the paper's drew (its 100K \
         hottest of 200M keys draw ≈ 59% of zipf 0.99 accesses; 0.625% of our key count \
         draws ≈ 46%: zipf mass grows like a power of the count, so a share of the keys does \
         not scale), sampled 1 in 4 so that the detector can \
         still tell its coldest keys from noise. The measured window starts after the \
         warm-up of five checks, by which the first switch has happened (switches and NAL hits \
         below count the whole run, warm-up included).\n\n\
         ## Our measurement\n\n\
         | engine | Mops/s | remote PM lines/op | PM lines/op | remote share | NAL keys at the \
         end | switches | NAL hits |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &report.runs {
        let _ = writeln!(
            md,
            "| {} | {:.3} | {:.2} | {:.2} | {:.0}% | {} | {} | {} |",
            r.engine,
            r.throughput_mops,
            figure(r.remote_reads_per_op) + figure(r.remote_writes_per_op),
            figure(r.pm_reads_per_op) + figure(r.pm_writes_per_op),
            figure(r.remote_share) * 100.0,
            counter(r, "nap_nal_keys"),
            counter(r, "nap_switches"),
            counter(r, "nap_nal_hits"),
        );
    }
    let get = |e: &str| report.runs.iter().find(|r| r.engine == e);
    let rem = |r: &crate::report::RunResult| {
        figure(r.remote_reads_per_op) + figure(r.remote_writes_per_op)
    };
    md.push('\n');
    for name in ["nap-fastfair", "nap-fastfair-cov"] {
        if let (Some(n), Some(f)) = (get(name), get("fastfair")) {
            let cut = 1.0 - rem(n) / rem(f).max(1e-9);
            let _ = writeln!(
                md,
                "- {name}: remote PM accesses {:.0}% below fastfair's ({:.2} vs {:.2} lines/op; \
                 paper: 45–51%, asked: at least 45%): {}. Throughput {:.3} vs {:.3} Mops/s \
                 ({:.2}×).",
                cut * 100.0,
                rem(n),
                rem(f),
                if cut >= 0.45 { "holds" } else { "does NOT hold" },
                n.throughput_mops,
                f.throughput_mops,
                n.throughput_mops / f.throughput_mops.max(1e-9)
            );
        }
    }
    if let Some(n) = get("nap-fastfair") {
        md.push_str(
            "\n## Memory (Table 1, §6.7)\n\n\
             The paper (4 nodes, 72 threads, hot set 100K): record buffers 21.1 MB, count-min \
             sketch 9.7 MB, min heap 4.2 MB, GV-view 3.6 MB (DRAM); PC-views 30.1 MB (PM).\n\n\
             | record buffers | count-min sketch | min heap | GV-view | PC-views (PM) |\n\
             |---:|---:|---:|---:|---:|\n",
        );
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            mib(counter(n, "nap_record_buffer_bytes")),
            mib(counter(n, "nap_sketch_bytes")),
            mib(counter(n, "nap_heap_bytes")),
            mib(counter(n, "nap_gv_bytes")),
            mib(counter(n, "nap_pc_view_bytes")),
        );
        let _ = writeln!(
            md,
            "\nOurs: {} record buffers of 300 KB (one per thread that ran an operation, loaders \
             included), the paper's 3 × 850,000 sketch, a heap sized for `hot` = {} keys, and \
             GV-view / PC-views of the NAL installed at the end (PC-views: one per node, whole \
             pages).",
            counter(n, "nap_record_buffer_bytes") / (300 * 1024),
            settings[0].1
        );
    }
    failures_md(&report, &mut md);
    Ok((md, report, Vec::new()))
}

/// One shift run: operations per bucket, the buckets in which switches completed, and the
/// engine's counters at the end.
type ShiftRun = (Vec<u64>, Vec<usize>, Vec<(&'static str, u64)>);

/// Share of the operations that go to the hot set in `nap-shift`.
const SHIFT_HOT_OPS: f64 = 0.9;
/// `nap-shift`'s hot set (and Nap's `hot`) is the loaded keys over this.
const HOT_DIVISOR: u64 = 16;
/// `nap-shift`'s workers, one per emulated node. The paper leaves the switch thread a core of
/// its own (71 workers on 72 cores); on a 2-core machine more workers would starve it, so a
/// switch would last several checks and be followed by more switches.
const SHIFT_THREADS: usize = 2;

/// Runs a write-intensive hot-set workload on a fresh nap-fastfair store for `buckets` buckets
/// of `bucket`; the hot set moves to other keys at bucket `shift_at`.
///
/// The hot set is `keys / HOT_DIVISOR` keys drawing [`SHIFT_HOT_OPS`] of the operations (uniform inside,
/// the rest uniform over every key), and Nap's `hot` is the same size. With zipf (the paper's
/// distribution) on a store this small, the keys around the NAL's boundary rank draw a sample or
/// two per check, so each check's top keys differ from the NAL's by chance in more than 25% and
/// the detector switches at every check, which hides the one switch the hotspot change causes.
/// A hot set of equally hot keys gives one switch per change, as the paper's figure shows.
fn shift_run(
    dir: &std::path::Path,
    opts: &ReproOptions,
    mode: &str,
    keys: u64,
    buckets: usize,
    bucket: Duration,
    shift_at: usize,
) -> Result<ShiftRun> {
    let mut engine = EngineKind::NapFastFair.default_options();
    let hot = keys / HOT_DIVISOR;
    let hot_opt = hot.to_string();
    for (k, v) in [
        ("switch_mode", mode),
        ("hot", hot_opt.as_str()),
        ("sample", "1"),
        ("check_period_ms", "200"),
    ] {
        engine.set(k, v).map_err(|e| BenchError::Config(format!("nap option {k}: {e}")))?;
    }
    let sopts = Options::default()
        .nodes(opts.nodes.max(2))
        .capacity_per_node(256 << 20)
        .mode(opts.persist)
        .engine(engine);
    let store = Arc::new(
        Store::create(dir, EngineKind::NapFastFair, sopts)
            .map_err(|e| BenchError::Config(format!("creating the nap store: {e}")))?,
    );
    let order = KeyOrder::Hashed;
    numakv_numa::set_current_node(0);
    for i in 0..keys {
        store.insert(order.key(i), i).map_err(|e| BenchError::Config(format!("load: {e}")))?;
    }
    // Optane's per-line latencies (papers/nstore.txt §II-A1) from here on, so that a switch's
    // flush of the old NAL into FAST&FAIR costs what PM writes cost: the outage the global lock
    // causes is that flush. Restored by the guard whatever way this returns.
    let _latency = LatencyGuard::install(numakv_pmem::LatencyModel::OPTANE);
    let stop = Arc::new(AtomicBool::new(false));
    let shifted = Arc::new(AtomicBool::new(false));
    let done: Arc<Vec<AtomicU64>> =
        Arc::new((0..SHIFT_THREADS).map(|_| AtomicU64::new(0)).collect());
    let barrier = Arc::new(Barrier::new(SHIFT_THREADS + 1));
    let mut handles = Vec::new();
    for th in 0..SHIFT_THREADS {
        let (store, stop, shifted, done, barrier) = (
            Arc::clone(&store),
            Arc::clone(&stop),
            Arc::clone(&shifted),
            Arc::clone(&done),
            Arc::clone(&barrier),
        );
        let seed = opts.seed ^ th as u64;
        handles.push(std::thread::spawn(move || -> std::result::Result<(), String> {
            numakv_numa::set_current_node(th % 2);
            let mut rng = SmallRng::seed_from_u64(seed);
            barrier.wait();
            while !stop.load(Ordering::Relaxed) {
                // The hot set is ranks [0, hot) before the shift and [keys/2, keys/2 + hot)
                // after it: disjoint, since hot is under half of the keys.
                let rank = if rng.gen_bool(SHIFT_HOT_OPS) {
                    let off = if shifted.load(Ordering::Relaxed) { keys / 2 } else { 0 };
                    off + rng.gen_range(0..hot)
                } else {
                    rng.gen_range(0..keys)
                };
                let k = order.key(rank);
                if rng.gen_bool(0.5) {
                    store.get(k).map_err(|e| e.to_string())?;
                } else {
                    store.upsert(k, rng.gen()).map_err(|e| e.to_string())?;
                }
                // One operation for the latency emulation: its lines are charged once each.
                numakv_pmem::account::op_end();
                done[th].fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }));
    }
    let total = || done.iter().map(|d| d.load(Ordering::Relaxed)).sum::<u64>();
    barrier.wait();
    // Let the first switch happen before the plotted window (five checks; a smoke run: two).
    std::thread::sleep(Duration::from_millis(if buckets < 100 { 400 } else { 1_000 }));
    // Switch completions are watched by a thread of their own, so the bucket loop does nothing
    // but read operation counters on time. (Before `stats()` stopped waiting for a running
    // switch, calling it in the loop stretched the bucket a switch ran in.)
    let watching = Arc::new(AtomicBool::new(true));
    let t0 = Instant::now();
    let watcher = {
        let (store, watching) = (Arc::clone(&store), Arc::clone(&watching));
        std::thread::spawn(move || {
            let switches =
                || store.stats().counters.iter().find(|c| c.0 == "nap_switches").map_or(0, |c| c.1);
            let (mut last, mut done_at) = (switches(), Vec::new());
            while watching.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
                let now = switches();
                if now != last {
                    done_at.push(t0.elapsed());
                    last = now;
                }
            }
            done_at
        })
    };
    let mut ops = Vec::with_capacity(buckets);
    let mut last_ops = total();
    for b in 0..buckets {
        if b == shift_at {
            shifted.store(true, Ordering::Relaxed);
        }
        let until = bucket * (b as u32 + 1);
        if let Some(d) = until.checked_sub(t0.elapsed()) {
            std::thread::sleep(d);
        }
        let o = total();
        ops.push(o - last_ops);
        last_ops = o;
    }
    watching.store(false, Ordering::Relaxed);
    let mut marks: Vec<usize> = watcher
        .join()
        .map_err(|_| BenchError::Config("the switch watcher panicked".into()))?
        .into_iter()
        .map(|t| (t.as_nanos() / bucket.as_nanos().max(1)) as usize)
        .filter(|&b| b < buckets)
        .collect();
    marks.dedup();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join()
            .map_err(|_| BenchError::Config("a shift worker panicked".into()))?
            .map_err(BenchError::Config)?;
    }
    let sw = store.stats().counters;
    match Arc::try_unwrap(store) {
        Ok(s) => s.close().map_err(|e| BenchError::Config(format!("close: {e}")))?,
        Err(_) => return Err(BenchError::Config("store still shared".into())),
    }
    Ok((ops, marks, sw))
}

/// `numakv repro nap-shift`.
pub(crate) fn shift(opts: &ReproOptions) -> Result<(String, Report, Vec<PathBuf>)> {
    let keys = scaled(100_000, opts.scale, 10_000);
    let bucket = Duration::from_millis(10);
    let small = opts.scale < 0.5;
    let buckets = if small { 60 } else { 200 };
    let shift_at = if small { 20 } else { 50 };
    let scratch = opts.scratch.clone().unwrap_or_else(default_scratch);
    let mut runs = Vec::new();
    for mode in ["three-phase", "global-lock"] {
        let dir = tempfile::Builder::new()
            .prefix("numakv-repro-napshift-")
            .tempdir_in(&scratch)
            .map_err(|e| BenchError::Config(format!("scratch dir: {e}")))?;
        runs.push((
            mode,
            shift_run(&dir.path().join("store"), opts, mode, keys, buckets, bucket, shift_at)?,
        ));
    }
    let mut md = String::new();
    header(
        &mut md,
        "nap-shift",
        opts,
        &format!(
            "{keys} keys loaded into nap-fastfair (hot = {} keys, sample 1, check 0.2 s), \
             {SHIFT_THREADS} threads on 2 emulated nodes, 50% lookup / 50% upsert, {:.0}% of them on a hot set \
             of {} keys (uniform inside it, the rest uniform over every key); Optane latency \
             emulated per PM line; 1 s (0.4 s at small scales) to settle, then {buckets} buckets \
             of 10 ms, the hot set moving to disjoint keys at bucket {shift_at}",
            keys / HOT_DIVISOR,
            SHIFT_HOT_OPS * 100.0,
            keys / HOT_DIVISOR
        ),
    );
    md.push_str(
        "## The paper's claim\n\n\
         papers/nap.txt §6.5, Fig. 15 (P-Masstree, 71 threads, write-intensive): \"After about \
         200~300ms, NAP identifies the new hot set ... In our three-phase switch, the throughput \
         can be maintained more than 10K ops/ms for about 130ms, then drops to 4K~8K ops/ms for \
         about 35ms ... However, when using the global lock, the system is unavailable (i.e., \
         throughput is 0) for about 195ms.\"\n\n## Our measurement\n\n\
         Under the global lock no operation runs while a switch does, so a switch's duration is \
         the outage; the three-phase switch only makes writes to keys of the previous NAL wait \
         for its flush. Before the shift the NAL serves the hot set; after it, operations go to \
         FAST&FAIR until the detector installs the new hot set (the first check after the shift \
         sees a mix of both sets, so a second switch follows). On a small shared machine the \
         10 ms buckets also show the scheduler's gaps; an *outage* below is a run of buckets \
         with no operation at all.\n\n",
    );
    let mut series: Vec<Series> = Vec::new();
    for (mode, (ops, marks, counters)) in &runs {
        let c = |name: &str| counters.iter().find(|c| c.0 == name).map_or(0, |c| c.1);
        let sw = c("nap_switches");
        let after = &ops[shift_at..];
        let zero = after.iter().filter(|&&o| o == 0).count();
        let longest = after.split(|&o| o != 0).map(<[u64]>::len).max().unwrap_or(0);
        let before = ops[..shift_at].iter().sum::<u64>() as f64 / shift_at as f64;
        let _ = writeln!(
            md,
            "- **{mode}**: {:.0} ops per 10 ms before the shift; after it {} ops in all, {zero} \
             buckets with no operation, the longest outage {} ms; switches completed in buckets \
             {:?} ({sw} switches in the whole run, {:.1} ms each on average, the longest {:.1} ms; \
             {} writes waited for a phase-2 flush).",
            before,
            after.iter().sum::<u64>(),
            longest * 10,
            marks,
            c("nap_switch_us_total") as f64 / 1e3 / sw.max(1) as f64,
            c("nap_switch_us_max") as f64 / 1e3,
            c("nap_blocked_writes"),
        );
        series.push((
            mode.to_string(),
            ops.iter().enumerate().map(|(i, &o)| (i as f64 * 10.0, o as f64 / 10.0)).collect(),
        ));
    }
    let after_sum = |i: usize| runs[i].1 .0[shift_at..].iter().sum::<u64>() as f64;
    let _ = writeln!(
        md,
        "\nFrom the shift to the end, the three-phase switch completed {:.2}× the operations of \
         the global-lock switch.",
        after_sum(0) / after_sum(1).max(1.0)
    );
    md.push_str(
        "\n| bucket | t (ms) | three-phase ops | global-lock ops |\n|---:|---:|---:|---:|\n",
    );
    for b in 0..buckets {
        let _ = writeln!(md, "| {b} | {} | {} | {} |", b * 10, runs[0].1 .0[b], runs[1].1 .0[b]);
    }
    let svg = opts.out_dir.join("nap-shift.svg");
    lines_svg(
        &svg,
        "nap-fastfair throughput across a hotspot change",
        "time (ms)",
        "ops/ms",
        &series,
    )?;
    md.push_str("\n![throughput per 10 ms](nap-shift.svg)\n");
    let mut csv = String::from("bucket,mode,ops\n");
    for (mode, (ops, _, _)) in &runs {
        for (i, o) in ops.iter().enumerate() {
            let _ = writeln!(csv, "{i},{mode},{o}");
        }
    }
    let path = opts.out_dir.join("nap-shift.csv");
    write_file(&path, &csv)?;
    Ok((md, Report::default(), vec![svg, path]))
}

/// Installs a process-wide latency model and puts back the one before when dropped.
struct LatencyGuard(numakv_pmem::LatencyModel);

impl LatencyGuard {
    fn install(model: numakv_pmem::LatencyModel) -> LatencyGuard {
        let before = numakv_pmem::account::latency();
        numakv_pmem::account::set_latency(model);
        LatencyGuard(before)
    }
}

impl Drop for LatencyGuard {
    fn drop(&mut self) {
        numakv_pmem::account::set_latency(self.0);
    }
}
