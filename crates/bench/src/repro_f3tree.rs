//! F3-tree reproductions (papers/f3tree.txt §5): `f3tree-numa` (Figs. 8-9), `f3tree-read`
//! (Fig. 10), `f3tree-folimit` (Fig. 6).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use numakv::{EngineKind, Index, Options, Store};
use numakv_numa::Placement;
use numakv_pmem::account::{self, AccessStats};
use numakv_pmem::cachemodel::{CacheConfig, CacheStats, FlushKind};

use crate::engines::EngineTarget;
use crate::error::{BenchError, Result};
use crate::report::figure;
use crate::report::Report;
use crate::repro::{base_config, failures_md, header, scaled, ReproOptions};
use crate::runner::{run_workloads, BenchConfig, Progress};
use crate::target::Target;

/// Worker threads of the F3-tree figures' headline (scaled down from the paper's 10-40).
const THREADS: usize = 4;

/// Fig. 9's sweep: nodes of the pool, and worker threads per node (the paper's 10 cores per
/// node, scaled down); a run on `k` nodes has `k · SWEEP_PER_NODE` workers filling the nodes
/// consecutively from the first, as the paper pins them (§3.2).
const SWEEP_NODES: usize = 4;
const SWEEP_PER_NODE: usize = 2;

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

/// The write of W1 as our API issues it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum W1Op {
    /// `upsert`: a blind write, as the paper's W1 insert is (Algorithm 1's INSERT_FO appends to
    /// the PTFO; F&F's `btree_insert` does not look for the key first).
    Upsert,
    /// `insert`: insert-if-absent, which must look the key up (F3-tree: in the global tree,
    /// under the key's shard lock) to return whether it was new.
    Insert,
}

/// W1's keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum W1Keys {
    /// Fresh random keys, each thread every `threads`-th of one random sequence.
    Random,
    /// Keys 1..=n, each thread an ascending contiguous range of them: how the F&F and F3-tree
    /// prototypes' benchmarks split a sorted input file among threads (Fig. 8a).
    Sequential,
}

/// One W1 variant: the write and the keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct W1 {
    op: W1Op,
    keys: W1Keys,
}

impl W1 {
    const UPSERT: W1 = W1 { op: W1Op::Upsert, keys: W1Keys::Random };
    const INSERT: W1 = W1 { op: W1Op::Insert, keys: W1Keys::Random };
    const UPSERT_SEQ: W1 = W1 { op: W1Op::Upsert, keys: W1Keys::Sequential };

    /// The report's name for it.
    fn label(self) -> &'static str {
        match (self.op, self.keys) {
            (W1Op::Upsert, W1Keys::Random) => "upsert",
            (W1Op::Insert, W1Keys::Random) => "insert",
            (W1Op::Upsert, W1Keys::Sequential) => "upsert, sequential",
            (W1Op::Insert, W1Keys::Sequential) => "insert, sequential",
        }
    }

    /// The keys thread `t` of `threads` writes, in order, out of `ops`.
    fn keys_of(self, t: u64, threads: u64, ops: u64) -> Box<dyn Iterator<Item = u64>> {
        match self.keys {
            W1Keys::Random => Box::new((t..ops).step_by(threads as usize).map(key_of)),
            W1Keys::Sequential => {
                let per = ops / threads;
                let to = if t + 1 == threads { ops } else { (t + 1) * per };
                Box::new((t * per..to).map(|i| i + 1))
            }
        }
    }
}

/// Workers and nodes of a W1 run: `threads` workers on a pool of `nodes` nodes, filling them
/// consecutively, `per_node` per node (worker `t` on node `t / per_node`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    threads: usize,
    nodes: usize,
    per_node: usize,
}

impl Shape {
    /// Nodes that have workers.
    fn used_nodes(self) -> usize {
        self.threads.div_ceil(self.per_node.max(1))
    }
}

/// What a run counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Count {
    /// Nothing (the timed run).
    Off,
    /// PM lines.
    Lines,
    /// PM lines, and the same accesses through [`LLC_MODELS`].
    LinesAndCaches,
}

/// The caches W1's counted run is replayed through: one socket of the paper's machine
/// (papers/f3tree.txt §5.1), with its `clflush`, and the same cache with a `clwb` that keeps lines.
const LLC_MODELS: [CacheConfig; 2] =
    [CacheConfig::XEON_E5_4640_V2, CacheConfig::XEON_E5_4640_V2.with_flush(FlushKind::Clwb)];

