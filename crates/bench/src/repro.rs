//! `numakv repro`: scaled-down reproductions of the papers' tables and figures, each written as
//! a Markdown report with the paper's claim (quoted, with its numbers) beside our measurement,
//! plus the raw results as JSON (and a plot where the paper has a figure).
//!
//! - `pm-lines`: papers/nbtree.txt Table I — PM line reads, writes and flushes per insert,
//!   update, delete and search, for every engine.
//! - `space`: bytes per key after a load (papers/nobtree.txt Table I, papers/nbtree.txt
//!   Table IV).
//! - `nobtree-remote`, `nobtree-migration`: papers/nobtree.txt Fig. 9 and §III-D (in
//!   `repro_nobtree.rs`).
//! - `recovery`: time to reopen after a crash versus key count (papers/nbtree.txt §VI-C,
//!   papers/nstore.txt §V-G, papers/nap.txt §6.7 Table 2).
//! - `nstore-raf`, `nstore-recovery`, `nstore-gc`: NStore's cache, recovery and GC figures
//!   (papers/nstore.txt Figs. 10–11, 16, 15), in [`crate::repro_nstore`].
//! - `nbtree-factors`: NBTree's factor analysis (papers/nbtree.txt §VI-E, Figs. 13–14) —
//!   NBTree vs NBTree-W vs NBTree-WR vs coupled leaves (and FAST&FAIR) side by side.
//! - `value-size`: the byte-string layer's scans and recovery versus value size
//!   (papers/nstore.txt Figs. 9(b), 16), in [`crate::repro_bytes`].
//! - `redis`: `redis-benchmark` SET/GET against `numakv serve` (fastfair, nbtree, nstore) and
//!   `redis-server`, in one run (issue 23; papers/nbtree.txt §VI-I), in [`crate::repro_redis`].
//! - `nbtree-alloc`: NBTree's allocators (papers/nbtree.txt §VI-F, Fig. 15) — Calloc vs the
//!   naive bump allocator vs the page heap, inserts and inserts + deletes, side by side.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use numakv_pmem::PersistMode;

use crate::dist::Dist;
use crate::error::{BenchError, Result};
use crate::plot::{lines_svg, Series};
use crate::report::figure;
use crate::report::{write_file, Report};
use crate::runner::{run_workloads, BenchConfig, Progress};
use crate::target::Target;
use crate::workload::{Mix, OpKind, Workload};

/// A reproduction's name and what it reproduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReproInfo {
    /// The name `numakv repro` takes.
    pub name: &'static str,
    /// What it measures.
    pub title: &'static str,
    /// The paper's table or figure.
    pub source: &'static str,
}

/// Every reproduction, in listing order.
pub const REPROS: &[ReproInfo] = &[
    ReproInfo {
        name: "pm-lines",
        title: "PM line reads, writes and flushes per insert / update / delete / search",
        source: "papers/nbtree.txt §II-B Table I",
    },
    ReproInfo {
        name: "space",
        title: "PM and DRAM bytes per key after a load",
        source: "papers/nobtree.txt §V-F Table I; papers/nbtree.txt §VI-C Table IV",
    },
    ReproInfo {
        name: "nobtree-remote",
        title:
            "remote PM line reads per operation, nobtree beside fastfair (read-only, write-heavy)",
        source: "papers/nobtree.txt §V-C Fig. 9",
    },
    ReproInfo {
        name: "nobtree-migration",
        title: "per-thread hot keys on remote leaves: remote share and throughput over time",
        source: "papers/nobtree.txt §III-D",
    },
    ReproInfo {
        name: "nstore-raf",
        title: "NStore get100 at Zipfian 0.99 with Optane latencies: RAF vs plain LFU vs no cache",
        source: "papers/nstore.txt §V-C/D/F Figs. 10-11",
    },
    ReproInfo {
        name: "nstore-recovery",
        title: "NStore recovery time by key count and recovery threads",
        source: "papers/nstore.txt §V-G Fig. 16",
    },
    ReproInfo {
        name: "nstore-gc",
        title: "NStore PM space and write throughput after updating 75% of keys, by gc_threshold",
        source: "papers/nstore.txt §V-F Fig. 15(a)",
    },
    ReproInfo {
        name: "nbtree-factors",
        title: "NBTree's design factors: lock-free writes and reads, decoupled leaves",
        source: "papers/nbtree.txt §VI-E Figs. 13-14",
    },
    ReproInfo {
        name: "nbtree-alloc",
        title: "NBTree over Calloc vs the naive allocator vs the page heap (inserts; inserts + deletes)",
        source: "papers/nbtree.txt §VI-F Fig. 15",
    },
    ReproInfo {
        name: "f3tree-numa",
        title: "F3-tree(N) vs its non-NUMA variant: remote PM accesses and write throughput (W1)",
        source: "papers/f3tree.txt §5.2.2 Figs. 8-9",
    },
    ReproInfo {
        name: "f3tree-read",
        title: "F3-tree reads with 20% of the keys still in PTFOs: hash table vs none vs FAST&FAIR",
        source: "papers/f3tree.txt §5.3.2 Fig. 10",
    },
    ReproInfo {
        name: "f3tree-folimit",
        title: "F3-tree write throughput versus the FO limit (100 / 500 / 1000 / unlimited)",
        source: "papers/f3tree.txt §5.2.1 Fig. 6",
    },
    ReproInfo {
        name: "nap-remote",
        title: "remote PM accesses and throughput, nap-fastfair beside fastfair (write-intensive); Nap's memory",
        source: "papers/nap.txt §6.2 Fig. 13, §6.7 Table 1",
    },
    ReproInfo {
        name: "nap-shift",
        title: "throughput per 10 ms across a hotspot change: three-phase vs global-lock switch",
        source: "papers/nap.txt §6.5 Fig. 15",
    },
    ReproInfo {
        name: "value-size",
        title: "byte-string layer: scan throughput and crash recovery versus value size (nstore, fastfair)",
        source: "papers/nstore.txt §V-H Fig. 9(b), §V-G Fig. 16",
    },
    ReproInfo {
        name: "redis",
        title: "redis-benchmark SET/GET -P 16: numakv serve (crash-persistent) vs redis-server (persistence off)",
        source: "issue 23; papers/nbtree.txt §VI-I (the trees inside Redis)",
    },
    ReproInfo {
        name: "fastfair-original",
        title: "the original FAST_FAIR's benchmark: insert half the keys, search them, insert the rest (Mops/s)",
        source: "DICL/FAST_FAIR concurrent/src/test.cpp (issue 40)",
    },
    ReproInfo {
        name: "recovery",
        title: "recovery time after a crash versus key count",
        source:
            "papers/nbtree.txt §VI-C; papers/nstore.txt §V-G Fig. 16; papers/nap.txt §6.7 Table 2",
    },
];

