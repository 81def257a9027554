//! Variable-length keys and values (the entry format with `k_len`/`v_len`, papers/nstore.txt
//! §III-D): put/get/delete through `put_bytes`/`get_bytes`/`delete_bytes`, beside the u64 keys;
//! a clean close reopens them from the snapshot, a crash by scanning the log; GC rewrites their
//! live entries; a power failure at any fence of their writes or of GC loses nothing
//! acknowledged and resurrects nothing deleted.

mod common;

use std::collections::BTreeMap;

use numakv_index::{Engine, Index};
use numakv_nstore::NStore;
use numakv_pmem::{CrashOptions, PersistMode, SimMode};
use rand::{Rng, SeedableRng};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn scale() -> u64 {
    std::env::var("NUMAKV_TEST_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1).max(1)
}

/// Key `i`: 1 to 40 bytes, distinct for distinct `i`.
fn key(i: u64) -> Vec<u8> {
    let mut k = i.to_le_bytes().to_vec();
    while k.len() > 1 && k.last() == Some(&0) {
        k.pop();
    }
    k.push(0xfe); // keeps the encoding prefix-free
    k.extend(std::iter::repeat_n(b'k', (i % 32) as usize));
    k
}

/// A value of `len` bytes that names `i` and `round`.
fn value(i: u64, round: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 31 + round as usize * 7 + j) as u8).collect()
}

/// Inserts `n` keys (values 0..300 bytes) from both nodes, updates 3/4 of them twice with new
/// lengths, deletes every tenth; also writes a few u64 keys, which must not mix with them.
fn churn(s: &NStore, n: u64) -> Model {
    let mut model = Model::new();
    for i in 1..=n {
        numakv_numa::set_current_node((i % 2) as usize);
        let v = value(i, 0, (i * 7 % 300) as usize);
        s.put_bytes(&key(i), &v).unwrap();
        model.insert(key(i), v);
        if i % 100 == 0 {
            s.upsert(i, i).unwrap();
        }
    }
    for round in 1..=2u64 {
        for i in (1..=n).filter(|i| i % 4 != 0) {
            numakv_numa::set_current_node(((i + round) % 2) as usize);
            let v = value(i, round, ((i * 13 + round * 50) % 400) as usize);
            s.put_bytes(&key(i), &v).unwrap();
            model.insert(key(i), v);
        }
    }
    for i in (10..=n).step_by(10) {
        assert!(s.delete_bytes(&key(i)).unwrap());
        model.remove(&key(i));
    }
    numakv_numa::set_current_node(0);
    model
}

/// Asserts that `s` holds exactly `model` as bytes keys and the u64 keys of [`churn`].
fn verify(s: &NStore, model: &Model, n: u64, ctx: &str) {
    for i in 1..=n {
        assert_eq!(s.get_bytes(&key(i)).unwrap().as_ref(), model.get(&key(i)), "{ctx}: key {i}");
    }
    assert_eq!(s.bytes_len(), model.len(), "{ctx}: bytes keys");
    let u64_keys = n / 100;
    for k in (100..=n).step_by(100) {
        assert_eq!(s.get(k).unwrap(), Some(k), "{ctx}: u64 key {k}");
    }
    let r = s.check().unwrap_or_else(|e| panic!("{ctx}: check: {e}"));
    assert_eq!(r.entries, model.len() as u64 + u64_keys, "{ctx}: entries");
    assert_eq!(r.reachable_blocks, r.allocated_blocks, "{ctx}: leak");
}

#[test]
fn put_get_delete_limits_and_separate_key_spaces() {
    let dir = tempfile::tempdir().unwrap();
    let s = common::create(dir.path(), PersistMode::Eadr, SimMode::Direct, &common::opts());
    assert_eq!(s.get_bytes(b"a").unwrap(), None);
    s.put_bytes(b"a", b"").unwrap();
    assert_eq!(s.get_bytes(b"a").unwrap(), Some(Vec::new()));
    s.put_bytes(b"a", b"a longer value than before").unwrap();
    assert_eq!(s.get_bytes(b"a").unwrap().as_deref(), Some(&b"a longer value than before"[..]));
    // Byte key "\x07" and u64 key 7 are different keys.
    s.put_bytes(&[7], b"bytes").unwrap();
    assert_eq!(s.get(7).unwrap(), None);
    s.insert(7, 70).unwrap();
    assert_eq!(s.get_bytes(&[7]).unwrap().as_deref(), Some(&b"bytes"[..]));
    // Limits: no empty key, key + value within one 255-word entry.
    assert!(s.put_bytes(b"", b"x").is_err());
    assert!(s.put_bytes(&[1u8; 4096], b"").is_err());
    assert!(s.put_bytes(&[1u8; 1000], &[2u8; 1040]).is_err());
    s.put_bytes(&[1u8; 1000], &[2u8; 1000]).unwrap();
    assert_eq!(s.get_bytes(&[1u8; 1000]).unwrap(), Some(vec![2u8; 1000]));
    assert!(s.delete_bytes(b"a").unwrap());
    assert!(!s.delete_bytes(b"a").unwrap());
    assert_eq!(s.get_bytes(b"a").unwrap(), None);
    let r = s.check().unwrap();
    assert_eq!(r.entries, 3);
    assert!(s.stats().pm_bytes() > 2000);
}

