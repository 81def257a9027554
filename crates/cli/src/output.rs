//! Rendering: the `inspect` report as text and JSON, and one-line JSON values.

use std::io::{self, Write};

use numakv::size::format_bytes;
use numakv::StoreInfo;
use serde_json::{json, Value};

/// Writes `v` as one line of compact JSON.
pub(crate) fn json_line(out: &mut dyn Write, v: &Value) -> io::Result<()> {
    writeln!(out, "{v}")
}

/// The `inspect` report as JSON.
pub(crate) fn info_json(info: &StoreInfo) -> Value {
    let space: Vec<Value> = info
        .space
        .iter()
        .map(|s| {
            json!({
                "node": s.node,
                "file": s.file.as_ref().map(|f| f.to_string_lossy().into_owned()),
                "capacity_bytes": s.capacity_bytes,
                "heap_pages": s.heap_pages,
                "used_pages": s.used_pages,
                "used_bytes": s.used_bytes,
                "engine_bytes": s.engine_bytes,
            })
        })
        .collect();
    let counters: serde_json::Map<_, _> =
        info.stats.counters.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    json!({
        "dir": info.dir.to_string_lossy(),
        "uuid": info.uuid,
        "pool_format_version": info.pool_format_version,
        "engine": info.engine.name(),
        "store": match info.store_kind {
            numakv::StoreKind::Bytes => "bytes",
            _ => "integer",
        },
        "engine_format_version": info.engine_format_version,
        "mode": info.mode.to_string(),
        "nodes": info.nodes,
        "capacity_per_node": info.capacity_per_node,
        "page_size": info.page_size,
        "was_clean": info.was_clean,
        "generation": info.generation,
        "space": space,
        "engine_pm_bytes": info.stats.pm_bytes(),
        "engine_dram_bytes": info.stats.dram_bytes,
        "counters": counters,
    })
}

/// The `inspect` report as aligned text.
pub(crate) fn info_text(out: &mut dyn Write, info: &StoreInfo) -> io::Result<()> {
    let row = |out: &mut dyn Write, k: &str, v: String| writeln!(out, "{k:<14}{v}");
    row(out, "store", info.dir.display().to_string())?;
    row(out, "uuid", info.uuid.clone())?;
    row(out, "pool format", format!("v{}", info.pool_format_version))?;
    row(out, "engine", format!("{} (format v{})", info.engine, info.engine_format_version))?;
    row(out, "keys", info.store_kind.to_string())?;
    row(out, "mode", info.mode.to_string())?;
    row(out, "nodes", info.nodes.to_string())?;
    row(
        out,
        "capacity",
        format!(
            "{} per node ({} bytes)",
            format_bytes(info.capacity_per_node),
            info.capacity_per_node
        ),
    )?;
    row(out, "page size", format_bytes(info.page_size))?;
    row(
        out,
        "clean",
        if info.was_clean {
            "yes (the last session closed the store cleanly)".to_string()
        } else {
            "no (the last session did not close the store; this open recovered it)".to_string()
        },
    )?;
    row(out, "opened", format!("{} times", info.generation))?;
    writeln!(out, "space per node:")?;
    writeln!(out, "  {:<6}{:>12}{:>12}{:>14}{:>8}", "node", "used", "engine", "heap", "used%")?;
    for s in &info.space {
        let heap = s.heap_pages * info.page_size;
        let pct =
            if s.heap_pages == 0 { 0.0 } else { 100.0 * s.used_pages as f64 / s.heap_pages as f64 };
        writeln!(
            out,
            "  {:<6}{:>12}{:>12}{:>14}{:>7.1}%",
            s.node,
            format_bytes(s.used_bytes),
            format_bytes(s.engine_bytes),
            format_bytes(heap),
            pct
        )?;
    }
    row(out, "engine DRAM", format_bytes(info.stats.dram_bytes))?;
    if !info.stats.counters.is_empty() {
        writeln!(out, "engine counters:")?;
        for (k, v) in &info.stats.counters {
            writeln!(out, "  {k:<24}{v}")?;
        }
    }
    Ok(())
}
