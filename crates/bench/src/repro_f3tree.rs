//! F3-tree reproductions (papers/f3tree.txt §5): `f3tree-numa` (Figs. 8-9), `f3tree-read`
//! (Fig. 10), `f3tree-folimit` (Fig. 6).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use numakv::{EngineKind, Index, Options, Store};
use numakv_numa::Placement;
use numakv_pmem::account::{self, AccessStats};

use crate::engines::EngineTarget;
use crate::error::{BenchError, Result};
use crate::report::Report;
use crate::repro::{base_config, failures_md, header, scaled, ReproOptions};
use crate::runner::{run_workloads, BenchConfig, Progress};
use crate::target::Target;

/// Worker threads of the F3-tree figures (scaled down from the paper's 10-40).
const THREADS: usize = 4;

fn target(name: &str) -> Result<Arc<dyn Target>> {
    crate::engines::available()
        .into_iter()
        .find(|t| t.name() == name)
        .ok_or_else(|| BenchError::Config(format!("no target {name}")))
}

/// Whether the caller asked for the F3-tree engines (the CLI's default `all` does).
fn wants_f3(targets: &[Arc<dyn Target>]) -> bool {
    targets.iter().any(|t| t.name().starts_with("f3tree"))
}

/// The given targets that are not part of an F3-tree figure's own set: run on the figure's
/// workload as reference rows (DRAM peers, other engines).
fn references(targets: &[Arc<dyn Target>], own: &[&str]) -> Vec<Arc<dyn Target>> {
    targets
        .iter()
        .filter(|t| {
            let n = t.name();
            !n.starts_with("f3tree") && !own.contains(&n.as_str())
        })
        .cloned()
        .collect()
}

fn w1_config(opts: &ReproOptions, ops: u64) -> BenchConfig {
    BenchConfig {
        threads: vec![THREADS],
        nodes: opts.nodes.max(2),
        // Two workers per node: the paper's threads span the sockets.
        placement: Placement::Interleave,
        ops: Some(ops),
        ..base_config(opts)
    }
}

/// One target's W1 run plus the PM accesses of every thread (workers and evaluate threads).
struct Measured {
    name: String,
    mops: f64,
    ops: u64,
    worker_remote_per_op: f64,
    all: AccessStats,
}

// ---------------------------------------------------------------------------------------------
// f3tree-numa
// ---------------------------------------------------------------------------------------------

