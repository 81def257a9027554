//! Drives the `numakv` binary end to end: a store's life across separate invocations, and every
//! kind of bad input — reserved and non-numeric keys, unknown engines and options, a missing
//! store, damaged and truncated node files — with the exit status and message each must give.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use numakv::{EngineKind, Options, Store};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_numakv");

/// One finished invocation.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn numakv<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    let out = Command::new(BIN).args(args).output().expect("the numakv binary runs");
    let run = Run {
        code: out.status.code().expect("numakv exits normally, not by a signal"),
        stdout: String::from_utf8(out.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(out.stderr).expect("UTF-8 stderr"),
    };
    // Whatever happens: no panic, no Debug dump of an error.
    for text in [&run.stdout, &run.stderr] {
        assert!(!text.contains("panicked"), "{run:?}");
        assert!(!text.contains("RUST_BACKTRACE"), "{run:?}");
        assert!(!text.contains(" { "), "looks like a Debug dump: {run:?}");
    }
    run
}

/// `numakv CMD DIR REST...`.
fn on(dir: &Path, cmd: &str, rest: &[&str]) -> Run {
    let mut args = vec![cmd.to_string(), dir.display().to_string()];
    args.extend(rest.iter().map(|s| s.to_string()));
    numakv(&args)
}

/// Asserts success with nothing on stderr.
fn ok(run: Run) -> Run {
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stderr.is_empty(), "{run:?}");
    run
}

/// Asserts a failure with `code` and an `error: ...` message on stderr containing `needle`.
fn fails(run: Run, code: i32, needle: &str) -> Run {
    assert_eq!(run.code, code, "{run:?}");
    assert!(run.stderr.starts_with("error: "), "{run:?}");
    assert!(
        run.stderr.to_lowercase().contains(&needle.to_lowercase()),
        "expected {needle:?}: {run:?}"
    );
    run
}

fn parse_json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {run:?}"))
}

fn create(dir: &Path) {
    let run = ok(on(dir, "create", &["--engine", "fastfair", "--capacity", "32M"]));
    assert!(run.stdout.contains("created fastfair store"), "{run:?}");
}

