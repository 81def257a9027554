//! `numakv serve` as a process: SIGKILL loses nothing acknowledged, SIGTERM closes the store
//! cleanly, and a bad start is a clear error.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use redis::Commands;

fn scale() -> usize {
    std::env::var("NUMAKV_TEST_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1).max(1)
}

/// Starts `numakv serve DIR --create ...` on a free port; returns the child and its URL.
fn serve(dir: &Path, engine: &str) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_numakv"))
        .args(["serve", dir.to_str().unwrap(), "--create", "--engine", engine])
        .args(["--capacity", "256M", "--bind", "127.0.0.1:0", "--threads", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let addr = line
        .strip_prefix("listening on ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    (child, format!("redis://{addr}/"))
}

#[test]
fn sigkill_loses_nothing_acknowledged() {
    for engine in ["fastfair", "nbtree"] {
        let dir = tempfile::tempdir().unwrap();
        let (mut child, url) = serve(dir.path(), engine);
        let mut c = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
        let n = 500 * scale();
        for i in 0..n {
            let _: () = c.set(format!("key:{i}"), format!("value-{i}")).unwrap();
            if i % 7 == 0 {
                let _: i64 = c.incr("acked", 1).unwrap();
            }
        }
        let _: i64 = c.del(format!("key:{}", n - 1)).unwrap();
        let acked: i64 = c.get("acked").unwrap();
        child.kill().unwrap(); // SIGKILL: no chance to close the store
        child.wait().unwrap();

        let (mut child, url) = serve(dir.path(), engine);
        let mut c = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
        for i in 0..n - 1 {
            let v: Option<String> = c.get(format!("key:{i}")).unwrap();
            assert_eq!(v, Some(format!("value-{i}")), "{engine}: key:{i} lost");
        }
        assert_eq!(c.get::<_, Option<String>>(format!("key:{}", n - 1)).unwrap(), None);
        assert_eq!(c.get::<_, i64>("acked").unwrap(), acked, "{engine}");
        assert_eq!(redis::cmd("DBSIZE").query::<usize>(&mut c).unwrap(), n);
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

#[test]
fn sigterm_closes_the_store_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let (child, url) = serve(dir.path(), "fastfair");
    let mut c = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    let _: () = c.set("k", "v").unwrap();
    let st = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(st.success());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert!(String::from_utf8_lossy(&out.stdout).contains("store closed cleanly"));
    let store = numakv::BytesStore::open(dir.path()).unwrap();
    assert!(store.recovery().unwrap().was_clean);
    assert_eq!(store.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    store.close().unwrap();
}

#[test]
fn serve_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_numakv"))
        .args(["serve", dir.path().join("new").to_str().unwrap(), "--create"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--engine is required"));
    let out = Command::new(env!("CARGO_BIN_EXE_numakv"))
        .args(["serve", dir.path().join("missing").to_str().unwrap()])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "));
}
