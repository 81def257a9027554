//! Command-line syntax: the clap definitions and the value parsers for keys, sizes and engine
//! options.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use numakv::{EngineKind, PersistMode};

/// Text shown after `numakv --help`.
const AFTER_HELP: &str = "\
Keys are integers in 1..=18446744073709551614 (0 and 2^64-1 are reserved), decimal or 0x-hex.
Values are any 64-bit unsigned integer, 0 included.
A bytes store (create --bytes) takes string keys of 1 B to 1 KiB, ordered bytewise, and values of
0 B to 1 MiB: put/get/del/scan take them as given, or as hex with --hex; put --value-file F
reads a value from a file; scan --prefix lists the keys starting with START.
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
    /// Machine-readable JSON output on stdout (also accepted after the store commands; for
    /// `bench` and `repro`, the report as JSON instead of the table).
    #[arg(long)]
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
    /// Bytes stores: apply puts and deletes read from FILE (or stdin) all or nothing, as one
    /// write batch. One operation per line: `put KEY VALUE` (VALUE is the rest of the line) or
    /// `del KEY`; empty lines and lines starting with `#` are skipped.
    Batch(BatchArgs),
    /// Print up to COUNT pairs in ascending key order, from the first key ≥ START (bytes
    /// stores: --prefix for the keys starting with START).
    Scan(ScanArgs),
    /// Describe a store: header, engine, clean-shutdown flag, space per node, engine counters.
    Inspect(DirArgs),
    /// Structural check (fsck) of a store: page heaps and the engine's invariants.
    Check(DirArgs),
    /// Benchmark engines and DRAM peers on the papers' workloads; with no arguments, a
    /// comparison of every engine and the DRAM peers on two emulated NUMA nodes (about a minute).
    #[command(after_long_help = bench_help(), args_override_self = true)]
    Bench(Box<BenchArgs>),
    /// Run a scaled-down reproduction of a paper's table or figure (`repro list` lists them).
    Repro(ReproArgs),
    /// Serve a bytes store over the Redis protocol (RESP2; RESP3 after HELLO 3) until SHUTDOWN, SIGTERM or SIGINT,
    /// then close it cleanly. Prints `listening on ADDR` once it accepts connections.
    #[command(after_long_help = engine_options_help())]
    Serve(ServeArgs),
}

/// `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Bytes store directory (with --create: created if it holds no store yet).
    pub dir: PathBuf,
    /// Create the bytes store if DIR holds none (then --engine is required; --nodes, --capacity,
    /// --page-size, --mode and -o apply to the new store).
    #[arg(long)]
    pub create: bool,
    /// Engine of a store created by --create.
    #[arg(long, short, value_name = "NAME", value_parser = parse_engine, help = engine_help())]
    pub engine: Option<EngineKind>,
    /// NUMA nodes (node files) of a created store.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub nodes: usize,
    /// Capacity of each node file of a created store, suffixes K/M/G/T.
    #[arg(long, default_value = "1G", value_name = "SIZE", value_parser = parse_size)]
    pub capacity: u64,
    /// Page-heap page size of a created store.
    #[arg(long, default_value = "256K", value_name = "SIZE", value_parser = parse_size)]
    pub page_size: u64,
    /// Persistence mode of a created store: adr or eadr.
    #[arg(long, default_value = "adr", value_name = "MODE", value_parser = parse_mode)]
    pub mode: PersistMode,
    /// Engine option KEY=VALUE of a created store (repeatable).
    #[arg(short = 'o', long = "opt", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub opts: Vec<(String, String)>,
    /// Address to listen on (port 0: any free port; the chosen one is printed).
    #[arg(long, default_value = "127.0.0.1:6379", value_name = "HOST:PORT")]
    pub bind: String,
    /// Worker threads (0: one per CPU). Each is placed on a NUMA node of the store, round-robin.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub threads: usize,
    /// Connections served at once; more are refused with "ERR max number of clients reached".
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub max_clients: usize,
    /// Count PM lines read and written (local and remote), flushes and fences of every command
    /// and report them, with the remote share, in `INFO numakv` (costs per line counted).
    #[arg(long)]
    pub accounting: bool,
}

