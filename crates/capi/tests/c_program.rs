//! Compiles `c/test.c` with the system C compiler against `include/numakv.h` and `libnumakv.a`,
//! and runs it for several engines: create, fill, scan, crash (fork + SIGKILL) and reopen, on an
//! integer and a bytes store, as a C program sees the library.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/<profile>`: where cargo puts `libnumakv.a`, beside this test's `deps/` directory.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// `libnumakv.a`, built for this test's profile and target directory. `cargo test` builds a
/// library target only as an rlib for the tests to link, and this crate has none (it is a C
/// library), so the test asks cargo for the static library itself, once.
fn static_library() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let profile = profile_dir();
            let target_dir = profile.parent().unwrap();
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "-p", "numakv-capi", "--target-dir"]).arg(target_dir);
            match profile.file_name().and_then(|n| n.to_str()) {
                Some("debug") => {}
                Some("release") => {
                    cmd.arg("--release");
                }
                Some(other) => {
                    cmd.args(["--profile", other]);
                }
                None => panic!("no profile directory above {}", profile.display()),
            }
            let out = cmd.output().expect("cargo runs");
            assert!(
                out.status.success(),
                "cargo build -p numakv-capi failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let lib = profile.join("libnumakv.a");
            assert!(lib.exists(), "{} not built", lib.display());
            lib
        })
        .clone()
}

/// Where the compiled C and C++ programs go: one directory per test binary run, shared by its
/// tests (each program is compiled once, see `compiled`).
fn build_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap()).path()
}

/// `c/<name>.c`, compiled once per test run (tests run in parallel; the first one builds).
fn compiled(name: &'static str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(&str, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, bin)) = built.iter().find(|(n, _)| *n == name) {
        return bin.clone();
    }
    let bin = compile(name, build_dir());
    built.push((name, bin.clone()));
    bin
}

/// Compiles `c/<name>.c` into `dir` with warnings as errors; returns the binary.
fn compile(name: &str, dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = static_library();
    let bin = dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(root.join("../../include"))
        .arg(root.join(format!("c/{name}.c")))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&bin)
        .output()
        .unwrap_or_else(|e| panic!("running the C compiler {cc:?}: {e}"));
    assert!(out.status.success(), "cc {name}.c failed:\n{}", String::from_utf8_lossy(&out.stderr));
    bin
}

#[test]
fn the_c_example_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = compile("example", tmp.path());
    let run = Command::new(&bin).arg(tmp.path().join("store")).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let text = String::from_utf8(run.stdout).unwrap();
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        ["95 -> 9025", "96 -> 9216", "97 -> 9409", "98 -> 9604", "99 -> 9801", "100 -> 10000"]
    );
}

#[test]
fn a_c_program_creates_fills_scans_crashes_and_reopens_stores() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = compile("test", tmp.path());
    // NStore opens a log file per hash cluster and node: fewer clusters fit the small pools.
    let engines = [
        ("fastfair", "nodes=2,capacity=64M"),
        ("nbtree", "nodes=2,capacity=64M"),
        ("nstore", "nodes=2,capacity=64M,clusters=4"),
        ("f3tree", "nodes=2,capacity=64M"),
        ("nobtree", "nodes=2,capacity=64M"),
        ("nap-fastfair", "nodes=2,capacity=64M"),
    ];
    for (engine, options) in engines {
        let dir = tmp.path().join(engine);
        let run = Command::new(&bin).arg(engine).arg(&dir).arg(options).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(run.status.success(), "{engine}: {text}");
        assert!(text.contains("survived SIGKILL"), "{engine}: {text}");
        eprint!("{text}");
    }
}

/// Runs one scenario of `c/defects.c` (the boundary rules of the C-ABI review) and
/// returns its output; fails with the program's own message when the rule is broken.
fn defect_scenario(bin: &Path, scenario: &str, dir: &Path) -> String {
    let run = Command::new(bin).arg(scenario).arg(dir).output().unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "scenario {scenario}: {:?}\n{text}", run.status);
    text
}

#[test]
fn a_fork_child_is_refused_and_the_parents_store_stays_intact() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = compiled("defects");
    let text = defect_scenario(&bin, "fork", &tmp.path().join("s"));
    assert!(text.contains("child refused, parent's store intact"), "{text}");
}

#[test]
fn a_call_from_a_thread_exit_destructor_does_not_abort() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = compiled("defects");
    let text = defect_scenario(&bin, "thread-exit", &tmp.path().join("s"));
    assert!(text.contains("thread-exit:"), "{text}");
}

