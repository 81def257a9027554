//! `numakv bench` and `numakv repro` end to end: a tiny comparison of an engine and a DRAM peer
//! writing every output file with the fields issue 4 names, JSON on stdout, the listing, and the
//! usage errors.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_numakv");

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn numakv(args: &[&str], cwd: &Path) -> Run {
    let out = Command::new(BIN).args(args).current_dir(cwd).output().expect("numakv runs");
    let run = Run {
        code: out.status.code().expect("numakv exits normally"),
        stdout: String::from_utf8(out.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(out.stderr).expect("UTF-8 stderr"),
    };
    assert!(!run.stderr.contains("panicked") && !run.stdout.contains("panicked"), "{run:?}");
    run
}

/// A run small enough for CI: one engine, one peer, one workload, one thread count.
const TINY: &[&str] = &[
    "bench",
    "--engines",
    "fastfair,rwlock-btreemap",
    "--workload",
    "ycsb-a",
    "--keys",
    "2000",
    "--ops",
    "4K",
    "--threads",
    "1",
    "--quiet",
];

/// The per-run fields issue 4 requires in the JSON (and CSV header).
const FIELDS: &[&str] = &[
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
];

#[test]
fn a_tiny_bench_writes_table_json_csv_and_plot() {
    let cwd = tempfile::tempdir().unwrap();
    let scratch = cwd.path().join("scratch");
    let mut args = TINY.to_vec();
    let scratch_arg = scratch.display().to_string();
    args.extend(["--scratch", &scratch_arg, "--reopen", "--crash", "--check"]);
    let run = numakv(&args, cwd.path());
    assert_eq!(run.code, 0, "{run:?}");
    // The table: a header and one line per target.
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(lines[0].starts_with("engine") && lines[0].contains("Mops/s"), "{run:?}");
    assert!(lines.iter().any(|l| l.starts_with("fastfair ")), "{run:?}");
    assert!(lines.iter().any(|l| l.starts_with("rwlock-btreemap ")), "{run:?}");

    // Without output flags the files go to numakv-results/bench-<time>/, named on stderr.
    let results = cwd.path().join("numakv-results");
    let dirs: Vec<_> = std::fs::read_dir(&results).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let dir = &dirs[0];
    assert!(
        run.stderr.contains(&format!(
            "results in numakv-results/{}",
            dir.file_name().unwrap().to_string_lossy()
        )),
        "{run:?}"
    );
    for f in ["results.json", "results.csv", "results.txt", "throughput.svg"] {
        assert!(dir.join(f).is_file(), "{f} missing in {}", dir.display());
    }

    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for r in runs {
        for f in FIELDS {
            assert!(r.get(*f).is_some_and(|v| !v.is_null()), "field {f} missing: {r}");
        }
        assert_eq!(r["ops"], 4000);
        assert_eq!(r["workload"], "ycsb-a");
        assert!(r["throughput_mops"].as_f64().unwrap() > 0.0);
    }
    let ff = runs.iter().find(|r| r["engine"] == "fastfair").unwrap();
    let peer = runs.iter().find(|r| r["engine"] == "rwlock-btreemap").unwrap();
    // The engine lives in PM: it reads PM lines, writes (updates) and flushes in ADR, and its
    // store was reopened and recovered; the DRAM peer touches no PM and cannot reopen.
    assert!(ff["pm_reads_per_op"].as_f64().unwrap() > 1.0, "{ff}");
    assert!(ff["pm_writes_per_op"].as_f64().unwrap() > 0.0, "{ff}");
    assert!(ff["flushes_per_op"].as_f64().unwrap() > 0.0, "{ff}");
    assert!(ff["pm_bytes"].as_u64().unwrap() > 0, "{ff}");
    assert!(ff["counters"]["height"].as_u64().is_some_and(|h| h >= 2), "{ff}");
    assert!(ff["reopen_ms"].as_f64().is_some() && ff["recover_ms"].as_f64().is_some(), "{ff}");
    assert_eq!(peer["pm_reads_per_op"].as_f64(), Some(0.0));
    assert!(peer["reopen_ms"].is_null());
    assert!(peer["dram_bytes"].as_u64().unwrap() > 0);

    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    for f in FIELDS {
        assert!(header.contains(f), "CSV header lacks {f}: {header:?}");
    }
    assert_eq!(csv.lines().count(), 3);
    let svg = std::fs::read_to_string(dir.join("throughput.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("fastfair") && svg.contains("million ops/s"));
    // Every store was removed from the scratch directory.
    let left: Vec<_> = std::fs::read_dir(&scratch).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn json_before_bench_prints_the_report_on_stdout() {
    let cwd = tempfile::tempdir().unwrap();
    let out = cwd.path().join("out");
    let out_arg = out.display().to_string();
    let mut args = vec!["--json"];
    args.extend(TINY);
    args.extend(["--engines", "fastfair", "--persist", "eadr", "--out", &out_arg]);
    let run = numakv(&args, cwd.path());
    assert_eq!(run.code, 0, "{run:?}");
    let json: Value = serde_json::from_str(&run.stdout).unwrap();
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["persist"], "eadr");
    // eADR: the persistent cache makes flushes unnecessary.
    assert_eq!(runs[0]["flushes_per_op"].as_f64(), Some(0.0));
    assert!(out.join("results.json").is_file());
    assert!(!cwd.path().join("numakv-results").exists());
}

#[test]
fn list_names_every_target_workload_and_reproduction() {
    let cwd = tempfile::tempdir().unwrap();
    let run = numakv(&["bench", "--list"], cwd.path());
    assert_eq!(run.code, 0, "{run:?}");
    for name in [
        "fastfair",
        "fastfair-interleave",
        "nobtree",
        "nobtree-nomigrate",
        "nbtree",
        "nbtree-w",
        "nbtree-wr",
        "nbtree-coupled",
        "crossbeam-skiplist",
        "scc-treeindex",
        "rwlock-btreemap",
        "nstore",
        "nstore-lfu",
        "nstore-nocache",
        "f3tree",
        "f3tree-batched",
        "f3tree-n2",
        "f3tree-ni",
        "f3tree-nonuma",
    ] {
        assert!(run.stdout.lines().any(|l| l.trim_start().starts_with(name)), "{name}: {run:?}");
    }
    for name in ["ycsb-a", "nstore-put100", "f3tree-composite", "nap-scan-intensive", "pm-lines"] {
        assert!(run.stdout.contains(name), "{name}: {run:?}");
    }
    let repros = numakv(&["repro", "list"], cwd.path());
    assert_eq!(repros.code, 0);
    assert_eq!(repros.stdout.lines().count(), numakv_bench::repro::list().len(), "{repros:?}");
    for name in [
        "pm-lines",
        "space",
        "recovery",
        "nobtree-remote",
        "nobtree-migration",
        "nstore-raf",
        "nstore-recovery",
        "nstore-gc",
        "nbtree-factors",
        "f3tree-numa",
        "f3tree-read",
        "f3tree-folimit",
    ] {
        assert!(repros.stdout.lines().any(|l| l.starts_with(name)), "{name}: {repros:?}");
    }
}

#[test]
fn bad_bench_arguments_are_usage_errors() {
    let cwd = tempfile::tempdir().unwrap();
    for (args, needle) in [
        (&["bench", "--engines", "nosuch"][..], "unknown engine \"nosuch\""),
        (&["bench", "--workload", "ycsb-z"][..], "unknown workload"),
        (&["bench", "--threads", "0"][..], "--threads"),
        (&["bench", "--dist", "zipf:abc"][..], "distribution"),
        (&["bench", "--mix", "get:50,fly:50"][..], "unknown operation"),
        (&["bench", "--budget", "-3"][..], "--budget"),
        (&["repro", "nosuch"][..], "unknown reproduction"),
        (&["repro", "pm-lines", "--scale", "0"][..], "scale"),
    ] {
        let run = numakv(args, cwd.path());
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        assert!(run.stderr.contains(needle), "{args:?}: expected {needle:?}: {run:?}");
    }
    assert!(!cwd.path().join("numakv-results").exists(), "a refused run wrote results");
}

#[test]
fn repro_pm_lines_writes_a_markdown_report() {
    let cwd = tempfile::tempdir().unwrap();
    let run = numakv(
        &["repro", "pm-lines", "--engines", "fastfair", "--scale", "0.02", "--quiet", "--out", "r"],
        cwd.path(),
    );
    assert_eq!(run.code, 0, "{run:?}");
    let md = std::fs::read_to_string(cwd.path().join("r/pm-lines.md")).unwrap();
    assert_eq!(md, run.stdout);
    assert!(md.contains("fastfair") && md.contains("Table I"), "{md}");
    assert!(cwd.path().join("r/pm-lines.json").is_file());
}