/// The reproductions (for `numakv repro list`).
pub fn list() -> &'static [ReproInfo] {
    REPROS
}

/// Knobs shared by the reproductions.
#[derive(Clone, Debug, PartialEq)]
pub struct ReproOptions {
    /// Where `NAME.md`, `NAME.json` (and plots) go.
    pub out_dir: PathBuf,
    /// Multiplies the default sizes (1.0: a run of seconds per engine on a laptop).
    pub scale: f64,
    /// NUMA nodes for `space` and `recovery` (`pm-lines` runs on one node, as Table I counts
    /// accesses regardless of placement).
    pub nodes: usize,
    /// Persistence mode.
    pub persist: PersistMode,
    /// Seed.
    pub seed: u64,
    /// No progress bars.
    pub quiet: bool,
    /// Where stores are created (default: [`crate::default_scratch`]).
    pub scratch: Option<PathBuf>,
    /// Worker threads of `nbtree-factors` (default 2; the paper's Figs. 13–14 ran 56): its
    /// factors are about contention, which grows with the thread count.
    pub threads: Option<usize>,
    /// `redis`: the servers and `redis-benchmark`'s knobs.
    pub redis: crate::repro_redis::RedisOptions,
    /// `fastfair-original`: the original's key file (`-i`), one integer per line; `None`:
    /// random keys from the seed.
    pub key_file: Option<PathBuf>,
}

impl Default for ReproOptions {
    fn default() -> ReproOptions {
        ReproOptions {
            out_dir: PathBuf::from("repro"),
            scale: 1.0,
            nodes: 2,
            persist: PersistMode::Adr,
            seed: 42,
            quiet: false,
            scratch: None,
            threads: None,
            redis: crate::repro_redis::RedisOptions::default(),
            key_file: None,
        }
    }
}

/// What a reproduction produced.
#[derive(Clone, Debug)]
pub struct ReproOutput {
    /// The reproduction.
    pub name: String,
    /// The Markdown report (also written to `out_dir/NAME.md`).
    pub markdown: String,
    /// The raw runs (also written to `out_dir/NAME.json`).
    pub report: Report,
    /// Every file written.
    pub files: Vec<PathBuf>,
}

/// Runs the reproduction `name` on `targets` and writes its files to `opts.out_dir`.
///
/// # Errors
///
/// [`BenchError::UnknownRepro`], a bad option ([`BenchError::Config`]), or a write failure.
/// Runs that fail appear in the report's failures and the Markdown.
pub fn run(
    name: &str,
    targets: &[Arc<dyn Target>],
    opts: &ReproOptions,
    progress: Progress,
) -> Result<ReproOutput> {
    if !(opts.scale > 0.0 && opts.scale.is_finite()) {
        return Err(BenchError::Config(format!("repro scale {} must be positive", opts.scale)));
    }
    let name = name.trim().to_ascii_lowercase();
    let (markdown, report, mut files) = match name.as_str() {
        "pm-lines" => pm_lines(targets, opts, progress)?,
        "space" => space(targets, opts, progress)?,
        "recovery" => recovery(targets, opts, progress)?,
        "nobtree-remote" => crate::repro_nobtree::remote(targets, opts, progress)?,
        "nobtree-migration" => crate::repro_nobtree::migration(opts)?,
        "nstore-raf" => crate::repro_nstore::raf(targets, opts, progress)?,
        "nstore-recovery" => crate::repro_nstore::recovery(targets, opts, progress)?,
        "nstore-gc" => crate::repro_nstore::gc(targets, opts, progress)?,
        "nbtree-factors" => nbtree_factors(targets, opts, progress)?,
        "nbtree-alloc" => nbtree_alloc(targets, opts, progress)?,
        "f3tree-numa" => crate::repro_f3tree::numa(targets, opts, progress)?,
        "f3tree-read" => crate::repro_f3tree::read(targets, opts, progress)?,
        "f3tree-folimit" => crate::repro_f3tree::fo_limit(targets, opts, progress)?,
        "nap-remote" => crate::repro_nap::remote(targets, opts, progress)?,
        "nap-shift" => crate::repro_nap::shift(opts)?,
        "value-size" => crate::repro_bytes::value_size(targets, opts, progress)?,
        "redis" => crate::repro_redis::redis(opts)?,
        "fastfair-original" => crate::repro_fastfair::original(targets, opts, progress)?,
        _ => {
            return Err(BenchError::UnknownRepro {
                name,
                available: REPROS.iter().map(|r| r.name).collect::<Vec<_>>().join(", "),
            })
        }
    };
    let md = opts.out_dir.join(format!("{name}.md"));
    write_file(&md, &markdown)?;
    let json = opts.out_dir.join(format!("{name}.json"));
    report.write_json(&json)?;
    files.insert(0, json);
    files.insert(0, md);
    Ok(ReproOutput { name, markdown, report, files })
}

