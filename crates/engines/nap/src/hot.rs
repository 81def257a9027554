//! Hot-set identification (papers/nap.txt §4.4): per-thread circular record buffers that access
//! threads append sampled `⟨timestamp, key⟩` pairs to without coordination, and the switch
//! thread's digest of them — a count-min sketch for frequencies and a bounded min-heap of the
//! current top keys — with the periodic decision (switch when more than the threshold of keys
//! differ; an empty NAL for uniform workloads).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use numakv_pmem::numa::MAX_THREADS;

/// One record: timestamp (ns since the recorder started, +1 so 0 means empty) and key.
#[derive(Debug, Default)]
struct Record {
    ts: AtomicU64,
    key: AtomicU64,
}

/// One thread's circular buffer. Only its thread writes it.
#[derive(Debug)]
struct RecordBuf {
    records: Box<[Record]>,
    head: AtomicU64,
}

/// The access threads' side: where samples go.
#[derive(Debug)]
pub(crate) struct Recorder {
    bufs: Box<[OnceLock<RecordBuf>]>,
    capacity: usize,
    /// Record every `sample`-th operation of a thread (0: never).
    sample: u64,
    epoch: Instant,
}

impl Recorder {
    pub fn new(capacity: usize, sample: u32) -> Recorder {
        Recorder {
            bufs: (0..MAX_THREADS).map(|_| OnceLock::new()).collect(),
            capacity: capacity.max(8),
            sample: u64::from(sample),
            epoch: Instant::now(),
        }
    }

    /// Nanoseconds since the recorder started, never 0.
    pub fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    /// Called by every operation with the thread's dense id and operation count: records one
    /// in `sample`.
    #[inline]
    pub fn sample(&self, tid: usize, count: u64, key: u64) {
        // A mask for power-of-two intervals (the default 32): no division on every operation.
        let skip = if self.sample.is_power_of_two() {
            count & (self.sample - 1) != 0
        } else {
            self.sample == 0 || count % self.sample != 0
        };
        if skip || tid >= self.bufs.len() {
            return;
        }
        let buf = self.bufs[tid].get_or_init(|| RecordBuf {
            records: (0..self.capacity).map(|_| Record::default()).collect(),
            head: AtomicU64::new(0),
        });
        // ORDERING: only this thread writes `head`.
        let h = buf.head.load(Ordering::Relaxed);
        let r = &buf.records[(h % self.capacity as u64) as usize];
        r.key.store(key, Ordering::Relaxed);
        // ORDERING: Release: a reader that sees the timestamp (Acquire) sees the key. Torn
        // pairs from a lapping writer only mis-attribute one sample, which sampling tolerates.
        r.ts.store(self.now(), Ordering::Release);
        buf.head.store(h + 1, Ordering::Relaxed);
    }

    /// DRAM bytes of the record buffers allocated so far.
    pub fn dram_bytes(&self) -> u64 {
        let n = self.bufs.iter().filter(|b| b.get().is_some()).count();
        (n * self.capacity * std::mem::size_of::<Record>()) as u64
    }
}

/// The switch thread's reading position in one buffer.
#[derive(Clone, Copy, Debug, Default)]
struct Cursor {
    pos: u64,
    max_ts: u64,
}

/// Count-min sketch of `depth` rows × `width` 32-bit counters.
#[derive(Debug)]
pub(crate) struct Sketch {
    rows: Vec<Vec<u32>>,
    width: u64,
}

const SEEDS: [u64; 8] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0xD6E8_FEB8_6659_FD93,
    0xFF51_AFD7_ED55_8CCD,
    0xC4CE_B9FE_1A85_EC53,
    0x2545_F491_4F6C_DD1D,
    0x94D0_49BB_1331_11EB,
];

impl Sketch {
    pub fn new(depth: usize, width: usize) -> Sketch {
        let depth = depth.clamp(1, SEEDS.len());
        Sketch { rows: vec![vec![0; width.max(1)]; depth], width: width.max(1) as u64 }
    }