#[test]
fn a_store_lives_across_invocations() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let run = ok(on(
        &dir,
        "create",
        &[
            "--engine",
            "fastfair",
            "--nodes",
            "2",
            "--capacity",
            "64M",
            "--mode",
            "eadr",
            "-o",
            "node_size=512",
        ],
    ));
    assert!(run.stdout.contains("2 node(s) x 64.0 MiB, mode eadr"), "{run:?}");
    assert!(dir.join("node0.pm").exists() && dir.join("node1.pm").exists());

    assert_eq!(ok(on(&dir, "put", &["10", "100"])).stdout, "inserted 10\n");
    assert_eq!(ok(on(&dir, "put", &["10", "101"])).stdout, "updated 10\n");
    ok(on(&dir, "put", &["0x20", "0"]));
    ok(on(&dir, "put", &["18446744073709551614", "18446744073709551615"]));
    ok(on(&dir, "put", &["30", "300", "--if-absent"]));
    let run = on(&dir, "put", &["30", "1", "--if-absent"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(run.stdout, "key 30 is present; not changed (--if-absent)\n");
    let run = on(&dir, "put", &["31", "1", "--if-present"]);
    assert_eq!(run.code, 1, "{run:?}");
    ok(on(&dir, "put", &["30", "301", "--if-present"]));
    let run = on(&dir, "put", &["1", "1", "--if-absent", "--if-present"]);
    assert_eq!(run.code, 2, "conflicting flags are a usage error: {run:?}");

    assert_eq!(ok(on(&dir, "get", &["10"])).stdout, "101\n");
    assert_eq!(ok(on(&dir, "get", &["32"])).stdout, "0\n", "value 0 is a value");
    assert_eq!(ok(on(&dir, "get", &["30"])).stdout, "301\n");
    assert_eq!(ok(on(&dir, "get", &["18446744073709551614"])).stdout, "18446744073709551615\n");
    let run = on(&dir, "get", &["11"]);
    assert_eq!((run.code, run.stdout.as_str()), (1, ""), "{run:?}");
    assert_eq!(run.stderr, "key 11 not found\n");

    assert_eq!(
        ok(on(&dir, "scan", &["0", "10"])).stdout,
        "10 101\n30 301\n32 0\n18446744073709551614 18446744073709551615\n"
    );
    assert_eq!(ok(on(&dir, "scan", &["11", "2"])).stdout, "30 301\n32 0\n");
    assert_eq!(ok(on(&dir, "scan", &["18446744073709551615", "5"])).stdout, "");
    assert_eq!(ok(on(&dir, "scan", &["1", "0"])).stdout, "");

    assert_eq!(ok(on(&dir, "del", &["30"])).stdout, "deleted 30\n");
    let run = on(&dir, "del", &["30"]);
    assert_eq!((run.code, run.stderr.as_str()), (1, "key 30 not found\n"), "{run:?}");
    assert_eq!(on(&dir, "get", &["30"]).code, 1);

    let run = ok(on(&dir, "inspect", &[]));
    for needle in [
        "fastfair (format v",
        "mode          eadr",
        "nodes         2",
        "64.0 MiB per node",
        "clean         yes",
        "space per node:",
    ] {
        assert!(run.stdout.contains(needle), "{needle:?} missing: {}", run.stdout);
    }
    let run = ok(on(&dir, "check", &[]));
    assert!(run.stdout.starts_with("ok: 3 entries"), "{run:?}");

    // Every command closed the store cleanly, so it is still clean after all of them.
    let store = Store::open(&dir).unwrap();
    assert!(store.recovery().unwrap().was_clean);
    assert_eq!(store.get(10).unwrap(), Some(101));
    assert_eq!(store.get(30).unwrap(), None);
    store.close().unwrap();
}

#[test]
fn json_output_is_machine_readable() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let d = dir.display().to_string();
    let created = parse_json(&ok(numakv(&[
        "--json",
        "create",
        &d,
        "--engine",
        "fastfair",
        "--capacity",
        "32M",
        "--nodes",
        "2",
    ])));
    assert_eq!(created["engine"], "fastfair");
    assert_eq!(created["nodes"], 2);
    assert_eq!(created["engine_options"]["node_size"], "512");

    let put = parse_json(&ok(on(dir, "put", &["7", "70", "--json"])));
    assert_eq!(put, json!({ "key": 7, "value": 70, "result": "inserted" }));
    ok(on(dir, "put", &["8", "18446744073709551615"]));
    assert_eq!(parse_json(&ok(on(dir, "get", &["7", "--json"]))), json!({ "key": 7, "value": 70 }));
    let absent = on(dir, "get", &["9", "--json"]);
    assert_eq!(absent.code, 1);
    assert_eq!(parse_json(&absent), json!({ "key": 9, "value": null }));

    let scan = parse_json(&ok(on(dir, "scan", &["1", "10", "--json"])));
    assert_eq!(scan, json!([{ "key": 7, "value": 70 }, { "key": 8, "value": u64::MAX }]));
    assert_eq!(parse_json(&ok(on(dir, "scan", &["9", "10", "--json"]))), json!([]));

    let info = parse_json(&ok(on(dir, "inspect", &["--json"])));
    assert_eq!(info["engine"], "fastfair");
    assert_eq!(info["mode"], "adr");
    assert_eq!(info["nodes"], 2);
    assert_eq!(info["was_clean"], true);
    assert_eq!(info["capacity_per_node"], 32 << 20);
    let space = info["space"].as_array().unwrap();
    assert_eq!(space.len(), 2);
    let used: u64 = space.iter().map(|s| s["used_bytes"].as_u64().unwrap()).sum();
    assert!(used > 0, "{info}");

    let check = parse_json(&ok(on(dir, "check", &["--json"])));
    assert_eq!(check["ok"], true);
    assert_eq!(check["entries"], 2);
    let del = parse_json(&ok(on(dir, "del", &["7", "--json"])));
    assert_eq!(del, json!({ "key": 7, "deleted": true }));
}

#[test]
fn scan_pages_through_large_ranges() {
    // More pairs than one scan batch of the CLI (4096), written through the library.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let opts = Options::default().capacity_per_node(64 << 20);
    let store = Store::create(dir, EngineKind::FastFair, opts).unwrap();
    for k in 1..=10_000u64 {
        store.insert(k * 3, k).unwrap();
    }
    store.close().unwrap();
    let run = ok(on(dir, "scan", &["2", "9000"]));
    let lines: Vec<_> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 9000);
    assert_eq!(lines[0], "3 1");
    assert_eq!(lines[4095], format!("{} 4096", 4096 * 3));
    assert_eq!(lines[4096], format!("{} 4097", 4097 * 3));
    assert_eq!(lines[8999], format!("{} 9000", 9000 * 3));
    let all = ok(on(dir, "scan", &["0", "1000000"]));
    assert_eq!(all.stdout.lines().count(), 10_000);
}

#[test]
fn an_unclean_store_is_recovered_by_the_next_command() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let opts = Options::default().capacity_per_node(32 << 20);
    let store = Store::create(dir, EngineKind::FastFair, opts).unwrap();
    for k in 1..=500u64 {
        store.insert(k, k + 1).unwrap();
    }
    drop(store); // no close: a crash as far as the store is concerned

    let run = numakv(&["check".to_string(), dir.display().to_string()]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stderr.starts_with("note: ") && run.stderr.contains("not closed cleanly"),
        "{run:?}"
    );
    assert!(run.stdout.starts_with("ok: 500 entries") && run.stdout.contains("after recovery"));
    // check closed it cleanly.
    let run = ok(on(dir, "inspect", &[]));
    assert!(run.stdout.contains("clean         yes"), "{run:?}");
    assert_eq!(ok(on(dir, "get", &["500"])).stdout, "501\n");
}