pub(crate) fn numa(
    targets: &[Arc<dyn Target>],
    opts: &ReproOptions,
    progress: Progress,
) -> Result<(String, Report, Vec<PathBuf>)> {
    let ops = scaled(200_000, opts.scale, 10_000);
    let config = w1_config(opts, ops);
    let workload = crate::presets::by_name("f3tree-w1")?;
    let mut report = Report::default();
    let mut rows = Vec::new();
    let own = ["f3tree-n", "f3tree-nonuma", "f3tree", "fastfair"];
    let mut run_targets = Vec::new();
    if wants_f3(targets) {
        for name in own {
            run_targets.push(target(name)?);
        }
    }
    run_targets.extend(references(targets, &[]));
    for t in run_targets {
        let name = t.name();
        let before = account::global_stats();
        let r = run_workloads(&config, std::slice::from_ref(&workload), &[t], progress)?;
        let all = account::global_stats().since(&before);
        if let Some(run) = r.runs.first() {
            rows.push(Measured {
                name: name.clone(),
                mops: run.throughput_mops,
                ops: run.ops,
                worker_remote_per_op: run.remote_reads_per_op + run.remote_writes_per_op,
                all,
            });
        }
        report.runs.extend(r.runs);
        report.failures.extend(r.failures);
    }
    let mut md = String::new();
    header(
        &mut md,
        "f3tree-numa",
        opts,
        &format!(
            "W1 (write only, {ops} random 8-byte keys into an empty tree), {THREADS} threads \
             interleaved over {} emulated nodes",
            config.nodes
        ),
    );
    md.push_str(
        "## The paper's claim\n\n\
         papers/f3tree.txt §5.2.2, Figs. 8-9: with PTFOs bound to the writer's node and \
         per-node evaluate threads, F3-tree(N) cuts remote memory accesses by more than half \
         compared with the NUMA-oblivious F3-tree, and writes faster than F&F.\n\n\
         ## Our measurement\n\n\
         `f3tree-n` is the NUMA-aware engine with node-batched evaluation; `f3tree-nonuma` is \
         the same engine with PTFOs interleaved over the nodes and evaluate threads serving any \
         node's PTFOs. *All threads* counts the PM lines of the workers and of the evaluate \
         threads during the measured phase (the paper counts both), per workload operation; \
         *workers* only the application threads.\n\n\
         | engine | Mops/s | remote lines/op (all threads) | remote share (all) | remote lines/op (workers) |\n\
         |---|---:|---:|---:|---:|\n",
    );
    for r in &rows {
        let remote = (r.all.reads_remote + r.all.writes_remote) as f64 / r.ops.max(1) as f64;
        let _ = writeln!(
            md,
            "| {} | {:.3} | {:.2} | {:.0}% | {:.2} |",
            r.name,
            r.mops,
            remote,
            r.all.remote_share() * 100.0,
            r.worker_remote_per_op
        );
    }
    let remote = |n: &str| {
        rows.iter()
            .find(|r| r.name == n)
            .map(|r| (r.all.reads_remote + r.all.writes_remote) as f64 / r.ops.max(1) as f64)
    };
    if let (Some(n), Some(o)) = (remote("f3tree-n"), remote("f3tree-nonuma")) {
        let cut = if o > 0.0 { 1.0 - n / o } else { 0.0 };
        let _ = writeln!(
            md,
            "\nRemote PM lines per operation, F3-tree(N) vs non-NUMA: {n:.2} vs {o:.2}, \
             {:.0}% fewer — the paper's \"at least 50% fewer\" {}.",
            cut * 100.0,
            if cut >= 0.5 { "holds" } else { "does not hold here" }
        );
    }
    md.push_str(
        "\nWhat stays remote in both: the global FAST&FAIR tree is shared by every node (the \
         paper does not bind it either), and an insert must look the key up in it to honour \
         insert-if-absent.\n",
    );
    failures_md(&report, &mut md);
    Ok((md, report, Vec::new()))
}

// ---------------------------------------------------------------------------------------------
// f3tree-read
// ---------------------------------------------------------------------------------------------

fn key_of(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % (u64::MAX - 2) + 1
}

fn store_options(opts: &ReproOptions, keys: u64) -> Options {
    let cap = (keys * 512 + (128 << 20)).div_ceil(256 << 10) * (256 << 10);
    Options::default().nodes(opts.nodes.max(2)).capacity_per_node(cap).mode(opts.persist)
}

fn insert_range(index: &dyn Index, from: u64, to: u64, nodes: usize) -> Result<()> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS as u64)
            .map(|t| {
                s.spawn(move || -> Result<()> {
                    numakv_numa::set_current_node(t as usize % nodes);
                    let mut i = from + t;
                    while i < to {
                        index.insert(key_of(i), i)?;
                        i += THREADS as u64;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err(panicked())))
    })
}

/// A store-level failure of a repro, as the target's error.
fn store_err(target: &str) -> impl Fn(numakv::Error) -> BenchError + '_ {
    move |e| BenchError::Target { target: target.to_string(), message: e.to_string() }
}

fn panicked() -> BenchError {
    BenchError::Config("a repro thread panicked".into())
}

fn counter(index: &dyn Index, name: &str) -> u64 {
    index.stats().counter(name).unwrap_or(0)
}

/// Random gets of loaded keys by every thread; (Mops/s, misses).
fn read_phase(index: &dyn Index, keys: u64, reads: u64, nodes: usize) -> Result<(f64, u64)> {
    let t0 = Instant::now();
    let misses = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS as u64)
            .map(|t| {
                s.spawn(move || -> Result<u64> {
                    numakv_numa::set_current_node(t as usize % nodes);
                    let mut x = t.wrapping_add(0x1234_5678);
                    let mut miss = 0;
                    for _ in 0..reads / THREADS as u64 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let i = x % keys;
                        if index.get(key_of(i))? != Some(i) {
                            miss += 1;
                        }
                    }
                    Ok(miss)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(panicked()))).sum::<Result<u64>>()
    })?;
    Ok((reads as f64 / t0.elapsed().as_secs_f64() / 1e6, misses))
}

