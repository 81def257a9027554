//! The server against a real Redis client (the `redis` crate) and raw sockets: every command,
//! pipelining, concurrent clients, binary-safe data, the error forms, protocol abuse, limits and
//! a clean SHUTDOWN. Each test runs its own server in-process on an ephemeral port.
//!
//! NUMAKV_TEST_SCALE multiplies the concurrent and pipelined counts (default 1: CI-sized).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::Duration;

use numakv::{BytesStore, EngineKind, Options};
use numakv_server::{Config, Handle, Server, ServerError};
use redis::{Commands, RedisResult, Value};

fn scale() -> usize {
    std::env::var("NUMAKV_TEST_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1).max(1)
}

struct Running {
    url: String,
    addr: std::net::SocketAddr,
    handle: Handle,
    thread: Option<JoinHandle<Result<(), ServerError>>>,
    dir: tempfile::TempDir,
}

impl Running {
    fn client(&self) -> redis::Connection {
        let c = redis::Client::open(self.url.as_str()).unwrap();
        c.get_connection().unwrap()
    }

    fn raw(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    /// Shuts down and returns the store directory (the store closed cleanly).
    fn stop(mut self) -> tempfile::TempDir {
        self.handle.shutdown();
        self.thread.take().unwrap().join().unwrap().unwrap();
        self.dir
    }
}

fn start_with(engine: EngineKind, config: Config) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let store =
        BytesStore::create(dir.path(), engine, Options::default().capacity_per_node(256 << 20))
            .unwrap();
    let server = Server::start(store, Config { bind: "127.0.0.1:0".into(), ..config }).unwrap();
    let addr = server.local_addr();
    let handle = server.handle();
    let thread = std::thread::spawn(move || server.wait());
    Running { url: format!("redis://{addr}/"), addr, handle, thread: Some(thread), dir }
}

fn start() -> Running {
    start_with(EngineKind::FastFair, Config { threads: 2, ..Config::default() })
}

fn err_text<T: std::fmt::Debug>(r: RedisResult<T>) -> String {
    let e = r.expect_err("expected an error reply");
    format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or(""))
}

