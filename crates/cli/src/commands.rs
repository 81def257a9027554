//! What each subcommand does. Every command that uses an existing store opens it, works, and
//! closes it cleanly — also when the work failed — so no invocation leaves the store unclean.

use std::io::Write;
use std::path::Path;

use numakv::{BytesStore, Options, Store, StoreKind};
use serde_json::json;

use crate::args::{Cli, Command, CreateArgs, JsonFlag, KeyArgs, PutArgs, ScanArgs};
use crate::output;
use crate::{CliError, Exit};

/// Runs the parsed command line. Results go to `out`; notes (e.g. "store was recovered") to
/// `err`. Failures come back as [`CliError`] for the caller to print and map to an exit status.
pub fn run(cli: &Cli, out: &mut dyn Write, err: &mut dyn Write) -> Result<Exit, CliError> {
    // `--json` before the subcommand, or after a store command.
    let json = |flag: &JsonFlag| cli.json || flag.json;
    match &cli.command {
        Command::Create(a) => create(a, json(&a.output), out),
        Command::Put(a) if is_bytes(&a.dir)? => {
            with_bytes(&a.dir, err, |s, _| crate::bytes::put(s, a, json(&a.output), out))
        }
        Command::Get(a) if is_bytes(&a.dir)? => {
            with_bytes(&a.dir, err, |s, err| crate::bytes::get(s, a, json(&a.output), out, err))
        }
        Command::Del(a) if is_bytes(&a.dir)? => {
            with_bytes(&a.dir, err, |s, err| crate::bytes::del(s, a, json(&a.output), out, err))
        }
        Command::Batch(a) if is_bytes(&a.dir)? => {
            with_bytes(&a.dir, err, |s, _| crate::bytes::batch(s, a, json(&a.output), out))
        }
        // An integer store has no batch; anything else unopenable: the open says why.
        Command::Batch(a) if Store::kind_of(&a.dir).is_ok() => {
            Err(CliError::Usage("batch needs a bytes store (one created with --bytes)".into()))
        }
        Command::Batch(a) => {
            with_bytes(&a.dir, err, |s, _| crate::bytes::batch(s, a, json(&a.output), out))
        }
        Command::Scan(a) if is_bytes(&a.dir)? => {
            with_bytes(&a.dir, err, |s, _| crate::bytes::scan(s, a, json(&a.output), out))
        }
        Command::Inspect(a) if is_bytes(&a.dir)? => {
            with_bytes(&a.dir, err, |s, _| inspect_info(s.inspect(), json(&a.output), out))
        }
        Command::Check(a) if is_bytes(&a.dir)? => with_bytes(&a.dir, err, |s, _| {
            let was_clean = s.recovery().is_none_or(|r| r.was_clean);
            check_report(s.fsck(), was_clean, json(&a.output), out)
        }),
        Command::Put(a) => with_store(&a.dir, err, |s, _| put(s, a, json(&a.output), out)),
        Command::Get(a) => with_store(&a.dir, err, |s, err| get(s, a, json(&a.output), out, err)),
        Command::Del(a) => with_store(&a.dir, err, |s, err| del(s, a, json(&a.output), out, err)),
        Command::Scan(a) => with_store(&a.dir, err, |s, _| scan(s, a, json(&a.output), out)),
        Command::Inspect(a) => {
            with_store(&a.dir, err, |s, _| inspect_info(s.inspect(), json(&a.output), out))
        }
        Command::Check(a) => with_store(&a.dir, err, |s, _| {
            let was_clean = s.recovery().is_none_or(|r| r.was_clean);
            check_report(s.fsck(), was_clean, json(&a.output), out)
        }),
        Command::Bench(a) => crate::bench::bench(a, cli.json, out, err),
        Command::Repro(a) => crate::bench::repro(a, cli.json, out, err),
        Command::Serve(a) => crate::serve::serve(a, out, err),
    }
}

/// Whether `dir` holds a bytes store (a missing or unreadable store reads as an integer one:
/// its open then reports what is wrong).
fn is_bytes(dir: &Path) -> Result<bool, CliError> {
    Ok(matches!(Store::kind_of(dir), Ok((_, StoreKind::Bytes))))
}

/// A note on stderr when the open had to recover the store.
fn recovered_note(dir: &Path, r: Option<&numakv::RecoveryReport>, err: &mut dyn Write) {
    if let Some(r) = r.filter(|r| !r.was_clean) {
        // A note, not output: a failed write to stderr must not fail the command.
        let _ = writeln!(
            err,
            "note: {}: the store was not closed cleanly; recovered in {:.1?}",
            dir.display(),
            r.elapsed
        );
    }
}