/// Engine options as (key, value) text.
type Settings = &'static [(&'static str, &'static str)];

pub(crate) fn read(
    targets: &[Arc<dyn Target>],
    opts: &ReproOptions,
    progress: Progress,
) -> Result<(String, Report, Vec<PathBuf>)> {
    let keys = scaled(50_000, opts.scale, 5_000);
    let in_tree = keys * 4 / 5;
    let reads = scaled(200_000, opts.scale, 20_000);
    let nodes = opts.nodes.max(2);
    let scratch = opts.scratch.clone().unwrap_or_else(crate::runner::default_scratch);
    let variants: [(&str, EngineKind, Settings); 4] = [
        ("fastfair", EngineKind::FastFair, &[]),
        ("f3tree", EngineKind::F3Tree, &[]),
        ("f3tree-nohash", EngineKind::F3Tree, &[("hash_lookups", "false")]),
        ("f3tree-n", EngineKind::F3Tree, &[("evaluation", "batched:1024")]),
    ];
    let mut rows = Vec::new();
    let own: &[(&str, EngineKind, Settings)] = if wants_f3(targets) { &variants } else { &[] };
    for &(name, kind, settings) in own {
        let dir = tempfile::Builder::new()
            .prefix("numakv-repro-")
            .tempdir_in(&scratch)
            .map_err(|e| BenchError::Config(format!("scratch directory: {e}")))?;
        let path = dir.path().join("store");
        let mut eopts = kind.default_options();
        for (k, v) in settings {
            eopts.set(k, v).map_err(store_err(name))?;
        }
        let store = Store::create(&path, kind, store_options(opts, keys).engine(eopts.clone()))
            .map_err(store_err(name))?;
        let (store, pending) = if kind == EngineKind::F3Tree {
            // 80% of the keys into the tree: insert, close (which drains the PTFOs) ...
            insert_range(store.index(), 0, in_tree, nodes)?;
            store.close().map_err(store_err(name))?;
            // ... then a session whose evaluators never trigger keeps the last 20% in PTFOs.
            let mut held = eopts.clone();
            held.set("count_threshold", &u64::MAX.to_string()).map_err(store_err(name))?;
            held.set("time_threshold_us", "3600000000").map_err(store_err(name))?;
            let store = Store::open_with(&path, &store_options(opts, keys).engine(held))
                .map_err(store_err(name))?;
            insert_range(store.index(), in_tree, keys, nodes)?;
            let pending = counter(store.index(), "pending_keys");
            (store, pending)
        } else {
            insert_range(store.index(), 0, keys, nodes)?;
            (store, 0)
        };
        let (mops, misses) = read_phase(store.index(), keys, reads, nodes)?;
        rows.push((name, mops, pending, misses));
        store.close().map_err(store_err(name))?;
    }
    let mut md = String::new();
    header(
        &mut md,
        "f3tree-read",
        opts,
        &format!(
            "{keys} random keys, {in_tree} of them evaluated into the tree and the rest held in \
             PTFOs; then {reads} random gets of loaded keys by {THREADS} threads on {nodes} nodes"
        ),
    );
    md.push_str(
        "## The paper's claim\n\n\
         papers/f3tree.txt §5.3.2, Fig. 10 (W2, 20% of the key-value pairs in PTFOs): F3-tree \
         \"No Hash\" has the worst read performance because every read goes over the PTFOs \
         first; with the in-memory hash table F3-tree reads close to F&F.\n\n\
         ## Our measurement\n\n\
         | engine | Mops/s | keys pending in PTFOs | misses |\n|---|---:|---:|---:|\n",
    );
    for (name, mops, pending, misses) in &rows {
        let _ = writeln!(md, "| {name} | {mops:.3} | {pending} | {misses} |");
    }
    // Reference rows: the other targets asked for, on W2 (read only) after a load of as many
    // keys (no PTFOs there).
    let refs = references(targets, &["fastfair"]);
    let mut report = Report::default();
    if !refs.is_empty() {
        let config = BenchConfig {
            threads: vec![THREADS],
            nodes,
            placement: Placement::Interleave,
            keys: Some(keys),
            ops: Some(reads),
            ..base_config(opts)
        };
        let w2 = crate::presets::by_name("f3tree-w2")?;
        let r = run_workloads(&config, std::slice::from_ref(&w2), &refs, progress)?;
        for run in &r.runs {
            let _ = writeln!(
                md,
                "| {} (W2 reference) | {:.3} | - | - |",
                run.engine, run.throughput_mops
            );
        }
        report = r;
    }
    let m = |n: &str| rows.iter().find(|r| r.0 == n).map_or(0.0, |r| r.1);
    let _ = writeln!(
        md,
        "\nHash table vs none: {:.1}x; F3-tree vs FAST&FAIR: {:.2}x.",
        m("f3tree") / m("f3tree-nohash").max(1e-9),
        m("f3tree") / m("fastfair").max(1e-9)
    );
    failures_md(&report, &mut md);
    Ok((md, report, Vec::new()))
}