/// PM lines of F3-tree's phases: `(local, remote)` per [`PHASES`] entry.
const PHASES: [&str; 4] = ["producer_tree", "producer_ptfo", "eval_ptfo", "eval_tree"];

/// One W1 run of the figure: producers until their last write, then the evaluators until every
/// entry is in the tree — with accounting on throughout, so the evaluate threads' PM lines are
/// all counted (the paper counts the whole run's remote accesses).
struct W1Run {
    name: String,
    w1: W1,
    shape: Shape,
    ops: u64,
    producer_secs: f64,
    drained_secs: f64,
    /// Every thread's PM lines (workers and evaluate threads).
    all: AccessStats,
    /// F3-tree's per-phase (local, remote) lines; zero for other engines.
    phases: [(u64, u64); 4],
    /// F3-N: entries written into the previous entry's leaf without a descent.
    leaf_reuses: u64,
    /// The engine's DRAM bytes when the last producer returned (F3-tree: tree handle and the
    /// pending-key table at its fullest).
    dram_bytes: u64,
    /// What each of [`LLC_MODELS`] counted over the same accesses (counted runs only).
    llc: Vec<(CacheConfig, CacheStats)>,
}

impl W1Run {
    fn remote_per_op(&self) -> f64 {
        (self.all.reads_remote + self.all.writes_remote) as f64 / self.ops.max(1) as f64
    }
    fn lines_per_op(&self) -> f64 {
        (self.all.reads() + self.all.writes()) as f64 / self.ops.max(1) as f64
    }
    fn mops(&self) -> f64 {
        self.ops as f64 / self.producer_secs.max(1e-9) / 1e6
    }
}

/// Timed runs per row; the row reports the one with the median producer time. On a small
/// shared machine one run of a fraction of a second varies by 2x from run to run.
const TIMED_RUNS: usize = 3;

/// W1 for one row of the figure on fresh stores: [`TIMED_RUNS`] times timed with accounting off
/// (counting costs per line and would slow the line-heavy tree more than the PTFO writes;
/// docs/design.md §11), then once counted. Throughput from the median timed run, PM lines from
/// the counted one.
fn w1_row(row: Row, w1: W1, opts: &ReproOptions, ops: u64, shape: Shape) -> Result<W1Run> {
    let mut timed = (0..TIMED_RUNS)
        .map(|_| run_w1(row, w1, opts, ops, shape, Count::Off))
        .collect::<Result<Vec<_>>>()?;
    timed.sort_by(|a, b| a.producer_secs.total_cmp(&b.producer_secs));
    let mid = &timed[timed.len() / 2];
    let counted = run_w1(row, w1, opts, ops, shape, Count::LinesAndCaches)?;
    Ok(W1Run { producer_secs: mid.producer_secs, drained_secs: mid.drained_secs, ..counted })
}

