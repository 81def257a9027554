//! NOBtree's reproductions (issue 6):
//!
//! - `nobtree-remote`: papers/nobtree.txt Fig. 9 in spirit — remote PM line reads per operation
//!   of nobtree beside fastfair on the read-only and write-heavy workloads (zipf 0.99, 2 nodes,
//!   4 threads), plus a run that shows the upper layer reads no remote line.
//! - `nobtree-migration`: §III-D — threads on node 1 with their own hot keys whose leaves sit on
//!   node 0; remote share and throughput per interval, with and without the coordinator.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use numakv::{EngineKind, EngineOptions, Index, Options, Store};
use numakv_pmem::account;
use numakv_pmem::LatencyModel;

use crate::engines::EngineTarget;
use crate::error::{BenchError, Result};
use crate::presets;
use crate::report::figure;
use crate::report::{write_file, Report};
use crate::repro::{base_config, failures_md, header, scaled, ReproOptions};
use crate::runner::{default_scratch, run_workloads, BenchConfig, Progress};
use crate::target::Target;

/// `numakv repro nobtree-remote`.
pub(crate) fn remote(
    targets: &[Arc<dyn Target>],
    opts: &ReproOptions,
    progress: Progress,
) -> Result<(String, Report, Vec<PathBuf>)> {
    // nobtree, its no-migration variant and fastfair always; the requested targets beside them.
    const WANT: [&str; 3] = ["nobtree", "nobtree-nomigrate", "fastfair"];
    let mut chosen: Vec<Arc<dyn Target>> =
        crate::engines::all().into_iter().filter(|t| WANT.contains(&t.name().as_str())).collect();
    chosen.extend(targets.iter().filter(|t| !WANT.contains(&t.name().as_str())).cloned());
    let keys = scaled(100_000, opts.scale, 2_000);
    let ops = scaled(200_000, opts.scale, 4_000);
    let workloads =
        vec![presets::by_name("nobtree-read-only")?, presets::by_name("nobtree-write-heavy")?];
    let config = BenchConfig {
        keys: Some(keys),
        ops: Some(ops),
        threads: vec![4],
        nodes: opts.nodes.max(2),
        ..base_config(opts)
    };
    let mut report = run_workloads(&config, &workloads, &chosen, progress)?;
    // Upper layer alone: every bottom node on node 0, one thread (on node 0 with the default
    // fill placement): any remote line would be the upper layer's.
    let local = EngineTarget::variant(
        "nobtree-bottom-on-node0",
        "nobtree with every bottom node on node 0",
        EngineKind::Nobtree,
        &[("nsm_mode", "node:0"), ("migration", "off")],
    )?;
    let one = BenchConfig { threads: vec![1], ..config.clone() };
    let lone: Vec<Arc<dyn Target>> = vec![Arc::new(local)];
    let r1 = run_workloads(&one, &workloads[..1], &lone, progress)?;
    report.runs.extend(r1.runs);
    report.failures.extend(r1.failures);

    let mut md = String::new();
    header(
        &mut md,
        "nobtree-remote",
        opts,
        &format!(
            "{keys} keys loaded, {ops} operations, 4 threads over {} emulated nodes (fill \
             placement), zipf 0.99",
            config.nodes
        ),
    );
    md.push_str(
        "## The paper's claim\n\n\
         papers/nobtree.txt §V-C, Fig. 9 (remote NVM traffic measured with Intel PCM, 40–80 \
         threads on two sockets): \"NOBtree consistently achieves less remote NVM access amount \
         than TLBtree except the scan workload. This can be owing to the replication of the \
         upper layer and the node migration\" and \"Fast&Fair experiences a significant amount \
         of remote NVM access, which is primarily due to its large node size.\"\n\n\
         ## Our measurement\n\n\
         | engine | workload | threads | remote PM line reads/op | PM line reads/op | remote \
         share | Mops/s |\n|---|---|---:|---:|---:|---:|---:|\n",
    );
    for r in &report.runs {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {:.2} | {:.0}% | {:.3} |",
            r.engine,
            r.workload,
            r.threads,
            figure(r.remote_reads_per_op),
            figure(r.pm_reads_per_op),
            figure(r.remote_share) * 100.0,
            r.throughput_mops
        );
    }
    md.push_str("\n### nobtree against fastfair\n\n");
    for w in &workloads {
        let get = |e: &str| {
            report.runs.iter().find(|r| r.engine == e && r.workload == w.name && r.threads == 4)
        };
        if let (Some(n), Some(f)) = (get("nobtree"), get("fastfair")) {
            let _ = writeln!(
                md,
                "- {}: remote reads/op {:.2} vs {:.2} ({:.0}% of fastfair's); throughput ratio \
                 {:.2}×; nobtree's remote reads are {}.",
                w.name,
                figure(n.remote_reads_per_op),
                figure(f.remote_reads_per_op),
                100.0 * figure(n.remote_reads_per_op) / figure(f.remote_reads_per_op).max(1e-9),
                n.throughput_mops / f.throughput_mops.max(1e-9),
                if figure(n.remote_reads_per_op) < figure(f.remote_reads_per_op) {
                    "lower"
                } else {
                    "NOT lower"
                }
            );
        }
    }
    if let Some(r) = report.runs.iter().find(|r| r.engine == "nobtree-bottom-on-node0") {
        let _ = writeln!(
            md,
            "- upper layer: with every bottom node on the thread's node, a lookup reads {:.2} \
             remote lines ({:.2} lines in all): each thread's upper-layer replica is local, so \
             the upper layer contributes {} remote reads.",
            figure(r.remote_reads_per_op),
            figure(r.pm_reads_per_op),
            if figure(r.remote_reads_per_op) == 0.0 { "no" } else { "SOME" }
        );
    }
    failures_md(&report, &mut md);
    Ok((md, report, Vec::new()))
}

