//! Results: one [`RunResult`] per (engine, workload, threads), as a table, JSON and CSV.
//!
//! JSON is `{"runs":[{...}], "failures":[{...}]}` with the fields of [`RunResult`] in declaration
//! order; CSV has one header row with the same column names and one row per run
//! (`pm_bytes_per_node` joined with `;`). A figure the run did not measure (PM columns without
//! accounting, a reopen time not asked for) is `null` in JSON and `-` in the table and CSV,
//! never 0.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result};

/// The measurements of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Target name.
    pub engine: String,
    /// Workload name.
    pub workload: String,
    /// Worker threads in the measured phase.
    pub threads: usize,
    /// NUMA nodes (real or emulated).
    pub nodes: usize,
    /// `fill` or `interleave`.
    pub placement: String,
    /// `adr` or `eadr` (what the target was asked for; DRAM peers ignore it).
    pub persist: String,
    /// Latency model (`none`, `optane`).
    pub latency: String,
    /// Key distribution.
    pub dist: String,
    /// Keys loaded before the run.
    pub keys: u64,
    /// Operations measured (warm-up excluded).
    pub ops: u64,
    /// Wall time of the measured phase, seconds.
    pub seconds: f64,
    /// Operations per second, millions.
    pub throughput_mops: f64,
    /// Median latency of the sampled operations, ns.
    pub p50_ns: u64,
    /// 99th percentile, ns.
    pub p99_ns: u64,
    /// 99.9th percentile, ns.
    pub p999_ns: u64,
    /// Largest sampled latency, ns.
    pub max_ns: u64,
    /// Distinct PM lines read per operation (local + remote), background threads' lines of the
    /// counted phase included (amortised over its operations). This and the other PM figures
    /// are `None` (JSON `null`, table and CSV `-`) when the run did not measure them: line counts
    /// need accounting or latency emulation, flush and fence counts need accounting.
    pub pm_reads_per_op: Option<f64>,
    /// Distinct PM lines written per operation (local + remote).
    pub pm_writes_per_op: Option<f64>,
    /// PM lines read on another node per operation.
    pub remote_reads_per_op: Option<f64>,
    /// PM lines written on another node per operation.
    pub remote_writes_per_op: Option<f64>,
    /// Share of PM line accesses that were remote, 0..1.
    pub remote_share: Option<f64>,
    /// Cache-line flushes per operation.
    pub flushes_per_op: Option<f64>,
    /// Fences per operation.
    pub fences_per_op: Option<f64>,
    /// Of `pm_reads_per_op`, lines read inside structural modifications (splits, copies and the
    /// allocator work they do), as the engine marks them (`numakv_pmem::account::smo_scope`).
    #[serde(default)]
    pub smo_reads_per_op: Option<f64>,
    /// Of `pm_writes_per_op`, lines written inside structural modifications.
    #[serde(default)]
    pub smo_writes_per_op: Option<f64>,
    /// Of `flushes_per_op`, flushes issued inside structural modifications.
    #[serde(default)]
    pub smo_flushes_per_op: Option<f64>,
    /// Of `pm_reads_per_op`, the lines the benchmark's worker threads read themselves (the
    /// rest is background threads' work: evaluation, GC, migration, switches).
    #[serde(default)]
    pub fg_pm_reads_per_op: Option<f64>,
    /// Of `pm_writes_per_op`, the lines the worker threads wrote themselves.
    #[serde(default)]
    pub fg_pm_writes_per_op: Option<f64>,
    /// Of `flushes_per_op`, the flushes the worker threads issued themselves.
    #[serde(default)]
    pub fg_flushes_per_op: Option<f64>,
    /// Share of the counted PM line accesses (reads and writes) done by background threads
    /// (or by the runner's wait for them), 0..1.
    #[serde(default)]
    pub bg_share: Option<f64>,
    /// Background work still pending when the counted phase closed (it was not counted), if any.
    #[serde(default)]
    pub pending: Option<String>,
    /// PM bytes held after the run, all nodes.
    pub pm_bytes: u64,
    /// PM bytes per node.
    pub pm_bytes_per_node: Vec<u64>,
    /// DRAM bytes of volatile structures after the run (approximate).
    pub dram_bytes: u64,
    /// Wall time of the parallel load, seconds.
    pub load_seconds: f64,
    /// Share of operations that found nothing to act on (get/update/remove of an absent key,
    /// insert of a present one, empty scan).
    pub miss_ratio: f64,
    /// Wall time of the open after a clean close, ms (when asked for and supported).
    pub reopen_ms: Option<f64>,
    /// Wall time of the open after a simulated crash, recovery included, ms.
    pub recover_ms: Option<f64>,
    /// The seed of the run.
    pub seed: u64,
    /// Operations of the run's accounting phase, over which the PM figures (`pm_*`, `remote_*`,
    /// `flushes_per_op`, ...) were counted; 0 when the timed operations were counted themselves
    /// (latency emulation on) or nothing was counted (`runner::ACCOUNTED_SHARE`).
    #[serde(default)]
    pub accounted_ops: u64,
    /// The engine's own counters after the run (splits, merges, switches, GC runs, ...), from
    /// `Index::stats`; JSON only (the CSV has fixed columns).
    #[serde(default)]
    pub counters: std::collections::BTreeMap<String, u64>,
    /// Bytes of the pools' working memory backed by transparent huge pages at the end of the
    /// timed phase (`/proc/self/smaps`; 0 with 0 resident when the run had no pool); `None`
    /// where smaps cannot be read. JSON only.
    #[serde(default)]
    pub pool_huge_bytes: Option<u64>,
    /// Resident bytes of the pools' working memory at the same moment. JSON only.
    #[serde(default)]
    pub pool_resident_bytes: Option<u64>,
}