/// Runs W1 (`ops` fresh keys by the shape's workers) on a fresh store of the row's engine and
/// settings, with accounting on throughout unless `count` is off.
fn run_w1(
    row: Row,
    w1: W1,
    opts: &ReproOptions,
    ops: u64,
    shape: Shape,
    count: Count,
) -> Result<W1Run> {
    let (name, kind, settings) = row;
    let scratch = opts.scratch.clone().unwrap_or_else(crate::runner::default_scratch);
    let dir = tempfile::Builder::new()
        .prefix("numakv-repro-")
        .tempdir_in(&scratch)
        .map_err(|e| BenchError::Config(format!("scratch directory: {e}")))?;
    let mut eopts = kind.default_options();
    for (k, v) in settings {
        eopts.set(k, v).map_err(store_err(name))?;
    }
    let store = Store::create(
        dir.path().join("store"),
        kind,
        store_options(shape.nodes, opts, ops).engine(eopts),
    )
    .map_err(store_err(name))?;
    let index = store.index();
    account::set_enabled(count != Count::Off);
    if count == Count::LinesAndCaches {
        account::start_cache_models(&LLC_MODELS);
    }
    account::op_discard();
    let before = account::global_stats();
    let t0 = Instant::now();
    let threads = shape.threads as u64;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> Result<()> {
                    let node = (t as usize / shape.per_node.max(1)).min(shape.nodes - 1);
                    numakv_numa::set_current_node(node);
                    account::op_discard();
                    for key in w1.keys_of(t, threads, ops) {
                        match w1.op {
                            W1Op::Upsert => index.upsert(key, key)?,
                            W1Op::Insert => {
                                if !index.insert(key, key)? {
                                    return Err(BenchError::Target {
                                        target: "w1".into(),
                                        message: format!("key {key} was not new"),
                                    });
                                }
                            }
                        }
                        account::op_end();
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err(panicked())))
    })
    .map_err(|e| match e {
        BenchError::Target { message, .. } => {
            BenchError::Target { target: name.to_string(), message }
        }
        e => e,
    })?;
    let producer_secs = t0.elapsed().as_secs_f64();
    let dram_bytes = index.stats().dram_bytes;
    // The evaluate threads checkpoint what is left; accounting stays on until they are done.
    let deadline = Instant::now() + Duration::from_secs(600);
    while counter(index, "pending_keys") + counter(index, "pending_entries") > 0
        && Instant::now() < deadline
    {
        // Reading the statistics touches no PM line that should count.
        account::op_discard();
        std::thread::sleep(Duration::from_millis(1));
    }
    let drained_secs = t0.elapsed().as_secs_f64();
    let all = account::global_stats().since(&before);
    let llc =
        if count == Count::LinesAndCaches { account::stop_cache_models() } else { Vec::new() };
    account::set_enabled(false);
    let phases = std::array::from_fn(|i| {
        (
            counter(index, &format!("pm_{}_local", PHASES[i])),
            counter(index, &format!("pm_{}_remote", PHASES[i])),
        )
    });
    let leaf_reuses = counter(index, "leaf_reuses");
    store.close().map_err(store_err(name))?;
    Ok(W1Run {
        name: name.to_string(),
        w1,
        shape,
        ops,
        producer_secs,
        drained_secs,
        all,
        phases,
        leaf_reuses,
        dram_bytes,
        llc,
    })
}

// ---------------------------------------------------------------------------------------------
// f3tree-numa
// ---------------------------------------------------------------------------------------------

/// The figure's own rows. All F3-tree rows but `f3tree-batched` evaluate key by key (F3-K), as
/// §5.3.1 does ("we only utilize the key-based approach").
const NUMA_ROWS: [Row; 6] = [
    ("f3tree", EngineKind::F3Tree, &[]),
    ("f3tree-n2", EngineKind::F3Tree, &[("evaluators", "total:2")]),
    ("f3tree-ni", EngineKind::F3Tree, &[("evaluators", "first-node:2")]),
    ("f3tree-nonuma", EngineKind::F3Tree, &[("numa_aware", "false"), ("evaluators", "unbound:2")]),
    ("f3tree-batched", EngineKind::F3Tree, &[("evaluation", "batched:1024")]),
    ("fastfair", EngineKind::FastFair, &[]),
];

/// The paper's label of a row.
fn paper_label(name: &str) -> &'static str {
    match name {
        "f3tree" => "F3-tree(N), F3-K",
        "f3tree-n2" => "F3-tree(N2), F3-K",
        "f3tree-ni" => "F3-tree(NI), F3-K",
        "f3tree-nonuma" => "≈ F3-tree(I), F3-K",
        "f3tree-batched" => "F3-tree(N), F3-N",
        "fastfair" => "F&F",
        _ => "",
    }
}

/// The pairs the verdict is drawn on: F3-tree(N) against each baseline, per W1 variant.
const VERDICT_PAIRS: [(&str, &str, W1); 6] = [
    ("f3tree", "f3tree-ni", W1::UPSERT),
    ("f3tree", "f3tree-ni", W1::UPSERT_SEQ),
    ("f3tree", "f3tree-ni", W1::INSERT),
    ("f3tree", "f3tree-n2", W1::UPSERT),
    ("f3tree", "f3tree-nonuma", W1::UPSERT),
    ("f3tree", "f3tree-nonuma", W1::UPSERT_SEQ),
];

/// The verdict on a cut of remote accesses, in the data's words.
fn verdict(cut: f64) -> &'static str {
    if cut >= 0.5 {
        "reproduced"
    } else if cut > 0.0 {
        "not reproduced (fewer, but not 50% fewer)"
    } else {
        "not reproduced (the baseline has fewer)"
    }
}