#[test]
fn iter_next_with_a_null_output_keeps_its_pair() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = compiled("defects");
    defect_scenario(&bin, "iter-null", &tmp.path().join("s"));
}

#[test]
fn bget_clears_outputs_on_a_miss_and_returns_a_real_empty_buffer() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = compiled("defects");
    defect_scenario(&bin, "bget", &tmp.path().join("s"));
}

#[test]
fn absurd_lengths_are_refused_as_too_large() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = compiled("defects");
    defect_scenario(&bin, "huge-len", &tmp.path().join("s"));
}

#[test]
fn a_c_program_uses_ranges_prefixes_placement_threads_and_open_options() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = compiled("features");
    let engines = [
        ("fastfair", "nodes=2,capacity=64M"),
        ("nobtree", "nodes=2,capacity=64M"),
        ("nstore", "nodes=2,capacity=64M,clusters=4"),
    ];
    for (engine, options) in engines {
        let dir = tmp.path().join(engine);
        let run = Command::new(&bin).arg(engine).arg(&dir).arg(options).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(run.status.success(), "{engine}: {text}");
        assert!(
            text.contains("over both nodes") && text.contains("prefix scans"),
            "{engine}: {text}"
        );
        eprint!("{text}");
    }
}

/// Builds `wrappers/pibench` (the wrapper, as a shared library over `libnumakv.a`) against the
/// `tree_api.hpp` written from PiBench's documentation, and the driver that stands in for
/// PiBench; returns (wrapper, driver).
fn pibench_build() -> (PathBuf, PathBuf) {
    static BUILT: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| pibench_compile(build_dir())).clone()
}