#[test]
fn clean_close_reopens_from_the_snapshot_and_a_crash_by_scanning() {
    let n = 1_500 * scale();
    let o = common::opts();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let s = common::create(&path, PersistMode::Adr, SimMode::Shadow, &o);
    let mut model = churn(&s, n);
    verify(&s, &model, n, "before close");
    s.close().unwrap();
    let (s, _, c) = common::open(&path, SimMode::Shadow, &o);
    assert_eq!(common::counter(&c, "from_snapshot"), 1, "{c:?}");
    assert_eq!(common::counter(&c, "snapshot_bytes_keys"), model.len() as u64, "{c:?}");
    verify(&s, &model, n, "after a snapshot open");
    for i in (1..=n).step_by(3) {
        let v = value(i, 9, (i % 50) as usize);
        s.put_bytes(&key(i), &v).unwrap();
        model.insert(key(i), v);
    }
    let pool = s.pool().clone();
    pool.crash(CrashOptions::STRICT).unwrap();
    drop(s);
    drop(pool);
    let (s, _, c) = common::open(&path, SimMode::Shadow, &o);
    assert_eq!(common::counter(&c, "from_snapshot"), 0, "{c:?}");
    assert_eq!(common::counter(&c, "bytes_keys_recovered"), model.len() as u64, "{c:?}");
    verify(&s, &model, n, "after a crash");
}

#[test]
fn gc_rewrites_live_variable_length_entries() {
    let n = 2_000 * scale();
    let o = common::opts();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let s = common::create(&path, PersistMode::Adr, SimMode::Shadow, &o);
    let model = churn(&s, n);
    let before = s.stats();
    let reclaimed = s.collect_garbage().unwrap();
    let after = s.stats();
    assert!(reclaimed > 0, "nothing reclaimed");
    assert!(after.counter("gc_entries_rewritten").unwrap_or(0) > 0, "{after:?}");
    assert!(after.pm_bytes() < before.pm_bytes(), "{before:?} {after:?}");
    verify(&s, &model, n, "after GC");
    let pool = s.pool().clone();
    pool.crash(CrashOptions::STRICT).unwrap();
    drop(s);
    drop(pool);
    let (s, _, _) = common::open(&path, SimMode::Shadow, &o);
    verify(&s, &model, n, "after GC and a crash");
    // A second GC after recovery (garbage counts rebuilt by the scan) finds the rest.
    s.collect_garbage().unwrap();
    verify(&s, &model, n, "after recovery and GC");
}

#[test]
fn power_failure_during_variable_length_writes_and_gc() {
    let seed: u64 = std::env::var("NUMAKV_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let n = 800 * scale();
    let o = common::opts();
    let mut inside = [0u32; 2];
    for round in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let s = common::create(&path, PersistMode::Adr, SimMode::Shadow, &o);
        let mut model = churn(&s, n);
        let pool = s.pool().clone();
        let fences = rng.gen_range(1..3_000);
        let copts = if rng.gen_bool(0.5) {
            CrashOptions::random(rng.gen())
        } else {
            CrashOptions { seed: rng.gen(), ..CrashOptions::STRICT }
        };
        pool.crash_after_fences(fences, copts).unwrap();
        // Writes (some that grow, some that shrink, deletes) until the power goes; the one
        // during which it went may or may not have happened.
        let mut in_flight: Option<(Vec<u8>, Option<Vec<u8>>)> = None;
        for j in 0..fences {
            let i = rng.gen_range(1..=n);
            let op = if rng.gen_bool(0.2) {
                None
            } else {
                Some(value(i, 100 + j, rng.gen_range(0..500)))
            };
            let r = match &op {
                Some(v) => s.put_bytes(&key(i), v).map(|_| true),
                None => s.delete_bytes(&key(i)),
            };
            if pool.has_crashed() {
                in_flight = Some((key(i), op));
                break;
            }
            r.unwrap();
            match op {
                Some(v) => model.insert(key(i), v),
                None => model.remove(&key(i)),
            };
            if j % 200 == 199 {
                let _ = s.collect_garbage();
                if pool.has_crashed() {
                    break;
                }
            }
        }
        if !pool.has_crashed() {
            let _ = s.collect_garbage();
        }
        if pool.has_crashed() {
            inside[usize::from(in_flight.is_some())] += 1;
        } else {
            pool.crash(copts).unwrap();
        }
        drop(s);
        drop(pool);
        let ctx = format!("seed {seed} round {round} (crash after {fences} fences)");
        let (s, _, _) = common::open(&path, SimMode::Shadow, &o);
        let mut got = Model::new();
        for i in 1..=n {
            if let Some(v) = s.get_bytes(&key(i)).unwrap() {
                got.insert(key(i), v);
            }
        }
        if let Some((k, op)) = &in_flight {
            let now = got.get(k);
            assert!(
                now == model.get(k) || now == op.as_ref(),
                "{ctx}: in-flight key holds {now:?}"
            );
            match now {
                Some(v) => model.insert(k.clone(), v.clone()),
                None => model.remove(k),
            };
        }
        if got != model {
            let mut diff = Vec::new();
            for (k, v) in &model {
                match got.get(k) {
                    None => diff.push(format!("{k:?}: lost (want {} B)", v.len())),
                    Some(g) if g != v => {
                        diff.push(format!("{k:?}: holds {} B, want {} B", g.len(), v.len()))
                    }
                    Some(_) => {}
                }
            }
            for (k, g) in &got {
                if !model.contains_key(k) {
                    diff.push(format!("{k:?}: came back ({} B)", g.len()));
                }
            }
            panic!(
                "{ctx}: {} of {} keys differ (in flight: {:?}): {diff:?}",
                diff.len(),
                model.len(),
                in_flight.as_ref().map(|(k, op)| (k, op.as_ref().map(Vec::len)))
            );
        }
        verify(&s, &model, n, &ctx);
        s.collect_garbage().unwrap();
        verify(&s, &model, n, &format!("{ctx}, GC again"));
    }
    assert!(inside[0] + inside[1] > 0, "no crash landed inside the writes or GC: {inside:?}");
}

