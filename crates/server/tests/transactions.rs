//! Multi-key writes and transactions against the `redis` crate and raw sockets: MSET, MSETNX
//! and DEL of several keys are all or nothing (a bad argument or a full store writes nothing
//! and answers an error); MULTI/EXEC/DISCARD/WATCH behave as redis-server's (QUEUED, EXECABORT
//! after a queued error, EXEC isolated from other clients, WATCH aborting EXEC). Each test runs
//! its own server in-process on an ephemeral port.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::Duration;

use numakv::{BytesStore, EngineKind, Options};
use numakv_server::{Config, Handle, Server, ServerError};
use redis::{Commands, RedisResult};

fn scale() -> usize {
    std::env::var("NUMAKV_TEST_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1).max(1)
}

struct Running {
    url: String,
    addr: std::net::SocketAddr,
    handle: Handle,
    thread: Option<JoinHandle<Result<(), ServerError>>>,
    _dir: tempfile::TempDir,
}

impl Running {
    fn client(&self) -> redis::Connection {
        redis::Client::open(self.url.as_str()).unwrap().get_connection().unwrap()
    }

    fn raw(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let r = t.join().unwrap();
            if !std::thread::panicking() {
                r.unwrap();
            }
        }
    }
}

fn start_with_capacity(capacity: u64) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let store = BytesStore::create(
        dir.path(),
        EngineKind::FastFair,
        Options::default().capacity_per_node(capacity),
    )
    .unwrap();
    let config = Config { bind: "127.0.0.1:0".into(), threads: 2, ..Config::default() };
    let server = Server::start(store, config).unwrap();
    let addr = server.local_addr();
    let handle = server.handle();
    let thread = std::thread::spawn(move || server.wait());
    Running { url: format!("redis://{addr}/"), addr, handle, thread: Some(thread), _dir: dir }
}

fn start() -> Running {
    start_with_capacity(64 << 20)
}

fn err_text<T: std::fmt::Debug>(r: RedisResult<T>) -> String {
    let e = r.expect_err("expected an error reply");
    format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or(""))
}

