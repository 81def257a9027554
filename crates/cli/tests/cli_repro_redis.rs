//! `numakv repro redis` end to end: a missing redis-server or redis-benchmark is an error naming
//! it (never a silent pass), bad flags are usage errors, and — where the tools are installed (CI
//! installs them) — a small run fills the table for redis-server and a numakv engine.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_numakv");

fn numakv(args: &[&str], path: Option<&Path>, cwd: &Path) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).current_dir(cwd);
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    cmd.output().expect("numakv runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_missing_tool_is_an_error_naming_it() {
    let cwd = tempfile::tempdir().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let out =
        numakv(&["repro", "redis", "--requests", "100", "-q"], Some(empty.path()), cwd.path());
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        err.contains("redis-server is not installed or not on PATH")
            && err.contains("apt-get install redis-server"),
        "{err}"
    );
    assert!(text(&out.stdout).is_empty(), "no table without the tools: {out:?}");
    // With redis-server there but not redis-benchmark, the error names redis-benchmark.
    if let Some(server) = numakv_bench::repro_redis::find_tool("redis-server") {
        std::os::unix::fs::symlink(server, empty.path().join("redis-server")).unwrap();
        let out =
            numakv(&["repro", "redis", "--requests", "100", "-q"], Some(empty.path()), cwd.path());
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{out:?}");
        assert!(err.contains("redis-benchmark is not installed") && err.contains("redis-tools"));
    }
}

#[test]
fn bad_flags_are_usage_errors() {
    let cwd = tempfile::tempdir().unwrap();
    let out = numakv(&["repro", "redis", "--engines", "fastfair,btree9"], None, cwd.path());
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(text(&out.stderr).contains("\"btree9\" is not an engine"), "{out:?}");
    let out = numakv(&["repro", "redis", "--requests", "0"], None, cwd.path());
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = numakv(&["repro", "redis", "--clients", "x"], None, cwd.path());
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

// A real run (redis-server and numakv serve under redis-benchmark) needs Debian's tools, which
// `cargo test` cannot assume: `.ci/redis-clients.sh` (run by `.ci/run`, which installs them)
// does it and fails when a tool is missing.