pub(crate) fn scaled(base: u64, scale: f64, min: u64) -> u64 {
    ((base as f64 * scale) as u64).max(min)
}

pub(crate) fn base_config(opts: &ReproOptions) -> BenchConfig {
    BenchConfig {
        threads: vec![1],
        nodes: opts.nodes,
        persist: opts.persist,
        seed: opts.seed,
        warmup: 0.0,
        latency_sample: 1,
        accounting: true,
        quiet: opts.quiet,
        scratch: opts.scratch.clone(),
        ..BenchConfig::default()
    }
}

pub(crate) fn failures_md(report: &Report, md: &mut String) {
    if report.failures.is_empty() {
        return;
    }
    md.push_str("\n### Failed runs\n\n");
    for f in &report.failures {
        let _ = writeln!(md, "- `{}` {} (t={}): {}", f.engine, f.workload, f.threads, f.error);
    }
}

pub(crate) fn header(md: &mut String, name: &str, opts: &ReproOptions, setup: &str) {
    let info = REPROS.iter().find(|r| r.name == name);
    let _ = writeln!(md, "# `numakv repro {name}`: {}\n", info.map_or("", |i| i.title));
    let _ = writeln!(md, "Reproduces {}.\n", info.map_or("", |i| i.source));
    let _ = writeln!(
        md,
        "Setup: {setup}; persistence mode {}, seed {}, scale {}. PM accesses are counted by \
         numakv's accounting layer (distinct 64-byte lines per operation), not by hardware \
         counters.\n",
        opts.persist, opts.seed, opts.scale
    );
}

// ---------------------------------------------------------------------------------------------
// pm-lines
// ---------------------------------------------------------------------------------------------