/// [`with_store`] for a bytes store.
fn with_bytes<T>(
    dir: &Path,
    err: &mut dyn Write,
    f: impl FnOnce(&BytesStore, &mut dyn Write) -> Result<T, CliError>,
) -> Result<T, CliError> {
    let store = BytesStore::open(dir)?;
    recovered_note(dir, store.recovery(), err);
    let result = f(&store, err);
    let closed = store.close();
    let value = result?;
    closed?;
    Ok(value)
}

/// An integer store's key argument (exit status 2 when it does not parse or is reserved).
fn int_key(s: &str) -> Result<u64, CliError> {
    crate::args::parse_key(s).map_err(|m| CliError::Usage(format!("invalid key {s:?}: {m}")))
}

/// An integer store's u64 argument.
fn int_arg(what: &str, s: &str) -> Result<u64, CliError> {
    crate::args::parse_u64(s).map_err(|m| CliError::Usage(format!("invalid {what} {s:?}: {m}")))
}

/// Refuses the bytes-store flags on an integer store.
fn no_bytes_flags(hex: bool, other: Option<&str>) -> Result<(), CliError> {
    if hex {
        return Err(CliError::Usage("--hex is for bytes stores (create --bytes)".into()));
    }
    if let Some(flag) = other {
        return Err(CliError::Usage(format!("{flag} is for bytes stores (create --bytes)")));
    }
    Ok(())
}

/// Opens the store in `dir`, runs `f` on it (with `err` for notes), and closes it cleanly whatever `f` returned.
fn with_store<T>(
    dir: &Path,
    err: &mut dyn Write,
    f: impl FnOnce(&Store, &mut dyn Write) -> Result<T, CliError>,
) -> Result<T, CliError> {
    let store = Store::open(dir)?;
    recovered_note(dir, store.recovery(), err);
    let result = f(&store, err);
    let closed = store.close();
    let value = result?;
    closed?;
    Ok(value)
}

fn create(a: &CreateArgs, json: bool, out: &mut dyn Write) -> Result<Exit, CliError> {
    let mut engine = a.engine.default_options();
    for (key, value) in &a.opts {
        engine.set(key, value)?;
    }
    let opts = Options::default()
        .nodes(a.nodes)
        .capacity_per_node(a.capacity)
        .page_size(a.page_size)
        .mode(a.mode)
        .engine(engine.clone());
    let info = if a.bytes {
        let store = BytesStore::create(&a.dir, a.engine, opts)?;
        let info = store.inspect();
        store.close()?;
        info?
    } else {
        let store = Store::create(&a.dir, a.engine, opts)?;
        let info = store.inspect();
        store.close()?;
        info?
    };
    let kind = if a.bytes { "bytes" } else { "integer" };
    if json {
        let engine_options: serde_json::Map<_, _> =
            engine.values().into_iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        output::json_line(
            out,
            &json!({
                "created": info.dir.to_string_lossy(),
                "engine": info.engine.name(),
                "store": kind,
                "engine_options": engine_options,
                "nodes": info.nodes,
                "capacity_per_node": info.capacity_per_node,
                "page_size": info.page_size,
                "mode": info.mode.to_string(),
                "uuid": info.uuid,
            }),
        )?;
    } else {
        let opts: Vec<_> = engine.values().into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        writeln!(
            out,
            "created {}{} store in {}: {} node(s) x {}, mode {}, options {}",
            info.engine,
            if a.bytes { " bytes" } else { "" },
            info.dir.display(),
            info.nodes,
            numakv::size::format_bytes(info.capacity_per_node),
            info.mode,
            opts.join(" ")
        )?;
    }
    Ok(Exit::Ok)
}

fn put(store: &Store, a: &PutArgs, json: bool, out: &mut dyn Write) -> Result<Exit, CliError> {
    no_bytes_flags(a.bytes.hex, a.value_file.as_ref().map(|_| "--value-file"))?;
    let key = int_key(&a.key)?;
    let value = int_arg("value", a.value.as_deref().unwrap_or_default())?;
    let a = IntPut { key, value, if_absent: a.if_absent, if_present: a.if_present };
    // The command holds the store's lock, so insert-then-update is as good as an upsert and
    // tells the user which one happened.
    let result = if a.if_present {
        if store.update(a.key, a.value)? {
            "updated"
        } else {
            "absent"
        }
    } else if store.insert(a.key, a.value)? {
        "inserted"
    } else if a.if_absent {
        "present"
    } else {
        store.upsert(a.key, a.value)?;
        "updated"
    };
    if json {
        output::json_line(out, &json!({ "key": a.key, "value": a.value, "result": result }))?;
    }
    Ok(match result {
        "inserted" | "updated" => {
            if !json {
                writeln!(out, "{result} {}", a.key)?;
            }
            Exit::Ok
        }
        _ => {
            if !json {
                let what = if result == "present" {
                    "is present; not changed (--if-absent)"
                } else {
                    "is absent; not inserted (--if-present)"
                };
                writeln!(out, "key {} {what}", a.key)?;
            }
            Exit::NotFound
        }
    })
}

