//! `numakv repro redis`: `redis-benchmark` SET and GET, pipelined, against `numakv serve` on
//! bytes stores of several engines and against Debian's `redis-server` with persistence off,
//! one server after another in one run on the same machine (issue 23's measurement; the setting
//! of papers/nbtree.txt §VI-I, which puts the trees inside Redis).
//!
//! Every server is a process of its own, started here and shut down with SHUTDOWN: `redis-server`
//! from `PATH`, the numakv engines as `<numakv> serve DIR --create --engine E` with the binary
//! the caller names ([`RedisOptions::numakv`]; the CLI passes itself). A missing tool is an
//! error naming it ([`BenchError::MissingTool`]), never a skipped row; a server that fails
//! (does not start, `redis-benchmark` reports an error reply, a test is missing from its output)
//! is a failed run in the report, with `redis-benchmark`'s own words.

use std::fmt::Write as _;
use std::io::{Read, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{BenchError, Result};
use crate::report::{Report, RunFailure, RunResult};
use crate::repro::{failures_md, ReproOptions, REPROS};

/// The knobs of `numakv repro redis` (the CLI's `--requests`, `--clients`, `--keyspace`,
/// `--value-bytes`, `--threads`, `--engines`).
#[derive(Clone, Debug, PartialEq)]
pub struct RedisOptions {
    /// The `numakv` binary that runs `serve` (`None`: the repro fails with a clear error).
    pub numakv: Option<PathBuf>,
    /// Engines of the bytes stores served, in table order.
    pub engines: Vec<String>,
    /// Requests per test (`redis-benchmark -n`).
    pub requests: u64,
    /// Parallel connections (`-c`).
    pub clients: u32,
    /// Requests in flight per connection (`-P`).
    pub pipeline: u32,
    /// Value bytes of SET (`-d`).
    pub value_bytes: u32,
    /// Random keys out of this many (`-r`); `None`: every request uses one key.
    pub keyspace: Option<u64>,
    /// `numakv serve --threads` (0: one per CPU).
    pub threads: usize,
    /// PM capacity per node of each store.
    pub capacity: u64,
    /// Times the whole sequence (redis-server, then each engine) runs; the table shows each
    /// figure's median over the rounds, and each ratio's median over the rounds of the ratio
    /// to the same round's redis-server (on a shared machine one round's figures swing).
    pub rounds: u32,
}

impl Default for RedisOptions {
    fn default() -> RedisOptions {
        RedisOptions {
            numakv: None,
            engines: DEFAULT_ENGINES.iter().map(|e| (*e).to_owned()).collect(),
            requests: 200_000,
            clients: 50,
            pipeline: 16,
            value_bytes: 16,
            keyspace: None,
            threads: 0,
            capacity: 2 << 30,
            rounds: 1,
        }
    }
}

/// The engines issue 23 asks about.
pub const DEFAULT_ENGINES: &[&str] = &["fastfair", "nbtree", "nstore"];
/// The tests run, in `redis-benchmark`'s names.
const TESTS: [&str; 2] = ["SET", "GET"];
/// The throughput ratio issue 23 sets as the goal for SET and GET.
const GOAL: f64 = 0.8;
/// Name of the reference row.
const REDIS: &str = "redis-server";

/// One test's line of `redis-benchmark --csv`.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchLine {
    /// The test (`SET`, `GET`, ...).
    pub test: String,
    /// Requests per second.
    pub rps: f64,
    /// Median latency, ms (absent from old `redis-benchmark`s' CSV).
    pub p50_ms: Option<f64>,
    /// 99th percentile latency, ms.
    pub p99_ms: Option<f64>,
}

