//! `numakv repro fastfair-original`: the original FAST_FAIR's own benchmark protocol over our
//! engines, so a user with the C++ original (DICL/FAST_FAIR, `concurrent/src/test.cpp`) can
//! compare on one machine: insert the first half of a key list (untimed warm-up, one thread),
//! time searching that half with T threads (each a contiguous share), then time inserting the
//! other half with T threads. The key list is the original's `-i` file (one integer per line)
//! when given, else random keys from the seed. Values are the keys, as in the original.
//!
//! The C++ prints microseconds per phase (`Concurrent searching with T threads (usec)`); this
//! prints Mops/s for both, and the microseconds, so the two read side by side.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use numakv_numa::{Placement, Registry, Topology};
use numakv_pmem::account;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::error::{BenchError, Result};
use crate::report::{Report, RunFailure, RunResult};
use crate::repro::{header, scaled, ReproOptions};
use crate::runner::Progress;
use crate::target::{Target, TargetEnv};

/// Thread counts when `--threads` is not given (the 1 and 2).
const DEFAULT_THREADS: [usize; 2] = [1, 2];
/// Keys at scale 1 (the smaller of the two sizes; `--scale 20` gives 4M).
const BASE_KEYS: u64 = 200_000;

/// Reads the original's key file: one integer per line (blank lines skipped).
///
/// # Errors
/// [`BenchError::Config`] naming the line that is not a key in `1..u64::MAX`.
pub fn read_key_file(path: &Path) -> Result<Vec<u64>> {
    let f = std::fs::File::open(path).map_err(|e| BenchError::io(path, e))?;
    let mut keys = Vec::new();
    for (n, line) in BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| BenchError::io(path, e))?;
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        match t.parse::<u64>() {
            Ok(k) if k != 0 && k != u64::MAX => keys.push(k),
            _ => {
                return Err(BenchError::Config(format!(
                    "{}:{}: {t:?} is not a key (an integer in 1..2^64-1)",
                    path.display(),
                    n + 1
                )))
            }
        }
    }
    if keys.len() < 2 {
        return Err(BenchError::Config(format!("{}: fewer than 2 keys", path.display())));
    }
    Ok(keys)
}

/// Distinct random keys from `seed` (the original's files hold distinct random integers).
fn random_keys(n: usize, seed: u64) -> Vec<u64> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut seen = std::collections::HashSet::with_capacity(n);
    let mut keys = Vec::with_capacity(n);
    while keys.len() < n {
        let k = rng.gen_range(1..u64::MAX >> 1);
        if seen.insert(k) {
            keys.push(k);
        }
    }
    keys
}

/// Splits `keys` into `threads` contiguous shares, the last taking the remainder (as the
/// original does).
fn shares(keys: &[u64], threads: usize) -> Vec<&[u64]> {
    let per = keys.len() / threads;
    (0..threads)
        .map(|t| {
            let end = if t + 1 == threads { keys.len() } else { (t + 1) * per };
            &keys[t * per..end]
        })
        .collect()
}

/// One phase: every thread registered on the run's registry, then `op` over its share.
/// Returns the wall time of the phase — from the first worker's start to the last one's end,
/// timed by the workers themselves (the spawning thread may not run again until a worker is
/// done, on a machine with as many cores as workers) — and the first error.
fn phase(
    registry: &Registry,
    parts: &[&[u64]],
    op: &(dyn Fn(u64) -> numakv_index::Result<bool> + Sync),
) -> (f64, Option<String>) {
    let barrier = std::sync::Barrier::new(parts.len());
    let results: Vec<(Instant, Instant, Option<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = parts
            .iter()
            .map(|part| {
                let barrier = &barrier;
                s.spawn(move || {
                    let _reg = registry.register();
                    barrier.wait();
                    let start = Instant::now();
                    let mut err = None;
                    for &k in *part {
                        match op(k) {
                            Ok(true) => {}
                            Ok(false) => {
                                err = Some(format!("key {k}: not found or not new"));
                                break;
                            }
                            Err(e) => {
                                err = Some(format!("key {k}: {e}"));
                                break;
                            }
                        }
                    }
                    (start, Instant::now(), err)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    let now = Instant::now();
                    (now, now, Some("worker panicked".into()))
                })
            })
            .collect()
    });
    let start = results.iter().map(|r| r.0).min();
    let end = results.iter().map(|r| r.1).max();
    let seconds = match (start, end) {
        (Some(s), Some(e)) => e.duration_since(s).as_secs_f64(),
        _ => 0.0,
    };
    (seconds, results.into_iter().find_map(|r| r.2))
}