#[test]
fn strings_commands() {
    let srv = start();
    let mut c = srv.client();
    assert_eq!(redis::cmd("PING").query::<String>(&mut c).unwrap(), "PONG");
    assert_eq!(redis::cmd("PING").arg("hi").query::<String>(&mut c).unwrap(), "hi");
    assert_eq!(redis::cmd("ECHO").arg("x y").query::<String>(&mut c).unwrap(), "x y");
    let _: () = c.set("user:1", "hello").unwrap();
    assert_eq!(c.get::<_, Option<String>>("user:1").unwrap().as_deref(), Some("hello"));
    assert_eq!(c.get::<_, Option<String>>("nope").unwrap(), None);
    // NX / XX / GET.
    let nx: Option<String> =
        redis::cmd("SET").arg("user:1").arg("x").arg("NX").query(&mut c).unwrap();
    assert_eq!(nx, None);
    let nx: Option<String> =
        redis::cmd("SET").arg("user:2").arg("two").arg("NX").query(&mut c).unwrap();
    assert_eq!(nx.as_deref(), Some("OK"));
    let xx: Option<String> =
        redis::cmd("SET").arg("user:3").arg("x").arg("XX").query(&mut c).unwrap();
    assert_eq!(xx, None);
    assert!(!c.exists::<_, bool>("user:3").unwrap());
    let xx: Option<String> =
        redis::cmd("SET").arg("user:2").arg("2").arg("XX").query(&mut c).unwrap();
    assert_eq!(xx.as_deref(), Some("OK"));
    let old: Option<String> =
        redis::cmd("SET").arg("user:2").arg("II").arg("GET").query(&mut c).unwrap();
    assert_eq!(old.as_deref(), Some("2"));
    let old: Option<String> =
        redis::cmd("SET").arg("new").arg("v").arg("GET").query(&mut c).unwrap();
    assert_eq!(old, None);
    assert_eq!(c.get::<_, String>("new").unwrap(), "v");
    let ok: String = redis::cmd("SET").arg("new").arg("w").arg("KEEPTTL").query(&mut c).unwrap();
    assert_eq!(ok, "OK");
    // EXISTS counts repeats, DEL counts what it removed.
    assert_eq!(c.exists::<_, i64>(&["user:1", "user:1", "zz"]).unwrap(), 2);
    assert_eq!(c.del::<_, i64>(&["new", "zz"]).unwrap(), 1);
    // MSET / MGET.
    let _: () = c.mset(&[("a", "1"), ("b", "2"), ("c", "3")]).unwrap();
    let v: Vec<Option<String>> = c.mget(&["a", "zz", "c"]).unwrap();
    assert_eq!(v, [Some("1".into()), None, Some("3".into())]);
    // INCR family.
    assert_eq!(c.incr::<_, _, i64>("n", 1).unwrap(), 1);
    assert_eq!(c.incr::<_, _, i64>("n", 41).unwrap(), 42);
    assert_eq!(c.decr::<_, _, i64>("n", 1).unwrap(), 41);
    assert_eq!(redis::cmd("DECR").arg("n").query::<i64>(&mut c).unwrap(), 40);
    assert_eq!(redis::cmd("INCR").arg("n").query::<i64>(&mut c).unwrap(), 41);
    assert_eq!(c.get::<_, String>("n").unwrap(), "41");
    // STRLEN / APPEND.
    assert_eq!(c.strlen::<_, i64>("user:1").unwrap(), 5);
    assert_eq!(c.strlen::<_, i64>("zz").unwrap(), 0);
    assert_eq!(c.append::<_, _, i64>("user:1", " world").unwrap(), 11);
    assert_eq!(c.append::<_, _, i64>("fresh", "abc").unwrap(), 3);
    assert_eq!(c.get::<_, String>("user:1").unwrap(), "hello world");
    assert_eq!(redis::cmd("TYPE").arg("a").query::<String>(&mut c).unwrap(), "string");
    assert_eq!(redis::cmd("TYPE").arg("zz").query::<String>(&mut c).unwrap(), "none");
    // Keys now: a b c fresh n user:1 user:2.
    assert_eq!(redis::cmd("DBSIZE").query::<i64>(&mut c).unwrap(), 7);
    let keys: Vec<String> = c.keys("*").unwrap();
    assert_eq!(keys, ["a", "b", "c", "fresh", "n", "user:1", "user:2"]);
    let keys: Vec<String> = c.keys("user:*").unwrap();
    assert_eq!(keys, ["user:1", "user:2"]);
    let keys: Vec<String> = c.keys("[ab]").unwrap();
    assert_eq!(keys, ["a", "b"]);
    // SELECT, CLIENT, QUIT.
    assert_eq!(redis::cmd("SELECT").arg(0).query::<String>(&mut c).unwrap(), "OK");
    assert_eq!(
        err_text(redis::cmd("SELECT").arg(1).query::<String>(&mut c)),
        "ERR DB index is out of range"
    );
    let _: () = redis::cmd("CLIENT").arg("SETNAME").arg("tester").query(&mut c).unwrap();
    let name: String = redis::cmd("CLIENT").arg("GETNAME").query(&mut c).unwrap();
    assert_eq!(name, "tester");
    assert!(redis::cmd("CLIENT").arg("ID").query::<i64>(&mut c).unwrap() > 0);
    // FLUSHDB / FLUSHALL.
    let _: () = redis::cmd("FLUSHDB").query(&mut c).unwrap();
    assert_eq!(redis::cmd("DBSIZE").query::<i64>(&mut c).unwrap(), 0);
    let _: () = c.set("x", "1").unwrap();
    let _: () = redis::cmd("FLUSHALL").arg("SYNC").query(&mut c).unwrap();
    assert_eq!(c.keys::<_, Vec<String>>("*").unwrap(), Vec::<String>::new());
    assert_eq!(redis::cmd("QUIT").query::<String>(&mut c).unwrap(), "OK");
    srv.stop();
}