/// `x` against `y` in words: "N% fewer" or "k.kx as many".
fn compare(x: f64, y: f64) -> String {
    if x < y {
        format!("{:.0}% fewer", (1.0 - x / y.max(1e-12)) * 100.0)
    } else {
        format!("{:.1}x as many", x / y.max(1e-12))
    }
}

/// Why a baseline has fewer remote lines, when its phases say so.
fn why_fewer(base: &W1Run) -> String {
    let (l, r) = base.phases[3];
    if l + r == 0 {
        return String::new();
    }
    let share = r as f64 / (l + r) as f64;
    if base.name == "f3tree-ni" && share < 0.25 {
        format!(
            " — NI's evaluator tree writes are {:.0}% remote: its evaluators all run on the \
             first node, so the tree they grow lives there",
            share * 100.0
        )
    } else {
        String::new()
    }
}

pub(crate) fn numa(
    targets: &[Arc<dyn Target>],
    opts: &ReproOptions,
    progress: Progress,
) -> Result<(String, Report, Vec<PathBuf>)> {
    let ops = scaled(200_000, opts.scale, 10_000);
    let nodes = opts.nodes.max(2);
    let headline = Shape { threads: THREADS, nodes, per_node: THREADS.div_ceil(nodes) };
    let mut rows: Vec<W1Run> = Vec::new();
    let mut sweep: Vec<W1Run> = Vec::new();
    if wants_f3(targets) {
        for row in NUMA_ROWS {
            rows.push(w1_row(row, W1::UPSERT, opts, ops, headline)?);
        }
        // Insert-if-absent: what a producer-side tree lookup adds.
        for &row in &NUMA_ROWS[..3] {
            rows.push(w1_row(row, W1::INSERT, opts, ops, headline)?);
        }
        // Fig. 8a's sequential keys: each thread's range grows at its own place in the tree.
        for row in NUMA_ROWS {
            rows.push(w1_row(row, W1::UPSERT_SEQ, opts, ops, headline)?);
        }
        // Fig. 9: 1..4 nodes filled consecutively, lines counted (no timing).
        let sweep_ops = scaled(100_000, opts.scale, 8_000);
        for k in 1..=SWEEP_NODES {
            let shape =
                Shape { threads: k * SWEEP_PER_NODE, nodes: SWEEP_NODES, per_node: SWEEP_PER_NODE };
            for &row in &NUMA_ROWS[..3] {
                sweep.push(run_w1(row, W1::UPSERT, opts, sweep_ops, shape, Count::Lines)?);
            }
        }
    }
    let mut report = Report::default();
    for r in rows.iter().chain(&sweep) {
        let per = |x: u64| x as f64 / r.ops.max(1) as f64;
        let mut counters = std::collections::BTreeMap::new();
        for (i, p) in PHASES.iter().enumerate() {
            counters.insert(format!("pm_{p}_local"), r.phases[i].0);
            counters.insert(format!("pm_{p}_remote"), r.phases[i].1);
        }
        counters.insert("dram_bytes_at_last_write".into(), r.dram_bytes);
        for (cfg, st) in &r.llc {
            let f = cfg.flush;
            counters.insert(format!("llc_{f}_hits"), st.hits);
            counters.insert(format!("llc_{f}_memory_reads_local"), st.memory_reads_local);
            counters.insert(format!("llc_{f}_memory_reads_remote"), st.memory_reads_remote);
            counters.insert(format!("llc_{f}_transfers_remote"), st.transfers_remote);
            counters.insert(format!("llc_{f}_writebacks_local"), st.writebacks_local);
            counters.insert(format!("llc_{f}_writebacks_remote"), st.writebacks_remote);
            counters.insert(format!("llc_{f}_invalidations"), st.invalidations);
        }
        let is_sweep = r.shape != headline;
        report.runs.push(crate::report::RunResult {
            engine: r.name.clone(),
            workload: if is_sweep {
                format!(
                    "f3tree-w1 ({}, fig. 9 sweep, {} nodes)",
                    r.w1.label(),
                    r.shape.used_nodes()
                )
            } else {
                format!("f3tree-w1 ({})", r.w1.label())
            },
            threads: r.shape.threads,
            nodes: r.shape.nodes,
            placement: "consecutive".into(),
            persist: opts.persist.to_string(),
            ops: r.ops,
            seconds: r.producer_secs,
            throughput_mops: if is_sweep { 0.0 } else { r.mops() },
            pm_reads_per_op: Some(per(r.all.reads())),
            pm_writes_per_op: Some(per(r.all.writes())),
            remote_reads_per_op: Some(per(r.all.reads_remote)),
            remote_writes_per_op: Some(per(r.all.writes_remote)),
            remote_share: Some(r.all.remote_share()),
            flushes_per_op: Some(per(r.all.flushes)),
            fences_per_op: Some(per(r.all.fences)),
            seed: opts.seed,
            counters,
            ..Default::default()
        });
    }
    // Reference rows: the other targets asked for, through the benchmark runner on W1.
    let refs = references(targets, &["fastfair"]);
    let mut ref_runs = Vec::new();
    if !refs.is_empty() {
        let config = w1_config(opts, ops);
        let workload = crate::presets::by_name("f3tree-w1")?;
        let r = run_workloads(&config, std::slice::from_ref(&workload), &refs, progress)?;
        ref_runs = r.runs.clone();
        report.runs.extend(r.runs);
        report.failures.extend(r.failures);
    }
    let mut md = String::new();
    header(
        &mut md,
        "f3tree-numa",
        opts,
        &format!(
            "W1 (write only, {ops} fresh 8-byte keys into an empty tree, random or sequential), \
             {THREADS} threads filling {nodes} emulated nodes consecutively ({} per node); \
             Fig. 9's sweep: {} per node on 1..{SWEEP_NODES} of {SWEEP_NODES} nodes",
            headline.per_node, SWEEP_PER_NODE
        ),
    );
    md.push_str(
        "## The paper's claim\n\n\
         papers/f3tree.txt §5.3.1, Figs. 8-9: with PTFOs in the writer's node and per-node \
         evaluate threads checkpointing only their node's PTFOs, F3-tree(N) has 50% fewer \
         remote memory accesses than F3-tree(NI) — PTFOs local too, but two evaluate threads \
         in total, pinned to the first node, serving every PTFO — and writes faster than F&F \
         (Fig. 8: 1.3x F3-tree, 5x F&F on 40 cores). Fig. 9 reports the *share* of remote \
         accesses as threads fill 1..4 nodes; N2 is F3-tree(N) with two evaluate threads in \
         total. The paper evaluates key by key (F3-K) throughout §5.3.1.\n\n\
         ## Our measurement\n\n\
         Rows (\"(N)\" = NUMA-aware; F3-K / F3-N = key-based / node-batched evaluation): \
         `f3tree` F3-tree(N), two pinned evaluators per node serving their node's PTFOs; \
         `f3tree-n2` the same with two evaluators in total (on nodes 0 and 1; a node without \
         one is served by evaluator `node % 2`); `f3tree-ni` F3-tree(NI); `f3tree-nonuma` our \
         F3-tree(I): FOs and tree nodes interleaved, two unpinned evaluators per node serving \
         any PTFO (the paper's (I) has two in total on the first node); `f3tree-batched` \
         F3-tree(N) with F3-N. W1's write is `upsert`, a blind write like the paper's insert \
         (rows marked `insert` use insert-if-absent). Keys are random (Fig. 8b) unless marked \
         `sequential`: keys 1..n, each thread an ascending contiguous range, how the F&F and \
         F3-tree prototypes split their sorted input (Fig. 8a); the paper does not say which \
         distribution Fig. 9 counted. \
         Lines are counted from the first write until the evaluate threads have checkpointed \
         every entry (accounting on throughout), for every thread, per W1 operation; an \
         evaluator's tree write is counted like one FAST&FAIR operation. Throughput comes from \
         separate runs of each row on fresh stores with accounting off (counting costs per \
         line), the median of several, in this same invocation. *Producers* is throughput until the last write \
         returned, *drained* until the tree holds every key.\n\n\
         | engine | paper | op | Mops/s producers | Mops/s drained | PM lines/op | remote \
         lines/op | remote read / written | remote share |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} / {:.2} | {:.0}% |",
            r.name,
            paper_label(&r.name),
            r.w1.label(),
            r.mops(),
            r.ops as f64 / r.drained_secs.max(1e-9) / 1e6,
            r.lines_per_op(),
            r.remote_per_op(),
            r.all.reads_remote as f64 / r.ops.max(1) as f64,
            r.all.writes_remote as f64 / r.ops.max(1) as f64,
            r.all.remote_share() * 100.0,
        );
    }
    for run in &ref_runs {
        let _ = writeln!(
            md,
            "| {} (runner, W1 reference) | | upsert | {:.3} | - | {:.2} | {:.2} | {:.2} / {:.2} \
             | {:.0}% |",
            run.engine,
            run.throughput_mops,
            figure(run.pm_reads_per_op) + figure(run.pm_writes_per_op),
            figure(run.remote_reads_per_op) + figure(run.remote_writes_per_op),
            figure(run.remote_reads_per_op),
            figure(run.remote_writes_per_op),
            figure(run.remote_share) * 100.0
        );
    }
    md.push_str(
        "\n### Where the lines go (F3-tree phases, lines per W1 operation, local / remote)\n\n\
         | engine | op | producer tree lookup | producer PTFO writes | evaluator PTFO reads | \
         evaluator tree writes | leaf reuses |\n|---|---|---:|---:|---:|---:|---:|\n",
    );
    for r in rows.iter().filter(|r| r.name.starts_with("f3tree")) {
        let per = |x: u64| x as f64 / r.ops.max(1) as f64;
        let cells: Vec<String> =
            r.phases.iter().map(|&(l, rm)| format!("{:.2} / {:.2}", per(l), per(rm))).collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.1}% |",
            r.name,
            r.w1.label(),
            cells.join(" | "),
            r.leaf_reuses as f64 * 100.0 / r.ops.max(1) as f64
        );
    }
    sweep_section(&sweep, &mut md);
    let find = |n: &str, w1: W1| rows.iter().find(|r| r.name == n && r.w1 == w1);
    md.push_str("\n### Verdict: remote PM lines, F3-tree(N) vs the baselines (lines counted)\n\n");
    for (numa, base, op) in VERDICT_PAIRS {
        let (Some(a), Some(b)) = (find(numa, op), find(base, op)) else { continue };
        let (x, y) = (a.remote_per_op(), b.remote_per_op());
        let cut = if y > 0.0 { 1.0 - x / y } else { 0.0 };
        let _ = writeln!(
            md,
            "- {} ({}), `{numa}` vs `{base}`: {:.2} vs {:.2} remote lines/op ({}), remote share \
             {:.0}% vs {:.0}%: the paper's 50% cut is {}{}.",
            if op.keys == W1Keys::Random {
                "random keys"
            } else {
                "sequential keys, per-thread ranges"
            },
            op.label(),
            x,
            y,
            compare(x, y),
            a.all.remote_share() * 100.0,
            b.all.remote_share() * 100.0,
            verdict(cut),
            if cut <= 0.0 { why_fewer(b) } else { String::new() },
        );
    }
    for w1 in [W1::UPSERT, W1::UPSERT_SEQ] {
        let Some(f) = find("fastfair", w1) else { continue };
        for name in ["f3tree", "f3tree-n2", "f3tree-ni", "f3tree-nonuma", "f3tree-batched"] {
            if let Some(n) = find(name, w1) {
                let drained = |r: &W1Run| r.ops as f64 / r.drained_secs.max(1e-9);
                let _ = writeln!(
                    md,
                    "- Write throughput vs FAST&FAIR, same run ({}, {THREADS} threads), \
                     `{name}`: {:.2}x until the producers' last write, {:.2}x until every entry \
                     is in the tree.",
                    w1.label(),
                    n.mops() / f.mops().max(1e-12),
                    drained(n) / drained(f).max(1e-12)
                );
            }
        }
    }
    llc_section(&rows, &mut md);
    dram_section(&rows, &mut md);
    md.push_str(
        "\nWhat stays remote in F3-tree(N): the evaluate threads' writes into the one global \
         FAST&FAIR tree, whose nodes NSM places on the node of the evaluator that allocates \
         them (the paper does not change F&F's allocation either, §4.2), and, with `insert`, \
         the producers' lookups in that tree. With random keys every leaf is written for every \
         node's threads, so the tree phase is remote in proportion to the nodes in use. \
         F3-tree(NI) grows its whole tree from the first node: under line accounting its only \
         remote lines are its evaluators' reads of the other nodes' PTFOs, so it has *fewer* \
         remote lines than F3-tree(N) with random keys. With sequential per-thread ranges each \
         thread's leaves are split by its own node's evaluators in F3-tree(N), and the tree \
         phase becomes local as well.\n",
    );
    failures_md(&report, &mut md);
    Ok((md, report, Vec::new()))
}

