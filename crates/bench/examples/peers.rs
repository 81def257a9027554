//! Runs a benchmark over the DRAM peers and writes the results to a directory.
//!
//! `cargo run --release -p numakv-bench --example peers -- [OUT_DIR] [WORKLOAD] [THREADS]`
//! (defaults: `bench-results`, `ycsb-a,nobtree-scan`, `1,2`). The `numakv bench` subcommand
//! does the same with the engines included.

use std::path::PathBuf;

use numakv_bench::{peers, repro, run, write_outputs, BenchConfig, Progress};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(args.next().unwrap_or_else(|| "bench-results".into()));
    let workload = args.next().unwrap_or_else(|| "ycsb-a,nobtree-scan".into());
    let threads = args
        .next()
        .unwrap_or_else(|| "1,2".into())
        .split(',')
        .map(str::parse)
        .collect::<Result<Vec<usize>, _>>()?;
    let config =
        BenchConfig { workload, threads, out: Some(out.clone()), ..BenchConfig::default() };
    let report = run(&config, &peers::all(), Progress::Auto)?;
    print!("{}", report.to_table());
    for path in write_outputs(&report, &config)? {
        println!("wrote {}", path.display());
    }
    let opts = repro::ReproOptions { out_dir: out.join("repro"), scale: 0.2, ..Default::default() };
    // `redis` drives external servers, not targets.
    for info in repro::list().iter().filter(|r| r.name != "redis") {
        let done = repro::run(info.name, &peers::all(), &opts, Progress::Auto)?;
        println!("wrote {}", done.files[0].display());
    }
    Ok(())
}
