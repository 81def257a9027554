//! Blind review of the server's transactions (docs/design.md, "Transactions"): UNWATCH queued
//! inside MULTI must not forget the WATCHed keys before EXEC checks them (Redis queues it and
//! EXEC still aborts). Only tests that fail on the code reviewed are kept.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::Duration;

use numakv::{BytesStore, EngineKind, Options};
use numakv_server::{Config, Handle, Server, ServerError};
use redis::Commands;

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

/// Redis: inside MULTI, UNWATCH is queued (`+QUEUED`) like any command but EXEC, DISCARD,
/// MULTI, WATCH and QUIT (and the design doc says the same); EXEC checks the watched keys before
/// running the queue, so a watched key changed before EXEC aborts it (`*-1`). Here UNWATCH runs
/// at once: it answers `+OK` and forgets the watch, and the EXEC runs although `w` changed.
#[test]
fn review_unwatch_inside_multi_is_queued_and_exec_still_aborts() {
    let srv = start();
    let mut c = srv.raw();
    let mut other = srv.client();
    assert_eq!(raw_exchange(&mut c, b"SET w 0\r\n", 1), "+OK\r\n");
    assert_eq!(raw_exchange(&mut c, b"WATCH w\r\n", 1), "+OK\r\n");
    let _: () = other.set("w", "changed").unwrap();
    assert_eq!(raw_exchange(&mut c, b"MULTI\r\n", 1), "+OK\r\n");
    let unwatch = raw_exchange(&mut c, b"UNWATCH\r\n", 1);
    assert_eq!(raw_exchange(&mut c, b"SET x tx\r\n", 1), "+QUEUED\r\n");
    let exec = raw_exchange(&mut c, b"EXEC\r\n", 1);
    let x: Option<String> = other.get("x").unwrap();
    assert!(
        unwatch == "+QUEUED\r\n" && exec == "*-1\r\n" && x.is_none(),
        "UNWATCH inside MULTI answered {unwatch:?}; EXEC after a watched key changed answered \
         {exec:?}; x = {x:?} (Redis: +QUEUED, *-1, x unset)"
    );
}
