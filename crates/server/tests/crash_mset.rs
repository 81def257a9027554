//! Multi-key writes across a SIGKILL: all or nothing, and finished by whichever program opens
//! the store next. The server runs in a child process (this test binary re-executed) and is
//! killed — while clients pipeline MSETs, good and bad, and multi-key DELs; or parked at the
//! batch's commit point. Every restart must succeed, no partial MSET or DEL may be visible, and
//! a write made by another program after the crash is never overwritten.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use numakv::{BytesStore, EngineKind, Options};
use numakv_server::{Config, Server};
use redis::Commands;

const CHILD_DIR: &str = "NUMAKV_MSET_CHILD_DIR";
const CHILD_PAUSE: &str = "NUMAKV_MSET_CHILD_PAUSE";
const CHILD_OPEN: &str = "NUMAKV_MSET_CHILD_OPEN";

/// The child: serves the store in the given directory (a new one, or the existing one when
/// asked) until killed, parking every batch at its commit point when asked to.
#[test]
fn child_server() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return; // run as an ordinary test: nothing to do
    };
    let sc = numakv_pmem::failpoint::Scenario::setup();
    if std::env::var_os(CHILD_PAUSE).is_some() {
        let pause = sc.pause("bytes.batch.committed");
        // Told on stdout, not seen through the server: a client polling the server could be
        // the task stuck behind the parked one on its worker (docs/design.md).
        std::thread::spawn(move || {
            pause.wait_parked();
            println!("PARKED");
            std::io::stdout().flush().unwrap();
            // Keep `pause` alive until the SIGKILL: dropping it would release the batch.
            loop {
                std::thread::park();
            }
        });
    }
    let store = if std::env::var_os(CHILD_OPEN).is_some() {
        BytesStore::open(&dir).unwrap()
    } else {
        let opts = Options::default().capacity_per_node(64 << 20);
        BytesStore::create(&dir, EngineKind::FastFair, opts).unwrap()
    };
    let config = Config { bind: "127.0.0.1:0".into(), threads: 4, ..Config::default() };
    let server = Server::start(store, config).unwrap();
    println!("ADDR {}", server.local_addr());
    std::io::stdout().flush().unwrap();
    server.wait().unwrap();
}

type Lines = std::io::Lines<BufReader<std::process::ChildStdout>>;

fn spawn_child(dir: &Path, pause: bool, open: bool) -> (Child, String, Lines) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_server", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if pause {
        cmd.env(CHILD_PAUSE, "1");
    }
    if open {
        cmd.env(CHILD_OPEN, "1");
    }
    let mut child = cmd.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("the child prints its address (it started)").unwrap();
        // libtest may print "test child_server ... " before it on the same line.
        if let Some((_, a)) = line.split_once("ADDR ") {
            break a.trim().to_owned();
        }
    };
    (child, format!("redis://{addr}/"), lines)
}

fn get(c: &mut redis::Connection, k: &str) -> Option<String> {
    c.get(k).unwrap()
}

/// Reopens the store in this process behind a new server; returns it and its client.
fn restart(dir: &Path) -> (Server, redis::Connection) {
    let store = BytesStore::open(dir).unwrap();
    let config = Config { bind: "127.0.0.1:0".into(), threads: 2, ..Config::default() };
    let server = Server::start(store, config).unwrap();
    let url = format!("redis://{}/", server.local_addr());
    let c = redis::Client::open(url).unwrap().get_connection().unwrap();
    (server, c)
}

fn counter(store: &BytesStore, name: &str) -> u64 {
    let r = store.recovery().expect("opened, not created");
    r.counters.iter().find(|(n, _)| *n == name).map(|&(_, v)| v).expect(name)
}