/// One row of papers/nbtree.txt Table I: flushes and line writes for insert/delete/update, and
/// line reads (of a search).
struct TableIRow {
    tree: &'static str,
    flush: [&'static str; 3],
    write: [&'static str; 3],
    read: &'static str,
}

const TABLE_I: &[TableIRow] = &[
    TableIRow { tree: "NVTree", flush: ["2", "2", "2"], write: ["2", "2", "2"], read: "O(n)" },
    TableIRow {
        tree: "WB+Tree",
        flush: ["4", "3", "3"],
        write: ["3", "2", "2"],
        read: "O(log(n))",
    },
    TableIRow { tree: "FPTree", flush: ["3", "1", "3"], write: ["3", "1", "3"], read: "3" },
    TableIRow { tree: "RNTree", flush: ["2", "1", "2"], write: ["3", "1", "3"], read: "O(log(n))" },
    TableIRow {
        tree: "BzTree",
        flush: ["15", "7", "10"],
        write: ["11", "6", "7"],
        read: "O(log(n))",
    },
    TableIRow {
        tree: "FAST&FAIR",
        flush: ["O(n)", "O(n)", "1"],
        write: ["O(n)", "O(n)", "1"],
        read: "O(n)",
    },
    TableIRow { tree: "uTree", flush: ["2", "1", "1"], write: ["2", "2", "1"], read: "2" },
    TableIRow { tree: "NBTree", flush: ["1", "1", "1"], write: ["1", "1", "1"], read: "1" },
];

/// The Table I row an engine corresponds to, if any.
fn table_i_row(engine: &str) -> Option<&'static TableIRow> {
    let tree = if engine.starts_with("fastfair") {
        "FAST&FAIR"
    } else if engine.starts_with("nbtree") {
        "NBTree"
    } else {
        return None;
    };
    TABLE_I.iter().find(|r| r.tree == tree)
}

/// The paper's figures for `engine` doing `op` as "flush / write / read".
fn table_i_claim(engine: &str, op: &str) -> String {
    let Some(row) = table_i_row(engine) else {
        return "— (not in Table I)".into();
    };
    let col = match op {
        "insert" => 0,
        "delete" => 1,
        "update" => 2,
        _ => return format!("{}: read {}", row.tree, row.read),
    };
    format!("{}: flush {}, write {}", row.tree, row.flush[col], row.write[col])
}

const PM_OPS: [(&str, OpKind); 4] = [
    ("insert", OpKind::Insert),
    ("update", OpKind::Update),
    ("delete", OpKind::Remove),
    ("search", OpKind::Get),
];

fn pm_lines(
    targets: &[Arc<dyn Target>],
    opts: &ReproOptions,
    progress: Progress,
) -> Result<(String, Report, Vec<PathBuf>)> {
    let keys = scaled(20_000, opts.scale, 100);
    let ops = scaled(2_000, opts.scale, 100).min(keys);
    let config = BenchConfig { keys: Some(keys), ops: Some(ops), nodes: 1, ..base_config(opts) };
    let workloads: Vec<Workload> = PM_OPS
        .iter()
        .map(|&(name, kind)| {
            // Deletes walk the loaded keys so each key is removed once; the rest draw uniformly.
            let dist = if kind == OpKind::Remove { Dist::Sequential } else { Dist::Uniform };
            Workload::new(format!("pm-{name}"), Mix::only(kind)).with_dist(dist)
        })
        .collect();
    let report = run_workloads(&config, &workloads, targets, progress)?;

    let mut md = String::new();
    header(
        &mut md,
        "pm-lines",
        opts,
        &format!("{keys} keys loaded, then {ops} operations of each kind on a fresh store, 1 thread, 1 node"),
    );
    md.push_str(
        "## The paper's claim\n\n\
         papers/nbtree.txt §II-B, Table I, \"PM overhead produced when accessing B⁺-Tree's leaf \
         nodes\" (a/b/c = insert/delete/update; *n* = key-value pairs in the leaf node):\n\n\
         | tree | flush | PM line write | PM line read |\n|---|---|---|---|\n",
    );
    for r in TABLE_I {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            r.tree,
            r.flush.join("/"),
            r.write.join("/"),
            r.read
        );
    }
    md.push_str(
        "\n> \"Table I shows that the base operations in the state-of-the-art persistent B⁺-Trees \
         produce considerable PM line read/writes when accessing the leaf nodes.\" NBTree: 1 \
         flush, 1 line write per insert/delete/update and 1 line read per search.\n\n",
    );
    md.push_str(
        "## Our measurement\n\n\
         Per operation, averaged over the run. **all**: every PM line the operation touched \
         (inner nodes, logs and allocator metadata included). **SMO**: the part of *all* \
         touched inside the engine's structural modifications — splits or leaf copies and the \
         allocator work they do — as the engine marks them (`account::smo_scope`), measured by \
         the same counters, amortised over all operations of the run. **op**: all − SMO, the \
         individual operation's own access — what Table I counts (\"PM overhead produced when \
         accessing B⁺-Tree's leaf nodes\", with FAST&FAIR's insert as O(n), i.e. no split). \
         An engine that marks no SMO (0 in the SMO columns) keeps its split cost in *op*. \
         DRAM peers touch no PM.\n\n\
         | engine | op | reads: all | reads: SMO | reads: op | writes: all | writes: SMO | \
         writes: op | flushes: all | flushes: SMO | flushes: op | fences | remote share | \
         paper (Table I) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for t in targets {
        for &(op, _) in &PM_OPS {
            let w = format!("pm-{op}");
            let Some(r) = report.runs.iter().find(|r| r.engine == t.name() && r.workload == w)
            else {
                continue;
            };
            let _ = writeln!(
                md,
                "| {} | {op} | {:.2} | {:.2} | **{:.2}** | {:.2} | {:.2} | **{:.2}** | {:.2} | \
                 {:.2} | **{:.2}** | {:.2} | {:.0}% | {} |",
                r.engine,
                figure(r.pm_reads_per_op),
                figure(r.smo_reads_per_op),
                figure(r.pm_reads_per_op) - figure(r.smo_reads_per_op),
                figure(r.pm_writes_per_op),
                figure(r.smo_writes_per_op),
                figure(r.pm_writes_per_op) - figure(r.smo_writes_per_op),
                figure(r.flushes_per_op),
                figure(r.smo_flushes_per_op),
                figure(r.flushes_per_op) - figure(r.smo_flushes_per_op),
                figure(r.fences_per_op),
                figure(r.remote_share) * 100.0,
                table_i_claim(&r.engine, op)
            );
        }
    }
    failures_md(&report, &mut md);
    Ok((md, report, Vec::new()))
}

// ---------------------------------------------------------------------------------------------
// space
// ---------------------------------------------------------------------------------------------

pub(crate) fn load_only(name: &str) -> Workload {
    Workload::new(name, Mix::only(OpKind::Get)).with_dist(Dist::Uniform)
}

/// Load `keys` keys (2 loader threads), run nothing, then time a clean reopen and a recovery
/// after a simulated crash: the configuration of the recovery reproductions.
pub(crate) fn recovery_config(opts: &ReproOptions, keys: u64) -> BenchConfig {
    BenchConfig {
        keys: Some(keys),
        ops: Some(0),
        reopen: true,
        crash: true,
        load_threads: Some(2),
        ..base_config(opts)
    }
}