/// `--json` after a store command (the same as before it).
#[derive(Debug, Args)]
pub struct JsonFlag {
    /// Machine-readable JSON output on stdout.
    #[arg(long)]
    pub json: bool,
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
    /// A bytes store: byte-string keys (1 B to 1 KiB, ordered bytewise) and values (0 B to
    /// 1 MiB) over the engine, instead of u64 keys and values. Recorded in the store.
    #[arg(long)]
    pub bytes: bool,
    #[command(flatten)]
    pub output: JsonFlag,
}

/// How keys and values are given on a bytes store.
#[derive(Debug, Args)]
pub struct BytesFlags {
    /// Bytes store: KEY, VALUE and START are hex (e.g. 00ff10), and output is hex.
    #[arg(long)]
    pub hex: bool,
}

/// `put`.
#[derive(Debug, Args)]
pub struct PutArgs {
    /// Store directory.
    pub dir: PathBuf,
    /// Key: on an integer store 1..=2^64-2 (decimal or 0x-hex); on a bytes store a string of
    /// 1 B to 1 KiB (hex with --hex).
    #[arg(allow_negative_numbers = true)]
    pub key: String,
    /// Value: on an integer store any u64 (decimal or 0x-hex); on a bytes store a string of
    /// 0 B to 1 MiB (hex with --hex; '' for empty). Omit it with --value-file.
    #[arg(allow_negative_numbers = true, required_unless_present = "value_file")]
    pub value: Option<String>,
    /// Bytes store: read the value from file F (any bytes).
    #[arg(long, value_name = "F", conflicts_with = "value")]
    pub value_file: Option<PathBuf>,
    #[command(flatten)]
    pub bytes: BytesFlags,
    /// Only insert: leave a present key unchanged (exit status 1).
    #[arg(long, conflicts_with = "if_present")]
    pub if_absent: bool,
    /// Only update: do nothing for an absent key (exit status 1).
    #[arg(long)]
    pub if_present: bool,
    #[command(flatten)]
    pub output: JsonFlag,
}

/// `batch`.
#[derive(Debug, Args)]
pub struct BatchArgs {
    /// Store directory (a bytes store).
    pub dir: PathBuf,
    /// File of operations, one per line (`put KEY VALUE`, `del KEY`); `-` or none: stdin.
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub bytes: BytesFlags,
    #[command(flatten)]
    pub output: JsonFlag,
}

/// `get`, `del`.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// Store directory.
    pub dir: PathBuf,
    /// Key: on an integer store 1..=2^64-2 (decimal or 0x-hex); on a bytes store a string
    /// (hex with --hex).
    #[arg(allow_negative_numbers = true)]
    pub key: String,
    #[command(flatten)]
    pub bytes: BytesFlags,
    #[command(flatten)]
    pub output: JsonFlag,
}

/// `scan`.
#[derive(Debug, Args)]
pub struct ScanArgs {
    /// Store directory.
    pub dir: PathBuf,
    /// First key to consider: any u64 on an integer store, any string on a bytes store (hex
    /// with --hex; '' for the first key); the scan starts at the first stored key ≥ START.
    #[arg(allow_negative_numbers = true)]
    pub start: String,
    /// Maximum number of pairs to print.
    #[arg(allow_negative_numbers = true)]
    pub count: usize,
    /// Bytes store: only keys that start with START.
    #[arg(long)]
    pub prefix: bool,
    #[command(flatten)]
    pub bytes: BytesFlags,
    #[command(flatten)]
    pub output: JsonFlag,
}

/// `inspect`, `check`.
#[derive(Debug, Args)]
pub struct DirArgs {
    /// Store directory.
    pub dir: PathBuf,
    #[command(flatten)]
    pub output: JsonFlag,
}