    fn slot(&self, row: usize, key: u64) -> usize {
        let h = (key ^ (key >> 29)).wrapping_mul(SEEDS[row]);
        // Multiply-shift range reduction (Lemire) rather than `%`: the switch thread computes
        // this for every row of every sample, and three divisions were a visible share of it.
        ((u128::from((h >> 32) ^ h) * u128::from(self.width)) >> 64) as usize
    }

    /// Asks the CPU to start loading `key`'s counters: the digest prefetches a batch of
    /// samples before counting them, so their cache misses overlap (the sketch is megabytes,
    /// and the misses were most of the switch thread's time).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        #[cfg(target_arch = "x86_64")]
        for (r, row) in self.rows.iter().enumerate() {
            let p = row[self.slot(r, key)..].as_ptr();
            // SAFETY: a prefetch is a hint that never faults; the address is in the row.
            unsafe { std::arch::x86_64::_mm_prefetch(p.cast(), std::arch::x86_64::_MM_HINT_T0) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = key;
    }

    /// Counts one occurrence of `key`; returns its new estimate.
    pub fn add(&mut self, key: u64) -> u32 {
        let mut est = u32::MAX;
        for r in 0..self.rows.len() {
            let s = self.slot(r, key);
            let c = &mut self.rows[r][s];
            *c = c.saturating_add(1);
            est = est.min(*c);
        }
        est
    }

    pub fn clear(&mut self) {
        for r in &mut self.rows {
            r.iter_mut().for_each(|c| *c = 0);
        }
    }

    pub fn bytes(&self) -> u64 {
        (self.rows.len() as u64) * self.width * 4
    }
}

/// Bounded min-heap of `(frequency, key)` with a position map, holding the current top keys.
#[derive(Debug)]
pub(crate) struct TopK {
    heap: Vec<(u32, u64)>,
    pos: HashMap<u64, usize>,
    cap: usize,
}

impl TopK {
    pub fn new(cap: usize) -> TopK {
        TopK { heap: Vec::new(), pos: HashMap::new(), cap }
    }

    /// Offers `key` with estimate `f` (estimates of a key only grow).
    pub fn offer(&mut self, key: u64, f: u32) {
        if self.cap == 0 {
            return;
        }
        if let Some(&i) = self.pos.get(&key) {
            self.heap[i].0 = f;
            self.down(i);
        } else if self.heap.len() < self.cap {
            self.heap.push((f, key));
            let i = self.heap.len() - 1;
            self.pos.insert(key, i);
            self.up(i);
        } else if f > self.heap[0].0 {
            self.pos.remove(&self.heap[0].1);
            self.heap[0] = (f, key);
            self.pos.insert(key, 0);
            self.down(0);
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.pos.insert(self.heap[a].1, a);
        self.pos.insert(self.heap[b].1, b);
    }

    fn up(&mut self, mut i: usize) {
        while i > 0 {
            let p = (i - 1) / 2;
            if self.heap[p].0 <= self.heap[i].0 {
                break;
            }
            self.swap(p, i);
            i = p;
        }
    }

    fn down(&mut self, mut i: usize) {
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < self.heap.len() && self.heap[l].0 < self.heap[m].0 {
                m = l;
            }
            if r < self.heap.len() && self.heap[r].0 < self.heap[m].0 {
                m = r;
            }
            if m == i {
                return;
            }
            self.swap(i, m);
            i = m;
        }
    }

    pub fn clear(&mut self) {
        self.heap.clear();
        self.pos.clear();
    }

    pub fn entries(&self) -> &[(u32, u64)] {
        &self.heap
    }