/// Parses `redis-benchmark --csv` output: a header line naming the columns (`"test","rps",
/// ... "p50_latency_ms" ... "p99_latency_ms" ...`, redis-benchmark 6.2 and later) then one line
/// per test; without a header (older versions), `"TEST","RPS"` lines.
///
/// # Errors
///
/// A line that does not parse (wrong column count, a non-numeric figure): the output is not what
/// this parser knows, and a guessed figure would be worse than none.
pub fn parse_csv(text: &str) -> std::result::Result<Vec<BenchLine>, String> {
    let rows: Vec<Vec<String>> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| l.split(',').map(|f| f.trim().trim_matches('"').to_owned()).collect())
        .collect();
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let header = first.first().is_some_and(|f| f == "test");
    let col = |name: &str| if header { first.iter().position(|f| f == name) } else { None };
    let (rps_at, p50_at, p99_at) = if header {
        (col("rps"), col("p50_latency_ms"), col("p99_latency_ms"))
    } else {
        (Some(1), None, None)
    };
    let Some(rps_at) = rps_at else {
        return Err(format!("no \"rps\" column in the header {first:?}"));
    };
    let num = |row: &[String], at: usize| -> std::result::Result<f64, String> {
        let f = row.get(at).ok_or_else(|| format!("line {row:?} has no column {at}"))?;
        f.parse::<f64>().map_err(|_| format!("{f:?} in line {row:?} is not a number"))
    };
    let mut out = Vec::new();
    for row in &rows[usize::from(header)..] {
        if row.len() != first.len() {
            return Err(format!(
                "line {row:?} has {} columns, the header {}",
                row.len(),
                first.len()
            ));
        }
        out.push(BenchLine {
            test: row[0].clone(),
            rps: num(row, rps_at)?,
            p50_ms: p50_at.map(|at| num(row, at)).transpose()?,
            p99_ms: p99_at.map(|at| num(row, at)).transpose()?,
        });
    }
    Ok(out)
}

/// Where `tool` is on `PATH`, if anywhere (an executable file).
pub fn find_tool(tool: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(tool)).find(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

fn require(tool: &str, package: &str) -> Result<PathBuf> {
    find_tool(tool).ok_or_else(|| BenchError::MissingTool {
        tool: tool.to_owned(),
        hint: format!("install it (Debian/Ubuntu: apt-get install {package}) or put it on PATH"),
    })
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::Io { path: path.to_path_buf(), source }
}

/// A free TCP port on 127.0.0.1 (bound then released: another process could take it in
/// between, and then the server's start fails visibly).
fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io_err(Path::new("127.0.0.1:0")))?;
    Ok(l.local_addr().map_err(io_err(Path::new("127.0.0.1:0")))?.port())
}

/// Sends one command (RESP array of bulk strings) and returns the first reply bytes.
fn command(port: u16, args: &[&str]) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        let _ = write!(req, "${}\r\n{a}\r\n", a.len());
    }
    s.write_all(req.as_bytes())?;
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf)?;
    Ok(buf[..n].to_vec())
}

/// A server process being measured; killed if still running when dropped.
struct Server {
    name: String,
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Server {
    fn start(name: &str, mut cmd: Command, port: u16, log: PathBuf) -> Result<Server> {
        let f = std::fs::File::create(&log).map_err(io_err(&log))?;
        let f2 = f.try_clone().map_err(io_err(&log))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f)
            .stderr(f2)
            .spawn()
            .map_err(|e| BenchError::Target { target: name.into(), message: format!("{e}") })?;
        let mut s = Server { name: name.into(), child, port, log };
        s.wait_up()?;
        Ok(s)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(5).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
    }