/// Fig. 9's sweep: remote lines and share as workers fill 1..4 nodes.
fn sweep_section(sweep: &[W1Run], md: &mut String) {
    if sweep.is_empty() {
        return;
    }
    let names = ["f3tree", "f3tree-n2", "f3tree-ni"];
    let _ = write!(
        md,
        "\n### Fig. 9: remote share as workers fill the nodes (upsert, random keys, lines \
         counted, {SWEEP_PER_NODE} workers per node, {SWEEP_NODES}-node pool)\n\n\
         | nodes used | workers |"
    );
    for n in names {
        let _ = write!(md, " {} remote lines/op (share) |", paper_label(n));
    }
    md.push_str("\n|---:|---:|---:|---:|---:|\n");
    for k in 1..=SWEEP_NODES {
        let _ = write!(md, "| {k} | {} |", k * SWEEP_PER_NODE);
        for n in names {
            match sweep.iter().find(|r| r.name == n && r.shape.used_nodes() == k) {
                Some(r) => {
                    let _ = write!(
                        md,
                        " {:.2} ({:.0}%) |",
                        r.remote_per_op(),
                        r.all.remote_share() * 100.0
                    );
                }
                None => md.push_str(" - |"),
            }
        }
        md.push('\n');
    }
    if let (Some(a), Some(b)) = (
        sweep.iter().find(|r| r.name == "f3tree" && r.shape.used_nodes() == SWEEP_NODES),
        sweep.iter().find(|r| r.name == "f3tree-ni" && r.shape.used_nodes() == SWEEP_NODES),
    ) {
        let (x, y) = (a.remote_per_op(), b.remote_per_op());
        let cut = if y > 0.0 { 1.0 - x / y } else { 0.0 };
        let _ = writeln!(
            md,
            "\nOn all {SWEEP_NODES} nodes, random keys, vs NI: {:.2} vs {:.2} remote lines/op \
             ({}), share {:.0}% vs {:.0}% — {}{}.",
            x,
            y,
            compare(x, y),
            a.all.remote_share() * 100.0,
            b.all.remote_share() * 100.0,
            verdict(cut),
            if cut <= 0.0 { why_fewer(b) } else { String::new() },
        );
    }
}