/// One interval of the migration run.
#[derive(Clone, Copy, Debug, Default)]
struct Interval {
    ops: u64,
    reads: u64,
    remote: u64,
    /// Migrations completed in the interval (the engine's `migrations` counter).
    migrations: u64,
}

/// The intervals of one migration run and the engine's counters after it.
type MigrationRun = (Vec<Interval>, Vec<(&'static str, u64)>);

/// Runs the per-thread-hotspot workload on a fresh store; returns the intervals and the
/// engine's counters.
fn migration_run(
    dir: &std::path::Path,
    opts: &ReproOptions,
    migrate: bool,
    keys: u64,
    intervals: usize,
    interval: Duration,
) -> Result<MigrationRun> {
    let mut engine = EngineKind::Nobtree.default_options();
    let set = |e: &mut EngineOptions, k: &str, v: &str| {
        e.set(k, v).map_err(|x| BenchError::Config(format!("nobtree option {k}: {x}")))
    };
    set(&mut engine, "nsm_mode", "node:0")?;
    set(&mut engine, "migration", if migrate { "on" } else { "off" })?;
    let sopts = Options::default()
        .nodes(opts.nodes.max(2))
        .capacity_per_node(256 << 20)
        .mode(opts.persist)
        .engine(engine);
    let store = Arc::new(
        Store::create(dir, EngineKind::Nobtree, sopts)
            .map_err(|e| BenchError::Config(format!("creating the nobtree store: {e}")))?,
    );
    numakv_numa::set_current_node(0);
    for k in 1..=keys {
        store.insert(k, k).map_err(|e| BenchError::Config(format!("load: {e}")))?;
    }
    const THREADS: usize = 2;
    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let mut handles = Vec::new();
    account::set_enabled(true);
    account::set_latency(LatencyModel::OPTANE);
    for th in 0..THREADS {
        let store = Arc::clone(&store);
        let stop = Arc::clone(&stop);
        let barrier = Arc::clone(&barrier);
        let slice = keys / THREADS as u64;
        handles.push(std::thread::spawn(move || -> Vec<Interval> {
            numakv_numa::set_current_node(1);
            // This thread's own hot keys: 48 keys spread over its slice (distinct leaves).
            let hot: Vec<u64> =
                (0..48u64).map(|j| 1 + th as u64 * slice + j * (slice / 48)).collect();
            let mut out = vec![Interval::default(); intervals];
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ th as u64;
            barrier.wait();
            let t0 = Instant::now();
            let mut i = 0;
            let mut base = account::thread_stats();
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let k = hot[(x % hot.len() as u64) as usize];
                let _ = store.get(k);
                account::op_end();
                let now = (t0.elapsed().as_secs_f64() / interval.as_secs_f64()) as usize;
                if now != i || now >= intervals {
                    let s = account::thread_stats();
                    let d = s.since(&base);
                    if let Some(iv) = out.get_mut(i) {
                        iv.ops = d.ops;
                        iv.reads = d.reads_local + d.reads_remote;
                        iv.remote = d.reads_remote;
                    }
                    base = s;
                    i = now;
                    if now >= intervals {
                        break;
                    }
                }
            }
            out
        }));
    }
    barrier.wait();
    // The coordinator's progress, read at every interval's end.
    let t0 = Instant::now();
    let migrations = || store.stats().counter("migrations").unwrap_or(0);
    let mut done = Vec::with_capacity(intervals);
    let mut last = migrations();
    for i in 1..=intervals {
        std::thread::sleep((interval * i as u32).saturating_sub(t0.elapsed()));
        let now = migrations();
        done.push(now - last);
        last = now;
    }
    std::thread::sleep(interval / 2);
    stop.store(true, Ordering::Relaxed);
    let mut total = vec![Interval::default(); intervals];
    for h in handles {
        let v = h.join().map_err(|_| BenchError::Config("a migration worker panicked".into()))?;
        for (t, x) in total.iter_mut().zip(v) {
            t.ops += x.ops;
            t.reads += x.reads;
            t.remote += x.remote;
        }
    }
    for (t, m) in total.iter_mut().zip(done) {
        t.migrations = m;
    }
    account::set_latency(LatencyModel::NONE);
    account::set_enabled(false);
    let counters = store.stats().counters;
    match Arc::try_unwrap(store) {
        Ok(s) => s.close().map_err(|e| BenchError::Config(format!("close: {e}")))?,
        Err(_) => return Err(BenchError::Config("store still shared".into())),
    }
    Ok((total, counters))
}

/// `numakv repro nobtree-migration`.
pub(crate) fn migration(opts: &ReproOptions) -> Result<(String, Report, Vec<PathBuf>)> {
    let keys = scaled(50_000, opts.scale, 5_000);
    let intervals = 20usize;
    let interval = Duration::from_millis(scaled(150, opts.scale, 50));
    let scratch = opts.scratch.clone().unwrap_or_else(default_scratch);
    let mut runs = Vec::new();
    for migrate in [true, false] {
        let dir = tempfile::Builder::new()
            .prefix("numakv-repro-mig-")
            .tempdir_in(&scratch)
            .map_err(|e| BenchError::Config(format!("scratch dir: {e}")))?;
        runs.push(migration_run(
            &dir.path().join("store"),
            opts,
            migrate,
            keys,
            intervals,
            interval,
        )?);
    }
    let mut md = String::new();
    header(
        &mut md,
        "nobtree-migration",
        opts,
        &format!(
            "{keys} keys loaded with every bottom node on node 0; 2 threads on node 1, each \
             reading 48 hot keys of its own (uniformly), {intervals} intervals of {} ms; \
             emulated Optane latency (remote reads cost 181 ns, local 113 ns); engine-specific: \
             runs nobtree and nobtree-nomigrate whatever targets were requested",
            interval.as_millis()
        ),
    );
    md.push_str(
        "## The paper's claim\n\n\
         papers/nobtree.txt §III-D: \"each thread has different data-accessing localities\" … \
         \"we can migrate nodes in the bottom layer to the socket that accesses them most \
         frequently, thereby reducing remote NVM access\"; nodes qualify when \"they are \
         considered hot nodes and … most accesses are remote NVM accesses\".\n\n\
         ## Our measurement\n\n\
         | interval | t (s) | nobtree Mops/s | nobtree remote share | nobtree migrations/s \
         | nobtree-nomigrate Mops/s | nobtree-nomigrate remote share |\n\
         |---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let secs = interval.as_secs_f64();
    let share =
        |iv: &Interval| if iv.reads == 0 { 0.0 } else { iv.remote as f64 / iv.reads as f64 };
    for i in 0..intervals {
        let (a, b) = (&runs[0].0[i], &runs[1].0[i]);
        let _ = writeln!(
            md,
            "| {i} | {:.2} | {:.3} | {:.0}% | {:.0} | {:.3} | {:.0}% |",
            (i + 1) as f64 * secs,
            a.ops as f64 / secs / 1e6,
            share(a) * 100.0,
            a.migrations as f64 / secs,
            b.ops as f64 / secs / 1e6,
            share(b) * 100.0
        );
    }
    let first = &runs[0].0[0];
    let last = &runs[0].0[intervals - 1];
    let c = |name: &str| runs[0].1.iter().find(|c| c.0 == name).map_or(0, |c| c.1);
    let _ = writeln!(
        md,
        "\nnobtree: remote share {:.0}% in the first interval, {:.0}% in the last; throughput \
         {:.3} → {:.3} Mops/s; {} migrations ({} queued, {} aborted).",
        share(first) * 100.0,
        share(last) * 100.0,
        first.ops as f64 / secs / 1e6,
        last.ops as f64 / secs / 1e6,
        c("migrations"),
        c("migrations_queued"),
        c("migrations_aborted")
    );
    // Whether migrations settle: their rate in the first second against the rest.
    let first_n = ((1.0 / secs).round() as usize).clamp(1, intervals);
    let rate = |ivs: &[Interval]| {
        ivs.iter().map(|iv| iv.migrations).sum::<u64>() as f64 / (ivs.len().max(1) as f64 * secs)
    };
    let later = &runs[0].0[first_n..];
    let _ = writeln!(
        md,
        "\nnobtree migrations per second: {:.0} in the first second, {:.0} after it (at most \
         {:.0} in one interval after it).",
        rate(&runs[0].0[..first_n]),
        rate(later),
        later.iter().map(|iv| iv.migrations).max().unwrap_or(0) as f64 / secs
    );
    let mut csv = String::from("interval,engine,ops,pm_reads,remote_reads,migrations\n");
    for (name, run) in [("nobtree", &runs[0]), ("nobtree-nomigrate", &runs[1])] {
        for (i, iv) in run.0.iter().enumerate() {
            let _ =
                writeln!(csv, "{i},{name},{},{},{},{}", iv.ops, iv.reads, iv.remote, iv.migrations);
        }
    }
    let path = opts.out_dir.join("nobtree-migration.csv");
    write_file(&path, &csv)?;
    Ok((md, Report::default(), vec![path]))
}