impl Report {
    /// One line on the page size the pools got over all runs (issue 40: pools ask for
    /// transparent huge pages, the kernel decides), e.g. `pool pages: 4 KiB (no huge pages
    /// granted; ...)`; `None` when no run measured it.
    pub fn pool_pages_note(&self) -> Option<String> {
        let (mut huge, mut resident) = (0u64, 0u64);
        let mut measured = false;
        for r in &self.runs {
            if let (Some(h), Some(res)) = (r.pool_huge_bytes, r.pool_resident_bytes) {
                if res > 0 {
                    measured = true;
                    huge += h;
                    resident += res;
                }
            }
        }
        if !measured {
            return None;
        }
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        Some(if huge == 0 {
            format!(
                "pool pages: 4 KiB (no transparent huge pages granted over {:.0} MiB resident; \
                 the pools ask for them with MADV_HUGEPAGE: see \
                 /sys/kernel/mm/transparent_hugepage/ and the tmpfs huge= mount option)",
                mib(resident)
            )
        } else {
            format!(
                "pool pages: 2 MiB for {:.0} of {:.0} MiB resident ({:.0}%), 4 KiB for the rest",
                mib(huge),
                mib(resident),
                100.0 * huge as f64 / resident as f64
            )
        })
    }
}

/// A run that did not produce a result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunFailure {
    /// Target name.
    pub engine: String,
    /// Workload name.
    pub workload: String,
    /// Worker threads.
    pub threads: usize,
    /// The error.
    pub error: String,
}

/// Everything a benchmark produced.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// One entry per (engine, workload, threads).
    pub runs: Vec<RunResult>,
    /// Runs that failed.
    #[serde(default)]
    pub failures: Vec<RunFailure>,
}

/// The CSV/JSON column names, in order.
pub const COLUMNS: &[&str] = &[
    "engine",
    "workload",
    "threads",
    "nodes",
    "placement",
    "persist",
    "latency",
    "dist",
    "keys",
    "ops",
    "seconds",
    "throughput_mops",
    "p50_ns",
    "p99_ns",
    "p999_ns",
    "max_ns",
    "pm_reads_per_op",
    "pm_writes_per_op",
    "remote_reads_per_op",
    "remote_writes_per_op",
    "remote_share",
    "flushes_per_op",
    "fences_per_op",
    "smo_reads_per_op",
    "smo_writes_per_op",
    "smo_flushes_per_op",
    "fg_pm_reads_per_op",
    "fg_pm_writes_per_op",
    "fg_flushes_per_op",
    "bg_share",
    "pending",
    "pm_bytes",
    "pm_bytes_per_node",
    "dram_bytes",
    "load_seconds",
    "miss_ratio",
    "reopen_ms",
    "recover_ms",
    "seed",
    "accounted_ops",
];

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// A PM figure for arithmetic in the reproductions (which always count): NaN where the run did
/// not measure it, so a missing figure shows as `NaN`, never as a plausible 0.
pub(crate) fn figure(v: Option<f64>) -> f64 {
    v.unwrap_or(f64::NAN)
}

/// A CSV cell: `-` for what was not measured.
fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |x| format!("{x}"))
}

/// A table cell with `digits` decimals, `-` for what was not measured.
fn cell(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |x| format!("{x:.digits$}"))
}

/// A share as a table cell, `-` for what was not measured.
fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |x| format!("{:.0}%", x * 100.0))
}