    pub fn bytes(&self) -> u64 {
        (self.cap * (12 + 24)) as u64
    }
}

/// The most records [`Detector::digest`] reads from one buffer before moving to the next.
const MAX_BATCH: usize = 32;

/// Tuning of the detector (from the options).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DetectorConfig {
    pub batch: usize,
    pub stale_ns: u64,
    pub threshold: f64,
    pub detect_uniform: bool,
    pub min_count: u32,
    pub min_samples: u64,
}

/// What a periodic check decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Keep the current NAL.
    Keep,
    /// Switch to a NAL over these keys (empty: the uniform-workload empty NAL).
    Switch(Vec<u64>),
}

/// The switch thread's digest state.
#[derive(Debug)]
pub(crate) struct Detector {
    sketch: Sketch,
    top: TopK,
    cursors: Vec<Cursor>,
    /// The buffer the next digest starts from (round robin across digests).
    next_buf: usize,
    /// Scratch list of the existing buffers (kept to reuse its allocation).
    live: Vec<usize>,
    samples: u64,
    cfg: DetectorConfig,
}

impl Detector {
    pub fn new(depth: usize, width: usize, hot: usize, cfg: DetectorConfig) -> Detector {
        Detector {
            sketch: Sketch::new(depth, width),
            top: TopK::new(hot),
            cursors: vec![Cursor::default(); MAX_THREADS],
            next_buf: 0,
            live: Vec::new(),
            samples: 0,
            cfg,
        }
    }

    /// Reads the records written before this call from every buffer, round-robin in batches.
    pub fn digest(&mut self, rec: &Recorder) {
        self.digest_until(rec, rec.now());
    }

    /// [`Detector::digest`] of the records stamped no later than `now`.
    fn digest_until(&mut self, rec: &Recorder, now: u64) {
        // The buffers that exist (a thread's appears with its first sample), listed once per
        // digest: a round over all `MAX_THREADS` slots for every batch of 8 records cost the
        // switch thread ~9% of a core at 70K samples/s, taken from the workers on a small
        // machine.
        let mut live = std::mem::take(&mut self.live);
        live.clear();
        live.extend((0..rec.bufs.len()).filter(|&b| rec.bufs[b].get().is_some()));
        // Round robin in batches, from where the last digest stopped.
        let start = live.iter().position(|&b| b >= self.next_buf).unwrap_or(0);
        live.rotate_left(start);
        loop {
            let mut any = false;
            for &b in &live {
                let Some(buf) = rec.bufs[b].get() else { continue };
                any |= self.digest_one(buf, b, rec.capacity as u64, now);
                self.next_buf = b + 1;
            }
            if !any {
                break;
            }
        }
        self.live = live;
    }

    /// One batch from buffer `b`; whether it had new records.
    fn digest_one(&mut self, buf: &RecordBuf, b: usize, cap: u64, now: u64) -> bool {
        let mut got = false;
        // The batch's fresh keys, prefetched, then counted (see `Sketch::prefetch`).
        let mut keys = [0u64; MAX_BATCH];
        let mut n = 0;
        for _ in 0..self.cfg.batch.clamp(1, MAX_BATCH) {
            let c = self.cursors[b];
            let r = &buf.records[(c.pos % cap) as usize];
            // ORDERING: Acquire pairs with the Release of the timestamp in `sample`.
            let ts = r.ts.load(Ordering::Acquire);
            let key = r.key.load(Ordering::Relaxed);
            if ts == 0 || ts <= c.max_ts {
                // Reached the tail (or the slot was not written yet): stop (§4.4 step 1 i).
                break;
            }
            if ts > now {
                // Written after this digest began: the next one reads it. Without this bound a
                // digest never ends while writers outpace it (dense sampling, a starved switch
                // thread), and the periodic decision never comes.
                break;
            }
            self.cursors[b] = Cursor { pos: c.pos + 1, max_ts: ts };
            got = true;
            if now.saturating_sub(ts) > self.cfg.stale_ns {
                continue; // too old to say anything about the present (§4.4 step 1 ii)
            }
            self.sketch.prefetch(key);
            keys[n] = key;
            n += 1;
        }
        for &key in &keys[..n] {
            self.samples += 1;
            let f = self.sketch.add(key);
            self.top.offer(key, f);
        }
        got
    }