fn per_key(bytes: u64, keys: u64) -> f64 {
    if keys == 0 {
        0.0
    } else {
        bytes as f64 / keys as f64
    }
}

fn space(
    targets: &[Arc<dyn Target>],
    opts: &ReproOptions,
    progress: Progress,
) -> Result<(String, Report, Vec<PathBuf>)> {
    let keys = scaled(100_000, opts.scale, 1_000);
    let config = BenchConfig { keys: Some(keys), ops: Some(0), ..base_config(opts) };
    let report = run_workloads(&config, &[load_only("space")], targets, progress)?;

    let mut md = String::new();
    header(
        &mut md,
        "space",
        opts,
        &format!(
            "{keys} random 8-byte keys with 8-byte values loaded by 1 thread, {} nodes",
            opts.nodes
        ),
    );
    md.push_str(
        "## The papers' claims\n\n\
         papers/nobtree.txt §V-F, Table I, \"Comparison of NVM consumption (GB)\" \"after loading \
         200 million records with 8-byte keys and values\":\n\n\
         | | NOBtree | TLBtree | Fast&Fair | PACTree | ROART |\n|---|---:|---:|---:|---:|---:|\n\
         | GB | 6.29 | 5.78 | 5.12 | 6.32 | 25.03 |\n\
         | bytes/key (GB = 10⁹ B) | 31.5 | 28.9 | 25.6 | 31.6 | 125.2 |\n\n\
         > \"Fast&Fair demonstrates the lowest-NVM consumption, mainly attributed to its larger \
         node size. NOBtree consumes more NVM spaces than TLBtree\" (smaller nodes carrying \
         migration statistics, and the upper layer replicated per node, \"only about 34 MB\").\n\n\
         papers/nbtree.txt §VI-C, Table IV: at 100 M key-values NBTree holds 2227 MB of leaf \
         key-values in PM (22.3 B/key) and 226 + 55 MB of leaf metadata and inner nodes in DRAM \
         (2.8 B/key): \"the ratio of DRAM and PM consumption in NBTree is around 1:8\".\n\n",
    );
    md.push_str(
        "## Our measurement\n\n\
         PM bytes are what the engine holds from its pool (`EngineStats::pm_bytes_per_node`); \
         DRAM bytes are the engine's estimate of its volatile structures. A key-value pair is 16 \
         bytes of payload.\n\n\
         | engine | keys | PM bytes | PM B/key | DRAM B/key | PM per node | load (s) |\n\
         |---|---:|---:|---:|---:|---|---:|\n",
    );
    for r in &report.runs {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.1} | {:.1} | {} | {:.2} |",
            r.engine,
            r.keys,
            r.pm_bytes,
            per_key(r.pm_bytes, r.keys),
            per_key(r.dram_bytes, r.keys),
            r.pm_bytes_per_node.iter().map(u64::to_string).collect::<Vec<_>>().join(" / "),
            r.load_seconds
        );
    }
    failures_md(&report, &mut md);
    Ok((md, report, Vec::new()))
}

// ---------------------------------------------------------------------------------------------
// recovery
// ---------------------------------------------------------------------------------------------

fn recovery(
    targets: &[Arc<dyn Target>],
    opts: &ReproOptions,
    progress: Progress,
) -> Result<(String, Report, Vec<PathBuf>)> {
    let top = scaled(100_000, opts.scale, 4_000);
    let counts = [top / 4, top / 2, top];
    let mut report = Report::default();
    for &keys in &counts {
        let config = recovery_config(opts, keys);
        let r = run_workloads(&config, &[load_only("recovery")], targets, progress)?;
        report.runs.extend(r.runs);
        report.failures.extend(r.failures);
    }

    let mut md = String::new();
    header(
        &mut md,
        "recovery",
        opts,
        &format!(
            "{} random keys loaded by 2 threads on {} nodes, then a clean close + open, then a \
             simulated crash + recovering open",
            counts.map(|c| c.to_string()).join(" / "),
            opts.nodes
        ),
    );
    md.push_str(
        "## The papers' claims\n\n\
         - papers/nbtree.txt §VI-C: \"Rebuilding NBTree from persistent leaf nodes with 16 million \
         key-value entries needs to take 0.32 s with a single thread ... comparable with ... \
         FPTree (0.16 s) and RNTree (0.34 s), and significantly outperforms uTree (7.25 s)\" \
         — 20 ns per key; FAST&FAIR and BzTree recover instantly.\n\
         - papers/nstore.txt §V-G: \"the recovery process with 32 threads takes only \
         1.2/2.4/5.3 seconds to rebuild the volatile index containing 50/100/150 million KV \
         pairs\"; at 100 M, \"reduced by 94% from 40.4 s with a single thread to 2.4 seconds\" \
         — 404 ns per key single-threaded, 24 ns per key with 32 threads.\n\
         - papers/nap.txt §6.7, Table 2 (recovery time, ms): CCEH 477, Clevel 522, P-CLHT 432, \
         P-Masstree 306, FAST_FAIR 963 — \"Due to the limited size of NAL, the recovery time is \
         bounded, which is less than one second.\"\n\n",
    );
    md.push_str(
        "## Our measurement\n\n\
         | engine | keys | clean reopen (ms) | crash recovery (ms) | recovery ns/key |\n\
         |---|---:|---:|---:|---:|\n",
    );
    let ms = |v: Option<f64>| v.map_or("n/a".to_owned(), |x| format!("{x:.2}"));
    let mut series: Vec<Series> = Vec::new();
    for t in targets {
        let mut pts = Vec::new();
        for r in report.runs.iter().filter(|r| r.engine == t.name()) {
            let ns_per_key = r
                .recover_ms
                .map_or("n/a".to_owned(), |m| format!("{:.0}", m * 1e6 / r.keys.max(1) as f64));
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                r.engine,
                r.keys,
                ms(r.reopen_ms),
                ms(r.recover_ms),
                ns_per_key
            );
            if let Some(m) = r.recover_ms {
                pts.push((r.keys as f64, m));
            }
        }
        if !pts.is_empty() {
            series.push((t.name(), pts));
        }
    }
    if targets.iter().any(|t| !t.persistent()) {
        md.push_str("\nDRAM peers lose their contents on a crash: n/a.\n");
    }
    let mut files = Vec::new();
    if !series.is_empty() {
        let svg = opts.out_dir.join("recovery.svg");
        lines_svg(
            &svg,
            "Recovery time after a crash vs keys",
            "keys loaded",
            "recovery time (ms)",
            &series,
        )?;
        md.push_str("\n![recovery time vs keys](recovery.svg)\n");
        files.push(svg);
    }
    failures_md(&report, &mut md);
    Ok((md, report, files))
}

