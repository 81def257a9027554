//! The commands: Redis's names, arities, replies and error texts, over the bytes store.
//!
//! Every call into the store runs right here, on the tokio worker thread that serves the
//! connection (see docs/design.md, "Redis-protocol server"): a store call is a few microseconds of
//! PM work that never waits on I/O.
//!
//! **Locks.** Every command holds the server's gate ([`Shared::gate`]) shared — its worker's
//! shard, uncontended — except EXEC and the multi-key writes (MSET of several pairs, MSETNX, DEL
//! of several keys), which hold it exclusively: nothing else runs meanwhile, so they are atomic
//! against every other client, readers included. Under the shared gate, writes of a key hold its
//! stripe, a reader-writer lock ([`Shared::stripe`]): read-modify-write commands (INCR, APPEND,
//! SET ... GET) hold it exclusively, so they cannot lose a concurrent update; a write that is one
//! store call (SET, SET NX/XX, DEL of one key) holds it shared — the store call is atomic on its
//! own, and it only has to stay out of a read-modify-write's window. Plain reads take no stripe.
//!
//! **Multi-key writes** go through the store's write batch ([`numakv::WriteBatch`]): every
//! argument is checked before anything is written, and the batch is all or nothing across a
//! crash too (its log is in the pool; the next open of the store finishes it).
//!
//! **Transactions.** MULTI queues commands (`+QUEUED`); an unknown command or a wrong number of
//! arguments while queueing answers its error and makes EXEC answer `EXECABORT`. EXEC holds the
//! gate exclusively, compares the versions of the WATCHed keys' stripes (a write bumps its
//! stripe's version after it returns; a change aborts EXEC with a null reply), then runs the
//! queue against an overlay of the store ([`Overlay`]): reads see the transaction's own writes,
//! and every write is collected and applied at the end as one batch — all or nothing across a
//! crash. A queued command that scans or flushes (KEYS, SCAN, DBSIZE, FLUSHDB, INFO, …) first
//! applies the writes queued before it as a batch of their own, then runs on the store (still
//! under the exclusive gate: isolated, but atomic across a crash only piecewise).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use bytes::BytesMut;
use numakv::{BatchOutcome, ByteMap, IndexError, WriteBatch};
use redis_protocol::resp2::types::BorrowedFrame;

use crate::glob;
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

/// A MULTI in progress on a connection.
#[derive(Debug, Default)]
pub struct Multi {
    /// The queued commands, name first.
    queued: Vec<Vec<Vec<u8>>>,
    /// A command was refused while queueing: EXEC answers EXECABORT.
    dirty: bool,
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
    /// MULTI ... EXEC in progress.
    pub multi: Option<Multi>,
    /// WATCHed stripes and their versions when watched.
    pub watched: Vec<(usize, u64)>,
}