    /// The periodic check: compares the top keys with `current` (sorted) and clears the
    /// statistics.
    pub fn decide(&mut self, current: &[u64]) -> Decision {
        let d = self.decide_inner(current);
        self.sketch.clear();
        self.top.clear();
        self.samples = 0;
        d
    }

    fn decide_inner(&self, current: &[u64]) -> Decision {
        if self.samples < self.cfg.min_samples {
            return Decision::Keep;
        }
        let hot: Vec<(u32, u64)> =
            self.top.entries().iter().copied().filter(|&(f, _)| f >= self.cfg.min_count).collect();
        if self.cfg.detect_uniform && self.uniform(&hot) {
            return if current.is_empty() { Decision::Keep } else { Decision::Switch(Vec::new()) };
        }
        let mut keys: Vec<u64> = hot.iter().map(|&(_, k)| k).collect();
        keys.sort_unstable();
        let differ = keys.iter().filter(|k| current.binary_search(k).is_err()).count()
            + current.len().saturating_sub(keys.len());
        let base = keys.len().max(current.len()).max(1);
        if differ as f64 > self.cfg.threshold * base as f64 {
            Decision::Switch(keys)
        } else {
            Decision::Keep
        }
    }

    /// §4.4 "Handling uniform workloads": ① the candidates receive under 10% of the sampled
    /// accesses, or ② the hottest candidate is within 3× of the coldest. Signal ② alone would
    /// also fire on a hot set of equally hot keys that absorbs most accesses (or on a key space
    /// smaller than the hot set), where a NAL pays off; so it counts only when the candidates
    /// receive under half of the accesses and either fill the heap or sit at the noise floor
    /// (the coldest counted at most twice `min_count`: a uniform stream with about as many
    /// samples per check as keys, where chance repeats alone make candidates — under a loaded
    /// machine's longer periods, thousands of them).
    fn uniform(&self, hot: &[(u32, u64)]) -> bool {
        let sum: u64 = hot.iter().map(|&(f, _)| u64::from(f)).sum();
        let share = sum as f64 / self.samples.max(1) as f64;
        if share < 0.10 {
            return true;
        }
        let max = hot.iter().map(|&(f, _)| f).max().unwrap_or(0);
        let min = hot.iter().map(|&(f, _)| f).min().unwrap_or(0);
        let full = hot.len() >= self.top.cap;
        let noise_floor = min <= 2 * self.cfg.min_count;
        (full || noise_floor) && share < 0.5 && u64::from(max) <= 3 * u64::from(min)
    }