#[test]
fn scan_walks_keys_in_byte_order() {
    let srv = start();
    let mut c = srv.client();
    let n = 300 * scale();
    let mut all: Vec<Vec<u8>> = Vec::new();
    let mut p = redis::pipe();
    for i in 0..n {
        let k = if i % 3 == 0 { format!("user:{i:05}") } else { format!("item:{i:05}") };
        p.set(&k, i).ignore();
        all.push(k.into_bytes());
    }
    p.set(b"\xffhigh".as_slice(), 1).ignore().set(b"\x00low".as_slice(), 1).ignore();
    all.push(b"\xffhigh".to_vec());
    all.push(b"\x00low".to_vec());
    let _: () = p.query(&mut c).unwrap();
    all.sort();
    // The client drives the cursor (redis-rs parses it as a number).
    let seen: Vec<Vec<u8>> = c.scan::<Vec<u8>>().unwrap().collect();
    assert_eq!(seen, all, "SCAN yields every key once, in byte order");
    let users: Vec<String> = c.scan_match("user:*").unwrap().collect();
    let want: Vec<String> = (0..n).filter(|i| i % 3 == 0).map(|i| format!("user:{i:05}")).collect();
    assert_eq!(users, want);
    // COUNT bounds the keys examined per call, MATCH filters them; the cursor ends at "0".
    let (mut cursor, mut calls, mut got) = ("0".to_string(), 0, Vec::<String>::new());
    loop {
        let (next, keys): (String, Vec<String>) = redis::cmd("SCAN")
            .arg(&cursor)
            .arg("MATCH")
            .arg("*:000[0-4]?")
            .arg("COUNT")
            .arg(7)
            .query(&mut c)
            .unwrap();
        assert!(keys.len() <= 7);
        got.extend(keys);
        calls += 1;
        if next == "0" {
            break;
        }
        cursor = next;
    }
    let want: Vec<String> = (0..50.min(n))
        .map(|i| if i % 3 == 0 { format!("user:{i:05}") } else { format!("item:{i:05}") })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(got, want);
    assert!(calls >= 50 / 7, "{calls} calls");
    assert_eq!(
        err_text(redis::cmd("SCAN").arg("nope").query::<Value>(&mut c)),
        "ERR invalid cursor"
    );
    assert_eq!(
        err_text(redis::cmd("SCAN").arg("123456789").query::<Value>(&mut c)),
        "ERR invalid cursor"
    );
    srv.stop();
}

#[test]
fn error_forms_match_redis() {
    let srv = start();
    let mut c = srv.client();
    assert_eq!(
        err_text(redis::cmd("FOO").arg("a").arg("b c").query::<Value>(&mut c)),
        "ERR unknown command 'FOO', with args beginning with: 'a' 'b c' "
    );
    assert_eq!(
        err_text(redis::cmd("GET").query::<Value>(&mut c)),
        "ERR wrong number of arguments for 'get' command"
    );
    assert_eq!(
        err_text(redis::cmd("MSET").arg("a").arg("1").arg("b").query::<Value>(&mut c)),
        "ERR wrong number of arguments for 'mset' command"
    );
    assert_eq!(
        err_text(redis::cmd("SET").arg("k").arg("v").arg("EX").arg(10).query::<Value>(&mut c)),
        "ERR SET EX is not supported: numakv keys do not expire"
    );
    assert_eq!(
        err_text(redis::cmd("SET").arg("k").arg("v").arg("PX").arg(10).query::<Value>(&mut c)),
        "ERR SET PX is not supported: numakv keys do not expire"
    );
    assert_eq!(
        err_text(redis::cmd("SET").arg("k").arg("v").arg("NX").arg("XX").query::<Value>(&mut c)),
        "ERR syntax error"
    );
    let _: () = c.set("s", "abc").unwrap();
    assert_eq!(
        err_text(c.incr::<_, _, i64>("s", 1)),
        "ERR value is not an integer or out of range"
    );
    assert_eq!(
        err_text(redis::cmd("INCRBY").arg("n").arg("1.5").query::<i64>(&mut c)),
        "ERR value is not an integer or out of range"
    );
    let _: () = c.set("big", i64::MAX).unwrap();
    assert_eq!(
        err_text(c.incr::<_, _, i64>("big", 1)),
        "ERR increment or decrement would overflow"
    );
    assert_eq!(c.get::<_, i64>("big").unwrap(), i64::MAX, "a refused INCR changes nothing");
    // The store's own limits come back as errors, and the connection stays usable.
    assert_eq!(err_text(c.set::<_, _, ()>("", "v")), "ERR empty keys are not supported by numakv");
    let long_key = vec![b'k'; numakv::MAX_KEY_LEN + 1];
    assert!(err_text(c.set::<_, _, ()>(long_key, "v")).starts_with("ERR "));
    assert_eq!(c.get::<_, String>("s").unwrap(), "abc");
    assert_eq!(
        err_text(redis::cmd("HELLO").arg(4).query::<Value>(&mut c)),
        "NOPROTO sorry, this protocol version is not supported"
    );
    srv.stop();
}