/// Sends `req` on a raw socket and reads until the reply holds `want_lines` CRLF-ended lines.
fn raw_exchange(s: &mut TcpStream, req: &[u8], want_lines: usize) -> String {
    s.write_all(req).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.windows(2).filter(|w| w == b"\r\n").count() < want_lines {
        let n = s.read(&mut buf).expect("reply");
        assert!(n > 0, "connection closed; got {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

fn keys(c: &mut redis::Connection) -> Vec<String> {
    let mut k: Vec<String> = c.keys("*").unwrap();
    k.sort();
    k
}

#[test]
fn mset_with_a_bad_argument_writes_nothing() {
    let srv = start();
    let mut c = srv.client();
    let long = "k".repeat(1025);
    for (what, bad) in [("1025-byte key", long.as_str()), ("empty key", "")] {
        let r: RedisResult<()> = redis::cmd("MSET")
            .arg("a")
            .arg("1")
            .arg("b")
            .arg("2")
            .arg(bad)
            .arg("3")
            .arg("d")
            .arg("4")
            .query(&mut c);
        let e = err_text(r);
        assert!(e.starts_with("ERR"), "{what}: {e}");
        assert_eq!(keys(&mut c), Vec::<String>::new(), "{what}: MSET wrote part of its pairs");
        // MSETNX the same.
        let r: RedisResult<i64> =
            redis::cmd("MSETNX").arg("a").arg("1").arg(bad).arg("3").query(&mut c);
        assert!(err_text(r).starts_with("ERR"), "{what}: MSETNX");
        assert_eq!(keys(&mut c), Vec::<String>::new(), "{what}: MSETNX wrote");
    }
    // A value over 1 MiB is refused by the request limits before the command runs; the keys
    // before it are not written either.
    let _: () = c.set("x", "1").unwrap();
    let _: () = c.set("y", "2").unwrap();
    // DEL with an empty key among others: nothing deleted, an error.
    let r: RedisResult<i64> = redis::cmd("DEL").arg("x").arg("").arg("y").query(&mut c);
    assert!(err_text(r).starts_with("ERR"));
    assert_eq!(keys(&mut c), ["x", "y"], "DEL deleted part of its keys");
    // The good forms.
    let _: () = redis::cmd("MSET").arg("a").arg("1").arg("b").arg("2").query(&mut c).unwrap();
    let n: i64 = redis::cmd("DEL").arg("a").arg("b").arg("a").arg("nope").query(&mut c).unwrap();
    assert_eq!(n, 2, "DEL counts each key it removed once");
}

#[test]
fn msetnx_sets_all_or_none() {
    let srv = start();
    let mut c = srv.client();
    let n: i64 = redis::cmd("MSETNX").arg("a").arg("1").arg("b").arg("2").query(&mut c).unwrap();
    assert_eq!(n, 1);
    let n: i64 = redis::cmd("MSETNX").arg("c").arg("3").arg("a").arg("9").query(&mut c).unwrap();
    assert_eq!(n, 0);
    assert_eq!(c.get::<_, Option<String>>("c").unwrap(), None);
    assert_eq!(c.get::<_, Option<String>>("a").unwrap().as_deref(), Some("1"));
    let r: RedisResult<i64> = redis::cmd("MSETNX").arg("a").arg("1").arg("b").query(&mut c);
    assert!(err_text(r).contains("wrong number of arguments"));
}

#[test]
fn a_full_store_writes_nothing() {
    let srv = start_with_capacity(8 << 20);
    let mut c = srv.client();
    let value = vec![b'v'; 8 << 10];
    let mut n = 0;
    loop {
        match c.set::<_, _, ()>(format!("fill:{n:06}"), &value) {
            Ok(()) => n += 1,
            Err(e) => {
                assert!(format!("{e}").contains("out of persistent memory"), "{e}");
                break;
            }
        }
        assert!(n < 10_000, "the store never filled");
    }
    let before = keys(&mut c);
    let mut rejected = 0;
    for round in 0..20 {
        let mut cmd = redis::cmd("MSET");
        for j in 0..8 {
            cmd.arg(format!("new:{round}:{j}")).arg(&value);
        }
        if let Err(e) = cmd.query::<()>(&mut c) {
            assert!(format!("{e}").contains("out of persistent memory"), "{e}");
            rejected += 1;
            assert_eq!(keys(&mut c), before, "round {round}: a failed MSET wrote something");
        } else {
            panic!("round {round}: an MSET of 64 KiB fit in a full store");
        }
    }
    assert_eq!(rejected, 20);
}

#[test]
fn multi_exec_queues_and_runs_in_order() {
    let srv = start();
    let mut c = srv.client();
    let _: () = c.set("n", "10").unwrap();
    // redis-rs's atomic pipeline: MULTI, the commands, EXEC; it returns EXEC's array.
    let (a, b, n, g): (i64, i64, i64, Option<String>) =
        redis::pipe().atomic().incr("n", 1).incr("n", 5).del("n").get("n").query(&mut c).unwrap();
    assert_eq!((a, b, n, g), (11, 16, 1, None));
    // Raw: QUEUED replies, and EXEC's array holding each reply (a runtime error in place).
    let mut s = srv.raw();
    assert_eq!(raw_exchange(&mut s, b"MULTI\r\n", 1), "+OK\r\n");
    assert_eq!(raw_exchange(&mut s, b"SET k v\r\n", 1), "+QUEUED\r\n");
    assert_eq!(raw_exchange(&mut s, b"INCR k\r\n", 1), "+QUEUED\r\n");
    assert_eq!(raw_exchange(&mut s, b"GET k\r\n", 1), "+QUEUED\r\n");
    let exec = raw_exchange(&mut s, b"EXEC\r\n", 5);
    assert_eq!(exec, "*3\r\n+OK\r\n-ERR value is not an integer or out of range\r\n$1\r\nv\r\n");
    // Errors of the MULTI state machine.
    assert_eq!(raw_exchange(&mut s, b"EXEC\r\n", 1), "-ERR EXEC without MULTI\r\n");
    assert_eq!(raw_exchange(&mut s, b"DISCARD\r\n", 1), "-ERR DISCARD without MULTI\r\n");
    assert_eq!(raw_exchange(&mut s, b"MULTI\r\n", 1), "+OK\r\n");
    assert_eq!(raw_exchange(&mut s, b"MULTI\r\n", 1), "-ERR MULTI calls can not be nested\r\n");
    assert_eq!(
        raw_exchange(&mut s, b"WATCH k\r\n", 1),
        "-ERR WATCH inside MULTI is not allowed\r\n"
    );
    assert_eq!(raw_exchange(&mut s, b"SET k w\r\n", 1), "+QUEUED\r\n");
    assert_eq!(raw_exchange(&mut s, b"DISCARD\r\n", 1), "+OK\r\n");
    assert_eq!(c.get::<_, Option<String>>("k").unwrap().as_deref(), Some("v"), "DISCARD ran");
}

#[test]
fn a_queued_syntax_error_aborts_exec() {
    let srv = start();
    let mut s = srv.raw();
    assert_eq!(raw_exchange(&mut s, b"MULTI\r\n", 1), "+OK\r\n");
    assert_eq!(raw_exchange(&mut s, b"SET a 1\r\n", 1), "+QUEUED\r\n");
    let wrong = raw_exchange(&mut s, b"SET b\r\n", 1);
    assert_eq!(wrong, "-ERR wrong number of arguments for 'set' command\r\n");
    let unknown = raw_exchange(&mut s, b"FROB x\r\n", 1);
    assert!(unknown.starts_with("-ERR unknown command 'FROB'"), "{unknown}");
    assert_eq!(
        raw_exchange(&mut s, b"EXEC\r\n", 1),
        "-EXECABORT Transaction discarded because of previous errors.\r\n"
    );
    let mut c = srv.client();
    assert_eq!(c.get::<_, Option<String>>("a").unwrap(), None, "an aborted EXEC wrote");
    // The connection left the MULTI state.
    assert_eq!(raw_exchange(&mut s, b"GET a\r\n", 1), "$-1\r\n");
}

#[test]
fn watch_aborts_exec_when_a_watched_key_changed() {
    let srv = start();
    let mut c = srv.client();
    let mut other = srv.client();
    let _: () = c.set("w", "1").unwrap();
    let _: () = redis::cmd("WATCH").arg("w").query(&mut c).unwrap();
    let _: () = other.set("w", "2").unwrap();
    let r: Option<(String,)> = redis::pipe().atomic().set("x", "from-tx").query(&mut c).unwrap();
    assert_eq!(r, None, "EXEC ran although a watched key changed");
    assert_eq!(other.get::<_, Option<String>>("x").unwrap(), None);
    // Unchanged watched keys: EXEC runs; UNWATCH forgets.
    let _: () = redis::cmd("WATCH").arg("w").arg("nope").query(&mut c).unwrap();
    let r: Option<(String,)> = redis::pipe().atomic().set("x", "ok").query(&mut c).unwrap();
    assert_eq!(r, Some(("OK".to_owned(),)));
    let _: () = redis::cmd("WATCH").arg("w").query(&mut c).unwrap();
    let _: () = other.del("w").unwrap();
    let _: () = redis::cmd("UNWATCH").query(&mut c).unwrap();
    let r: Option<(String,)> = redis::pipe().atomic().set("x", "again").query(&mut c).unwrap();
    assert_eq!(r, Some(("OK".to_owned(),)));
    // A watched key deleted by a multi-key DEL, or written by an MSET, aborts too.
    for change in [&["DEL", "q", "w"][..], &["MSET", "q", "1", "w", "3"][..]] {
        let _: () = c.set("w", "0").unwrap();
        let _: () = redis::cmd("WATCH").arg("w").query(&mut c).unwrap();
        let _: () = redis::cmd(change[0]).arg(&change[1..]).query(&mut other).unwrap();
        let r: Option<(String,)> = redis::pipe().atomic().set("x", "no").query(&mut c).unwrap();
        assert_eq!(r, None, "{change:?} did not abort the EXEC");
    }
}

/// The `redis` crate's WATCH retry loop (`redis::transaction`) from several clients at once
/// increments a counter exactly once per loop: EXEC is isolated and WATCH catches every race.
#[test]
fn watch_retry_loops_lose_no_update() {
    let srv = start();
    let (clients, rounds) = (4, 50 * scale());
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let mut c = srv.client();
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    let _: () = redis::transaction(&mut c, &["counter"], |c, pipe| {
                        let v: Option<i64> = c.get("counter")?;
                        pipe.set("counter", v.unwrap_or(0) + 1).ignore().query(c)
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut c = srv.client();
    assert_eq!(c.get::<_, i64>("counter").unwrap(), (clients * rounds) as i64);
}

/// EXEC runs as one: a client reading the two keys a transaction moves a value between never
/// sees the value in both or in neither. Timing-dependent (the window is a few microseconds): it
/// did not catch EXEC holding the gate only shared in 200 rounds; a forced version needs the
/// commands on plain threads (as lib.rs's interleavings), not behind tokio's LIFO slot.
#[test]
fn exec_is_isolated_from_other_clients() {
    let srv = start();
    let mut c = srv.client();
    let _: () = c.set("left", "token").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let mut r = srv.client();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (l, rt): (Option<String>, Option<String>) =
                    redis::cmd("MGET").arg("left").arg("right").query(&mut r).unwrap();
                assert!(l.is_some() != rt.is_some(), "saw left={l:?} right={rt:?}");
                reads += 1;
            }
            reads
        })
    };
    for i in 0..(200 * scale()) {
        let (from, to) = if i % 2 == 0 { ("left", "right") } else { ("right", "left") };
        let _: () = redis::pipe()
            .atomic()
            .del(from)
            .ignore()
            .set(to, "token")
            .ignore()
            .query(&mut c)
            .unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
}
