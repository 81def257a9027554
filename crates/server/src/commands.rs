//! The commands: Redis's names, arities, replies and error texts, over the bytes store.
//!
//! Every call into the store runs right here, on the tokio worker thread that serves the
//! connection (see docs/design.md, "Redis-protocol server"): a store call is a few microseconds of
//! PM work that never waits on I/O. Writes of a key hold its stripe, a reader-writer lock
//! ([`Shared::stripe`]): read-modify-write commands (INCR, APPEND, SET ... GET, MSET) hold it
//! exclusively, so they cannot lose a concurrent update; a write that is one store call (SET,
//! SET NX/XX, DEL) holds it shared — the store call is atomic on its own, and it only has to stay
//! out of a read-modify-write's window. Plain reads take no lock (the store's reads are
//! linearizable on their own).

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use numakv::{ByteMap, IndexError};
use redis_protocol::resp2::types::BorrowedFrame;

use crate::glob;
use crate::intent::LogError;
use crate::reply::Out;
use crate::Shared;

/// What the connection does after a command.
#[derive(Debug, PartialEq, Eq)]
pub enum Flow {
    /// Read the next request.
    Continue,
    /// Send what is pending, then close this connection (QUIT).
    Close,
    /// Close this connection without a reply and shut the server down (SHUTDOWN).
    Shutdown,
}

/// Per-connection state the commands see.
#[derive(Debug)]
pub struct Conn {
    /// Connection id (CLIENT ID).
    pub id: u64,
    /// CLIENT SETNAME.
    pub name: Option<Vec<u8>>,
    /// Reused value buffer for GET-like commands.
    pub scratch: Vec<u8>,
    /// Commands run since the last [`Conn::take_commands`] (added to the server's total once
    /// per batch, not per command: one shared counter bumped by every worker per command is a
    /// cache line bouncing between them).
    pub commands: u64,
}

impl Conn {
    /// A connection's state before its first command.
    pub fn new(id: u64) -> Conn {
        Conn { id, name: None, scratch: Vec::new(), commands: 0 }
    }

    /// The commands counted since the last call.
    pub fn take_commands(&mut self) -> u64 {
        std::mem::take(&mut self.commands)
    }
}

/// The commands: name, Redis arity (positive: exact count including the name; negative: at
/// least), and a one-line summary for COMMAND DOCS.
pub const COMMANDS: &[(&str, i64, &str)] = &[
    ("append", 3, "Appends a string to the value of a key."),
    ("client", -2, "CLIENT SETNAME/GETNAME/ID/SETINFO/INFO."),
    ("command", -1, "Returns information about the commands."),
    ("config", -2, "CONFIG GET (read-only configuration)."),
    ("dbsize", 1, "Returns the number of keys."),
    ("decr", 2, "Decrements the integer value of a key by one."),
    ("decrby", 3, "Decrements the integer value of a key by a number."),
    ("del", -2, "Deletes one or more keys."),
    ("echo", 2, "Returns the given string."),
    ("exists", -2, "Counts how many of the given keys exist."),
    ("flushall", -1, "Deletes every key."),
    ("flushdb", -1, "Deletes every key."),
    ("get", 2, "Returns the value of a key."),
    ("hello", -1, "Handshake: RESP2 (HELLO 2) or RESP3 (HELLO 3)."),
    ("incr", 2, "Increments the integer value of a key by one."),
    ("incrby", 3, "Increments the integer value of a key by a number."),
    ("info", -1, "Server, clients, keyspace and numakv store information."),
    ("keys", 2, "Returns the keys matching a pattern, in byte order."),
    ("mget", -2, "Returns the values of several keys."),
    ("mset", -3, "Sets several keys."),
    ("ping", -1, "Returns PONG, or the argument."),
    ("quit", -1, "Closes the connection."),
    ("scan", -2, "Iterates over the keys in byte order."),
    ("select", 2, "Selects database 0 (the only one)."),
    ("set", -3, "Sets the value of a key (NX, XX, GET; no expiry)."),
    ("shutdown", -1, "Closes the store cleanly and stops the server."),
    ("strlen", 2, "Returns the length of a value."),
    ("type", 2, "Returns the type of a key: string or none."),
];