/// RESP3 (`HELLO 3`, which the redis crate sends for `?protocol=resp3`): nulls are `_`, HELLO
/// and CONFIG GET are maps; the rest reads as in RESP2.
#[test]
fn resp3_with_the_redis_crate_and_raw() {
    let srv = start();
    let mut c = redis::Client::open(format!("{}?protocol=resp3", srv.url).as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let hello: Value = redis::cmd("HELLO").arg(3).query(&mut c).unwrap();
    let Value::Map(props) = &hello else { panic!("HELLO 3 is not a map: {hello:?}") };
    assert!(props.contains(&(Value::BulkString(b"proto".to_vec()), Value::Int(3))), "{hello:?}");
    let _: () = c.set("k", "v").unwrap();
    assert_eq!(c.get::<_, Option<String>>("k").unwrap().as_deref(), Some("v"));
    assert_eq!(redis::cmd("GET").arg("missing").query::<Value>(&mut c).unwrap(), Value::Nil);
    let vals: Vec<Option<String>> = c.mget(&["k", "missing"]).unwrap();
    assert_eq!(vals, [Some("v".to_owned()), None]);
    assert_eq!(c.incr::<_, _, i64>("n", 5).unwrap(), 5);
    let cfg: Value = redis::cmd("CONFIG").arg("GET").arg("appendonly").query(&mut c).unwrap();
    assert_eq!(
        cfg,
        Value::Map(vec![(
            Value::BulkString(b"appendonly".to_vec()),
            Value::BulkString(b"no".to_vec())
        )])
    );
    let keys: Vec<String> = c.keys("*").unwrap();
    assert_eq!(keys, ["k", "n"]);
    // On the wire: the null of RESP3, a map header; HELLO 2 goes back to RESP2.
    let mut s = srv.raw();
    s.write_all(b"HELLO 3\r\nGET missing\r\nMGET k missing\r\nHELLO 2\r\nGET missing\r\n").unwrap();
    let mut got = Vec::new();
    let want_end = b"$-1\r\n";
    let mut buf = [0u8; 4096];
    while !got.ends_with(want_end) {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("%7\r\n"), "{text}");
    assert!(text.contains("$5\r\nproto\r\n:3\r\n"), "{text}");
    assert!(text.contains("_\r\n*2\r\n$1\r\nv\r\n_\r\n*14\r\n"), "{text}");
    assert!(text.contains("$5\r\nproto\r\n:2\r\n"), "{text}");
    srv.stop();
}

#[test]
fn introspection_for_clients() {
    let srv = start();
    let mut c = srv.client();
    let _: () = c.set("k", "v").unwrap();
    let info: String = redis::cmd("INFO").query(&mut c).unwrap();
    for needle in [
        "# Server",
        "redis_version:",
        "# Keyspace",
        "db0:keys=1,",
        "# numakv",
        "engine:fastfair",
        "pm_bytes:",
    ] {
        assert!(info.contains(needle), "INFO lacks {needle:?}:\n{info}");
    }
    let only: String = redis::cmd("INFO").arg("numakv").query(&mut c).unwrap();
    assert!(only.starts_with("# numakv") && !only.contains("# Server"), "{only}");
    let cfg: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("save").query(&mut c).unwrap();
    assert_eq!(cfg, ["save", ""]);
    let cfg: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("appendonly").query(&mut c).unwrap();
    assert_eq!(cfg, ["appendonly", "no"]);
    let cfg: Vec<String> =
        redis::cmd("CONFIG").arg("GET").arg("no-such-thing").query(&mut c).unwrap();
    assert!(cfg.is_empty());
    let n: i64 = redis::cmd("COMMAND").arg("COUNT").query(&mut c).unwrap();
    let all: Vec<Value> = redis::cmd("COMMAND").query(&mut c).unwrap();
    assert_eq!(all.len() as i64, n);
    let docs: Vec<Value> = redis::cmd("COMMAND").arg("DOCS").arg("get").query(&mut c).unwrap();
    assert_eq!(docs.len(), 2, "name + doc map: {docs:?}");
    let hello: Vec<Value> = redis::cmd("HELLO").arg(2).query(&mut c).unwrap();
    assert!(hello.len() >= 6);
    srv.stop();
}

#[test]
fn binary_safe_keys_and_values() {
    let srv = start();
    let mut c = srv.client();
    let all_bytes: Vec<u8> = (0..=255u8).collect();
    let keys: [&[u8]; 5] = [b"\x00", b"a\r\nb", b"\xff\xfe", b"k\x00ey", &all_bytes];
    for (i, k) in keys.iter().enumerate() {
        let mut v = all_bytes.clone();
        v.rotate_left(i);
        let _: () = c.set(*k, &v).unwrap();
    }
    for (i, k) in keys.iter().enumerate() {
        let mut v = all_bytes.clone();
        v.rotate_left(i);
        assert_eq!(c.get::<_, Vec<u8>>(*k).unwrap(), v);
    }
    let big = vec![0xabu8; numakv::MAX_VALUE_LEN];
    let _: () = c.set("big", &big).unwrap();
    assert_eq!(c.get::<_, Vec<u8>>("big").unwrap(), big);
    let empty: Vec<u8> = Vec::new();
    let _: () = c.set("empty", &empty).unwrap();
    assert_eq!(c.get::<_, Option<Vec<u8>>>("empty").unwrap(), Some(vec![]));
    srv.stop();
}

#[test]
fn pipelining_keeps_order() {
    let srv = start();
    let mut c = srv.client();
    let n = 2000 * scale();
    let mut p = redis::pipe();
    for i in 0..n {
        p.set(format!("p{i}"), i).ignore();
        p.incr("pc", 1);
    }
    let counts: Vec<i64> = p.query(&mut c).unwrap();
    assert_eq!(counts, (1..=n as i64).collect::<Vec<_>>());
    let mut p = redis::pipe();
    for i in 0..n {
        p.get(format!("p{i}"));
    }
    let vals: Vec<usize> = p.query(&mut c).unwrap();
    assert_eq!(vals, (0..n).collect::<Vec<_>>());
    // A raw pipeline in one write, split anywhere by TCP, answered in order.
    let mut s = srv.raw();
    let mut req = Vec::new();
    for i in 0..100 {
        req.extend_from_slice(
            format!("*2\r\n$4\r\nECHO\r\n${}\r\n{i}\r\n", i.to_string().len()).as_bytes(),
        );
    }
    req.extend_from_slice(b"PING\r\n");
    s.write_all(&req).unwrap();
    let mut r = BufReader::new(s);
    for i in 0..100 {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert_eq!(line, format!("${}\r\n", i.to_string().len()));
        line.clear();
        r.read_line(&mut line).unwrap();
        assert_eq!(line, format!("{i}\r\n"));
    }
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line, "+PONG\r\n");
    srv.stop();
}