fn pibench_compile(dir: &Path) -> (PathBuf, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let pibench = root.join("wrappers/pibench");
    let lib = static_library();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let wrapper = dir.join("libnumakv_pibench.so");
    let run = |cmd: &mut Command, what: &str| {
        let out = cmd.output().unwrap_or_else(|e| panic!("running the C++ compiler {cxx:?}: {e}"));
        assert!(out.status.success(), "{what} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    };
    run(
        Command::new(&cxx)
            .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", "-shared", "-fPIC", "-I"])
            .arg(pibench.join("ci/include"))
            .arg("-I")
            .arg(root.join("include"))
            .arg(pibench.join("numakv_wrapper.cpp"))
            .arg(&lib)
            .args(["-Wl,--exclude-libs,ALL", "-lpthread", "-ldl", "-lm", "-o"])
            .arg(&wrapper),
        "building the PiBench wrapper",
    );
    let driver = dir.join("pibench_driver");
    run(
        Command::new(&cxx)
            .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
            .arg(pibench.join("ci/include"))
            .arg(pibench.join("ci/driver.cpp"))
            .args(["-ldl", "-lpthread", "-o"])
            .arg(&driver),
        "building the PiBench driver",
    );
    (wrapper, driver)
}

/// Runs the driver; returns its stdout + stderr, asserting success.
fn pibench_run(driver: &Path, wrapper: &Path, key_size: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(driver);
    cmd.arg(wrapper).arg(key_size).arg("4");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let run = cmd.output().unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "driver {key_size}-byte keys {env:?}: {text}");
    text
}

#[test]
fn the_pibench_wrapper_places_threads_on_both_nodes_and_scans_in_key_order() {
    let (wrapper, driver) = pibench_build();
    for engine in ["nobtree", "fastfair"] {
        let env = [("NUMAKV_ENGINE", engine), ("NUMAKV_OPTIONS", "nodes=2")];
        let text = pibench_run(&driver, &wrapper, "8", &env);
        assert!(text.contains("scanned records in order"), "{engine}: {text}");
        // Four workers round-robin, then the driver's main thread (its scans) on node 0.
        assert!(text.contains("worker threads per node: node 0: 3, node 1: 2"), "{engine}: {text}");
        assert!(text.contains("\"nodes\":2"), "{engine}: {text}");
        eprint!("{text}");
    }
    let text = pibench_run(&driver, &wrapper, "16", &[("NUMAKV_OPTIONS", "nodes=2")]);
    assert!(text.contains("bytes store") && text.contains("scanned records in order"), "{text}");
}

#[test]
fn the_pibench_wrapper_reports_bad_settings_and_foreign_stores() {
    let tmp = tempfile::tempdir().unwrap();
    let (wrapper, driver) = pibench_build();
    for (env, says) in [
        ([("NUMAKV_ENGINE", "no-such-engine"), ("NUMAKV_OPTIONS", "")], "no-such-engine"),
        ([("NUMAKV_ENGINE", "fastfair"), ("NUMAKV_OPTIONS", "leaf_slots=7")], "leaf_slots"),
    ] {
        let run = Command::new(&driver).arg(&wrapper).arg("8").arg("1").envs(env).output().unwrap();
        let text = String::from_utf8_lossy(&run.stderr).to_string();
        assert!(!run.status.success(), "{env:?}: {text}");
        assert!(text.contains("creating a") && text.contains(says), "{env:?}: {text}");
        assert!(!text.contains("no numakv store here"), "{text}");
        // "... store in /dev/shm/numakv-pibench-XXXXXX/store (options ...": its scratch
        // directory is gone.
        let dir = text
            .split(" store in ")
            .nth(1)
            .and_then(|rest| rest.split(" (options").next())
            .unwrap_or_else(|| panic!("no store directory in {text}"));
        let scratch = Path::new(dir).parent().unwrap();
        assert!(scratch.starts_with("/dev/shm"), "{text}");
        assert!(!scratch.exists(), "a failed create left {} behind", scratch.display());
    }

    // A store of another engine at --pool_path is refused with a message, not used blindly.
    let pool = tmp.path().join("pool");
    let pool_arg = pool.to_str().unwrap();
    let mut cmd = Command::new(&driver);
    cmd.arg(&wrapper).args(["8", "1", pool_arg]).env("NUMAKV_ENGINE", "nbtree");
    let first = cmd.output().unwrap();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let mut cmd = Command::new(&driver);
    cmd.arg(&wrapper).args(["8", "1", pool_arg]).env("NUMAKV_ENGINE", "fastfair");
    let second = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{text}");
    assert!(text.contains("holds a nbtree int store, not the fastfair int store"), "{text}");
}

// --- the review's scenarios (c/review.c) ------------------------------------------------------

/// The engines every review scenario runs on (NStore with fewer clusters for the small pools).
const REVIEW_ENGINES: [(&str, &str); 6] = [
    ("fastfair", "nodes=2,capacity=64M"),
    ("nbtree", "nodes=2,capacity=64M"),
    ("nstore", "nodes=2,capacity=64M,clusters=4"),
    ("f3tree", "nodes=2,capacity=64M"),
    ("nobtree", "nodes=2,capacity=64M"),
    ("nap-fastfair", "nodes=2,capacity=64M"),
];

/// Runs `c/review.c`'s `scenario` on every engine (or on FAST&FAIR only); collects the
/// engines where it failed and fails with their output, so one run shows them all.
fn review(scenario: &str, all_engines: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let bin = compiled("review");
    let engines = if all_engines { &REVIEW_ENGINES[..] } else { &REVIEW_ENGINES[..1] };
    let mut failed = Vec::new();
    for (engine, options) in engines {
        let dir = tmp.path().join(format!("{scenario}-{engine}"));
        let run =
            Command::new(&bin).arg(scenario).arg(&dir).arg(engine).arg(options).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        eprintln!("--- {scenario} on {engine}: {:?}\n{text}", run.status);
        if !run.status.success() {
            failed.push(format!("{engine}: {:?}\n{text}", run.status));
        }
    }
    assert!(failed.is_empty(), "review scenario {scenario} failed on:\n{}", failed.join("\n"));
}

#[test]
fn review_a_scan_refused_for_a_null_iterator_output_does_not_keep_the_store_busy() {
    review("scan-null-iter", false);
}

#[test]
fn review_a_node_count_far_out_of_range_is_refused_not_an_abort() {
    review("huge-nodes", false);
}

#[test]
fn review_abandon_with_an_open_iterator_lets_the_next_open_recover() {
    review("abandon-iter", false);
}

#[test]
fn review_a_child_of_the_raw_fork_system_call_is_refused_too() {
    review("raw-fork", false);
}

#[test]
fn review_abandon_and_iter_free_from_a_thread_exit_destructor_do_not_abort() {
    review("dtor-abandon", true);
}

#[test]
fn review_a_store_closes_from_an_atexit_handler() {
    review("atexit-close", true);
}

#[test]
fn review_more_than_a_thousand_threads_at_once_can_use_a_handle() {
    review("many-threads", false);
}

#[test]
fn review_threads_whose_first_call_is_in_a_key_destructor_do_not_leak_thread_ids() {
    review("dtor-tid-leak", false);
}
