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
    let bin = compile("defects", tmp.path());
    let text = defect_scenario(&bin, "fork", &tmp.path().join("s"));
    assert!(text.contains("child refused, parent's store intact"), "{text}");
}

#[test]
fn a_call_from_a_thread_exit_destructor_does_not_abort() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = compile("defects", tmp.path());
    let text = defect_scenario(&bin, "thread-exit", &tmp.path().join("s"));
    assert!(text.contains("thread-exit:"), "{text}");
}

#[test]
fn iter_next_with_a_null_output_keeps_its_pair() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = compile("defects", tmp.path());
    defect_scenario(&bin, "iter-null", &tmp.path().join("s"));
}

#[test]
fn bget_clears_outputs_on_a_miss_and_returns_a_real_empty_buffer() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = compile("defects", tmp.path());
    defect_scenario(&bin, "bget", &tmp.path().join("s"));
}

#[test]
fn absurd_lengths_are_refused_as_too_large() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = compile("defects", tmp.path());
    defect_scenario(&bin, "huge-len", &tmp.path().join("s"));
}

#[test]
fn a_c_program_uses_ranges_prefixes_placement_threads_and_open_options() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = compile("features", tmp.path());
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