#[test]
fn bad_keys_are_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    create(dir);
    for key in ["0", "18446744073709551615", "0xffffffffffffffff"] {
        fails(on(dir, "get", &[key]), 2, "reserved");
        fails(on(dir, "put", &[key, "1"]), 2, "reserved");
        fails(on(dir, "del", &[key]), 2, "reserved");
    }
    for key in ["abc", "-1", "1.5", "18446744073709551616", ""] {
        fails(on(dir, "get", &[key]), 2, "not an unsigned 64-bit integer");
    }
    fails(on(dir, "put", &["1", "x"]), 2, "not an unsigned 64-bit integer");
    fails(on(dir, "scan", &["1", "-3"]), 2, "invalid value");
    // The store was not touched by any of that.
    assert_eq!(ok(on(dir, "scan", &["0", "10"])).stdout, "");
}

#[test]
fn unknown_engines_and_options_are_usage_errors_and_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let run = fails(on(&dir, "create", &["--engine", "btree9000"]), 2, "unknown engine");
    assert!(run.stderr.contains("fastfair"), "lists the known engines: {run:?}");
    fails(on(&dir, "create", &[]), 2, "--engine");
    let run = fails(
        on(&dir, "create", &["--engine", "fastfair", "-o", "colour=blue"]),
        2,
        "unknown option",
    );
    assert!(run.stderr.contains("node_size"), "lists the options: {run:?}");
    fails(on(&dir, "create", &["--engine", "fastfair", "-o", "node_size"]), 2, "KEY=VALUE");
    fails(on(&dir, "create", &["--engine", "fastfair", "-o", "node_size=100"]), 2, "node_size");
    fails(on(&dir, "create", &["--engine", "fastfair", "--capacity", "lots"]), 2, "invalid size");
    fails(on(&dir, "create", &["--engine", "fastfair", "--mode", "nvme"]), 2, "persistence mode");
    fails(on(&dir, "create", &["--engine", "fastfair", "--nodes", "0"]), 2, "node count");
    fails(on(&dir, "create", &["--engine", "fastfair", "--capacity", "4K"]), 2, "capacity");
    assert!(!dir.exists(), "failed creates leave nothing behind");
}

#[test]
fn a_missing_store_is_a_store_error() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    let commands: [&[&str]; 6] = [
        &["get", "1"],
        &["put", "1", "2"],
        &["del", "1"],
        &["scan", "1", "1"],
        &["inspect"],
        &["check"],
    ];
    for cmd in commands {
        let run = on(&missing, cmd[0], &cmd[1..]);
        fails(run, 3, "no numakv store here (directory not found)");
    }
    fails(on(tmp.path(), "get", &["1"]), 3, "node0.pm not found");
    assert!(!missing.exists(), "reading commands do not create directories");
}

#[test]
fn create_refuses_an_existing_store() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    create(dir);
    ok(on(dir, "put", &["1", "11"]));
    fails(on(dir, "create", &["--engine", "fastfair"]), 3, "already exists");
    assert_eq!(ok(on(dir, "get", &["1"])).stdout, "11\n");
}

fn overwrite(path: &Path, offset: u64, bytes: &[u8]) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

#[test]
fn a_corrupted_header_is_reported_with_exit_status_4() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    create(dir);
    ok(on(dir, "put", &["1", "11"]));
    let node0 = dir.join("node0.pm");

    // The capacity field (offset 40) is inside the checksummed header.
    overwrite(&node0, 40, &[0xEE; 8]);
    let commands: [&[&str]; 5] =
        [&["get", "1"], &["put", "2", "2"], &["scan", "0", "5"], &["inspect"], &["check"]];
    for cmd in commands {
        let run = fails(on(dir, cmd[0], &cmd[1..]), 4, "checksum mismatch");
        assert!(run.stderr.contains("node0.pm"), "names the file: {run:?}");
        assert!(run.stdout.is_empty(), "{run:?}");
    }
    assert_eq!(on(dir, "check", &["--json"]).code, 4);

    // Not a pool file at all.
    overwrite(&node0, 0, b"GARBAGE!");
    fails(on(dir, "get", &["1"]), 4, "not a numakv pool file");
}