/// A crash after the batch's commit point: the next program to open the store — here not the
/// server but another one, as `numakv del DIR a` would — finishes the MSET, then deletes `a`;
/// the server started after it keeps that delete (the old intent-file replay put `a` back).
#[test]
fn a_write_by_another_program_after_a_crash_is_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, url, mut lines) = spawn_child(dir.path(), true, false);
    let addr = url.trim_start_matches("redis://").trim_end_matches('/').to_owned();
    // The MSET goes out on a raw socket: its reply never comes (parked, then killed).
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(b"*5\r\n$4\r\nMSET\r\n$1\r\na\r\n$1\r\n1\r\n$1\r\nb\r\n$1\r\n2\r\n").unwrap();
    while !lines.next().expect("the child reports the pause").unwrap().contains("PARKED") {}
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    drop(s);

    // Another program opens the store: the committed batch is rolled forward, whole.
    let store = BytesStore::open(dir.path()).unwrap();
    assert!(!store.recovery().unwrap().was_clean);
    assert_eq!(counter(&store, "bytes_batches_rolled_forward"), 1);
    assert_eq!(store.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(store.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
    assert!(store.delete(b"a").unwrap());
    store.close().unwrap();

    let (server, mut c) = restart(dir.path());
    assert_eq!(get(&mut c, "a"), None, "the crashed MSET was replayed over a later delete");
    assert_eq!(get(&mut c, "b").as_deref(), Some("2"));
    drop(c);
    server.handle().shutdown();
    server.wait().unwrap();
}

/// EXEC's writes are one batch: a SIGKILL at its commit point (before any key is written)
/// leaves the whole transaction to the next open, which applies all of it.
#[test]
fn an_exec_cut_by_sigkill_is_applied_whole_by_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, url, mut lines) = spawn_child(dir.path(), true, false);
    let addr = url.trim_start_matches("redis://").trim_end_matches('/').to_owned();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(b"MULTI\r\nSET a 1\r\nINCR n\r\nINCR n\r\nSET b 2\r\nDEL a\r\nSET c 3\r\nEXEC\r\n")
        .unwrap();
    while !lines.next().expect("the child reports the pause").unwrap().contains("PARKED") {}
    child.kill().unwrap();
    child.wait().unwrap();
    drop(s);
    let store = BytesStore::open(dir.path()).unwrap();
    assert_eq!(counter(&store, "bytes_batches_rolled_forward"), 1);
    assert_eq!(store.get(b"a").unwrap(), None);
    assert_eq!(store.get(b"n").unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(store.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(store.get(b"c").unwrap().as_deref(), Some(&b"3"[..]));
    store.close().unwrap();
}

/// An acknowledged MSET followed by a SET of one of its keys: a SIGKILL and a restart keep
/// the SET.
#[test]
fn an_acknowledged_mset_is_not_replayed_over_later_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, url, _lines) = spawn_child(dir.path(), false, false);
    let mut c = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    let _: () = c.mset(&[("k1", "a"), ("k2", "b")]).unwrap();
    let _: () = c.set("k1", "later").unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let (server, mut c) = restart(dir.path());
    assert_eq!(get(&mut c, "k1").as_deref(), Some("later"));
    assert_eq!(get(&mut c, "k2").as_deref(), Some("b"));
    drop(c);
    server.handle().shutdown();
    server.wait().unwrap();
}

/// Intent files of an earlier version: a valid record is applied as one batch, one with a key
/// the store refuses (what made restarts fail) or a torn one is dropped, and all are removed.
#[test]
fn intent_files_of_an_earlier_version_are_applied_once_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let store = BytesStore::create(
        dir.path(),
        EngineKind::FastFair,
        Options::default().capacity_per_node(64 << 20),
    )
    .unwrap();
    store.close().unwrap();
    let long = vec![b'k'; 1025];
    let good = numakv_server::intent::encode(&[b"g1", b"v1", b"g2", b"v2"]);
    let bad = numakv_server::intent::encode(&[b"x1", b"v", &long, b"v"]);
    let mut torn = numakv_server::intent::encode(&[b"t1", b"v"]);
    let at = torn.len() - 1;
    torn[at] ^= 1;
    std::fs::write(dir.path().join("serve-mset.0"), good).unwrap();
    std::fs::write(dir.path().join("serve-mset.1"), bad).unwrap();
    std::fs::write(dir.path().join("serve-mset.2"), torn).unwrap();
    let (server, mut c) = restart(dir.path());
    let r = server.replayed().clone();
    assert_eq!((r.msets, r.pairs, r.refused, r.torn, r.files), (1, 2, 1, 1, 3), "{r:?}");
    assert_eq!(get(&mut c, "g1").as_deref(), Some("v1"));
    assert_eq!(get(&mut c, "g2").as_deref(), Some("v2"));
    assert_eq!(get(&mut c, "x1"), None);
    assert_eq!(get(&mut c, "t1"), None);
    let _: () = c.set("g1", "later").unwrap();
    drop(c);
    server.handle().shutdown();
    server.wait().unwrap();
    assert!(!dir.path().join("serve-mset.0").exists());
    let (server, mut c) = restart(dir.path());
    assert_eq!(server.replayed().files, 0);
    assert_eq!(get(&mut c, "g1").as_deref(), Some("later"));
    drop(c);
    server.handle().shutdown();
    server.wait().unwrap();
}