// ---------------------------------------------------------------------------------------------
// nbtree-alloc
// ---------------------------------------------------------------------------------------------

/// The targets of `nbtree-alloc`, in report order (Calloc first: the ratios' base).
const ALLOC_TARGETS: [&str; 3] = ["nbtree", "nbtree-naive", "nbtree-pageheap"];

fn nbtree_alloc(
    targets: &[Arc<dyn Target>],
    opts: &ReproOptions,
    progress: Progress,
) -> Result<(String, Report, Vec<PathBuf>)> {
    // The three targets when the selection names any of them (`-e all` names all three), else
    // the selection as given (the first is the ratios' base).
    let mut chosen: Vec<Arc<dyn Target>> = ALLOC_TARGETS
        .iter()
        .filter_map(|n| targets.iter().find(|t| t.name() == *n).cloned())
        .collect();
    if chosen.is_empty() {
        chosen = targets.to_vec();
    }
    let keys = scaled(100_000, opts.scale, 1_000);
    let ops = scaled(200_000, opts.scale, 1_000);
    let threads = opts.threads.unwrap_or(FACTOR_THREADS).max(1);
    let config = BenchConfig {
        keys: Some(keys),
        ops: Some(ops),
        threads: vec![threads],
        nodes: 1,
        latency_sample: 16,
        // The allocators differ in the PM lines their metadata costs: emulate Optane's latency
        // per PM line, as the paper ran on Optane.
        latency: numakv_pmem::LatencyModel::OPTANE,
        ..base_config(opts)
    };
    // Fig. 15(a): inserts only (every ~30th splits a leaf: one allocation, one free); (b): half
    // inserts, half deletes (fewer SMOs, and compactions instead of splits).
    let insert = Workload::new("alloc-insert", Mix::only(OpKind::Insert)).with_dist(Dist::Uniform);
    let mixed =
        Workload::new("alloc-insert-delete", Mix::new(&[(OpKind::Insert, 1), (OpKind::Remove, 1)]))
            .with_dist(Dist::Uniform);
    let report = run_workloads(&config, &[insert, mixed], &chosen, progress)?;

    let mut md = String::new();
    header(
        &mut md,
        "nbtree-alloc",
        opts,
        &format!(
            "{keys} keys loaded, then {ops} operations by {threads} threads on 1 node, uniform \
             keys, Optane latency emulated per PM line; the three allocators side by side in \
             one run"
        ),
    );
    md.push_str(
        "## The paper's claims\n\n\
         papers/nbtree.txt §VI-F, Fig. 15: \"Calloc achieves up to 6.5× higher throughput than \
         PMDK, NValloc, nvm_alloc during insert operations\" (a); \"the performance gap ... \
         diminishes in the workload involving both insert and delete operations\" (b); \"the \
         naive allocator sets the performance ceiling ... Calloc achieves comparable performance \
         to the naive allocator\".\n\n\
         Here the general-purpose side is the pool's page heap (a 4 KiB page per block, its \
         persistent page descriptor written on every allocation and free), not PMDK, NVAlloc or \
         nvm_malloc.\n\n## Our measurement\n\n\
         | workload | allocator | Mops/s | vs the first | PM line writes/op | of which SMO | PM line reads/op |\n\
         |---|---|---:|---:|---:|---:|---:|\n",
    );
    let find =
        |engine: &str, w: &str| report.runs.iter().find(|r| r.engine == engine && r.workload == w);
    for w in ["alloc-insert", "alloc-insert-delete"] {
        let base = chosen
            .first()
            .and_then(|t| find(&t.name(), w))
            .map(|r| r.throughput_mops)
            .filter(|m| *m > 0.0);
        for t in &chosen {
            let name = t.name();
            if let Some(r) = find(&name, w) {
                let label = match name.as_str() {
                    "nbtree" => "calloc".to_owned(),
                    "nbtree-naive" => "naive".to_owned(),
                    "nbtree-pageheap" => "page heap".to_owned(),
                    other => other.to_owned(),
                };
                let ratio = base
                    .map_or_else(|| "-".to_owned(), |b| format!("{:.2}×", r.throughput_mops / b));
                let _ = writeln!(
                    md,
                    "| {w} | {label} | {:.3} | {ratio} | {:.2} | {:.2} | {:.2} |",
                    r.throughput_mops,
                    figure(r.pm_writes_per_op),
                    figure(r.smo_writes_per_op),
                    figure(r.pm_reads_per_op)
                );
            }
        }
    }
    md.push_str(
        "\nPM lines are counted by the substrate's accounting (every line the operation and its \
         share of SMOs touched, allocator metadata included); *of which SMO* is the part inside \
         the SMOs, where allocation and free happen.\n\n## Verdict\n\n",
    );
    let mops = |e: &str, w: &str| find(e, w).map(|r| r.throughput_mops).filter(|m| *m > 0.0);
    if let (Some(c), Some(p), Some(n)) = (
        mops("nbtree", "alloc-insert"),
        mops("nbtree-pageheap", "alloc-insert"),
        mops("nbtree-naive", "alloc-insert"),
    ) {
        let gap = c / p;
        let _ = writeln!(
            md,
            "- Fig. 15(a), Calloc vs a general-purpose allocator on inserts: {gap:.2}× ({}; the \
             paper: up to 6.5× over PMDK, NVAlloc and nvm_malloc, whose logging and bookkeeping \
             write far more PM per allocation than this page heap's one descriptor).",
            if gap >= 1.5 { "reproduced" } else { "not reproduced" }
        );
        let _ = writeln!(
            md,
            "- Calloc vs the naive ceiling on inserts: {:.2}× ({}).",
            c / n,
            if c / n >= 0.8 { "comparable, as the paper says" } else { "below the ceiling" }
        );
    }
    failures_md(&report, &mut md);
    Ok((md, report, Vec::new()))
}

