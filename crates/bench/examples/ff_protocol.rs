//! Scratch: FAST_FAIR's own protocol over numakv's fastfair (insert half, search it, insert rest).
use std::io::BufRead;
use std::time::Instant;

use numakv::{EngineKind, Options, Store};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = &args[1];
    let threads: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(1);
    let keys: Vec<u64> = std::io::BufReader::new(std::fs::File::open(path).unwrap())
        .lines()
        .map(|l| l.unwrap().trim().parse().unwrap())
        .collect();
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let cap = (keys.len() as u64 * 64 + (64 << 20)).div_ceil(1 << 21) * (1 << 21);
    let store = Store::create(
        dir.path().join("s"),
        EngineKind::FastFair,
        Options::default().capacity_per_node(cap),
    )
    .unwrap();
    let idx = store.index();
    let half = keys.len() / 2;
    for &k in &keys[..half] {
        idx.insert(k, k).unwrap();
    }
    let per = half / threads;
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let ks = &keys[t * per..if t + 1 == threads { half } else { (t + 1) * per }];
            s.spawn(move || {
                for &k in ks {
                    assert!(idx.get(k).unwrap().is_some());
                }
            });
        }
    });
    let search = t0.elapsed();
    let t0 = Instant::now();
    let rest = &keys[half..];
    let per = rest.len() / threads;
    std::thread::scope(|s| {
        for t in 0..threads {
            let ks = &rest[t * per..if t + 1 == threads { rest.len() } else { (t + 1) * per }];
            s.spawn(move || {
                for &k in ks {
                    idx.insert(k, k).unwrap();
                }
            });
        }
    });
    let insert = t0.elapsed();
    println!(
        "search {:.2} Mops/s ({} us), insert {:.2} Mops/s ({} us)",
        half as f64 / search.as_secs_f64() / 1e6,
        search.as_micros(),
        rest.len() as f64 / insert.as_secs_f64() / 1e6,
        insert.as_micros()
    );
}