/// `bench`. Every flag is optional; the defaults are the comparison `numakv bench` runs.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Print the engines, variants, DRAM peers and workload presets, then exit.
    #[arg(long)]
    pub list: bool,
    /// Targets to run, comma-separated (see --list); `default`: every engine with its paper
    /// defaults and the DRAM peers; `all`: also the engines' variants.
    #[arg(long, short, value_name = "A,B|default|all", default_value = "default")]
    pub engines: String,
    /// Workload presets, comma-separated (see --list).
    #[arg(long, short, value_name = "NAME[,NAME]", default_value = numakv_bench::presets::DEFAULT_COMPARISON)]
    pub workload: String,
    /// Keys loaded before each run [default: the preset's, 100000 for most].
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub keys: Option<u64>,
    /// Measured operations per run, all threads together (instead of --budget).
    #[arg(long, value_name = "N", value_parser = parse_count, conflicts_with = "duration")]
    pub ops: Option<u64>,
    /// Measured seconds per run (instead of --budget); workloads that use up their keys
    /// (nstore-delete100) always run by count.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub duration: Option<f64>,
    /// Measured seconds spread over all runs (each 0.25-5 s); ignored with --ops or --duration.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_BUDGET, allow_negative_numbers = true)]
    pub budget: f64,
    /// Worker thread counts, one run each.
    #[arg(long, short, value_name = "N[,N]", value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    /// NUMA nodes (emulated when the machine has fewer).
    #[arg(long, value_name = "K", default_value_t = 2)]
    pub nodes: usize,
    /// Worker placement on nodes: fill (node 0 first) or interleave.
    #[arg(long, value_name = "fill|interleave", default_value = "fill", value_parser = parse_from_str::<numakv_bench::Placement>)]
    pub placement: numakv_bench::Placement,
    /// Persistence mode of the engines' stores.
    #[arg(long, value_name = "adr|eadr", default_value = "adr", value_parser = parse_mode)]
    pub persist: PersistMode,
    /// Emulated PM latency during the measured phase.
    #[arg(long, value_name = "none|optane", default_value = "none", value_parser = parse_from_str::<numakv_bench::LatencyModel>)]
    pub latency: numakv_bench::LatencyModel,
    /// Key distribution, overriding the presets' (uniform | zipf:0.99 | latest | ...).
    #[arg(long, value_name = "DIST", value_parser = parse_from_str::<numakv_bench::Dist>)]
    pub dist: Option<numakv_bench::Dist>,
    /// Operation mix, overriding the presets' (e.g. get:50,update:50).
    #[arg(long, value_name = "OP:W[,OP:W]", value_parser = parse_from_str::<numakv_bench::Mix>)]
    pub mix: Option<numakv_bench::Mix>,
    /// Byte-string keys of N bytes (8..=1024): every selected engine also runs as its byte
    /// twin (`ENGINE+kNvM`, the engine under the byte-string layer) in the same bench, so the
    /// table shows the layer's cost beside the u64 engine. Default with --value-size: 16.
    #[arg(long, value_name = "N")]
    pub key_size: Option<usize>,
    /// Byte-string values of N bytes (8..=1048576) for the byte twins (see --key-size).
    /// Default with --key-size: 100.
    #[arg(long, value_name = "N")]
    pub value_size: Option<usize>,
    /// Seed of every generator (same seed, same operations).
    #[arg(long, value_name = "N", default_value_t = 42, value_parser = parse_u64)]
    pub seed: u64,
    /// Share of the operations (or time) run before measuring.
    #[arg(long, value_name = "F", default_value_t = 0.1, allow_negative_numbers = true)]
    pub warmup: f64,
    /// Time every N-th operation for the latency percentiles.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub latency_sample: u32,
    /// Do not count PM lines, flushes and fences. By default they are counted after the timed
    /// operations, over a further quarter of them, so the count does not slow the timed ones
    /// (with `--latency optane` the timed operations are the counted ones).
    #[arg(long)]
    pub no_accounting: bool,
    /// After each run, time a clean close and reopen.
    #[arg(long)]
    pub reopen: bool,
    /// After each run, time a crash and recovery.
    #[arg(long)]
    pub crash: bool,
    /// Run the structural check after each run (and after recovery).
    #[arg(long)]
    pub check: bool,
    /// Pin workers to CPUs [default: only on real multi-node machines].
    #[arg(long, value_name = "BOOL")]
    pub pin: Option<bool>,
    /// Loader threads [default: the run's thread count].
    #[arg(long, value_name = "N")]
    pub load_threads: Option<usize>,
    /// Where stores are created [default: /dev/shm if writable, else the temp directory].
    #[arg(long, value_name = "DIR")]
    pub scratch: Option<PathBuf>,
    /// Write the runs as JSON to PATH (`--json` before `bench` prints JSON instead).
    #[arg(long = "json", value_name = "PATH")]
    pub json_path: Option<PathBuf>,
    /// Write the runs as CSV to PATH.
    #[arg(long, value_name = "PATH")]
    pub csv: Option<PathBuf>,
    /// Draw throughput against threads to PATH.svg.
    #[arg(long, value_name = "PATH.svg")]
    pub plot: Option<PathBuf>,
    /// Write results.json, results.csv, results.txt and throughput.svg to DIR [default without
    /// --json/--csv/--plot: numakv-results/bench-<UTC time> under the current directory].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

