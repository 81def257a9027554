//! `numakv bench` and `numakv repro`: the flags become a [`BenchConfig`] /
//! [`ReproOptions`], the targets are the engines (through the facade) and the DRAM peers, and
//! the results go to the terminal and to files.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use numakv::EngineKind;
use numakv_bench::repro::{self, ReproOptions};
use numakv_bench::repro_redis::{self, RedisOptions};
use numakv_bench::{engines, presets, target, BenchConfig, Progress};

use crate::args::{BenchArgs, ReproArgs};
use crate::{CliError, Exit};

/// Where results go when no output flag is given: under the current directory.
const RESULTS_DIR: &str = "numakv-results";

/// The [`BenchConfig`] the flags describe, and whether the output paths were left to us.
pub fn config(a: &BenchArgs) -> (BenchConfig, bool) {
    let config = BenchConfig {
        engines: vec![a.engines.clone()],
        workload: a.workload.clone(),
        keys: a.keys,
        ops: a.ops,
        duration: a.duration,
        budget: Some(a.budget),
        threads: a.threads.clone(),
        nodes: a.nodes,
        placement: a.placement,
        persist: a.persist,
        latency: a.latency,
        dist: a.dist.clone(),
        mix: a.mix.clone(),
        seed: a.seed,
        warmup: a.warmup,
        latency_sample: a.latency_sample,
        accounting: !a.no_accounting,
        reopen: a.reopen,
        crash: a.crash,
        check: a.check,
        pin: a.pin,
        load_threads: a.load_threads,
        scratch: a.scratch.clone(),
        json: a.json_path.clone(),
        csv: a.csv.clone(),
        plot: a.plot.clone(),
        out: a.out.clone(),
        quiet: a.quiet,
    };
    let default_out = config.json.is_none()
        && config.csv.is_none()
        && config.plot.is_none()
        && config.out.is_none();
    (config, default_out)
}