// ---------------------------------------------------------------------------------------------
// nbtree-factors
// ---------------------------------------------------------------------------------------------

/// `nbtree-factors`' default worker threads (`--threads` sets others).
const FACTOR_THREADS: usize = 2;

/// Paired NBTree / NBTree-W rounds of `nbtree-factors` (odd: the median is one of them).
const FACTOR_ROUNDS: usize = 7;

/// The targets of `nbtree-factors`, in report order.
const FACTOR_TARGETS: [&str; 5] = ["nbtree", "nbtree-w", "nbtree-wr", "nbtree-coupled", "fastfair"];

fn nbtree_factors(
    targets: &[Arc<dyn Target>],
    opts: &ReproOptions,
    progress: Progress,
) -> Result<(String, Report, Vec<PathBuf>)> {
    // The five targets when the selection names any of them (`-e all` names all five), else
    // the selection as given.
    let mut chosen: Vec<Arc<dyn Target>> = FACTOR_TARGETS
        .iter()
        .filter_map(|n| targets.iter().find(|t| t.name() == *n).cloned())
        .collect();
    if chosen.is_empty() {
        chosen = targets.to_vec();
    }
    let keys = scaled(100_000, opts.scale, 1_000);
    let ops = scaled(400_000, opts.scale, 1_000);
    let threads = opts.threads.unwrap_or(FACTOR_THREADS).max(1);
    let config = BenchConfig {
        keys: Some(keys),
        ops: Some(ops),
        threads: vec![threads],
        nodes: 1,
        latency_sample: 16,
        // The factors are about PM accesses inside and outside critical sections: emulate
        // Optane's latency per PM line (papers/nstore.txt §II-A1), as the paper ran on Optane.
        latency: numakv_pmem::LatencyModel::OPTANE,
        ..base_config(opts)
    };
    // Fig. 14: zipfian 0.99, write-heavy (10% search, 90% upsert, mostly updates of hot keys).
    // Fig. 13: uniform inserts, where leaf metadata writes dominate.
    let upsert = crate::presets::by_name("nbtree-upsert:10:0.99")?;
    let upsert = Workload { name: "factors-upsert".into(), ..upsert };
    let insert =
        Workload::new("factors-insert", Mix::only(OpKind::Insert)).with_dist(Dist::Uniform);
    let mut report = run_workloads(&config, &[upsert.clone(), insert], &chosen, progress)?;
    // The lock-free factor at a few threads is a few percent, the size of the drift between
    // two runs on a shared machine: measure it again in paired rounds, alternating which of
    // the pair runs first, and quote the median of the per-round ratios.
    let pair: Vec<Arc<dyn Target>> = ["nbtree", "nbtree-w"]
        .iter()
        .filter_map(|n| chosen.iter().find(|t| t.name() == *n).cloned())
        .collect();
    let mut paired = Vec::new();
    if pair.len() == 2 {
        let rounds_config = BenchConfig { ops: Some((ops / 2).max(1_000)), ..config.clone() };
        for round in 0..FACTOR_ROUNDS {
            let order: Vec<_> =
                if round % 2 == 0 { pair.clone() } else { pair.iter().rev().cloned().collect() };
            let r = run_workloads(&rounds_config, std::slice::from_ref(&upsert), &order, progress)?;
            let mops = |n: &str| r.runs.iter().find(|x| x.engine == n).map(|x| x.throughput_mops);
            if let (Some(a), Some(b)) = (mops("nbtree"), mops("nbtree-w")) {
                if b > 0.0 {
                    paired.push(a / b);
                }
            }
            report.failures.extend(r.failures);
        }
    }

    let mut md = String::new();
    header(
        &mut md,
        "nbtree-factors",
        opts,
        &format!(
            "{keys} keys loaded, then {ops} operations by {threads} threads on 1 node: \
             `factors-upsert` = 10% search / 90% upsert, zipfian 0.99 (scrambled); \
             `factors-insert` = inserts of new keys, uniform; Optane latency emulated per PM \
             line"
        ),
    );
    md.push_str(
        "## The paper's claims\n\n\
         - Fig. 14 (56 threads, zipfian): \"NBTree achieves 5.5× higher throughput and 48.6× \
         lower tail latency than NBTree-W due to our lock-free write design ... NBTree-W achieves \
         up to 1.8× higher throughput and 47.9× lower tail latency than NBTree-WR in \
         read-intensive workloads.\"\n\
         - Fig. 13 (56 threads, uniform): \"decoupled leaf node design achieves 2.4× performance \
         improvement in the insert operations since the modifications of leaf metadata are \
         absorbed in DRAM ... still improves [UDS] throughput by up to 29% due to fewer PM line \
         reads.\"\n\n\
         A few threads show the direction of these factors, not their 56-thread magnitude: \
         contention on hot leaves grows with the thread count (`--threads N` runs N workers; \
         the default is 2).\n\n",
    );
    md.push_str(
        "## Our measurement\n\n\
         | workload | engine | Mops/s | p99 (µs) | PM line reads/op | PM line writes/op |\n\
         |---|---|---:|---:|---:|---:|\n",
    );
    let find =
        |engine: &str, w: &str| report.runs.iter().find(|r| r.engine == engine && r.workload == w);
    for w in ["factors-upsert", "factors-insert"] {
        for t in &chosen {
            if let Some(r) = find(&t.name(), w) {
                let _ = writeln!(
                    md,
                    "| {w} | {} | {:.3} | {:.1} | {:.2} | {:.2} |",
                    r.engine,
                    r.throughput_mops,
                    r.p99_ns as f64 / 1e3,
                    figure(r.pm_reads_per_op),
                    figure(r.pm_writes_per_op)
                );
            }
        }
    }
    md.push_str(
        "\n## Ratios (throughput)\n\n| workload | ratio | value | paper |\n|---|---|---:|---|\n",
    );
    let ratios: [(&str, &str, &str, &str); 5] = [
        ("factors-upsert", "nbtree", "nbtree-w", "5.5× (Fig. 14, 56 threads)"),
        ("factors-upsert", "nbtree-w", "nbtree-wr", "up to 1.8× (Fig. 14, read-intensive)"),
        ("factors-upsert", "nbtree", "fastfair", "6.0× at 50:50 (Fig. 9, 56 threads)"),
        ("factors-insert", "nbtree", "nbtree-coupled", "2.4× (Fig. 13, inserts)"),
        ("factors-upsert", "nbtree", "nbtree-coupled", "up to 1.29× (Fig. 13, UDS)"),
    ];
    for (w, a, b, paper) in ratios {
        if let (Some(x), Some(y)) = (find(a, w), find(b, w)) {
            if y.throughput_mops > 0.0 {
                let _ = writeln!(
                    md,
                    "| {w} | {a} / {b} | {:.2}× | {paper} |",
                    x.throughput_mops / y.throughput_mops
                );
            }
        }
    }
    if !paired.is_empty() {
        let mut sorted = paired.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let _ = writeln!(
            md,
            "\n## NBTree vs NBTree-W in paired rounds\n\n\
             `factors-upsert`, {} rounds of {} operations each, alternating which runs first; \
             per-round throughput ratio nbtree / nbtree-w: {}; median **{median:.2}×** (min \
             {:.2}×, max {:.2}×).",
            paired.len(),
            (ops / 2).max(1_000),
            paired.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", "),
            sorted[0],
            sorted[sorted.len() - 1],
        );
    }
    failures_md(&report, &mut md);
    Ok((md, report, Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_i_claims_map_engines_to_rows() {
        assert_eq!(table_i_claim("nbtree", "insert"), "NBTree: flush 1, write 1");
        assert_eq!(table_i_claim("fastfair", "delete"), "FAST&FAIR: flush O(n), write O(n)");
        assert_eq!(table_i_claim("fastfair", "update"), "FAST&FAIR: flush 1, write 1");
        assert_eq!(table_i_claim("nbtree", "search"), "NBTree: read 1");
        assert!(table_i_claim("scc-treeindex", "insert").contains("not in Table I"));
    }

    #[test]
    fn unknown_repro_is_refused() {
        let err = run("nope", &[], &ReproOptions::default(), Progress::Hidden).unwrap_err();
        assert!(matches!(err, BenchError::UnknownRepro { .. }));
        assert!(err.to_string().contains("pm-lines"));
    }
}