/// 32 clients INCR one key at once: the total is exact (the striped lock serialises each
/// read-modify-write). APPEND of fixed-size pieces likewise keeps every piece.
#[test]
fn concurrent_incr_loses_no_update() {
    let srv = start_with(EngineKind::NbTree, Config { threads: 4, ..Config::default() });
    let clients = 32;
    let per = 500 * scale();
    std::thread::scope(|s| {
        for t in 0..clients {
            let srv = &srv;
            s.spawn(move || {
                let mut c = srv.client();
                for i in 0..per {
                    let _: i64 = c.incr("counter", 1).unwrap();
                    if i % 10 == 0 {
                        let _: i64 = c.append("log", format!("{t:02}")).unwrap();
                    }
                }
            });
        }
    });
    let mut c = srv.client();
    assert_eq!(c.get::<_, i64>("counter").unwrap(), (clients * per) as i64);
    assert_eq!(c.strlen::<_, usize>("log").unwrap(), clients * per.div_ceil(10) * 2);
    srv.stop();
}

#[test]
fn malformed_frame_closes_only_that_connection() {
    let srv = start();
    let mut good = srv.client();
    let _: () = good.set("k", "v").unwrap();
    for (bad, want) in [
        (&b"*1\r\n:5\r\n"[..], "-ERR Protocol error: expected '$', got ':'\r\n"),
        (b"*2\r\n$3\r\nGET\r\n$abc\r\n", "-ERR Protocol error: invalid bulk length\r\n"),
        (b"*-5x\r\n", "-ERR Protocol error: invalid multibulk length\r\n"),
        (b"*1\r\n*1\r\n*1\r\n*1\r\n", "-ERR Protocol error: expected '$', got '*'\r\n"),
    ] {
        let mut s = srv.raw();
        s.write_all(bad).unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).unwrap(); // ends: the server closed the connection
        assert_eq!(got, want);
    }
    assert_eq!(good.get::<_, String>("k").unwrap(), "v", "other connections are unaffected");
    srv.stop();
}

