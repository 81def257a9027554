//! Writers, readers and scanners race the background GC threads (every millisecond, low
//! threshold, tiny files): every get returns the value its key's owner wrote last, every scan is
//! ascending, agrees with the owners' records and returns no value older than one acknowledged
//! before it began, and the final store is exact and leak-free.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use numakv_index::Index;
use numakv_nstore::NStoreOptions;
use numakv_pmem::{PersistMode, SimMode};
use rand::{Rng, SeedableRng};

const WRITERS: u64 = 3;
const KEYS: u64 = 600;

#[test]
fn gc_races_writers_readers_and_scans() {
    let o = NStoreOptions {
        gc_threads_per_node: 1,
        gc_threshold: 0.2,
        gc_interval: Duration::from_millis(1),
        ..common::opts()
    };
    let dir = tempfile::tempdir().unwrap();
    let s = common::create(dir.path(), PersistMode::Eadr, SimMode::Direct, &o);
    // Owner w writes keys ≡ w (mod WRITERS); its last acknowledged value is published here
    // (0 = absent), written after the store acknowledged it.
    let acked: Vec<AtomicU64> = (0..=KEYS).map(|_| AtomicU64::new(0)).collect();
    let done = AtomicBool::new(false);
    let seed: u64 = rand::random();
    std::thread::scope(|sc| {
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let (s, acked) = (&s, &acked);
            writers.push(sc.spawn(move || {
                numakv_numa::set_current_node(w as usize % 2);
                let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ w);
                for i in 1..=12_000u64 {
                    let k = rng.gen_range(0..KEYS / WRITERS) * WRITERS + w + 1;
                    let v = (i << 8) | w;
                    if rng.gen_bool(0.15) {
                        s.remove(k).unwrap();
                        acked[k as usize].store(0, Ordering::Release);
                    } else {
                        s.upsert(k, v).unwrap();
                        acked[k as usize].store(v, Ordering::Release);
                    }
                    // Own keys: exact.
                    let got = s.get(k).unwrap();
                    let want = acked[k as usize].load(Ordering::Acquire);
                    assert_eq!(got.unwrap_or(0), want, "writer {w}: key {k}");
                }
            }));
        }
        let (s, done, acked) = (&s, &done, &acked);
        sc.spawn(move || {
            numakv_numa::set_current_node(1);
            let mut out = Vec::new();
            while !done.load(Ordering::Relaxed) {
                // What was acknowledged before the scan: a key's values only grow (v = i << 8
                // | w, i counting up), so a scan must return at least that for a present key
                // (never an older value, e.g. a copy GC moved or a stale address).
                let before: Vec<u64> = acked.iter().map(|a| a.load(Ordering::Acquire)).collect();
                out.clear();
                s.scan(1, usize::MAX, &mut out).unwrap();
                assert!(out.windows(2).all(|p| p[0].0 < p[1].0), "scan not ascending");
                for &(k, v) in &out {
                    assert!((1..=KEYS).contains(&k) && v & 0xff == (k - 1) % WRITERS, "bad pair");
                    assert!(
                        v >= before[k as usize],
                        "key {k}: scan returned {v:#x}, older than \
                         the {:#x} acknowledged before it",
                        before[k as usize]
                    );
                }
            }
        });
        let results: Vec<_> = writers.into_iter().map(|h| h.join()).collect();
        done.store(true, Ordering::Relaxed);
        for r in results {
            if let Err(p) = r {
                std::panic::resume_unwind(p);
            }
        }
    });
    let model: BTreeMap<u64, u64> = (1..=KEYS)
        .filter_map(|k| {
            let v = acked[k as usize].load(Ordering::Acquire);
            (v != 0).then_some((k, v))
        })
        .collect();
    let stats = s.stats();
    assert!(stats.counter("gc_files_reclaimed").unwrap_or(0) > 0, "GC never ran: {stats:?}");
    common::verify(&s, &model, "after the race");
}