/// What the counts leave out: the producers' and evaluators' shared DRAM state.
fn dram_section(rows: &[W1Run], md: &mut String) {
    let Some(r) = rows.iter().find(|r| r.name == "f3tree" && r.w1 == W1::UPSERT) else { return };
    let _ = writeln!(
        md,
        "\n### Not counted: shared DRAM state\n\n\
         The paper's PM is emulated on DRAM, so its counters see every memory access; ours \
         count PM lines only. F3-tree's DRAM state shared between threads is not in the \
         counts: per W1 write the producer takes the key's shard mutex of the pending-key \
         table (one line), probes and inserts into that shard's hash map (about two lines: \
         control bytes and the entry), and publishes the entry to its list's consumer (one line \
         with `head_used`/`produced`); its evaluator later takes the same shard mutex, probes \
         and removes the entry, and reads that list line — about 8 DRAM line accesses per \
         write. The shard lines are shared by every thread whatever its node (a random key's \
         shard was last touched by any node's thread), the list line by a producer and its \
         evaluator (the same node in F3-tree(N), the first node's evaluator for every list in \
         NI). Size: the table held {:.1} MiB of DRAM when the last producer returned in the \
         `f3tree` upsert run ({} keys written, engine DRAM as `stats().dram_bytes` reports it).",
        r.dram_bytes as f64 / (1 << 20) as f64,
        r.ops
    );
}