/// Runs the protocol on every target and thread count.
pub fn original(
    targets: &[Arc<dyn Target>],
    opts: &ReproOptions,
    _progress: Progress,
) -> Result<(String, Report, Vec<PathBuf>)> {
    let key_file = opts.key_file.as_ref();
    let keys = match key_file {
        Some(p) => read_key_file(p)?,
        None => random_keys(scaled(BASE_KEYS, opts.scale, 1_000) as usize, opts.seed),
    };
    let half = keys.len() / 2;
    let thread_counts: Vec<usize> = match opts.threads {
        Some(t) => vec![t.max(1)],
        None => DEFAULT_THREADS.to_vec(),
    };
    let topology = Arc::new(Topology::with_nodes(1)?);
    let scratch = opts.scratch.clone().unwrap_or_else(crate::default_scratch);
    std::fs::create_dir_all(&scratch).map_err(|e| BenchError::io(&scratch, e))?;
    // The original's benchmark counts nothing: accounting and latency emulation stay off.
    account::set_enabled(false);
    account::set_latency(numakv_pmem::LatencyModel::NONE);

    let mut report = Report::default();
    let mut rows = Vec::new();
    for target in targets {
        for &threads in &thread_counts {
            let dir = tempfile::Builder::new()
                .prefix("numakv-ffproto-")
                .tempdir_in(&scratch)
                .map_err(|e| BenchError::io(&scratch, e))?;
            let env = TargetEnv {
                dir: dir.path().to_path_buf(),
                topology: Arc::clone(&topology),
                persist: opts.persist,
                max_keys: keys.len() as u64,
                threads,
            };
            let fail = |report: &mut Report, message: String| {
                report.failures.push(RunFailure {
                    engine: target.name(),
                    workload: "fastfair-original".into(),
                    threads,
                    error: message,
                })
            };
            let instance = match target.open(&env) {
                Ok(i) => i,
                Err(e) => {
                    fail(&mut report, e.to_string());
                    continue;
                }
            };
            let index = instance.index();
            let registry = Registry::new(Arc::clone(&topology), Placement::Fill);
            let insert = |k: u64| index.insert(k, k);
            let search = |k: u64| index.get(k).map(|v| v == Some(k));
            let (load_s, err) = phase(&registry, &[&keys[..half]], &insert);
            if let Some(e) = err {
                fail(&mut report, format!("warm-up insert: {e}"));
                continue;
            }
            let (search_s, err) = phase(&registry, &shares(&keys[..half], threads), &search);
            if let Some(e) = err {
                fail(&mut report, format!("search: {e}"));
                continue;
            }
            let (insert_s, err) = phase(&registry, &shares(&keys[half..], threads), &insert);
            if let Some(e) = err {
                fail(&mut report, format!("insert: {e}"));
                continue;
            }
            drop(index);
            drop(instance);
            let mops = |n: usize, s: f64| n as f64 / s / 1e6;
            for (workload, n, s) in
                [("ff-search", half, search_s), ("ff-insert", keys.len() - half, insert_s)]
            {
                report.runs.push(RunResult {
                    engine: target.name(),
                    workload: workload.into(),
                    threads,
                    nodes: 1,
                    placement: "fill".into(),
                    persist: opts.persist.to_string(),
                    keys: half as u64,
                    ops: n as u64,
                    seconds: s,
                    throughput_mops: mops(n, s),
                    load_seconds: load_s,
                    seed: opts.seed,
                    ..RunResult::default()
                });
            }
            rows.push((
                target.name(),
                threads,
                mops(half, search_s),
                search_s,
                mops(keys.len() - half, insert_s),
                insert_s,
            ));
        }
    }

    let mut md = String::new();
    let source = match key_file {
        Some(p) => format!("the {} keys of {}", keys.len(), p.display()),
        None => format!("{} distinct random keys (seed {})", keys.len(), opts.seed),
    };
    header(
        &mut md,
        "fastfair-original",
        opts,
        &format!(
            "{source}: the first {half} inserted by one thread (untimed), searched by T threads, \
             then the other {} inserted by T threads; 1 node, accounting off",
            keys.len() - half
        ),
    );
    md.push_str(
        "## The claim\n\n\
         numakv's FAST&FAIR searches and inserts at least as fast as the original C++ FAST_FAIR \
         (concurrent version, `g++ -O3`) on the original's own protocol, at 1 and 2 threads \
         (issue 40).\n\n\
         ## The protocol\n\n\
         The original FAST_FAIR's `concurrent/src/test.cpp` (DICL/FAST_FAIR): warm-up inserts \
         of the first half, then `Concurrent searching with T threads (usec)` over that half and \
         `Concurrent inserting with T threads (usec)` of the other half. Build it with `g++ -O3` \
         and run it with `-w 0 -t T -n N -i KEYFILE` (`-w` is its emulated write latency); pass \
         the same file here with `--key-file KEYFILE` and compare the microseconds.\n\n\
         ## Our measurement\n\n\
         | engine | threads | search Mops/s | search µs | insert Mops/s | insert µs |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    for (engine, t, sm, ss, im, is) in &rows {
        let _ = writeln!(
            md,
            "| {engine} | {t} | {sm:.2} | {} | {im:.2} | {} |",
            (ss * 1e6) as u64,
            (is * 1e6) as u64
        );
    }
    for f in &report.failures {
        let _ = writeln!(md, "\n**{} failed**: {}", f.engine, f.error);
    }
    Ok((md, report, Vec::new()))
}