impl RunResult {
    fn csv_row(&self) -> Vec<String> {
        vec![
            csv_field(&self.engine),
            csv_field(&self.workload),
            self.threads.to_string(),
            self.nodes.to_string(),
            csv_field(&self.placement),
            csv_field(&self.persist),
            csv_field(&self.latency),
            csv_field(&self.dist),
            self.keys.to_string(),
            self.ops.to_string(),
            self.seconds.to_string(),
            self.throughput_mops.to_string(),
            self.p50_ns.to_string(),
            self.p99_ns.to_string(),
            self.p999_ns.to_string(),
            self.max_ns.to_string(),
            opt(self.pm_reads_per_op),
            opt(self.pm_writes_per_op),
            opt(self.remote_reads_per_op),
            opt(self.remote_writes_per_op),
            opt(self.remote_share),
            opt(self.flushes_per_op),
            opt(self.fences_per_op),
            opt(self.smo_reads_per_op),
            opt(self.smo_writes_per_op),
            opt(self.smo_flushes_per_op),
            opt(self.fg_pm_reads_per_op),
            opt(self.fg_pm_writes_per_op),
            opt(self.fg_flushes_per_op),
            opt(self.bg_share),
            csv_field(self.pending.as_deref().unwrap_or("")),
            self.pm_bytes.to_string(),
            self.pm_bytes_per_node.iter().map(u64::to_string).collect::<Vec<_>>().join(";"),
            self.dram_bytes.to_string(),
            self.load_seconds.to_string(),
            self.miss_ratio.to_string(),
            opt(self.reopen_ms),
            opt(self.recover_ms),
            self.seed.to_string(),
            self.accounted_ops.to_string(),
        ]
    }
}

fn human_ns(ns: u64) -> String {
    if ns >= 10_000_000 {
        format!("{:.0}ms", ns as f64 / 1e6)
    } else if ns >= 10_000 {
        format!("{:.0}µs", ns as f64 / 1e3)
    } else {
        format!("{ns}ns")
    }
}

fn human_bytes(b: u64) -> String {
    if b == 0 {
        "-".into()
    } else if b >= 10 << 20 {
        format!("{:.0}MiB", b as f64 / f64::from(1 << 20))
    } else {
        format!("{:.1}MiB", b as f64 / f64::from(1 << 20))
    }
}

impl Report {
    /// A fixed-width table for terminals: one line per run, then the failures.
    pub fn to_table(&self) -> String {
        let header = [
            "engine", "workload", "thr", "nodes", "Mops/s", "p50", "p99", "p99.9", "PM rd/op",
            "PM wr/op", "bg", "remote", "flush/op", "fence/op", "PM", "DRAM",
        ];
        let rows: Vec<Vec<String>> = self
            .runs
            .iter()
            .map(|r| {
                vec![
                    r.engine.clone(),
                    r.workload.clone(),
                    r.threads.to_string(),
                    r.nodes.to_string(),
                    format!("{:.3}", r.throughput_mops),
                    human_ns(r.p50_ns),
                    human_ns(r.p99_ns),
                    human_ns(r.p999_ns),
                    cell(r.pm_reads_per_op, 2),
                    cell(r.pm_writes_per_op, 2),
                    percent(r.bg_share),
                    percent(r.remote_share),
                    cell(r.flushes_per_op, 2),
                    cell(r.fences_per_op, 2),
                    human_bytes(r.pm_bytes),
                    human_bytes(r.dram_bytes),
                ]
            })
            .collect();
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for row in &rows {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        let line = |cells: &[String], out: &mut String| {
            for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
                let pad = w - c.chars().count();
                if i < 2 {
                    out.push_str(c);
                    out.push_str(&" ".repeat(pad));
                } else {
                    out.push_str(&" ".repeat(pad));
                    out.push_str(c);
                }
                out.push_str(if i + 1 < cells.len() { "  " } else { "\n" });
            }
        };
        line(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>(), &mut out);
        for row in &rows {
            line(row, &mut out);
        }
        for r in self.runs.iter().filter(|r| r.pending.is_some()) {
            let _ = writeln!(
                out,
                "note: {} {} t={}: background work not counted, still pending {}",
                r.engine,
                r.workload,
                r.threads,
                r.pending.as_deref().unwrap_or_default()
            );
        }
        for f in &self.failures {
            let _ =
                writeln!(out, "FAILED {} {} t={}: {}", f.engine, f.workload, f.threads, f.error);
        }
        out
    }

    /// The JSON document (pretty-printed).
    pub fn to_json(&self) -> Result<String> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// The CSV document.
    pub fn to_csv(&self) -> String {
        let mut out = COLUMNS.join(",");
        out.push('\n');
        for r in &self.runs {
            out.push_str(&r.csv_row().join(","));
            out.push('\n');
        }
        out
    }

    /// Writes [`to_json`](Self::to_json) to `path`, creating parent directories.
    ///
    /// # Errors
    ///
    /// [`BenchError::Io`] or [`BenchError::Json`].
    pub fn write_json(&self, path: &Path) -> Result<()> {
        write_file(path, &self.to_json()?)
    }