/// The figure's remote accesses counted as the modelled per-node caches ([`LLC_MODELS`]) count
/// them: what would leave a socket's cache, the paper's hardware-counter view.
fn llc_section(rows: &[W1Run], md: &mut String) {
    let Some(first) = rows.iter().find(|r| !r.llc.is_empty()) else { return };
    let shape = first.llc[0].0;
    let _ = write!(
        md,
        "\n### Through a modelled cache per node ({} MiB, {}-way: one socket of the paper's \
         machine)\n\n\
         The counted run's PM accesses, replayed in the order they happened through one LLC \
         per node with a directory (`numakv_pmem::cachemodel`): a miss is served by the home \
         node's memory or, when another node holds the line dirty, by that node's cache; a \
         flush writes a dirty line back to its home (`clflush` also drops it, as on the \
         paper's Ivy Bridge; `clwb` keeps it). Remote = memory reads and cache transfers from \
         the other node, and writebacks to it. DRAM (the pending-key table) is not modelled. \
         Per W1 operation:\n\n\
         | engine | op | flush | memory reads local / remote | remote transfers | \
         writebacks local / remote | remote accesses | remote share |\n\
         |---|---|---|---:|---:|---:|---:|---:|\n",
        shape.bytes_per_node >> 20,
        shape.ways
    );
    for r in rows {
        let per = |x: u64| x as f64 / r.ops.max(1) as f64;
        for (cfg, st) in &r.llc {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.2} / {:.2} | {:.2} | {:.2} / {:.2} | {:.2} | {:.0}% |",
                r.name,
                r.w1.label(),
                cfg.flush,
                per(st.memory_reads_local),
                per(st.memory_reads_remote),
                per(st.transfers_remote),
                per(st.writebacks_local),
                per(st.writebacks_remote),
                per(st.remote()),
                st.remote_share() * 100.0
            );
        }
    }
    md.push('\n');
    let find = |n: &str, w1: W1| rows.iter().find(|r| r.name == n && r.w1 == w1);
    for (numa, base, op) in VERDICT_PAIRS {
        let (Some(a), Some(b)) = (find(numa, op), find(base, op)) else { continue };
        for ((cfg, x), (_, y)) in a.llc.iter().zip(&b.llc) {
            let (sx, sy) = (x.remote_share(), y.remote_share());
            let (x, y) = (x.remote() as f64 / a.ops as f64, y.remote() as f64 / b.ops as f64);
            let cut = if y > 0.0 { 1.0 - x / y } else { 0.0 };
            let _ = writeln!(
                md,
                "- `{numa}` vs `{base}` ({}, {}): {x:.2} vs {y:.2} remote accesses/op ({}), \
                 share {:.0}% vs {:.0}%: the paper's 50% cut is {}.",
                op.label(),
                cfg.flush,
                compare(x, y),
                sx * 100.0,
                sy * 100.0,
                verdict(cut),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// f3tree-read
// ---------------------------------------------------------------------------------------------

fn key_of(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % (u64::MAX - 2) + 1
}

fn store_options(nodes: usize, opts: &ReproOptions, keys: u64) -> Options {
    let cap = (keys * 512 + (128 << 20)).div_ceil(256 << 10) * (256 << 10);
    Options::default().nodes(nodes).capacity_per_node(cap).mode(opts.persist)
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
/// A figure row: (name, engine, settings).
type Row = (&'static str, EngineKind, Settings);

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
    let variants: [Row; 4] = [
        ("fastfair", EngineKind::FastFair, &[]),
        ("f3tree", EngineKind::F3Tree, &[]),
        ("f3tree-nohash", EngineKind::F3Tree, &[("hash_lookups", "false")]),
        ("f3tree-batched", EngineKind::F3Tree, &[("evaluation", "batched:1024")]),
    ];
    let mut rows = Vec::new();
    let own: &[Row] = if wants_f3(targets) { &variants } else { &[] };
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
        let store =
            Store::create(&path, kind, store_options(nodes, opts, keys).engine(eopts.clone()))
                .map_err(store_err(name))?;
        let (store, pending) = if kind == EngineKind::F3Tree {
            // 80% of the keys into the tree: insert, close (which drains the PTFOs) ...
            insert_range(store.index(), 0, in_tree, nodes)?;
            store.close().map_err(store_err(name))?;
            // ... then a session whose evaluators never trigger keeps the last 20% in PTFOs.
            let mut held = eopts.clone();
            held.set("count_threshold", &u64::MAX.to_string()).map_err(store_err(name))?;
            held.set("time_threshold_us", "3600000000").map_err(store_err(name))?;
            let store = Store::open_with(&path, &store_options(nodes, opts, keys).engine(held))
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
