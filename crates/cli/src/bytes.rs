//! `put`, `get`, `del`, `batch` and `scan` on a bytes store ([`numakv::BytesStore`]): keys and values are
//! the argument strings as given, or hex with `--hex`; `put --value-file` reads the value from a
//! file; `scan --prefix` lists the keys starting with START.
//!
//! Output: `get` writes the value's bytes as they are (hex with `--hex`) and a newline; `put`,
//! `del` and `scan` show keys and values with non-printable bytes escaped (`\x00`), long values in
//! `scan` cut at 64 bytes with their length.

use std::io::Write;

use numakv::{BytesStore, WriteBatch};
use serde_json::json;

use crate::args::{BatchArgs, KeyArgs, PutArgs, ScanArgs};
use crate::output;
use crate::{CliError, Exit};

/// Bytes of a value `scan` shows before cutting it.
const SCAN_VALUE_SHOWN: usize = 64;

fn hex_decode(what: &str, s: &str) -> Result<Vec<u8>, CliError> {
    let t = s.trim();
    let t = t.strip_prefix("0x").unwrap_or(t);
    if t.len() % 2 != 0 {
        return Err(CliError::Usage(format!("{what} {s:?} is not hex: odd number of digits")));
    }
    (0..t.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&t[i..i + 2], 16)
                .map_err(|_| CliError::Usage(format!("{what} {s:?} is not hex")))
        })
        .collect()
}