/// Clients pipeline MSETs of groups of keys (one value per group and MSET), MSETs that the
/// store must refuse whole (a 1025-byte key, an empty key), and DELs of whole groups; the
/// server is SIGKILLed under that load, ten times. Every restart succeeds, and every group is
/// whole (all its keys with one value, or none of them); no refused MSET left a key.
#[test]
fn a_server_killed_under_pipelined_msets_restarts_every_time_with_no_partial_write() {
    const GROUP: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let long = "k".repeat(1025);
    let mut restarts = 0;
    for round in 0..10u64 {
        let (mut child, url, _lines) = spawn_child(dir.path(), false, round > 0);
        restarts += usize::from(round > 0);
        let acked = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..3u64)
            .map(|t| {
                let (url, acked, stop, long) =
                    (url.clone(), Arc::clone(&acked), Arc::clone(&stop), long.clone());
                std::thread::spawn(move || {
                    let Ok(mut c) =
                        redis::Client::open(url.as_str()).and_then(|c| c.get_connection())
                    else {
                        return;
                    };
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let v = format!("{round}-{t}-{i}");
                        let mut p = redis::pipe();
                        let mut mset = redis::cmd("MSET");
                        for j in 0..GROUP {
                            mset.arg(format!("g{t}:{j}")).arg(&v);
                        }
                        p.add_command(mset);
                        p.cmd("MSET").arg(format!("bad{t}:a")).arg(&v).arg(&long).arg(&v);
                        p.cmd("MSET").arg(format!("bad{t}:b")).arg(&v).arg("").arg(&v);
                        let mut del = redis::cmd("DEL");
                        let mut mset2 = redis::cmd("MSET");
                        for j in 0..GROUP {
                            del.arg(format!("d{t}:{j}"));
                            mset2.arg(format!("d{t}:{j}")).arg(&v);
                        }
                        p.add_command(if i % 2 == 0 { mset2 } else { del });
                        // Errors come back inside the pipeline's replies; a dead server ends it.
                        let r: redis::RedisResult<Vec<redis::Value>> = p.query(&mut c);
                        match r {
                            Ok(replies) => {
                                assert!(
                                    matches!(replies[1], redis::Value::ServerError(_))
                                        && matches!(replies[2], redis::Value::ServerError(_)),
                                    "a bad MSET was accepted: {replies:?}"
                                );
                                acked.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) if e.is_io_error() || e.is_connection_dropped() => return,
                            Err(e) if e.code().is_some() => {
                                // The first server error of a pipeline (the redis crate's
                                // choice): the bad MSETs, as expected.
                                acked.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => return,
                        }
                        i += 1;
                    }
                })
            })
            .collect();
        // Kill at a different moment each round: after some pipelines were acknowledged.
        let want = 3 + round * 7;
        let t0 = std::time::Instant::now();
        while acked.load(Ordering::Relaxed) < want {
            assert!(t0.elapsed().as_secs() < 60, "round {round}: the clients made no progress");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        child.kill().unwrap(); // SIGKILL, clients mid-pipeline
        child.wait().unwrap();
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            c.join().unwrap();
        }
        // Whatever the kill interrupted: the store opens, and no group is partial.
        let store = BytesStore::open(dir.path()).expect("the store opens after a SIGKILL");
        for t in 0..3 {
            for prefix in [format!("g{t}:"), format!("d{t}:")] {
                let vals: Vec<Option<Vec<u8>>> = (0..GROUP)
                    .map(|j| store.get(format!("{prefix}{j}").as_bytes()).unwrap())
                    .collect();
                assert!(
                    vals.iter().all(|v| *v == vals[0]),
                    "round {round}: a partial MSET or DEL of {prefix}*: {vals:?}"
                );
            }
            for bad in ["a", "b"] {
                assert_eq!(store.get(format!("bad{t}:{bad}").as_bytes()).unwrap(), None);
            }
        }
        store.fsck().expect("fsck after a SIGKILL");
        store.close().unwrap();
    }
    // The tenth restart: a server again.
    let (server, c) = restart(dir.path());
    restarts += 1;
    drop(c);
    server.handle().shutdown();
    server.wait().unwrap();
    assert_eq!(restarts, 10);
}