#[test]
fn huge_bulk_length_refused_before_the_bytes_arrive() {
    let srv = start();
    let mut s = srv.raw();
    // 4 GiB announced, nothing sent after the header: the refusal cannot have waited for it.
    s.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4294967296\r\n").unwrap();
    let mut got = String::new();
    s.read_to_string(&mut got).unwrap();
    assert_eq!(got, "-ERR Protocol error: invalid bulk length\r\n");
    // Just over the value limit is refused too; at the limit is served (binary_safe test).
    let mut s = srv.raw();
    let len = numakv_server::Config::default().limits.max_bulk + 1;
    s.write_all(format!("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n${len}\r\n").as_bytes()).unwrap();
    let mut got = String::new();
    s.read_to_string(&mut got).unwrap();
    assert_eq!(got, "-ERR Protocol error: invalid bulk length\r\n");
    assert_eq!(srv.client().get::<_, Option<String>>("k").unwrap(), None);
    srv.stop();
}

#[test]
fn inline_commands() {
    let srv = start();
    let mut s = srv.raw();
    s.write_all(b"SET greeting \"hello world\"\r\nGET greeting\r\nPING\n").unwrap();
    let mut r = BufReader::new(s);
    let mut out = String::new();
    for _ in 0..4 {
        r.read_line(&mut out).unwrap();
    }
    assert_eq!(out, "+OK\r\n$11\r\nhello world\r\n+PONG\r\n");
    srv.stop();
}

#[test]
fn max_clients_refuses_extra_connections() {
    let srv = start_with(
        EngineKind::FastFair,
        Config { threads: 2, max_clients: 2, ..Config::default() },
    );
    let mut a = srv.client();
    let mut b = srv.client();
    assert_eq!(redis::cmd("PING").query::<String>(&mut a).unwrap(), "PONG");
    let mut s = srv.raw();
    let mut got = String::new();
    s.read_to_string(&mut got).unwrap();
    assert_eq!(got, "-ERR max number of clients reached\r\n");
    assert_eq!(redis::cmd("PING").query::<String>(&mut b).unwrap(), "PONG");
    drop(a);
    // The slot frees once the server sees the close.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = srv.raw();
        s.write_all(b"PING\r\n").unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        if line == "+PONG\r\n" {
            break;
        }
        assert_eq!(line, "-ERR max number of clients reached\r\n");
        assert!(std::time::Instant::now() < deadline, "slot never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    srv.stop();
}

#[test]
fn shutdown_command_closes_the_store_cleanly() {
    let srv = start();
    let mut c = srv.client();
    let _: () = c.set("kept", "yes").unwrap();
    // SHUTDOWN gets no reply: the connection closes.
    let r: RedisResult<Value> = redis::cmd("SHUTDOWN").query(&mut c);
    assert!(r.is_err(), "{r:?}");
    let Running { mut thread, dir, .. } = srv;
    thread.take().unwrap().join().unwrap().unwrap();
    let store = BytesStore::open(dir.path()).unwrap();
    assert!(store.recovery().unwrap().was_clean, "SHUTDOWN closed the store cleanly");
    assert_eq!(store.get(b"kept").unwrap().as_deref(), Some(&b"yes"[..]));
    store.close().unwrap();
}
