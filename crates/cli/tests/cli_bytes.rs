//! The bytes-store scenario of issue 22 through the `numakv` binary, for every engine: create
//! --bytes, string keys, an empty value, a 1 MiB value from a file, prefix and start scans, del,
//! get; a 0-byte key and a 2 MiB value refused with clear messages, the store still usable; hex
//! keys; and the integer-only flags refused on an integer store.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_numakv");

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: Vec<u8>,
    stderr: String,
}

impl Run {
    fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

fn numakv(args: &[&str]) -> Run {
    let out = Command::new(BIN).args(args).output().expect("the numakv binary runs");
    let run = Run {
        code: out.status.code().expect("numakv exits normally"),
        stdout: out.stdout,
        stderr: String::from_utf8(out.stderr).expect("UTF-8 stderr"),
    };
    assert!(!run.stderr.contains("panicked"), "{run:?}");
    run
}

fn ok(run: Run) -> Run {
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stderr.is_empty(), "{run:?}");
    run
}

fn fails(run: Run, code: i32, needle: &str) -> Run {
    assert_eq!(run.code, code, "{run:?}");
    assert!(
        run.stderr.starts_with("error: ") && run.stderr.contains(needle),
        "{needle:?}: {run:?}"
    );
    run
}

fn scenario(dir: &Path, engine: &str) {
    let d = dir.to_str().unwrap();
    // 128 MiB (sparse): NStore refuses pools below its minimum of about 97 MiB at the defaults.
    let run = ok(numakv(&["create", d, "--engine", engine, "--bytes", "--capacity", "128M"]));
    assert!(run.out().contains(&format!("created {engine} bytes store")), "{run:?}");
    assert_eq!(ok(numakv(&["put", d, "user:1", "hello"])).out(), "inserted user:1 (5 bytes)\n");
    assert_eq!(ok(numakv(&["put", d, "user:2", ""])).out(), "inserted user:2 (0 bytes)\n");
    let big: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let file = dir.parent().unwrap().join(format!("{engine}.value"));
    std::fs::write(&file, &big).unwrap();
    ok(numakv(&["put", d, "blob", "--value-file", file.to_str().unwrap()]));
    let scan = ok(numakv(&["scan", d, "user:", "10"])).out();
    assert_eq!(scan, "user:1 hello\nuser:2 \n", "{engine}");
    let scan = ok(numakv(&["scan", d, "", "10"])).out();
    assert!(scan.starts_with("blob ") && scan.contains("(1048576 bytes)\nuser:1"), "{scan}");
    let scan = ok(numakv(&["scan", d, "user:", "10", "--prefix"])).out();
    assert_eq!(scan, "user:1 hello\nuser:2 \n");
    assert_eq!(ok(numakv(&["get", d, "blob"])).stdout, [&big[..], b"\n"].concat());
    assert_eq!(ok(numakv(&["del", d, "user:1"])).out(), "deleted user:1\n");
    let run = numakv(&["get", d, "user:1"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(ok(numakv(&["get", d, "user:2"])).out(), "\n");
    // The limits, each a clear usage error that leaves the store as it was.
    fails(numakv(&["put", d, "", "x"]), 2, "empty key");
    let file2 = dir.parent().unwrap().join(format!("{engine}.2m"));
    std::fs::write(&file2, vec![1u8; 2 << 20]).unwrap();
    fails(
        numakv(&["put", d, "k", "--value-file", file2.to_str().unwrap()]),
        2,
        "value of 2097152 bytes is too large: the limit is 1048576 bytes",
    );
    // Binary keys through --hex.
    ok(numakv(&["put", d, "00ff01", "abcd", "--hex"]));
    assert_eq!(ok(numakv(&["get", d, "00ff01", "--hex"])).out(), "abcd\n");
    let scan = ok(numakv(&["scan", d, "00", "1", "--hex"])).out();
    assert_eq!(scan, "00ff01 abcd\n");
    let check = ok(numakv(&["check", d])).out();
    assert!(check.starts_with("ok: 3 entries"), "{check}");
    let inspect = ok(numakv(&["inspect", d])).out();
    assert!(inspect.contains("bytes (byte-string keys and values)"), "{inspect}");
}

#[test]
fn every_engine_runs_the_bytes_scenario() {
    let tmp = tempfile::tempdir().unwrap();
    for engine in numakv::EngineKind::all() {
        let dir = tmp.path().join(engine.name());
        scenario(&dir, engine.name());
    }
}

#[test]
fn bytes_flags_are_refused_on_an_integer_store() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("i");
    let d = d.to_str().unwrap();
    ok(numakv(&["create", d, "--engine", "fastfair", "--capacity", "32M"]));
    fails(numakv(&["put", d, "1", "2", "--hex"]), 2, "--hex is for bytes stores");
    fails(numakv(&["scan", d, "1", "2", "--prefix"]), 2, "--prefix is for bytes stores");
    fails(numakv(&["put", d, "user:1", "2"]), 2, "not an unsigned 64-bit integer");
    ok(numakv(&["put", d, "1", "2"]));
    assert_eq!(ok(numakv(&["get", d, "1"])).out(), "2\n");
}

/// `numakv batch DIR FILE`: puts and deletes from a file applied as one write batch; a bad line
/// or a 1025-byte key writes nothing; an integer store is refused.
#[test]
fn batch_applies_a_file_all_or_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let d = dir.to_str().unwrap();
    ok(numakv(&["create", d, "--engine", "fastfair", "--bytes", "--capacity", "64M"]));
    ok(numakv(&["put", d, "old", "x"]));
    let file = tmp.path().join("ops");
    std::fs::write(&file, "# a comment\nput a 1\nput b two words\n\ndel old\ndel nope\nput e \n")
        .unwrap();
    let run = ok(numakv(&["batch", d, file.to_str().unwrap()]));
    assert_eq!(run.out(), "applied 3 put(s) and 2 delete(s) (1 key(s) deleted)\n");
    assert_eq!(ok(numakv(&["get", d, "b"])).out(), "two words\n");
    assert_eq!(ok(numakv(&["get", d, "e"])).out(), "\n");
    assert_eq!(numakv(&["get", d, "old"]).code, 1);
    // A bad line, or a key the store refuses: an error, and nothing written.
    let long = "k".repeat(1025);
    for (text, code, msg) in [
        ("put c 3\nfrob x\n".to_owned(), 2, "batch line 2"),
        (format!("put c 3\nput {long} v\n"), 2, "1025 bytes is too large"),
        ("put c 3\ndel\n".to_owned(), 2, "batch line 2"),
    ] {
        std::fs::write(&file, &text).unwrap();
        let run = numakv(&["batch", d, file.to_str().unwrap()]);
        assert_eq!(run.code, code, "{run:?}");
        assert!(run.stderr.contains(msg), "{run:?}");
        assert_eq!(numakv(&["get", d, "c"]).code, 1, "{text:?} wrote c");
    }
    // stdin, hex, JSON.
    let mut child = std::process::Command::new(BIN)
        .args(["batch", d, "--hex", "--json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"put 00ff 0102\ndel 61\n").unwrap();
    let outp = child.wait_with_output().unwrap();
    assert!(outp.status.success());
    let line = String::from_utf8(outp.stdout).unwrap();
    assert!(line.contains("\"deleted\":1"), "{line}");
    assert_eq!(ok(numakv(&["get", d, "--hex", "00ff"])).out(), "0102\n");
    // An integer store has no batch.
    let int = tmp.path().join("i");
    ok(numakv(&["create", int.to_str().unwrap(), "--engine", "fastfair", "--capacity", "64M"]));
    let run = numakv(&["batch", int.to_str().unwrap(), file.to_str().unwrap()]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("bytes store"), "{run:?}");
}