impl Conn {
    /// A connection's state before its first command.
    pub fn new(id: u64) -> Conn {
        Conn { id, name: None, scratch: Vec::new(), commands: 0, multi: None, watched: Vec::new() }
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
    ("del", -2, "Deletes one or more keys (several: all or nothing)."),
    ("discard", 1, "Discards the commands queued since MULTI."),
    ("echo", 2, "Returns the given string."),
    ("exec", 1, "Runs the commands queued since MULTI, atomically."),
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
    ("mset", -3, "Sets several keys, all or nothing."),
    ("msetnx", -3, "Sets several keys only if none of them exists."),
    ("multi", 1, "Starts a transaction."),
    ("ping", -1, "Returns PONG, or the argument."),
    ("quit", -1, "Closes the connection."),
    ("scan", -2, "Iterates over the keys in byte order."),
    ("select", 2, "Selects database 0 (the only one)."),
    ("set", -3, "Sets the value of a key (NX, XX, GET; no expiry)."),
    ("shutdown", -1, "Closes the store cleanly and stops the server."),
    ("strlen", 2, "Returns the length of a value."),
    ("type", 2, "Returns the type of a key: string or none."),
    ("unwatch", 1, "Forgets every WATCHed key."),
    ("watch", -2, "Makes the next EXEC abort if one of these keys is written first."),
];

/// Commands a transaction runs against its overlay (point reads and writes); any other queued
/// command first applies the overlay, then runs on the store.
const POINT: &[&str] = &[
    "append", "decr", "decrby", "del", "echo", "exists", "get", "incr", "incrby", "mget", "mset",
    "msetnx", "ping", "select", "set", "strlen", "type",
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

/// A transaction's writes, not yet applied: key → new value (`None`: deleted).
#[derive(Debug, Default)]
pub(crate) struct Overlay {
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

/// Where a command's point reads and writes go: the store (each write then marks its key for
/// WATCH), or inside EXEC a transaction's [`Overlay`].
pub(crate) struct View<'a> {
    sh: &'a Shared,
    overlay: Option<&'a mut Overlay>,
}

impl View<'_> {
    fn map(&self) -> &dyn ByteMap {
        self.sh.store.map()
    }

    fn get_into(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, IndexError> {
        if let Some(o) = self.overlay.as_deref() {
            numakv_bytes::layout::check_key(key)?;
            if let Some(v) = o.writes.get(key) {
                return Ok(match v {
                    Some(v) => {
                        out.clear();
                        out.extend_from_slice(v);
                        true
                    }
                    None => false,
                });
            }
        }
        self.map().get_into(key, out)
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        let mut v = Vec::new();
        Ok(self.get_into(key, &mut v)?.then_some(v))
    }

    fn exists(&self, key: &[u8]) -> Result<bool, IndexError> {
        self.get_into(key, &mut Vec::new())
    }

    /// Records a write of the overlay, checked as the store would check it.
    fn stage(o: &mut Overlay, key: &[u8], value: Option<&[u8]>) -> Result<(), IndexError> {
        numakv_bytes::layout::check_key(key)?;
        if let Some(v) = value {
            numakv_bytes::layout::check_value(v)?;
        }
        o.writes.insert(key.to_vec(), value.map(<[u8]>::to_vec));
        Ok(())
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), IndexError> {
        match self.overlay.as_deref_mut() {
            Some(o) => Self::stage(o, key, Some(value)),
            None => {
                self.sh.store.map().put(key, value)?;
                self.sh.touch(key);
                Ok(())
            }
        }
    }

    fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool, IndexError> {
        if self.overlay.is_some() {
            if self.exists(key)? {
                return Ok(false);
            }
            return self.put(key, value).map(|()| true);
        }
        let done = self.sh.store.map().insert(key, value)?;
        if done {
            self.sh.touch(key);
        }
        Ok(done)
    }

    fn update(&mut self, key: &[u8], value: &[u8]) -> Result<bool, IndexError> {
        if self.overlay.is_some() {
            if !self.exists(key)? {
                return Ok(false);
            }
            return self.put(key, value).map(|()| true);
        }
        let done = self.sh.store.map().update(key, value)?;
        if done {
            self.sh.touch(key);
        }
        Ok(done)
    }

    fn delete(&mut self, key: &[u8]) -> Result<bool, IndexError> {
        if self.overlay.is_some() {
            let had = self.exists(key)?;
            if let Some(o) = self.overlay.as_deref_mut() {
                Self::stage(o, key, None)?;
            }
            return Ok(had);
        }
        let done = self.sh.store.map().delete(key)?;
        if done {
            self.sh.touch(key);
        }
        Ok(done)
    }

    /// A batch: to the store (the caller holds the gate exclusively), or into the overlay;
    /// `absent` repeats the batch's `require_absent` keys (checked here against the overlay).
    fn batch(&mut self, b: &WriteBatch, absent: &[&[u8]]) -> Result<BatchOutcome, IndexError> {
        b.validate()?;
        if self.overlay.is_none() {
            let out = self.sh.store.map().write_batch(b)?;
            if out.applied {
                b.ops().for_each(|(k, _)| self.sh.touch(k));
            }
            return Ok(out);
        }
        let existed = b.ops().map(|(k, _)| self.exists(k)).collect::<Result<Vec<_>, _>>()?;
        for k in absent {
            if self.exists(k)? {
                return Ok(BatchOutcome { applied: false, existed });
            }
        }
        if let Some(o) = self.overlay.as_deref_mut() {
            for (k, v) in b.ops() {
                Self::stage(o, k, v)?;
            }
        }
        Ok(BatchOutcome { applied: true, existed })
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
        if let Some(m) = &mut conn.multi {
            m.dirty = true;
        }
        return Flow::Continue;
    };
    let n = args.len() as i64;
    if (arity > 0 && n != arity)
        || (arity < 0 && n < -arity)
        || ((name == "mset" || name == "msetnx") && n % 2 == 0)
    {
        out.err(&format!("ERR wrong number of arguments for '{name}' command"));
        if let Some(m) = &mut conn.multi {
            m.dirty = true;
        }
        return Flow::Continue;
    }
    if name == "info" {
        // INFO's total_commands_processed includes this connection's batch so far.
        sh.commands.fetch_add(conn.take_commands(), Ordering::Relaxed);
    }
    conn.commands += 1;
    let a = &args[1..];
    match (name, conn.multi.is_some()) {
        ("multi", false) => {
            conn.multi = Some(Multi::default());
            out.ok();
            return Flow::Continue;
        }
        ("multi", true) => {
            out.err("ERR MULTI calls can not be nested");
            return Flow::Continue;
        }
        ("exec", false) => {
            out.err("ERR EXEC without MULTI");
            return Flow::Continue;
        }
        ("discard", false) => {
            out.err("ERR DISCARD without MULTI");
            return Flow::Continue;
        }
        ("exec", true) => return exec(sh, conn, out),
        ("discard", true) => {
            conn.multi = None;
            conn.watched.clear();
            out.ok();
            return Flow::Continue;
        }
        ("watch", true) => {
            out.err("ERR WATCH inside MULTI is not allowed");
            return Flow::Continue;
        }
        ("watch", false) => {
            let _gate = sh.gate.shared();
            for k in a {
                let s = sh.stripe_of(k);
                conn.watched.push((s, sh.version(s)));
            }
            out.ok();
            return Flow::Continue;
        }
        // Inside MULTI, UNWATCH is queued like any other command (Redis): the WATCH stays in
        // force until EXEC has checked it.
        ("unwatch", false) => {
            conn.watched.clear();
            out.ok();
            return Flow::Continue;
        }
        ("quit", _) => {}
        (_, true) => {
            if let Some(m) = &mut conn.multi {
                m.queued.push(args.iter().map(|a| a.to_vec()).collect());
            }
            out.simple("QUEUED");
            return Flow::Continue;
        }
        _ => {}
    }
    let multi_key = match name {
        "mset" => a.len() > 2,
        "msetnx" => true,
        "del" => a.len() > 1,
        _ => false,
    };
    let mut view = View { sh, overlay: None };
    if multi_key {
        let _gate = sh.gate.exclusive();
        run(&mut view, conn, name, a, out)
    } else {
        let _gate = sh.gate.shared();
        run(&mut view, conn, name, a, out)
    }
}

/// EXEC: under the exclusive gate, aborts if a WATCHed key was written, else runs the queue
/// against an overlay and applies its writes as one batch; the reply is the array of the
/// queued commands' replies.
fn exec(sh: &Shared, conn: &mut Conn, out: &mut Out) -> Flow {
    let multi = conn.multi.take().unwrap_or_default();
    let watched = std::mem::take(&mut conn.watched);
    if multi.dirty {
        out.err("EXECABORT Transaction discarded because of previous errors.");
        return Flow::Continue;
    }
    let _gate = sh.gate.exclusive();
    if watched.iter().any(|&(s, v)| sh.version(s) != v) {
        out.null_array();
        return Flow::Continue;
    }
    let mut overlay = Overlay::default();
    let mut body = Out { buf: BytesMut::new(), resp3: out.resp3 };
    let mut flow = Flow::Continue;
    for cmd in &multi.queued {
        let args: Vec<&[u8]> = cmd.iter().map(Vec::as_slice).collect();
        let Some(&(name, _, _)) = lookup(args[0]) else { continue };
        conn.commands += 1;
        let f = if POINT.contains(&name) {
            let mut view = View { sh, overlay: Some(&mut overlay) };
            run(&mut view, conn, name, &args[1..], &mut body)
        } else {
            if let Err(e) = apply(sh, &mut overlay) {
                out.err(&format!("ERR EXEC stopped before '{name}': {e}"));
                return Flow::Continue;
            }
            let mut view = View { sh, overlay: None };
            run(&mut view, conn, name, &args[1..], &mut body)
        };
        if f != Flow::Continue && flow == Flow::Continue {
            flow = f;
        }
    }
    match apply(sh, &mut overlay) {
        Ok(()) => {
            out.buf.extend_from_slice(format!("*{}\r\n", multi.queued.len()).as_bytes());
            out.buf.extend_from_slice(&body.buf);
        }
        Err(e) => {
            out.err(&format!("ERR EXEC failed, its writes were not applied: {e}"));
            return Flow::Continue;
        }
    }
    flow
}

/// Applies a transaction's overlay as one batch (the caller holds the gate exclusively).
fn apply(sh: &Shared, overlay: &mut Overlay) -> Result<(), IndexError> {
    if overlay.writes.is_empty() {
        return Ok(());
    }
    let mut b = WriteBatch::new();
    for (k, v) in &overlay.writes {
        match v {
            Some(v) => b.put(k, v),
            None => b.delete(k),
        };
    }
    // Between the queue's run and its batch: a crash here loses the whole transaction.
    numakv_pmem::pause_point!("server.exec.batch");
    sh.store.map().write_batch(&b)?;
    for k in overlay.writes.keys() {
        sh.touch(k);
    }
    overlay.writes.clear();
    Ok(())
}

/// Runs command `name` (checked: known, right number of arguments) with arguments `a`.
fn run(view: &mut View<'_>, conn: &mut Conn, name: &str, a: &[&[u8]], out: &mut Out) -> Flow {
    let sh = view.sh;
    match name {
        "ping" => match a {
            [] => out.simple("PONG"),
            [m] => out.bulk(m),
            _ => out.err("ERR wrong number of arguments for 'ping' command"),
        },
        "echo" => out.bulk(a[0]),
        "get" => match view.get_into(a[0], &mut conn.scratch) {
            Ok(true) => out.bulk(&conn.scratch),
            Ok(false) => out.null(),
            Err(e) => store_err(out, &e),
        },
        "set" => set(view, conn, a, out),
        "del" if a.len() == 1 => {
            // One store call: shared (see `Shared::stripe_shared`).
            let _g = sh.stripe_shared(a[0]);
            match view.delete(a[0]) {
                Ok(d) => out.int(i64::from(d)),
                Err(e) => store_err(out, &e),
            }
        }
        "del" => {
            let mut b = WriteBatch::new();
            for k in a {
                b.delete(k);
            }
            match view.batch(&b, &[]) {
                Ok(done) => {
                    // A key named twice is removed (and counted) once.
                    let mut removed: Vec<&[u8]> =
                        a.iter().zip(&done.existed).filter(|(_, &e)| e).map(|(k, _)| *k).collect();
                    removed.sort_unstable();
                    removed.dedup();
                    out.int(removed.len() as i64)
                }
                Err(e) => store_err(out, &e),
            }
        }
        "exists" => {
            let mut n = 0;
            for k in a {
                match view.get_into(k, &mut conn.scratch) {
                    Ok(true) => n += 1,
                    Ok(false) => {}
                    Err(e) => return store_err_flow(out, &e),
                }
            }
            out.int(n);
        }
        "type" => match view.get_into(a[0], &mut conn.scratch) {
            Ok(true) => out.simple("string"),
            Ok(false) => out.simple("none"),
            Err(e) => store_err(out, &e),
        },
        "mget" => {
            let mut vals = Vec::with_capacity(a.len());
            for k in a {
                match view.get(k) {
                    Ok(v) => vals.push(v),
                    Err(e) => return store_err_flow(out, &e),
                }
            }
            out.opt_bulks(&vals);
        }
        "mset" if a.len() == 2 => {
            // One pair: one put (atomic on its own), under the key's stripe so that no INCR of
            // it interleaves.
            let _g = sh.stripe(a[0]);
            match view.put(a[0], a[1]) {
                Ok(()) => out.ok(),
                Err(e) => store_err(out, &e),
            }
        }
        "mset" | "msetnx" => {
            let mut b = WriteBatch::new();
            for kv in a.chunks(2) {
                b.put(kv[0], kv[1]);
            }
            let absent: Vec<&[u8]> =
                if name == "msetnx" { a.iter().step_by(2).copied().collect() } else { Vec::new() };
            for k in &absent {
                b.require_absent(k);
            }
            match view.batch(&b, &absent) {
                Ok(done) if name == "mset" => {
                    debug_assert!(done.applied);
                    out.ok()
                }
                Ok(done) => out.int(i64::from(done.applied)),
                Err(e) => store_err(out, &e),
            }
        }
        "incr" => incr_by(view, conn, a[0], Some(1), out),
        "decr" => incr_by(view, conn, a[0], Some(-1), out),
        "incrby" => incr_by(view, conn, a[0], parse_i64(a[1]), out),
        "decrby" => incr_by(view, conn, a[0], parse_i64(a[1]).and_then(|d| d.checked_neg()), out),
        "strlen" => match view.get_into(a[0], &mut conn.scratch) {
            Ok(true) => out.int(conn.scratch.len() as i64),
            Ok(false) => out.int(0),
            Err(e) => store_err(out, &e),
        },
        "append" => {
            let _g = sh.stripe(a[0]);
            let r = match view.get_into(a[0], &mut conn.scratch) {
                Ok(true) => {
                    conn.scratch.extend_from_slice(a[1]);
                    let v = std::mem::take(&mut conn.scratch);
                    let r = view.put(a[0], &v).map(|()| v.len());
                    conn.scratch = v;
                    r
                }
                Ok(false) => view.put(a[0], a[1]).map(|()| a[1].len()),
                Err(e) => Err(e),
            };
            match r {
                Ok(len) => out.int(len as i64),
                Err(e) => store_err(out, &e),
            }
        }
        "dbsize" => match count_keys(view.map()) {
            Ok(n) => out.int(n as i64),
            Err(e) => store_err(out, &e),
        },
        "scan" => scan(sh, a, out),
        "keys" => {
            let pat = a[0];
            let prefix = glob::literal_prefix(pat);
            let mut keys = Vec::new();
            for r in view.map().scan_prefix(&prefix, usize::MAX) {
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
        // MULTI, EXEC, DISCARD, WATCH and UNWATCH never get here (dispatch answers them), but
        // inside EXEC a queued one is answered as Redis does.
        "multi" => out.err("ERR MULTI calls can not be nested"),
        "watch" => out.err("ERR WATCH inside MULTI is not allowed"),
        "exec" | "discard" | "unwatch" => out.ok(),
        _ => out.err(&format!("ERR unknown command '{name}'")),
    }
    Flow::Continue
}

fn store_err_flow(out: &mut Out, e: &IndexError) -> Flow {
    store_err(out, e);
    Flow::Continue
}

/// SET key value [NX|XX] [GET] [KEEPTTL]; EX/PX/EXAT/PXAT are refused (keys do not expire).
fn set(view: &mut View<'_>, conn: &mut Conn, a: &[&[u8]], out: &mut Out) {
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
    let sh = view.sh;
    // SET ... GET reads, then writes: exclusive. Without GET it is one store call (put, insert
    // or update, each atomic in the store): shared, so SETs of one key do not queue here.
    let (_exclusive, _shared) =
        if get { (Some(sh.stripe(key)), None) } else { (None, Some(sh.stripe_shared(key))) };
    let old = if get {
        match view.get_into(key, &mut conn.scratch) {
            Ok(present) => present,
            Err(e) => return store_err(out, &e),
        }
    } else {
        false
    };
    let wrote = if nx {
        view.insert(key, value)
    } else if xx {
        view.update(key, value)
    } else {
        view.put(key, value).map(|()| true)
    };
    match wrote {
        Err(e) => store_err(out, &e),
        Ok(_) if get && old => out.bulk(&conn.scratch),
        Ok(_) if get => out.null(),
        Ok(true) => out.ok(),
        Ok(false) => out.null(),
    }
}

fn incr_by(view: &mut View<'_>, conn: &mut Conn, key: &[u8], delta: Option<i64>, out: &mut Out) {
    let Some(delta) = delta else {
        return out.err(INVALID_INT);
    };
    let _g = view.sh.stripe(key);
    let cur = match view.get_into(key, &mut conn.scratch) {
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
    match view.put(key, new.to_string().as_bytes()) {
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
            sh.touch_all();
            return out.ok();
        }
        for k in &batch {
            let _g = sh.stripe_shared(k);
            if let Err(e) = map.delete(k) {
                sh.touch_all();
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