/// The measured seconds `numakv bench` spreads over its runs by default.
pub const DEFAULT_BUDGET: f64 = 40.0;

/// `repro`.
#[derive(Debug, Args)]
pub struct ReproArgs {
    /// A reproduction's name, or `list`.
    #[arg(value_name = "NAME|list")]
    pub name: String,
    /// Targets to include, comma-separated; `default`: every engine with its paper defaults and
    /// the DRAM peers; `all`: also the engines' variants.
    #[arg(long, short, value_name = "A,B|default|all", default_value = "default")]
    pub engines: String,
    /// Where NAME.md, NAME.json and plots go [default: numakv-results/repro-NAME-<UTC time>].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Multiplies the default sizes (1 = seconds per engine).
    #[arg(long, value_name = "F", default_value_t = 1.0, allow_negative_numbers = true)]
    pub scale: f64,
    /// NUMA nodes for `space` and `recovery` (emulated when the machine has fewer).
    #[arg(long, value_name = "K", default_value_t = 2)]
    pub nodes: usize,
    /// Persistence mode of the engines' stores.
    #[arg(long, value_name = "adr|eadr", default_value = "adr", value_parser = parse_mode)]
    pub persist: PersistMode,
    /// Seed of every generator.
    #[arg(long, value_name = "N", default_value_t = 42, value_parser = parse_u64)]
    pub seed: u64,
    /// Where stores are created [default: /dev/shm if writable, else the temp directory].
    #[arg(long, value_name = "DIR")]
    pub scratch: Option<PathBuf>,
    /// Worker threads of `nbtree-factors` [default: 2; the paper ran 56]; for `redis`, the
    /// `numakv serve --threads` [default: one per CPU].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: Option<u64>,
    /// `redis`: requests per test (redis-benchmark -n).
    #[arg(long, value_name = "N", default_value_t = 200_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: u64,
    /// `redis`: parallel connections (redis-benchmark -c).
    #[arg(long, value_name = "N", default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub clients: u32,
    /// `redis`: random keys out of N (redis-benchmark -r) [default: every request uses one key].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub keyspace: Option<u64>,
    /// `redis`: times the whole sequence of servers runs; the table reports medians.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// `redis`: SET value bytes (redis-benchmark -d).
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub value_bytes: u32,
    /// `fastfair-original`: the original FAST_FAIR's key file (its `-i`), one integer per
    /// line [default: random keys, 200,000 × scale].
    #[arg(long, value_name = "PATH")]
    pub key_file: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
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

/// Parses a count: a u64 with optional `_` separators and a K/M/G (×1000) suffix.
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    let (digits, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1_000),
        Some((i, 'm' | 'M')) => (&t[..i], 1_000_000),
        Some((i, 'g' | 'G')) => (&t[..i], 1_000_000_000),
        _ => (t.as_str(), 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s:?} is not a count (e.g. 100000, 100K, 2M)"))
}

fn parse_from_str<T>(s: &str) -> Result<T, String>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    s.parse().map_err(|e: T::Err| e.to_string())
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

fn bench_help() -> String {
    format!(
        "Examples:\n  \
         numakv bench                                  # every engine + peers, default workloads, ~1 min\n  \
         numakv bench --list                           # targets and workload presets\n  \
         numakv bench -e fastfair,rwlock-btreemap -w ycsb-a --threads 1,2,4 --ops 1M\n  \
         numakv bench -w nstore-put100 --persist eadr --latency optane --out results\n\n\
         Distributions (--dist): {}\n\
         Operations (--mix): get, insert, upsert, update, remove, scan, rmw",
        numakv_bench::Dist::SYNTAX
    )
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
        assert_eq!(parse_count("100K"), Ok(100_000));
        assert_eq!(parse_count("2m"), Ok(2_000_000));
        assert_eq!(parse_count("1_000"), Ok(1_000));
        assert!(parse_count("1.5M").is_err());
        assert!(parse_count("99999999999G").is_err());
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