    /// Until the server answers PING (redis-benchmark, started earlier, retries forever).
    fn wait_up(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if command(self.port, &["PING"]).is_ok_and(|r| r.starts_with(b"+PONG")) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(self.failed(format!("exited ({status}) before answering PING")));
            }
            if Instant::now() > deadline {
                return Err(self.failed("did not answer PING within 30 s".into()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn failed(&self, what: String) -> BenchError {
        BenchError::Target {
            target: self.name.clone(),
            message: format!("{what}; log: {}", self.log_tail()),
        }
    }

    /// SHUTDOWN (NOSAVE for redis-server), then waits for the process; `Err` if it did not
    /// exit cleanly (for numakv: the store was not closed cleanly).
    fn stop(mut self, args: &[&str]) -> Result<()> {
        let _ = command(self.port, args);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) if s.success() => return Ok(()),
                Ok(Some(s)) => return Err(self.failed(format!("exited with {s} after SHUTDOWN"))),
                Ok(None) if Instant::now() > deadline => {
                    return Err(self.failed("still running 30 s after SHUTDOWN".into()))
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(self.failed(format!("waiting for it: {e}"))),
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The `redis-benchmark` command line for one server.
pub fn benchmark_args(o: &RedisOptions, port: u16) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "-h".into(),
        "127.0.0.1".into(),
        "-p".into(),
        port.to_string(),
        "-t".into(),
        TESTS.join(",").to_ascii_lowercase(),
        "-n".into(),
        o.requests.to_string(),
        "-c".into(),
        o.clients.to_string(),
        "-d".into(),
        o.value_bytes.to_string(),
        "-P".into(),
        o.pipeline.to_string(),
    ];
    if let Some(r) = o.keyspace {
        a.extend(["-r".into(), r.to_string()]);
    }
    a.push("--csv".into());
    a
}

/// Runs redis-benchmark against `port`; the parsed lines, or why they cannot be trusted.
fn benchmark(
    tool: &Path,
    o: &RedisOptions,
    port: u16,
) -> std::result::Result<Vec<BenchLine>, String> {
    let mut child = Command::new(tool)
        .args(benchmark_args(o, port))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting redis-benchmark: {e}"))?;
    // Read both pipes on threads (a full pipe would stall it), and bound the run: a server that
    // stops answering would otherwise keep redis-benchmark waiting forever.
    let mut so = child.stdout.take().ok_or("no stdout")?;
    let mut se = child.stderr.take().ok_or("no stderr")?;
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let limit = Duration::from_secs(120 + o.requests / 10_000);
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("redis-benchmark did not finish within {limit:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("waiting for redis-benchmark: {e}")),
        }
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    if !status.success() {
        return Err(format!("redis-benchmark exited with {status}: {}", err.trim()));
    }
    // redis-benchmark prints error replies ("Error from server: ...") on stderr and goes on.
    if !err.trim().is_empty() {
        let first: String = err.trim().chars().take(300).collect();
        return Err(format!("redis-benchmark reported: {first}"));
    }
    let lines = parse_csv(&out)?;
    for t in TESTS {
        if !lines.iter().any(|l| l.test == t) {
            return Err(format!("no {t} line in redis-benchmark's output: {out:?}"));
        }
    }
    Ok(lines)
}

fn run_result(
    round: u32,
    server: &str,
    threads: usize,
    persist: &str,
    o: &RedisOptions,
    l: &BenchLine,
) -> RunResult {
    let ns = |ms: Option<f64>| ms.map_or(0, |m| (m * 1e6).round() as u64);
    RunResult {
        engine: server.to_owned(),
        workload: l.test.clone(),
        threads,
        nodes: 1,
        placement: "-".into(),
        persist: persist.into(),
        latency: "none".into(),
        dist: if o.keyspace.is_some() { "uniform".into() } else { "one key".into() },
        keys: o.keyspace.unwrap_or(1),
        ops: o.requests,
        seconds: if l.rps > 0.0 { o.requests as f64 / l.rps } else { 0.0 },
        throughput_mops: l.rps / 1e6,
        p50_ns: ns(l.p50_ms),
        p99_ns: ns(l.p99_ms),
        counters: [("round".to_owned(), u64::from(round))].into(),
        ..RunResult::default()
    }
}

/// The reproduction; see the module docs.
pub fn redis(opts: &ReproOptions) -> Result<(String, Report, Vec<PathBuf>)> {
    let o = &opts.redis;
    // Every tool first: a missing one is reported before anything runs.
    let server_bin = require("redis-server", "redis-server")?;
    let bench_bin = require("redis-benchmark", "redis-tools")?;
    let Some(numakv) = o.numakv.clone() else {
        return Err(BenchError::Config(
            "repro redis: the numakv binary to run `serve` is not known (RedisOptions::numakv)"
                .into(),
        ));
    };
    if o.engines.is_empty() {
        return Err(BenchError::Config("repro redis: no engines to serve".into()));
    }
    for e in &o.engines {
        if numakv::EngineKind::from_name(e).is_none() {
            return Err(BenchError::UnknownTarget {
                name: e.clone(),
                available: numakv::EngineKind::ALL
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    if o.requests == 0 || o.clients == 0 || o.pipeline == 0 {
        return Err(BenchError::Config(
            "repro redis: requests, clients and pipeline must be positive".into(),
        ));
    }
    let scratch = opts.scratch.clone().unwrap_or_else(crate::default_scratch);
    let work = tempfile::Builder::new()
        .prefix("numakv-repro-redis")
        .tempdir_in(&scratch)
        .map_err(io_err(&scratch))?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = if o.threads == 0 { cpus } else { o.threads };
    let mut report = Report::default();
    let record = |report: &mut Report,
                  round: u32,
                  name: &str,
                  t: usize,
                  persist: &str,
                  r: Result<std::result::Result<Vec<BenchLine>, String>>| {
        match r {
            Ok(Ok(lines)) => {
                for l in lines.iter().filter(|l| TESTS.contains(&l.test.as_str())) {
                    report.runs.push(run_result(round, name, t, persist, o, l));
                }
            }
            Ok(Err(e)) => report.failures.push(RunFailure {
                engine: name.into(),
                workload: "SET,GET".into(),
                threads: t,
                error: format!("round {round}: {e}"),
            }),
            Err(e) => report.failures.push(RunFailure {
                engine: name.into(),
                workload: "SET,GET".into(),
                threads: t,
                error: format!("round {round}: {e}"),
            }),
        }
    };

    // Rounds interleave the servers, so a slow spell of a shared machine hits all of them.
    for round in 0..o.rounds.max(1) {
        // redis-server, persistence off (no RDB snapshots, no AOF).
        let port = free_port()?;
        let r = (|| {
            let mut cmd = Command::new(&server_bin);
            cmd.args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ])
            .arg("--dir")
            .arg(work.path());
            let s = Server::start(REDIS, cmd, port, work.path().join("redis-server.log"))?;
            let lines = benchmark(&bench_bin, o, port);
            s.stop(&["SHUTDOWN", "NOSAVE"])?;
            Ok(lines)
        })();
        record(&mut report, round, REDIS, 1, "none", r);

        for e in &o.engines {
            let name = format!("numakv-{e}");
            let port = free_port()?;
            let dir = work.path().join(e);
            let r = (|| {
                let mut cmd = Command::new(&numakv);
                cmd.arg("serve")
                    .arg(&dir)
                    .args(["--create", "--engine", e, "--capacity", &o.capacity.to_string()])
                    .args(["--mode", &opts.persist.to_string()])
                    .args([
                        "--bind",
                        &format!("127.0.0.1:{port}"),
                        "--threads",
                        &threads.to_string(),
                    ]);
                let s = Server::start(&name, cmd, port, work.path().join(format!("{e}.log")))?;
                let lines = benchmark(&bench_bin, o, port);
                // A clean exit: the store closed cleanly after the run.
                s.stop(&["SHUTDOWN"])?;
                Ok(lines)
            })();
            record(&mut report, round, &name, threads, &opts.persist.to_string(), r);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    let md = markdown(opts, &report, threads, cpus);
    Ok((md, report, Vec::new()))
}

fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    Some(if n % 2 == 1 { xs[n / 2] } else { (xs[n / 2 - 1] + xs[n / 2]) / 2.0 })
}

fn markdown(opts: &ReproOptions, report: &Report, threads: usize, cpus: usize) -> String {
    let o = &opts.redis;
    let info = REPROS.iter().find(|r| r.name == "redis");
    let mut md = String::new();
    let _ = writeln!(md, "# `numakv repro redis`: {}\n", info.map_or("", |i| i.title));
    let _ = writeln!(md, "Reproduces {}.\n", info.map_or("", |i| i.source));
    let keys = match o.keyspace {
        Some(r) => format!(
            "-r {r}: random keys `key:%012d` out of {r} (they all share their first 8 bytes, \
             `key:0000`, i.e. one prefix tree of the byte layer)"
        ),
        None => "no -r: every request uses the one key `key:__rand_int__`".into(),
    };
    let _ = writeln!(
        md,
        "Setup: `redis-benchmark -t set,get -n {} -c {} -d {} -P {}{}` against each server in \
         turn, on 127.0.0.1, {keys}. `redis-server` with persistence off (`--save '' \
         --appendonly no`), one thread; `numakv serve --threads {threads}` on a new bytes store \
         per engine ({} mode, in {}); {cpus} CPUs, shared by the server and redis-benchmark. \
         Each server is shut down with SHUTDOWN before the next starts; {}.\n",
        o.requests,
        o.clients,
        o.value_bytes,
        o.pipeline,
        o.keyspace.map_or(String::new(), |r| format!(" -r {r}")),
        opts.persist,
        opts.scratch.as_deref().map_or_else(
            || crate::default_scratch().display().to_string(),
            |p| p.display().to_string()
        ),
        if o.rounds > 1 {
            format!(
                "{} rounds of the whole sequence; each figure is the median over the rounds, \
                 each ratio the median of the ratios to the same round's redis-server",
                o.rounds
            )
        } else {
            "one round (`--rounds N` repeats the sequence and reports medians)".into()
        },
    );
    md.push_str(
        "## The claim\n\n\
         Issue 23 (after papers/nbtree.txt §VI-I, which measures the trees inside Redis): \
         throughput of at least 0.8x redis-server's while being crash-persistent — a numakv \
         reply to a SET is sent only after the write is durable in the store's mode.\n\n\
         ## Our measurement\n\n\
         | server | SET req/s | SET / redis | SET p99 ms | GET req/s | GET / redis | GET p99 ms |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    let round_of = |r: &RunResult| r.counters.get("round").copied().unwrap_or(0);
    let runs = |server: &str, test: &str| -> Vec<&RunResult> {
        report.runs.iter().filter(|r| r.engine == server && r.workload == test).collect()
    };
    // Median rps, median ratio to the same round's redis-server, median p99 (ms).
    let summary = |server: &str, test: &str| -> Option<(f64, Option<f64>, Option<f64>)> {
        let rs = runs(server, test);
        if rs.is_empty() {
            return None;
        }
        let base = runs(REDIS, test);
        let ratios: Vec<f64> = rs
            .iter()
            .filter_map(|r| {
                let b = base.iter().find(|b| round_of(b) == round_of(r))?;
                (b.throughput_mops > 0.0).then(|| r.throughput_mops / b.throughput_mops)
            })
            .collect();
        let p99s: Vec<f64> =
            rs.iter().filter(|r| r.p99_ns > 0).map(|r| r.p99_ns as f64 / 1e6).collect();
        let rps: Vec<f64> = rs.iter().map(|r| r.throughput_mops * 1e6).collect();
        Some((median(rps)?, median(ratios), median(p99s)))
    };
    let mut servers: Vec<String> = vec![REDIS.into()];
    servers.extend(o.engines.iter().map(|e| format!("numakv-{e}")));
    let mut below = Vec::new();
    for s in &servers {
        if runs(s, "SET").is_empty() && runs(s, "GET").is_empty() {
            let _ = writeln!(md, "| {s} | failed | | | | | |");
            continue;
        }
        let _ = write!(md, "| {s} |");
        for t in TESTS {
            match summary(s, t) {
                Some((rps, ratio, p99)) => {
                    let ratio_s = ratio.map_or("n/a".into(), |x| format!("{x:.2}x"));
                    let p99 = p99.map_or("n/a".into(), |x| format!("{x:.3}"));
                    let _ = write!(md, " {rps:.0} | {ratio_s} | {p99} |");
                    if s != REDIS && ratio.is_some_and(|x| x < GOAL) {
                        below.push(format!("{s} {t}"));
                    }
                }
                None => md.push_str(" failed | | |"),
            }
        }
        md.push('\n');
    }
    let _ = writeln!(
        md,
        "\nBelow the {GOAL}x goal in this run: {}.",
        if below.is_empty() { "none".into() } else { below.join(", ") }
    );
    failures_md(report, &mut md);
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_of_redis_benchmark_7() {
        let out = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                   \"SET\",\"719424.44\",\"1.012\",\"0.208\",\"0.975\",\"1.311\",\"1.463\",\"2.031\"\n\
                   \"GET\",\"836820.12\",\"0.889\",\"0.200\",\"0.871\",\"1.135\",\"1.231\",\"1.551\"\n";
        let l = parse_csv(out).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(
            l[0],
            BenchLine {
                test: "SET".into(),
                rps: 719424.44,
                p50_ms: Some(0.975),
                p99_ms: Some(1.463)
            }
        );
        assert_eq!(l[1].test, "GET");
        assert_eq!(l[1].p99_ms, Some(1.231));
    }

    #[test]
    fn csv_without_header_and_bad_csv() {
        let l = parse_csv("\"SET\",\"1000.00\"\n\"GET\",\"2000.00\"\n").unwrap();
        assert_eq!(l[1], BenchLine { test: "GET".into(), rps: 2000.0, p50_ms: None, p99_ms: None });
        assert_eq!(parse_csv("").unwrap(), Vec::new());
        assert!(parse_csv("\"test\",\"rps\"\n\"SET\",\"fast\"\n")
            .unwrap_err()
            .contains("not a number"));
        assert!(parse_csv("\"test\",\"rps\",\"p99_latency_ms\"\n\"SET\",\"1\"\n")
            .unwrap_err()
            .contains("columns"));
        assert!(parse_csv("\"test\",\"speed\"\n\"SET\",\"1\"\n")
            .unwrap_err()
            .contains("no \"rps\""));
    }

    #[test]
    fn benchmark_command_line() {
        let o = RedisOptions { requests: 1000, keyspace: Some(50), ..RedisOptions::default() };
        let a = benchmark_args(&o, 7000).join(" ");
        assert_eq!(a, "-h 127.0.0.1 -p 7000 -t set,get -n 1000 -c 50 -d 16 -P 16 -r 50 --csv");
        let a = benchmark_args(&RedisOptions::default(), 1).join(" ");
        assert!(!a.contains("-r") && a.contains("-n 200000"), "{a}");
    }

    #[test]
    fn table_ratios_goal_and_failures() {
        let o = RedisOptions {
            engines: vec!["fastfair".into(), "nbtree".into()],
            ..RedisOptions::default()
        };
        let opts = ReproOptions { redis: o.clone(), ..ReproOptions::default() };
        let line = |t: &str, rps: f64| BenchLine {
            test: t.into(),
            rps,
            p50_ms: Some(1.0),
            p99_ms: Some(2.5),
        };
        let mut report = Report::default();
        for (s, set, get) in [(REDIS, 1000.0, 2000.0), ("numakv-fastfair", 500.0, 1800.0)] {
            for l in [line("SET", set), line("GET", get)] {
                report.runs.push(run_result(0, s, 1, "adr", &o, &l));
            }
        }
        report.failures.push(RunFailure {
            engine: "numakv-nbtree".into(),
            workload: "SET,GET".into(),
            threads: 2,
            error: "redis-benchmark reported: ERR out of PM".into(),
        });
        let md = markdown(&opts, &report, 2, 2);
        assert!(
            md.contains("| redis-server | 1000 | 1.00x | 2.500 | 2000 | 1.00x | 2.500 |"),
            "{md}"
        );
        assert!(
            md.contains("| numakv-fastfair | 500 | 0.50x | 2.500 | 1800 | 0.90x | 2.500 |"),
            "{md}"
        );
        assert!(md.contains("| numakv-nbtree | failed |"), "{md}");
        assert!(md.contains("Below the 0.8x goal in this run: numakv-fastfair SET."), "{md}");
        assert!(md.contains("ERR out of PM"), "{md}");
    }

    #[test]
    fn medians_over_rounds() {
        let o =
            RedisOptions { engines: vec!["fastfair".into()], rounds: 3, ..RedisOptions::default() };
        let opts = ReproOptions { redis: o.clone(), ..ReproOptions::default() };
        let line = |t: &str, rps: f64, p99: f64| BenchLine {
            test: t.into(),
            rps,
            p50_ms: None,
            p99_ms: Some(p99),
        };
        let mut report = Report::default();
        // Round by round: redis 1000 / 400 / 800, fastfair 900 / 390 / 400 (ratios 0.9, 0.975,
        // 0.5): the ratio's median is 0.9, not the ratio of the medians (800 / 400 = 0.5).
        for (round, rd, ff) in [(0, 1000.0, 900.0), (1, 400.0, 390.0), (2, 800.0, 400.0)] {
            for t in TESTS {
                report.runs.push(run_result(round, REDIS, 1, "none", &o, &line(t, rd, 1.0)));
                let p99 = f64::from(round) + 2.0;
                report.runs.push(run_result(
                    round,
                    "numakv-fastfair",
                    2,
                    "adr",
                    &o,
                    &line(t, ff, p99),
                ));
            }
        }
        let md = markdown(&opts, &report, 2, 2);
        assert!(
            md.contains("| redis-server | 800 | 1.00x | 1.000 | 800 | 1.00x | 1.000 |"),
            "{md}"
        );
        assert!(
            md.contains("| numakv-fastfair | 400 | 0.90x | 3.000 | 400 | 0.90x | 3.000 |"),
            "{md}"
        );
        assert!(md.contains("3 rounds of the whole sequence"), "{md}");
        assert!(md.contains("Below the 0.8x goal in this run: none."), "{md}");
        assert_eq!(median(vec![3.0, 1.0, 2.0, 10.0]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
    }

    #[test]
    fn a_missing_tool_is_named() {
        // No PATH lookup can find a name with a slash-free random suffix.
        assert!(find_tool("redis-benchmark-that-does-not-exist-4f9a").is_none());
        let e = require("redis-benchmark-that-does-not-exist-4f9a", "redis-tools").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("redis-benchmark-that-does-not-exist-4f9a")
                && msg.contains("apt-get install redis-tools"),
            "{msg}"
        );
    }
}