/// `numakv bench`.
pub fn bench(
    a: &BenchArgs,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Exit, CliError> {
    let available = engines::available();
    if a.list {
        list(out, &available)?;
        return Ok(Exit::Ok);
    }
    let (mut config, default_out) = config(a);
    config.validate()?;
    let workloads = config.workloads()?;
    let mut targets = engines::select(&config.engines)?;
    if a.key_size.is_some() || a.value_size.is_some() {
        targets = numakv_bench::bytes::with_twins(
            targets,
            a.key_size.unwrap_or(16),
            a.value_size.unwrap_or(100),
        )?;
    }
    if default_out {
        config.out = Some(timestamped(RESULTS_DIR, "bench"));
    }
    let runs = workloads.len() * targets.len() * config.threads.len();
    let names: Vec<String> = targets.iter().map(|t| t.name()).collect();
    let _ = writeln!(
        err,
        "numakv bench: {runs} runs ({} x {} x threads {:?}) on {} node(s), {}; stores in {}",
        names.join(","),
        config.workload,
        config.threads,
        config.nodes,
        config.persist,
        config.scratch.clone().unwrap_or_else(numakv_bench::default_scratch).display(),
    );
    let started = Instant::now();
    let report = numakv_bench::run_workloads(&config, &workloads, &targets, Progress::Auto)?;
    if json {
        writeln!(out, "{}", report.to_json()?)?;
    } else {
        write!(out, "{}", report.to_table())?;
    }
    // The table first, then the notes on stderr (stdout is buffered).
    out.flush()?;
    let written = numakv_bench::write_outputs(&report, &config)?;
    let _ = writeln!(err, "finished {runs} runs in {:.0?}", started.elapsed());
    if let Some(note) = report.pool_pages_note() {
        let _ = writeln!(err, "{note}");
    }
    for path in &written {
        let _ = writeln!(err, "wrote {}", path.display());
    }
    if let Some(dir) = &config.out {
        let _ = writeln!(err, "results in {}", dir.display());
    }
    failures(&report, err)
}

/// `numakv repro`.
pub fn repro(
    a: &ReproArgs,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Exit, CliError> {
    if a.name.eq_ignore_ascii_case("list") {
        let width = repro::list().iter().map(|r| r.name.len()).max().unwrap_or(0);
        for r in repro::list() {
            writeln!(out, "{:width$}  {} ({})", r.name, r.title, r.source)?;
        }
        return Ok(Exit::Ok);
    }
    let name = a.name.trim().to_ascii_lowercase();
    if !repro::list().iter().any(|r| r.name == name) {
        let available: Vec<&str> = repro::list().iter().map(|r| r.name).collect();
        return Err(CliError::Usage(format!(
            "unknown reproduction {:?} (available: {}; or `list`)",
            a.name,
            available.join(", ")
        )));
    }
    // `redis` serves bytes stores from `numakv serve` processes: engine names, not targets.
    let (targets, redis) = if name == "redis" {
        (Vec::new(), redis_options(a)?)
    } else {
        (engines::select(std::slice::from_ref(&a.engines))?, RedisOptions::default())
    };
    let opts = ReproOptions {
        out_dir: a
            .out
            .clone()
            .unwrap_or_else(|| timestamped(RESULTS_DIR, &format!("repro-{name}"))),
        scale: a.scale,
        nodes: a.nodes,
        persist: a.persist,
        seed: a.seed,
        quiet: a.quiet,
        scratch: a.scratch.clone(),
        threads: a.threads.map(|t| t as usize),
        redis,
        key_file: a.key_file.clone(),
    };
    let started = Instant::now();
    let output = repro::run(&name, &targets, &opts, Progress::Auto)?;
    if json {
        writeln!(out, "{}", output.report.to_json()?)?;
    } else {
        write!(out, "{}", output.markdown)?;
    }
    out.flush()?;
    let _ = writeln!(err, "finished in {:.0?}", started.elapsed());
    for path in &output.files {
        let _ = writeln!(err, "wrote {}", path.display());
    }
    failures(&output.report, err)
}

/// `repro redis`'s knobs from the flags; `--engines`: `default` (fastfair, nbtree, nstore),
/// `all` (every engine) or engine names, comma-separated.
pub fn redis_options(a: &ReproArgs) -> Result<RedisOptions, CliError> {
    let engines: Vec<String> = match a.engines.trim() {
        "default" => repro_redis::DEFAULT_ENGINES.iter().map(|e| (*e).to_owned()).collect(),
        "all" => EngineKind::ALL.iter().map(|k| k.name().to_owned()).collect(),
        list => list.split(',').map(|e| e.trim().to_owned()).filter(|e| !e.is_empty()).collect(),
    };
    if let Some(bad) = engines.iter().find(|e| EngineKind::from_name(e).is_none()) {
        let known: Vec<&str> = EngineKind::ALL.iter().map(|k| k.name()).collect();
        return Err(CliError::Usage(format!(
            "repro redis: {bad:?} is not an engine (engines: {}; or default, all)",
            known.join(", ")
        )));
    }
    if engines.is_empty() {
        return Err(CliError::Usage("repro redis: --engines names no engine".into()));
    }
    let numakv = std::env::current_exe().map_err(CliError::Output)?;
    Ok(RedisOptions {
        numakv: Some(numakv),
        engines,
        requests: a.requests,
        clients: a.clients,
        keyspace: a.keyspace,
        value_bytes: a.value_bytes,
        rounds: a.rounds,
        threads: a.threads.map_or(0, |t| t as usize),
        ..RedisOptions::default()
    })
}

/// Exit status 3 if any run failed (the table and files still hold the others).
fn failures(report: &numakv_bench::Report, err: &mut dyn Write) -> Result<Exit, CliError> {
    if report.failures.is_empty() {
        return Ok(Exit::Ok);
    }
    let _ = writeln!(err, "error: {} run(s) failed (listed above)", report.failures.len());
    Ok(Exit::Store)
}

fn list(
    out: &mut dyn Write,
    targets: &[std::sync::Arc<dyn numakv_bench::Target>],
) -> Result<(), CliError> {
    writeln!(out, "Targets (--engines):")?;
    for line in target::describe(targets).lines() {
        writeln!(out, "  {line}")?;
    }
    writeln!(out, "\nWorkloads (--workload; default {}):", presets::DEFAULT_COMPARISON)?;
    let width = presets::PRESETS.iter().map(|p| p.name.len()).max().unwrap_or(0);
    for p in presets::PRESETS {
        writeln!(out, "  {:width$}  {} [{}]", p.name, p.summary, p.source)?;
    }
    writeln!(out, "\nReproductions (numakv repro NAME):")?;
    let width = repro::list().iter().map(|r| r.name.len()).max().unwrap_or(0);
    for r in repro::list() {
        writeln!(out, "  {:width$}  {}", r.name, r.title)?;
    }
    Ok(())
}

/// `base/prefix-YYYYMMDD-HHMMSS` (UTC), with `-2`, `-3`, ... if that exists already.
fn timestamped(base: &str, prefix: &str) -> PathBuf {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let stem = format!("{prefix}-{}", utc_stamp(secs));
    let first = Path::new(base).join(&stem);
    if !first.exists() {
        return first;
    }
    (2..)
        .map(|n| Path::new(base).join(format!("{stem}-{n}")))
        .find(|p| !p.exists())
        .unwrap_or(first)
}

/// `YYYYMMDD-HHMMSS` for seconds since the Unix epoch, UTC (proleptic Gregorian; days to date
/// by H. Hinnant's `civil_from_days`).
fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}{month:02}{day:02}-{:02}{:02}{:02}", rem / 3_600, rem % 3_600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "19700101-000000");
        assert_eq!(utc_stamp(951_782_400), "20000229-000000"); // a leap day
        assert_eq!(utc_stamp(1_795_259_045), "20261121-110405");
    }
}