    /// Writes [`to_csv`](Self::to_csv) to `path`, creating parent directories.
    ///
    /// # Errors
    ///
    /// [`BenchError::Io`].
    pub fn write_csv(&self, path: &Path) -> Result<()> {
        write_file(path, &self.to_csv())
    }

    /// Draws the throughput plot to `path` (see [`crate::plot::throughput_svg`]).
    ///
    /// # Errors
    ///
    /// [`BenchError::Plot`] or [`BenchError::Io`].
    pub fn plot_svg(&self, path: &Path) -> Result<()> {
        crate::plot::throughput_svg(self, path)
    }

    /// Reads a report written by [`write_json`](Self::write_json).
    ///
    /// # Errors
    ///
    /// [`BenchError::Io`] or [`BenchError::Json`].
    pub fn read_json(path: &Path) -> Result<Report> {
        let text = fs::read_to_string(path).map_err(|e| BenchError::io(path, e))?;
        Ok(serde_json::from_str(&text)?)
    }
}

/// Writes `text` to `path`, creating the parent directories.
pub(crate) fn write_file(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    }
    fs::write(path, text).map_err(|e| BenchError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        Report {
            runs: vec![RunResult {
                engine: "rwlock-btreemap".into(),
                workload: "ycsb-a".into(),
                threads: 2,
                nodes: 2,
                throughput_mops: 1.5,
                pm_bytes_per_node: vec![1, 2],
                dist: "hotspot:0.1:0.9@5s".into(),
                reopen_ms: Some(1.5),
                ..RunResult::default()
            }],
            failures: vec![RunFailure {
                engine: "x".into(),
                workload: "w".into(),
                threads: 1,
                error: "boom".into(),
            }],
        }
    }

    #[test]
    fn json_fields_are_the_columns_in_order() {
        let v: serde_json::Value = serde_json::from_str(&sample().to_json().unwrap()).unwrap();
        let run = v["runs"][0].as_object().unwrap();
        let keys: Vec<&str> = run.keys().map(String::as_str).collect();
        // Every CSV column, plus the engine counters and the pools' page sizes (JSON only).
        let mut sorted_cols = COLUMNS.to_vec();
        sorted_cols.extend(["counters", "pool_huge_bytes", "pool_resident_bytes"]);
        sorted_cols.sort_unstable();
        // serde_json's map is sorted without the preserve_order feature: compare as sets.
        assert_eq!(keys, sorted_cols);
        assert_eq!(run["reopen_ms"], 1.5);
        assert!(run["recover_ms"].is_null());
        assert_eq!(v["failures"][0]["error"], "boom");
    }

    #[test]
    fn unmeasured_figures_print_a_dash_and_null_never_zero() {
        let mut report = sample();
        report.runs[0].pm_reads_per_op = Some(1.25);
        report.runs[0].pm_writes_per_op = Some(0.0);
        let table = report.to_table();
        let row = table.lines().nth(1).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        // PM rd/op, PM wr/op, bg, remote, flush/op, fence/op: measured lines, the rest not.
        assert_eq!(&cells[8..14], ["1.25", "0.00", "-", "-", "-", "-"], "{table}");
        let csv = report.to_csv();
        let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
        let values: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
        let col = |name: &str| values[header.iter().position(|h| *h == name).unwrap()];
        assert_eq!((col("pm_reads_per_op"), col("flushes_per_op")), ("1.25", "-"));
        assert_eq!((col("bg_share"), col("recover_ms")), ("-", "-"));
        let v: serde_json::Value = serde_json::from_str(&report.to_json().unwrap()).unwrap();
        assert_eq!(v["runs"][0]["pm_writes_per_op"], 0.0);
        assert!(v["runs"][0]["fences_per_op"].is_null());
        assert!(v["runs"][0]["fg_pm_writes_per_op"].is_null());
    }

    #[test]
    fn pending_background_work_is_reported_under_the_table() {
        let mut report = sample();
        report.runs[0].pending = Some("after 120 s: 7 entries to evaluate".into());
        assert!(report.to_table().contains(
            "note: rwlock-btreemap ycsb-a t=2: background work not counted, still pending after \
             120 s: 7 entries to evaluate"
        ));
    }

    #[test]
    fn csv_has_one_row_per_run_and_matching_columns() {
        let csv = sample().to_csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].split(',').count(), COLUMNS.len());
        assert_eq!(lines[1].split(',').count(), COLUMNS.len());
        assert!(lines[1].contains(",1;2,"));
    }

    #[test]
    fn table_lists_runs_and_failures() {
        let t = sample().to_table();
        assert!(t.contains("rwlock-btreemap") && t.contains("1.500") && t.contains("FAILED x w"));
    }
}