    pub fn dram_bytes(&self) -> (u64, u64) {
        (self.sketch.bytes(), self.top.bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> DetectorConfig {
        DetectorConfig {
            batch: 8,
            stale_ns: u64::MAX,
            threshold: 0.25,
            detect_uniform: true,
            min_count: 2,
            min_samples: 100,
        }
    }

    #[test]
    fn topk_keeps_the_largest() {
        let mut t = TopK::new(3);
        for (k, f) in [(1, 5), (2, 1), (3, 7), (4, 2), (5, 9), (6, 3)] {
            t.offer(k, f);
        }
        let mut ks: Vec<u64> = t.entries().iter().map(|e| e.1).collect();
        ks.sort();
        assert_eq!(ks, vec![1, 3, 5]);
        t.offer(1, 10);
        t.offer(7, 8); // beats key 3's 7
        let mut ks: Vec<u64> = t.entries().iter().map(|e| e.1).collect();
        ks.sort();
        assert_eq!(ks, vec![1, 5, 7]);
    }

    #[test]
    fn sketch_never_underestimates() {
        let mut s = Sketch::new(3, 64);
        for k in 0..1000u64 {
            for _ in 0..(k % 5) {
                s.add(k);
            }
        }
        for k in 0..1000u64 {
            assert!(s.add(k) > (k % 5) as u32);
        }
    }

    #[test]
    fn a_digest_reads_only_what_was_written_before_it_began() {
        // A digest that also took records written while it ran could chase busy writers forever
        // (dense sampling, a starved switch thread): the periodic decision never came and
        // nap-shift with every operation sampled saw no switch at all.
        let rec = Recorder::new(4096, 1);
        let mut d = Detector::new(3, 1 << 16, 1000, cfg());
        for i in 0..100u64 {
            rec.sample(0, i, i + 1);
        }
        let cut = rec.now();
        for i in 100..250u64 {
            rec.sample(0, i, i + 1);
        }
        d.digest_until(&rec, cut);
        assert_eq!(d.samples, 100, "records after the digest's start were read");
        d.digest(&rec);
        assert_eq!(d.samples, 250, "the next digest reads the rest");
    }

    #[test]
    fn chance_repeats_of_a_uniform_stream_are_not_a_hot_set() {
        // About as many samples as keys: 5 000 keys drawn twice (chance repeats) among 20 000
        // drawn once. The candidates (count 2) get a third of the samples — over signal ①'s
        // 10% — and fill only part of a large heap; signal ② at the noise floor empties the NAL.
        let rec = Recorder::new(100_000, 1);
        let mut d = Detector::new(3, 850_000, 100_000, cfg());
        let mut i = 0u64;
        for k in 0..5_000u64 {
            for _ in 0..2 {
                rec.sample(0, i, k * 7919 + 1);
                i += 1;
            }
        }
        for k in 0..20_000u64 {
            rec.sample(0, i, 1_000_000_007 + k * 104_729);
            i += 1;
        }
        d.digest(&rec);
        assert_eq!(d.decide(&(1..=1_000).collect::<Vec<_>>()), Decision::Switch(vec![]));
        // Ten equally hot keys drawing 60% of the accesses are a hot set, not noise.
        let mut h = 0u64;
        for j in 0..25_000u64 {
            let k = if j % 5 < 3 {
                h += 1;
                h % 10 + 1
            } else {
                5_000_000 + j
            };
            rec.sample(0, i, k);
            i += 1;
        }
        d.digest(&rec);
        match d.decide(&[]) {
            // (a few sketch collisions may ride along)
            Decision::Switch(keys) => {
                assert!((1..=10).all(|k| keys.contains(&k)) && keys.len() < 20, "{keys:?}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn skew_switches_and_uniform_empties() {
        let rec = Recorder::new(100_000, 1);
        let mut d = Detector::new(3, 4096, 10, cfg());
        // Skewed: keys 1..=10 dominate.
        for i in 0..20_000u64 {
            let k = if i % 2 == 0 { (i / 2) % 10 + 1 } else { 1_000_000 + i };
            rec.sample(0, i, k);
        }
        d.digest(&rec);
        match d.decide(&[]) {
            Decision::Switch(keys) => assert_eq!(keys, (1..=10).collect::<Vec<_>>()),
            other => panic!("{other:?}"),
        }
        // Same hot set again: keep.
        for i in 20_000..40_000u64 {
            rec.sample(0, i, if i % 2 == 0 { (i / 2) % 10 + 1 } else { 1_000_000 + i });
        }
        d.digest(&rec);
        assert_eq!(d.decide(&(1..=10).collect::<Vec<_>>()), Decision::Keep);
        // Uniform over a large space: the empty NAL.
        for i in 40_000..60_000u64 {
            rec.sample(0, i, i * 7919);
        }
        d.digest(&rec);
        assert_eq!(d.decide(&(1..=10).collect::<Vec<_>>()), Decision::Switch(vec![]));
    }
}