/// `put`'s arguments on an integer store, parsed.
struct IntPut {
    key: u64,
    value: u64,
    if_absent: bool,
    if_present: bool,
}

fn get(
    store: &Store,
    a: &KeyArgs,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Exit, CliError> {
    no_bytes_flags(a.bytes.hex, None)?;
    let a = IntKey { key: int_key(&a.key)? };
    let value = store.get(a.key)?;
    if json {
        output::json_line(out, &json!({ "key": a.key, "value": value }))?;
    } else if let Some(v) = value {
        writeln!(out, "{v}")?;
    } else {
        let _ = writeln!(err, "key {} not found", a.key);
    }
    Ok(if value.is_some() { Exit::Ok } else { Exit::NotFound })
}

fn del(
    store: &Store,
    a: &KeyArgs,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Exit, CliError> {
    no_bytes_flags(a.bytes.hex, None)?;
    let a = IntKey { key: int_key(&a.key)? };
    let removed = store.remove(a.key)?;
    if json {
        output::json_line(out, &json!({ "key": a.key, "deleted": removed }))?;
    } else if removed {
        writeln!(out, "deleted {}", a.key)?;
    } else {
        let _ = writeln!(err, "key {} not found", a.key);
    }
    Ok(if removed { Exit::Ok } else { Exit::NotFound })
}

/// A key argument on an integer store, parsed.
struct IntKey {
    key: u64,
}

fn scan(store: &Store, a: &ScanArgs, json: bool, out: &mut dyn Write) -> Result<Exit, CliError> {
    no_bytes_flags(a.bytes.hex, a.prefix.then_some("--prefix"))?;
    let start = int_arg("start", &a.start)?;
    // Scan in batches so a huge COUNT neither allocates up front nor holds everything.
    const BATCH: usize = 4096;
    let mut buf = Vec::with_capacity(BATCH.min(a.count));
    let mut next = start;
    let mut left = a.count;
    let mut first = true;
    if json {
        out.write_all(b"[")?;
    }
    while left > 0 {
        buf.clear();
        let want = BATCH.min(left);
        let n = store.scan(next, want, &mut buf)?;
        for &(k, v) in &buf {
            if json {
                let sep = if first { "" } else { "," };
                write!(out, "{sep}{}", json!({ "key": k, "value": v }))?;
            } else {
                writeln!(out, "{k} {v}")?;
            }
            first = false;
        }
        left -= n;
        if n < want {
            break; // the end of the index
        }
        match buf.last() {
            Some(&(k, _)) if k < numakv::MAX_KEY => next = k + 1,
            _ => break,
        }
    }
    if json {
        out.write_all(b"]\n")?;
    }
    Ok(Exit::Ok)
}

fn inspect_info(
    info: numakv::Result<numakv::StoreInfo>,
    json: bool,
    out: &mut dyn Write,
) -> Result<Exit, CliError> {
    let info = info?;
    if json {
        output::json_line(out, &output::info_json(&info))?;
    } else {
        output::info_text(out, &info)?;
    }
    Ok(Exit::Ok)
}

fn check_report(
    report: numakv::Result<numakv::CheckReport>,
    was_clean: bool,
    json: bool,
    out: &mut dyn Write,
) -> Result<Exit, CliError> {
    match report {
        Ok(r) => {
            if json {
                output::json_line(
                    out,
                    &json!({
                        "ok": true,
                        "was_clean": was_clean,
                        "entries": r.entries,
                        "reachable_blocks": r.reachable_blocks,
                        "allocated_blocks": r.allocated_blocks,
                    }),
                )?;
            } else {
                writeln!(
                    out,
                    "ok: {} entries, {} reachable PM blocks, {} allocated{}",
                    r.entries,
                    r.reachable_blocks,
                    r.allocated_blocks,
                    if was_clean { "" } else { " (after recovery)" }
                )?;
            }
            Ok(Exit::Ok)
        }
        Err(e) => {
            if json {
                output::json_line(out, &json!({ "ok": false, "error": e.to_string() }))?;
            }
            Err(CliError::Store(e))
        }
    }
}