#[test]
fn background_gc_races_variable_length_writers_and_readers() {
    const MAX_ROUNDS: u64 = 400;
    let n = 600 * scale();
    let o = numakv_nstore::NStoreOptions {
        gc_threads_per_node: 1,
        gc_threshold: 0.3,
        gc_interval: std::time::Duration::from_millis(1),
        ..common::opts()
    };
    let dir = tempfile::tempdir().unwrap();
    let s = common::create(dir.path(), PersistMode::Eadr, SimMode::Direct, &o);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let models: Vec<Model> = std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            let mut reads = 0u64;
            // The newest round read per key: one writer writes a key's rounds in order, so a
            // later read never returns an earlier round (a stale copy, an old address).
            let mut seen = vec![0u64; 2 * n as usize + 1];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for i in (1..=2 * n).step_by(7) {
                    // Every value read is one that was written for key i, whole.
                    if let Some(v) = s.get_bytes(&key(i)).unwrap() {
                        let round = (0..MAX_ROUNDS).find(|&round| {
                            let len = ((i + round * 37) % 200) as usize;
                            v.len() == len
                                && v.iter().enumerate().all(|(j, &b)| {
                                    b == (i as usize * 31 + round as usize * 7 + j) as u8
                                })
                        });
                        let Some(round) = round else {
                            panic!("key {i}: a value never written for it: {v:?}")
                        };
                        let last = &mut seen[i as usize];
                        assert!(round >= *last, "key {i}: round {round} read after round {last}");
                        *last = round;
                        reads += 1;
                    }
                }
            }
            reads
        });
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let s = &s;
                sc.spawn(move || {
                    numakv_numa::set_current_node(t as usize);
                    let mut model = Model::new();
                    // At least 6 rounds, and on until GC has reclaimed a file meanwhile.
                    for round in 0..MAX_ROUNDS {
                        let reclaimed = s.stats().counter("gc_files_reclaimed").unwrap_or(0);
                        if round >= 6 && reclaimed > 0 {
                            break;
                        }
                        for i in (1 + t * n..=(t + 1) * n).filter(|i| i % 3 != round % 3) {
                            let v = value(i, round, ((i + round * 37) % 200) as usize);
                            s.put_bytes(&key(i), &v).unwrap();
                            model.insert(key(i), v);
                        }
                        for i in (1 + t * n..=(t + 1) * n).step_by(11 + round as usize) {
                            if s.delete_bytes(&key(i)).unwrap() {
                                model.remove(&key(i));
                            }
                        }
                    }
                    model
                })
            })
            .collect();
        let models = writers.into_iter().map(|w| w.join().unwrap()).collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
        models
    });
    let model: Model = models.into_iter().flatten().collect();
    let st = s.stats();
    assert!(st.counter("gc_files_reclaimed").unwrap_or(0) > 0, "GC never ran: {st:?}");
    for i in 1..=2 * n {
        assert_eq!(s.get_bytes(&key(i)).unwrap().as_ref(), model.get(&key(i)), "key {i}");
    }
    assert!(s.gc_quiesce(std::time::Duration::from_secs(30)).unwrap());
    let r = s.check().unwrap();
    assert_eq!(r.entries, model.len() as u64);
    assert_eq!(s.bytes_len(), model.len());
}
