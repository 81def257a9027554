//! Command-line syntax: the clap definitions and the value parsers for keys, sizes and engine
//! options.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use numakv::{EngineKind, PersistMode};

/// Text shown after `numakv --help`.
const AFTER_HELP: &str = "\
Keys are integers in 1..=18446744073709551614 (0 and 2^64-1 are reserved), decimal or 0x-hex.
Values are any 64-bit unsigned integer, 0 included.
Sizes are bytes with an optional binary suffix: 4096, 256K, 512M, 1G (1K = 1024).

Every command opens the store, does its work and closes the store cleanly; a store left unclean
by a crash is recovered by whichever command opens it next.

Exit status:
  0  success
  1  not found / condition not met (get or del of an absent key, put --if-absent on a present key,
     put --if-present on an absent key)
  2  usage error (bad arguments, reserved or non-numeric key, unknown engine or option)
  3  store error (no store, store locked, I/O error, out of space, engine mismatch)
  4  corrupted store (damaged header or node file, or check found a violated invariant)";

/// numakv: NUMA-aware persistent-memory indexes.
///
/// A store is a directory of node files (node0.pm, node1.pm, ...), one per NUMA node, holding one
/// engine's index of u64 keys to u64 values.
#[derive(Debug, Parser)]
#[command(name = "numakv", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// Machine-readable JSON output on stdout (get, scan, inspect, check, put, del, create).
    #[arg(long, global = true)]
    pub json: bool,

    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a new, empty store in DIR.
    #[command(after_long_help = engine_options_help())]
    Create(CreateArgs),
    /// Store VALUE under KEY (insert, or overwrite the present value).
    Put(PutArgs),
    /// Print the value stored under KEY.
    Get(KeyArgs),
    /// Remove KEY.
    Del(KeyArgs),
    /// Print up to COUNT pairs in ascending key order, from the first key ≥ START.
    Scan(ScanArgs),
    /// Describe a store: header, engine, clean-shutdown flag, space per node, engine counters.
    Inspect(DirArgs),
    /// Structural check (fsck) of a store: page heaps and the engine's invariants.
    Check(DirArgs),
}

/// `create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Store directory (created if missing; must not already hold a store).
    pub dir: PathBuf,
    /// Index engine.
    #[arg(long, short, value_name = "NAME", value_parser = parse_engine, help = engine_help())]
    pub engine: EngineKind,
    /// NUMA nodes, i.e. node files (1..=256; emulated when the machine has fewer).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub nodes: usize,
    /// Capacity of each node file in bytes, suffixes K/M/G/T (binary). Files are sparse: only
    /// touched pages use space.
    #[arg(long, default_value = "1G", value_name = "SIZE", value_parser = parse_size)]
    pub capacity: u64,
    /// Page-heap page size in bytes, a power of two ≥ 4K.
    #[arg(long, default_value = "256K", value_name = "SIZE", value_parser = parse_size)]
    pub page_size: u64,
    /// Persistence mode: adr (stores durable after flush + fence) or eadr (CPU caches are
    /// persistent; flushes are skipped). Fixed for the store's life.
    #[arg(long, default_value = "adr", value_name = "MODE", value_parser = parse_mode)]
    pub mode: PersistMode,
    /// Engine option KEY=VALUE (repeatable); see the list below (`create --help`).
    #[arg(short = 'o', long = "opt", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub opts: Vec<(String, String)>,
}

/// `put`.
#[derive(Debug, Args)]
pub struct PutArgs {
    /// Store directory.
    pub dir: PathBuf,
    /// Key, 1..=2^64-2 (decimal or 0x-hex).
    #[arg(value_parser = parse_key, allow_negative_numbers = true)]
    pub key: u64,
    /// Value, any u64 (decimal or 0x-hex).
    #[arg(value_parser = parse_u64, allow_negative_numbers = true)]
    pub value: u64,
    /// Only insert: leave a present key unchanged (exit status 1).
    #[arg(long, conflicts_with = "if_present")]
    pub if_absent: bool,
    /// Only update: do nothing for an absent key (exit status 1).
    #[arg(long)]
    pub if_present: bool,
}

/// `get`, `del`.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// Store directory.
    pub dir: PathBuf,
    /// Key, 1..=2^64-2 (decimal or 0x-hex).
    #[arg(value_parser = parse_key, allow_negative_numbers = true)]
    pub key: u64,
}

/// `scan`.
#[derive(Debug, Args)]
pub struct ScanArgs {
    /// Store directory.
    pub dir: PathBuf,
    /// First key to consider (any u64; the scan starts at the first stored key ≥ START).
    #[arg(value_parser = parse_u64, allow_negative_numbers = true)]
    pub start: u64,
    /// Maximum number of pairs to print.
    #[arg(allow_negative_numbers = true)]
    pub count: usize,
}

/// `inspect`, `check`.
#[derive(Debug, Args)]
pub struct DirArgs {
    /// Store directory.
    pub dir: PathBuf,
}

/// Parses a u64, decimal or `0x`-hex, `_` separators allowed.
pub fn parse_u64(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse::<u64>(),
    };
    parsed.map_err(|_| format!("{s:?} is not an unsigned 64-bit integer (decimal or 0x-hex)"))
}

/// Parses a user key: a u64 outside the reserved 0 and `u64::MAX`.
pub fn parse_key(s: &str) -> Result<u64, String> {
    let key = parse_u64(s)?;
    numakv::check_key(key).map_err(|e| e.to_string())?;
    Ok(key)
}

fn parse_size(s: &str) -> Result<u64, String> {
    numakv::size::parse_size(s)
}

fn parse_engine(s: &str) -> Result<EngineKind, String> {
    s.parse().map_err(|e: numakv::Error| e.to_string())
}

fn parse_mode(s: &str) -> Result<PersistMode, String> {
    s.parse()
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    Ok((k.trim().to_string(), v.trim().to_string()))
}

fn engine_help() -> String {
    let names: Vec<_> = EngineKind::all().iter().map(|k| k.name()).collect();
    format!("Index engine: {}", names.join(", "))
}

fn engine_options_help() -> String {
    let mut s = String::from("Engine options (-o KEY=VALUE; sizes accept K/M/G suffixes):\n");
    for &kind in EngineKind::all() {
        let defaults = kind.default_options().values();
        s.push_str(&format!("  {kind}:\n"));
        for key in kind.option_keys() {
            let default = defaults.iter().find(|(k, _)| *k == key.key).map(|(_, v)| v.as_str());
            s.push_str(&format!(
                "    {:<12} {} [default: {}]\n",
                key.key,
                key.help,
                default.unwrap_or("-")
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn keys_and_values_parse() {
        assert_eq!(parse_u64("0x10"), Ok(16));
        assert_eq!(parse_u64("1_000"), Ok(1000));
        assert_eq!(parse_u64("18446744073709551615"), Ok(u64::MAX));
        assert!(parse_u64("-1").is_err());
        assert!(parse_u64("abc").is_err());
        assert!(parse_u64("18446744073709551616").is_err());
        assert!(parse_key("0").unwrap_err().contains("reserved"));
        assert!(parse_key("0xffffffffffffffff").unwrap_err().contains("reserved"));
        assert_eq!(parse_key("18446744073709551614"), Ok(u64::MAX - 1));
        assert_eq!(parse_key_value("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(parse_key_value("ab").is_err());
    }

    #[test]
    fn engine_options_are_listed_in_create_help() {
        let help = engine_options_help();
        for &kind in EngineKind::all() {
            assert!(help.contains(kind.name()));
            for key in kind.option_keys() {
                assert!(help.contains(key.key), "{help}");
            }
        }
    }
}