fn hex_encode(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A key or value argument: the string's bytes, or hex-decoded with `--hex`.
fn arg(what: &str, s: &str, hex: bool) -> Result<Vec<u8>, CliError> {
    if hex {
        hex_decode(what, s)
    } else {
        Ok(s.as_bytes().to_vec())
    }
}

/// A key or value for a human: hex, or printable with the rest escaped.
fn show(b: &[u8], hex: bool) -> String {
    if hex {
        hex_encode(b)
    } else {
        b.escape_ascii().to_string()
    }
}

/// A value in `scan` output: shown whole up to 64 bytes, else cut with its length.
fn show_value(b: &[u8], hex: bool) -> String {
    if b.len() <= SCAN_VALUE_SHOWN {
        show(b, hex)
    } else {
        format!("{}... ({} bytes)", show(&b[..SCAN_VALUE_SHOWN], hex), b.len())
    }
}

/// `put` on a bytes store.
pub(crate) fn put(
    store: &BytesStore,
    a: &PutArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<Exit, CliError> {
    let hex = a.bytes.hex;
    let key = arg("key", &a.key, hex)?;
    let value = match (&a.value, &a.value_file) {
        (_, Some(f)) => std::fs::read(f).map_err(|e| {
            CliError::Usage(format!("cannot read the value file {}: {e}", f.display()))
        })?,
        (Some(v), None) => arg("value", v, hex)?,
        (None, None) => return Err(CliError::Usage("a VALUE or --value-file is needed".into())),
    };
    // The command holds the store's lock, so insert-then-update is as good as a put and tells
    // the user which one happened.
    let result = if a.if_present {
        if store.update(&key, &value)? {
            "updated"
        } else {
            "absent"
        }
    } else if store.insert(&key, &value)? {
        "inserted"
    } else if a.if_absent {
        "present"
    } else {
        store.put(&key, &value)?;
        "updated"
    };
    let shown = show(&key, hex);
    if json {
        output::json_line(
            out,
            &json!({ "key": shown, "value_bytes": value.len(), "result": result }),
        )?;
    }
    Ok(match result {
        "inserted" | "updated" => {
            if !json {
                writeln!(out, "{result} {shown} ({} bytes)", value.len())?;
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
                writeln!(out, "key {shown} {what}")?;
            }
            Exit::NotFound
        }
    })
}

/// `get` on a bytes store.
pub(crate) fn get(
    store: &BytesStore,
    a: &KeyArgs,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Exit, CliError> {
    let hex = a.bytes.hex;
    let key = arg("key", &a.key, hex)?;
    let value = store.get(&key)?;
    if json {
        let v = value.as_deref().map(|v| {
            if hex {
                hex_encode(v)
            } else {
                String::from_utf8_lossy(v).into_owned()
            }
        });
        output::json_line(out, &json!({ "key": show(&key, hex), "value": v }))?;
    } else if let Some(v) = &value {
        if hex {
            writeln!(out, "{}", hex_encode(v))?;
        } else {
            out.write_all(v)?;
            out.write_all(b"\n")?;
        }
    } else {
        let _ = writeln!(err, "key {} not found", show(&key, hex));
    }
    Ok(if value.is_some() { Exit::Ok } else { Exit::NotFound })
}

/// `del` on a bytes store.
pub(crate) fn del(
    store: &BytesStore,
    a: &KeyArgs,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Exit, CliError> {
    let hex = a.bytes.hex;
    let key = arg("key", &a.key, hex)?;
    let removed = store.delete(&key)?;
    let shown = show(&key, hex);
    if json {
        output::json_line(out, &json!({ "key": shown, "deleted": removed }))?;
    } else if removed {
        writeln!(out, "deleted {shown}")?;
    } else {
        let _ = writeln!(err, "key {shown} not found");
    }
    Ok(if removed { Exit::Ok } else { Exit::NotFound })
}

/// The operations of a `batch` file: `put KEY VALUE` (VALUE the rest of the line, may be empty)
/// or `del KEY`, one per line; blank lines and `#` comments skipped. A bad line is a usage error
/// naming it: nothing is written.
fn parse_batch(text: &str, hex: bool) -> Result<WriteBatch, CliError> {
    let mut b = WriteBatch::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let bad = |why: &str| CliError::Usage(format!("batch line {}: {why}: {line:?}", n + 1));
        let (op, rest) = line.split_once(' ').unwrap_or((line, ""));
        match op {
            "put" => {
                let Some((k, v)) = rest.split_once(' ') else {
                    return Err(bad("`put KEY VALUE` needs a key and a value"));
                };
                b.put(&arg("key", k, hex)?, &arg("value", v, hex)?);
            }
            "del" if !rest.is_empty() && !rest.contains(' ') => {
                b.delete(&arg("key", rest, hex)?);
            }
            "del" => return Err(bad("`del KEY` needs one key")),
            _ => return Err(bad("not `put KEY VALUE` or `del KEY`")),
        }
    }
    Ok(b)
}

/// `batch` on a bytes store: every operation checked, then all applied as one write batch
/// (all or nothing, across a crash too).
pub(crate) fn batch(
    store: &BytesStore,
    a: &BatchArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<Exit, CliError> {
    let text = match a.file.as_deref() {
        Some(f) if f != std::path::Path::new("-") => std::fs::read_to_string(f).map_err(|e| {
            CliError::Usage(format!("cannot read the batch file {}: {e}", f.display()))
        })?,
        _ => std::io::read_to_string(std::io::stdin())
            .map_err(|e| CliError::Usage(format!("cannot read the batch from stdin: {e}")))?,
    };
    let b = parse_batch(&text, a.bytes.hex)?;
    let done = store.write_batch(&b)?;
    let puts = b.ops().filter(|(_, v)| v.is_some()).count();
    let dels = b.len() - puts;
    let removed = b.ops().zip(&done.existed).filter(|((_, v), &e)| v.is_none() && e).count();
    if json {
        output::json_line(
            out,
            &json!({ "applied": done.applied, "puts": puts, "deletes": dels, "deleted": removed }),
        )?;
    } else {
        writeln!(out, "applied {puts} put(s) and {dels} delete(s) ({removed} key(s) deleted)")?;
    }
    Ok(Exit::Ok)
}

/// `scan` on a bytes store: streams the pairs as the layer's iterator yields them.
pub(crate) fn scan(
    store: &BytesStore,
    a: &ScanArgs,
    json: bool,
    out: &mut dyn Write,
) -> Result<Exit, CliError> {
    let hex = a.bytes.hex;
    let start = arg("start", &a.start, hex)?;
    let iter = if a.prefix {
        store.scan_prefix(&start, a.count)
    } else {
        store.scan(&start, None, a.count)
    };
    if json {
        out.write_all(b"[")?;
    }
    for (i, pair) in iter.enumerate() {
        let (k, v) = pair?;
        if json {
            let sep = if i == 0 { "" } else { "," };
            let v = if hex { hex_encode(&v) } else { String::from_utf8_lossy(&v).into_owned() };
            write!(out, "{sep}{}", json!({ "key": show(&k, hex), "value": v }))?;
        } else {
            writeln!(out, "{} {}", show(&k, hex), show_value(&v, hex))?;
        }
    }
    if json {
        out.write_all(b"]\n")?;
    }
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        assert_eq!(hex_decode("k", "00ff10").unwrap(), vec![0, 0xff, 0x10]);
        assert_eq!(hex_decode("k", "0x0a").unwrap(), vec![10]);
        assert!(hex_decode("k", "abc").is_err());
        assert!(hex_decode("k", "zz").is_err());
        assert_eq!(hex_encode(&[0, 0xff]), "00ff");
        assert_eq!(show(b"a\0b", false), "a\\x00b");
        assert!(show_value(&[b'x'; 100], false).ends_with("... (100 bytes)"));
    }
}