// ---------------------------------------------------------------------------------------------
// f3tree-folimit
// ---------------------------------------------------------------------------------------------

/// FO entries in the sweep: small FOs so that the paper's limits (counted in FOs) bind at a
/// scaled-down key count.
const SWEEP_FO_ENTRIES: &str = "16";

pub(crate) fn fo_limit(
    targets: &[Arc<dyn Target>],
    opts: &ReproOptions,
    progress: Progress,
) -> Result<(String, Report, Vec<PathBuf>)> {
    let ops = scaled(200_000, opts.scale, 10_000);
    let config = w1_config(opts, ops);
    let workload = crate::presets::by_name("f3tree-w1")?;
    let mut report = Report::default();
    let mut rows = Vec::new();
    let mut run_targets: Vec<(String, Arc<dyn Target>)> = Vec::new();
    if wants_f3(targets) {
        for limit in ["100", "500", "1000", "unlimited"] {
            let name = format!("f3tree-folimit-{limit}");
            let t: Arc<dyn Target> = Arc::new(EngineTarget::variant(
                &name,
                "F3-tree with an FO limit",
                EngineKind::F3Tree,
                &[("fo_limit", limit), ("fo_entries", SWEEP_FO_ENTRIES)],
            )?);
            run_targets.push((format!("f3tree, limit {limit}"), t));
        }
    }
    run_targets.extend(references(targets, &[]).into_iter().map(|t| (t.name(), t)));
    for (label, t) in run_targets {
        let t0 = Instant::now();
        let r = run_workloads(&config, std::slice::from_ref(&workload), &[t], progress)?;
        let wall = t0.elapsed();
        if let Some(run) = r.runs.first() {
            rows.push((label, run.throughput_mops, run.p99_ns, wall));
        }
        report.runs.extend(r.runs);
        report.failures.extend(r.failures);
    }
    let mut md = String::new();
    header(
        &mut md,
        "f3tree-folimit",
        opts,
        &format!(
            "W1 ({ops} random inserts), {THREADS} threads on {} nodes, {SWEEP_FO_ENTRIES} \
             entries per FO",
            config.nodes
        ),
    );
    md.push_str(
        "## The paper's claim\n\n\
         papers/f3tree.txt §5.2.1, Fig. 6: the FO limit (100 / 500 / 1000 / unlimited) bounds \
         how far producers may run ahead of the evaluate threads; once it is met the producer \
         waits, so small limits cost write throughput and \"unlimited\" is fastest.\n\n\
         ## Our measurement\n\n\
         | target | Mops/s | p99 | wall (incl. drain at close) |\n|---|---:|---:|---:|\n",
    );
    for (limit, mops, p99, wall) in &rows {
        let _ = writeln!(
            md,
            "| {limit} | {mops:.3} | {:?} | {:.2?} |",
            Duration::from_nanos(*p99),
            wall
        );
    }
    failures_md(&report, &mut md);
    Ok((md, report, Vec::new()))
}