#[test]
fn a_corrupted_page_descriptor_is_reported_with_exit_status_4() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    create(dir);
    ok(on(dir, "put", &["1", "11"]));
    // The page-descriptor table follows the header (docs/design.md §4); an all-ones descriptor
    // has a bad head tag.
    let descriptors = numakv_pmem::layout::DESCRIPTORS_OFF as u64;
    overwrite(&dir.join("node0.pm"), descriptors, &[0xFF; 8]);
    fails(on(dir, "check", &[]), 4, "corrupted");
    fails(on(dir, "get", &["1"]), 4, "corrupted");
}

#[test]
fn a_truncated_or_missing_node_file_is_reported_with_exit_status_4() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(on(dir, "create", &["--engine", "fastfair", "--capacity", "32M", "--nodes", "2"]));
    ok(on(dir, "put", &["1", "11"]));
    let node1 = OpenOptions::new().write(true).open(dir.join("node1.pm")).unwrap();
    node1.set_len(1 << 20).unwrap();
    let run = fails(on(dir, "get", &["1"]), 4, "truncated");
    assert!(run.stderr.contains("node1.pm"), "{run:?}");
    // Cut inside the header.
    node1.set_len(50).unwrap();
    fails(on(dir, "inspect", &[]), 4, "truncated");
    // A node file missing altogether.
    std::fs::remove_file(dir.join("node1.pm")).unwrap();
    fails(on(dir, "check", &[]), 4, "node file missing");
    // Node 0 cut inside the header.
    let node0 = OpenOptions::new().write(true).open(dir.join("node0.pm")).unwrap();
    node0.set_len(64).unwrap();
    fails(on(dir, "get", &["1"]), 4, "truncated");
}

#[test]
fn help_and_version_work() {
    let run = ok(numakv(&["--help"]));
    for needle in
        ["create", "put", "get", "del", "scan", "inspect", "check", "Exit status", "1K = 1024"]
    {
        assert!(run.stdout.contains(needle), "{needle:?} missing from --help: {}", run.stdout);
    }
    let run = ok(numakv(&["create", "--help"]));
    for needle in ["--engine", "--capacity", "--mode", "node_size", "nsm_mode", "[default: 1G]"] {
        assert!(run.stdout.contains(needle), "{needle:?} missing: {}", run.stdout);
    }
    ok(numakv(&["help", "scan"]));
    let run = ok(numakv(&["--version"]));
    assert!(run.stdout.starts_with("numakv "), "{run:?}");
    let run = numakv::<&str>(&[]);
    assert_eq!(run.code, 2, "no subcommand is a usage error: {run:?}");
    let run = fails(numakv(&["frobnicate"]), 2, "unrecognized subcommand");
    assert!(run.stdout.is_empty());
}

/// A default NStore store (`create --engine nstore`, 1 GiB per node) takes distinct keys one
/// process each far beyond the ~128 at which its preallocated 8 MiB files used to exhaust it,
/// and `inspect` shows space in proportion; a capacity below NStore's minimum is refused at
/// create with the minimum named. (150 keys × NUMAKV_TEST_SCALE: one process each costs.)
#[test]
fn a_default_nstore_store_takes_distinct_keys_one_process_each() {
    let scale: u64 =
        std::env::var("NUMAKV_TEST_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1).max(1);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    ok(on(&dir, "create", &["--engine", "nstore"]));
    let n = 150 * scale;
    for k in 1..=n {
        ok(on(&dir, "put", &[&k.to_string(), &(k * 7).to_string()]));
    }
    let run = ok(on(&dir, "get", &[&n.to_string()]));
    assert_eq!(run.stdout.trim(), (n * 7).to_string());
    let info = parse_json(&ok(on(&dir, "inspect", &["--json"])));
    let used = info["space"][0]["used_bytes"].as_u64().unwrap();
    assert!(used < 128 << 20, "{used} bytes of 1 GiB in use for {n} keys: {info}");
    let small = tmp.path().join("small");
    fails(on(&small, "create", &["--engine", "nstore", "--capacity", "16M"]), 2, "at least");
}

#[test]
fn inspect_lists_each_engine_counter_once() {
    for &kind in EngineKind::all() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let store = Store::create(&dir, kind, Options::default());
        let store = store.unwrap_or_else(|e| panic!("{}: {e}", kind.name()));
        for k in 1..=100u64 {
            store.insert(k, k).unwrap();
            store.get(k).unwrap();
        }
        store.close().unwrap();
        let info = parse_json(&ok(on(&dir, "inspect", &["--json"])));
        let counters = info["counters"].as_object().unwrap();
        let text = ok(on(&dir, "inspect", &[])).stdout;
        let listed = text.split("engine counters:").nth(1).unwrap_or_default();
        let names: Vec<&str> = listed.lines().filter_map(|l| l.split_whitespace().next()).collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(names.len(), unique.len(), "{}: a counter listed twice:\n{text}", kind.name());
        assert_eq!(names.len(), counters.len(), "{}:\n{text}", kind.name());
    }
}