const INVALID_INT: &str = "ERR value is not an integer or out of range";
const SYNTAX: &str = "ERR syntax error";

/// The command table's entry for `name` (any case), without allocating: command names are short.
fn lookup(name: &[u8]) -> Option<&'static (&'static str, i64, &'static str)> {
    let mut low = [0u8; 16];
    let low = low.get_mut(..name.len())?;
    for (d, s) in low.iter_mut().zip(name) {
        *d = s.to_ascii_lowercase();
    }
    COMMANDS.iter().find(|c| c.0.as_bytes() == low)
}

fn lower(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_ascii_lowercase()
}

fn eq(a: &[u8], b: &str) -> bool {
    a.eq_ignore_ascii_case(b.as_bytes())
}

/// Redis's `string2ll`: optional '-', decimal digits, no leading zeros or spaces, fits an i64.
fn parse_i64(b: &[u8]) -> Option<i64> {
    if b.is_empty() || b.len() > 20 || b[0] == b'+' || (b.len() > 1 && b[0] == b'0') {
        return None;
    }
    if b.len() > 1 && b[0] == b'-' && b[1] == b'0' {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

fn store_err(out: &mut Out, e: &IndexError) {
    match e {
        IndexError::EmptyKey { .. } => out.err("ERR empty keys are not supported by numakv"),
        _ => out.err(&format!("ERR {e}")),
    }
}

/// Runs one request (`args[0]` is the command name).
pub fn dispatch(sh: &Shared, conn: &mut Conn, args: &[&[u8]], out: &mut Out) -> Flow {
    let Some(&(name, arity, _)) = lookup(args[0]) else {
        let mut msg = format!(
            "ERR unknown command '{}', with args beginning with: ",
            String::from_utf8_lossy(&args[0][..args[0].len().min(128)])
        );
        for a in args[1..].iter().take(16) {
            let _ = write!(msg, "'{}' ", String::from_utf8_lossy(&a[..a.len().min(128)]));
        }
        out.err(&msg);
        return Flow::Continue;
    };
    let n = args.len() as i64;
    if (arity > 0 && n != arity) || (arity < 0 && n < -arity) || (name == "mset" && n % 2 == 0) {
        out.err(&format!("ERR wrong number of arguments for '{name}' command"));
        return Flow::Continue;
    }
    if name == "info" {
        // INFO's total_commands_processed includes this connection's batch so far.
        sh.commands.fetch_add(conn.take_commands(), Ordering::Relaxed);
    }
    conn.commands += 1;
    let map = sh.store.map();
    let a = &args[1..];
    match name {
        "ping" => match a {
            [] => out.simple("PONG"),
            [m] => out.bulk(m),
            _ => out.err("ERR wrong number of arguments for 'ping' command"),
        },
        "echo" => out.bulk(a[0]),
        "get" => match map.get_into(a[0], &mut conn.scratch) {
            Ok(true) => out.bulk(&conn.scratch),
            Ok(false) => out.null(),
            Err(e) => store_err(out, &e),
        },
        "set" => set(sh, conn, a, out),
        "del" => {
            let mut n = 0;
            for k in a {
                // One store call: shared (see `Shared::stripe_shared`).
                let _g = sh.stripe_shared(k);
                match map.delete(k) {
                    Ok(true) => n += 1,
                    Ok(false) => {}
                    Err(e) => return store_err_flow(out, &e),
                }
            }
            out.int(n);
        }
        "exists" => {
            let mut n = 0;
            for k in a {
                match map.get_into(k, &mut conn.scratch) {
                    Ok(true) => n += 1,
                    Ok(false) => {}
                    Err(e) => return store_err_flow(out, &e),
                }
            }
            out.int(n);
        }
        "type" => match map.get_into(a[0], &mut conn.scratch) {
            Ok(true) => out.simple("string"),
            Ok(false) => out.simple("none"),
            Err(e) => store_err(out, &e),
        },
        "mget" => {
            let mut vals = Vec::with_capacity(a.len());
            for k in a {
                match map.get(k) {
                    Ok(v) => vals.push(v),
                    Err(e) => return store_err_flow(out, &e),
                }
            }
            out.opt_bulks(&vals);
        }
        "mset" => {
            // Lock every stripe involved (in order, so two MSETs cannot deadlock), so no INCR
            // or SET ... GET of these keys interleaves with the batch.
            let mut stripes: Vec<usize> = a.chunks(2).map(|kv| sh.stripe_of(kv[0])).collect();
            stripes.sort_unstable();
            stripes.dedup();
            let _guards: Vec<_> = stripes.iter().map(|&s| sh.stripes[s].write()).collect();
            return mset(sh, a, out);
        }
        "incr" => incr_by(sh, conn, a[0], Some(1), out),
        "decr" => incr_by(sh, conn, a[0], Some(-1), out),
        "incrby" => incr_by(sh, conn, a[0], parse_i64(a[1]), out),
        "decrby" => incr_by(sh, conn, a[0], parse_i64(a[1]).and_then(|d| d.checked_neg()), out),
        "strlen" => match map.get_into(a[0], &mut conn.scratch) {
            Ok(true) => out.int(conn.scratch.len() as i64),
            Ok(false) => out.int(0),
            Err(e) => store_err(out, &e),
        },
        "append" => {
            let _g = sh.stripe(a[0]);
            let r = match map.get_into(a[0], &mut conn.scratch) {
                Ok(true) => {
                    conn.scratch.extend_from_slice(a[1]);
                    map.put(a[0], &conn.scratch).map(|()| conn.scratch.len())
                }
                Ok(false) => map.put(a[0], a[1]).map(|()| a[1].len()),
                Err(e) => Err(e),
            };
            match r {
                Ok(len) => out.int(len as i64),
                Err(e) => store_err(out, &e),
            }
        }
        "dbsize" => match count_keys(map) {
            Ok(n) => out.int(n as i64),
            Err(e) => store_err(out, &e),
        },
        "scan" => scan(sh, a, out),
        "keys" => {
            let pat = a[0];
            let prefix = glob::literal_prefix(pat);
            let mut keys = Vec::new();
            for r in map.scan_prefix(&prefix, usize::MAX) {
                match r {
                    Ok((k, _)) if glob::matches(pat, &k) => keys.push(k),
                    Ok(_) => {}
                    Err(e) => return store_err_flow(out, &e),
                }
            }
            out.bulks(&keys);
        }
        "flushdb" | "flushall" => match a {
            [] => flush(sh, out),
            [m] if eq(m, "sync") || eq(m, "async") => flush(sh, out),
            _ => out.err(SYNTAX),
        },
        "select" => match parse_i64(a[0]) {
            Some(0) => out.ok(),
            Some(_) => out.err("ERR DB index is out of range"),
            None => out.err(INVALID_INT),
        },
        "info" => out.bulk(crate::info::info(sh, a).as_bytes()),
        "config" => config(sh, a, out),
        "command" => command(a, out),
        "client" => client(conn, a, out),
        "hello" => hello(conn, a, out),
        "quit" => {
            out.ok();
            return Flow::Close;
        }
        "shutdown" => {
            if a.len() > 1
                || a.first()
                    .is_some_and(|m| !["nosave", "save", "now", "force"].iter().any(|o| eq(m, o)))
            {
                out.err(SYNTAX);
            } else {
                return Flow::Shutdown;
            }
        }
        _ => unreachable!("every name in COMMANDS has an arm"),
    }
    Flow::Continue
}

fn store_err_flow(out: &mut Out, e: &IndexError) -> Flow {
    store_err(out, e);
    Flow::Continue
}

/// SET key value [NX|XX] [GET] [KEEPTTL]; EX/PX/EXAT/PXAT are refused (keys do not expire).
fn set(sh: &Shared, conn: &mut Conn, a: &[&[u8]], out: &mut Out) {
    let (key, value) = (a[0], a[1]);
    let (mut nx, mut xx, mut get) = (false, false, false);
    let mut i = 2;
    while i < a.len() {
        let o = a[i];
        if eq(o, "nx") && !xx {
            nx = true;
        } else if eq(o, "xx") && !nx {
            xx = true;
        } else if eq(o, "get") {
            get = true;
        } else if eq(o, "keepttl") {
        } else if ["ex", "px", "exat", "pxat"].iter().any(|x| eq(o, x)) {
            if i + 1 >= a.len() {
                return out.err(SYNTAX);
            }
            return out.err(&format!(
                "ERR SET {} is not supported: numakv keys do not expire",
                lower(o).to_ascii_uppercase()
            ));
        } else {
            return out.err(SYNTAX);
        }
        i += 1;
    }
    let map = sh.store.map();
    // SET ... GET reads, then writes: exclusive. Without GET it is one store call (put, insert
    // or update, each atomic in the store): shared, so SETs of one key do not queue here.
    let (_exclusive, _shared) =
        if get { (Some(sh.stripe(key)), None) } else { (None, Some(sh.stripe_shared(key))) };
    let old = if get {
        match map.get_into(key, &mut conn.scratch) {
            Ok(present) => present,
            Err(e) => return store_err(out, &e),
        }
    } else {
        false
    };
    let wrote = if nx {
        map.insert(key, value)
    } else if xx {
        map.update(key, value)
    } else {
        map.put(key, value).map(|()| true)
    };
    match wrote {
        Err(e) => store_err(out, &e),
        Ok(_) if get && old => out.bulk(&conn.scratch),
        Ok(_) if get => out.null(),
        Ok(true) => out.ok(),
        Ok(false) => out.null(),
    }
}

/// MSET's puts, under the caller's exclusive stripes of every key. One pair is one put (atomic
/// on its own); several go through the intent log ([`crate::intent`]): recorded durably first,
/// cleared durably after the last put, before the reply — all or nothing across a crash.
fn mset(sh: &Shared, a: &[&[u8]], out: &mut Out) -> Flow {
    let map = sh.store.map();
    if a.len() == 2 {
        match map.put(a[0], a[1]) {
            Ok(()) => out.ok(),
            Err(e) => store_err(out, &e),
        }
        return Flow::Continue;
    }
    let slot = match sh.intents.begin(a) {
        Ok(slot) => slot,
        Err(e @ LogError::Failed(_)) => {
            out.err(&format!("ERR {e}"));
            return Flow::Continue;
        }
        Err(e @ LogError::Fatal(_)) => return fatal(out, &e),
    };
    let mut failed = None;
    for (i, kv) in a.chunks(2).enumerate() {
        if let Err(e) = map.put(kv[0], kv[1]) {
            failed = Some((i, e));
            break;
        }
        // After each put, with the intent durable: a crash here is what the replay is for.
        numakv_pmem::pause_point!("server.mset.put");
    }
    // The record goes even when a put failed: the pairs not put would otherwise be put by the
    // next open, after the client was told the MSET failed.
    if let Err(e) = sh.intents.end(slot) {
        return fatal(out, &e);
    }
    match failed {
        None => out.ok(),
        Some((i, e)) => {
            out.err(&format!("ERR MSET stopped after {i} of {} pairs: {e}", a.len() / 2))
        }
    }
    Flow::Continue
}

/// An intent log failure that leaves a record behind: reply, then shut the server down.
fn fatal(out: &mut Out, e: &LogError) -> Flow {
    eprintln!("numakv serve: {e}");
    out.err(&format!("ERR {e}"));
    Flow::Shutdown
}

fn incr_by(sh: &Shared, conn: &mut Conn, key: &[u8], delta: Option<i64>, out: &mut Out) {
    let Some(delta) = delta else {
        return out.err(INVALID_INT);
    };
    let map = sh.store.map();
    let _g = sh.stripe(key);
    let cur = match map.get_into(key, &mut conn.scratch) {
        Ok(true) => match parse_i64(&conn.scratch) {
            Some(v) => v,
            None => return out.err(INVALID_INT),
        },
        Ok(false) => 0,
        Err(e) => return store_err(out, &e),
    };
    // Between the read and the write: a concurrent INCR of the key must wait here (the stripe).
    numakv_pmem::pause_point!("server.incr.read");
    let Some(new) = cur.checked_add(delta) else {
        return out.err("ERR increment or decrement would overflow");
    };
    match map.put(key, new.to_string().as_bytes()) {
        Ok(()) => out.int(new),
        Err(e) => store_err(out, &e),
    }
}

/// Counts every key (a full scan: the store keeps no count).
pub(crate) fn count_keys(map: &dyn ByteMap) -> Result<u64, IndexError> {
    let mut n = 0;
    for r in map.scan(&[], None, usize::MAX) {
        r?;
        n += 1;
    }
    Ok(n)
}

/// FLUSHDB: deletes every key, a batch of keys at a time, each delete under its key's stripe.
fn flush(sh: &Shared, out: &mut Out) {
    let map = sh.store.map();
    loop {
        let batch: Result<Vec<Vec<u8>>, _> =
            map.scan(&[], None, 1024).map(|r| r.map(|(k, _)| k)).collect();
        let batch = match batch {
            Ok(b) => b,
            Err(e) => return store_err(out, &e),
        };
        if batch.is_empty() {
            return out.ok();
        }
        for k in &batch {
            let _g = sh.stripe_shared(k);
            if let Err(e) = map.delete(k) {
                return store_err(out, &e);
            }
        }
    }
}

/// SCAN cursors: the key to resume after, behind a number (clients — redis-cli, redis-rs —
/// parse the cursor as an unsigned integer, so the key cannot be the cursor itself). The table
/// keeps the newest [`CURSORS`] cursors of the whole server; an older one is "invalid cursor".
#[derive(Debug, Default)]
pub struct Cursors {
    next: u64,
    map: HashMap<u64, Vec<u8>>,
    order: VecDeque<u64>,
}

/// How many SCAN cursors stay valid.
pub const CURSORS: usize = 16384;

impl Cursors {
    fn put(&mut self, key: Vec<u8>) -> u64 {
        self.next += 1;
        let id = self.next;
        self.map.insert(id, key);
        self.order.push_back(id);
        if self.order.len() > CURSORS {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
        id
    }
}

/// SCAN cursor [MATCH pattern] [COUNT n] [TYPE t]: up to COUNT keys examined per call in byte
/// order, those matching returned; cursor 0 when the keyspace is exhausted.
fn scan(sh: &Shared, a: &[&[u8]], out: &mut Out) {
    let after: Option<Vec<u8>> = match std::str::from_utf8(a[0]).ok().and_then(|s| s.parse().ok()) {
        Some(0u64) => None,
        Some(id) => match sh.cursors.lock().map.get(&id) {
            Some(k) => Some(k.clone()),
            None => return out.err("ERR invalid cursor"),
        },
        None => return out.err("ERR invalid cursor"),
    };
    let (mut pat, mut count, mut only_strings) = (None, 10usize, true);
    let mut i = 1;
    while i < a.len() {
        if i + 1 >= a.len() {
            return out.err(SYNTAX);
        }
        let v = a[i + 1];
        if eq(a[i], "match") {
            pat = Some(v);
        } else if eq(a[i], "count") {
            match parse_i64(v) {
                Some(c) if c >= 1 => count = c as usize,
                Some(_) => return out.err(SYNTAX),
                None => return out.err(INVALID_INT),
            }
        } else if eq(a[i], "type") {
            only_strings = eq(v, "string");
        } else {
            return out.err(SYNTAX);
        }
        i += 2;
    }
    let prefix = pat.map(glob::literal_prefix).unwrap_or_default();
    let start = match &after {
        Some(k) if k.as_slice() > prefix.as_slice() => k.clone(),
        _ => prefix.clone(),
    };
    let end = numakv_bytes::prefix_end(&prefix);
    let map = sh.store.map();
    let mut keys = Vec::new();
    let mut last = None;
    let mut examined = 0;
    // One extra: the resume key itself comes back first and is skipped.
    for r in map.scan(&start, end.as_deref(), count + 1) {
        let k = match r {
            Ok((k, _)) => k,
            Err(e) => return store_err(out, &e),
        };
        if after.as_deref() == Some(k.as_slice()) {
            continue;
        }
        if examined == count {
            break;
        }
        examined += 1;
        if only_strings && pat.is_none_or(|p| glob::matches(p, &k)) {
            keys.push(k.clone());
        }
        last = Some(k);
    }
    let cursor = match last {
        Some(k) if examined == count => sh.cursors.lock().put(k),
        _ => 0,
    };
    let cursor = cursor.to_string();
    let keys: Vec<BorrowedFrame<'_>> = keys.iter().map(|k| BorrowedFrame::BulkString(k)).collect();
    out.frame(&BorrowedFrame::Array(&[
        BorrowedFrame::BulkString(cursor.as_bytes()),
        BorrowedFrame::Array(&keys),
    ]));
}

/// CONFIG GET pattern...: the few parameters clients ask about (redis-benchmark asks `save` and
/// `appendonly`); an unknown one matches nothing (an empty array), as in Redis.
fn config(sh: &Shared, a: &[&[u8]], out: &mut Out) {
    let sub = lower(a[0]);
    match sub.as_str() {
        "get" if a.len() >= 2 => {
            let params: [(&str, String); 8] = [
                ("appendonly", "no".into()),
                ("save", String::new()),
                ("databases", "1".into()),
                ("maxclients", sh.config.max_clients.to_string()),
                ("bind", sh.addr.ip().to_string()),
                ("port", sh.addr.port().to_string()),
                ("proto-max-bulk-len", sh.config.limits.max_bulk.to_string()),
                ("io-threads", sh.threads.to_string()),
            ];
            let mut items: Vec<(&str, &str)> = Vec::new();
            for (k, v) in &params {
                if a[1..].iter().any(|p| glob::matches(&p.to_ascii_lowercase(), k.as_bytes())) {
                    items.push((k, v));
                }
            }
            // A map, as Redis 7 answers (a flat array in RESP2).
            out.map_header(items.len());
            for (k, v) in items {
                out.bulk(k.as_bytes());
                out.bulk(v.as_bytes());
            }
        }
        "get" => out.err("ERR wrong number of arguments for 'config|get' command"),
        "resetstat" => out.ok(),
        "set" | "rewrite" => {
            out.err(&format!("ERR CONFIG {} is not supported by numakv", sub.to_ascii_uppercase()))
        }
        _ => out.err(&format!(
            "ERR unknown subcommand '{}'. Try CONFIG HELP.",
            String::from_utf8_lossy(a[0])
        )),
    }
}

/// COMMAND, COMMAND COUNT, COMMAND INFO, COMMAND DOCS: enough for redis-cli's hints.
fn command(a: &[&[u8]], out: &mut Out) {
    let pick = |names: &[&[u8]]| -> Vec<&(&str, i64, &str)> {
        if names.is_empty() {
            COMMANDS.iter().collect()
        } else {
            COMMANDS.iter().filter(|c| names.iter().any(|n| eq(n, c.0))).collect()
        }
    };
    let sub = a.first().map(|s| lower(s));
    match sub.as_deref() {
        None | Some("info") => {
            let cmds = pick(a.get(1..).unwrap_or(&[]));
            let (keyless, keyed) = ([0i64, 0, 0], [1i64, 1, 1]);
            let rows: Vec<[BorrowedFrame<'_>; 6]> = cmds
                .iter()
                .map(|c| {
                    let has_key = !matches!(
                        c.0,
                        "client"
                            | "command"
                            | "config"
                            | "dbsize"
                            | "echo"
                            | "flushall"
                            | "flushdb"
                            | "hello"
                            | "info"
                            | "keys"
                            | "ping"
                            | "quit"
                            | "scan"
                            | "select"
                            | "shutdown"
                    );
                    let [first, last, step] = if has_key {
                        match c.0 {
                            "del" | "exists" | "mget" => [1, -1, 1],
                            "mset" => [1, -1, 2],
                            _ => keyed,
                        }
                    } else {
                        keyless
                    };
                    [
                        BorrowedFrame::BulkString(c.0.as_bytes()),
                        BorrowedFrame::Integer(c.1),
                        BorrowedFrame::Array(&[]),
                        BorrowedFrame::Integer(first),
                        BorrowedFrame::Integer(last),
                        BorrowedFrame::Integer(step),
                    ]
                })
                .collect();
            let frames: Vec<BorrowedFrame<'_>> =
                rows.iter().map(|r| BorrowedFrame::Array(r)).collect();
            out.frame(&BorrowedFrame::Array(&frames));
        }
        Some("count") => out.int(COMMANDS.len() as i64),
        Some("docs") => {
            let cmds = pick(&a[1..]);
            let docs: Vec<[BorrowedFrame<'_>; 4]> = cmds
                .iter()
                .map(|c| {
                    [
                        BorrowedFrame::BulkString(b"summary"),
                        BorrowedFrame::BulkString(c.2.as_bytes()),
                        BorrowedFrame::BulkString(b"group"),
                        BorrowedFrame::BulkString(b"generic"),
                    ]
                })
                .collect();
            let mut frames = Vec::with_capacity(cmds.len() * 2);
            for (c, d) in cmds.iter().zip(&docs) {
                frames.push(BorrowedFrame::BulkString(c.0.as_bytes()));
                frames.push(BorrowedFrame::Array(d));
            }
            out.frame(&BorrowedFrame::Array(&frames));
        }
        Some(_) => out.err(&format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(a[0])
        )),
    }
}

fn client(conn: &mut Conn, a: &[&[u8]], out: &mut Out) {
    let sub = lower(a[0]);
    match (sub.as_str(), a.len()) {
        ("setname", 2) => {
            if a[1].iter().any(|&b| b <= b' ' || b > b'~') {
                out.err("ERR Client names cannot contain spaces, newlines or special characters.");
            } else {
                conn.name = (!a[1].is_empty()).then(|| a[1].to_vec());
                out.ok();
            }
        }
        ("getname", 1) => match &conn.name {
            Some(n) => out.bulk(n),
            None => out.null(),
        },
        ("id", 1) => out.int(conn.id as i64),
        // redis-rs and others announce themselves with CLIENT SETINFO on connect.
        ("setinfo", 3) => out.ok(),
        ("info", 1) => {
            let name = conn.name.as_deref().map(String::from_utf8_lossy).unwrap_or_default();
            out.bulk(format!("id={} name={} db=0\n", conn.id, name).as_bytes());
        }
        ("setname" | "getname" | "id" | "setinfo" | "info", _) => {
            out.err(&format!("ERR wrong number of arguments for 'client|{sub}' command"))
        }
        _ => out.err(&format!(
            "ERR unknown subcommand '{}'. Try CLIENT HELP.",
            String::from_utf8_lossy(a[0])
        )),
    }
}

/// HELLO [protover [SETNAME name]]: protover 2 (RESP2) or 3 (RESP3, from this reply on); the
/// reply is Redis's map of server properties.
fn hello(conn: &mut Conn, a: &[&[u8]], out: &mut Out) {
    let mut resp3 = out.resp3;
    if let Some(v) = a.first() {
        match parse_i64(v) {
            Some(2) => resp3 = false,
            Some(3) => resp3 = true,
            Some(_) => return out.err("NOPROTO sorry, this protocol version is not supported"),
            None => return out.err("ERR Protocol version is not an integer or out of range"),
        }
        let mut i = 1;
        while i < a.len() {
            if eq(a[i], "setname") && i + 1 < a.len() {
                conn.name = Some(a[i + 1].to_vec());
                i += 2;
            } else {
                return out.err(&format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(a[i])
                ));
            }
        }
    }
    // The reply already speaks the protocol asked for, as Redis's does.
    out.resp3 = resp3;
    out.map_header(7);
    for (k, v) in [
        ("server", "redis"),
        ("version", crate::info::REDIS_VERSION),
        ("mode", "standalone"),
        ("role", "master"),
    ] {
        out.bulk(k.as_bytes());
        out.bulk(v.as_bytes());
    }
    out.bulk(b"proto");
    out.int(if resp3 { 3 } else { 2 });
    out.bulk(b"id");
    out.int(conn.id as i64);
    out.bulk(b"modules");
    out.frame(&BorrowedFrame::Array(&[]));
}

#[cfg(test)]
mod tests {
    use super::parse_i64;

    #[test]
    fn integers_as_redis_reads_them() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        for bad in [&b""[..], b"+1", b"01", b" 1", b"1 ", b"-0", b"9223372036854775808", b"1.5"] {
            assert_eq!(parse_i64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
