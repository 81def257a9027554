//! Byte-string twins of the engines: the same engine under the byte-string layer
//! ([`numakv::BytesStore`]), driven by the same workloads through an [`Index`] adapter that turns
//! each `u64` key into a `key_size`-byte key and each value into a `value_size`-byte value
//! (`numakv bench --key-size 16 --value-size 100`: YCSB's shape).
//!
//! Key bytes: the key big-endian (so byte order is the workload's key order and every key has
//! its own 8-byte prefix, i.e. a tree of one leaf), then `key_size - 8` filler bytes derived from the
//! key. Value bytes: the value little-endian, then `value_size - 8` filler bytes. The adapter
//! reuses per-thread buffers: the only allocation of a point operation is the layer's.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use numakv::{
    BytesStore, CheckReport, EngineKind, EngineOptions, EngineStats, Index, Options, MAX_KEY_LEN,
    MAX_VALUE_LEN,
};

use crate::error::{BenchError, Result};
use crate::target::{Reopen, Target, TargetEnv, TargetInstance};

/// Node-file slack (headers, page heap, allocator metadata).
const SLACK_BYTES: u64 = 64 << 20;
/// PM bytes budgeted per key for the engine's own structure.
const INDEX_BYTES_PER_KEY: u64 = 256;

/// Checks `--key-size` and `--value-size`.
///
/// # Errors
/// [`BenchError::Config`] outside 8..=1024 (keys) or 8..=1 MiB (values).
pub fn check_sizes(key_size: usize, value_size: usize) -> Result<()> {
    if !(8..=MAX_KEY_LEN).contains(&key_size) {
        return Err(BenchError::Config(format!(
            "--key-size {key_size}: byte keys of the bench are 8..={MAX_KEY_LEN} bytes (the \
             first 8 hold the workload's key)"
        )));
    }
    if !(8..=MAX_VALUE_LEN).contains(&value_size) {
        return Err(BenchError::Config(format!(
            "--value-size {value_size}: values of the bench are 8..={MAX_VALUE_LEN} bytes (the \
             first 8 hold the workload's value)"
        )));
    }
    Ok(())
}

/// The name of the byte twin of target `base`: `base+k16v100`.
pub fn twin_name(base: &str, key_size: usize, value_size: usize) -> String {
    format!("{base}+k{key_size}v{value_size}")
}

/// An engine under the byte-string layer, as a benchmark target.
#[derive(Clone, Debug)]
pub struct BytesTarget {
    name: String,
    base: String,
    kind: EngineKind,
    options: EngineOptions,
    key_size: usize,
    value_size: usize,
}

impl BytesTarget {
    /// The byte twin of engine target `base` (kind and options as given).
    pub fn new(
        base: &str,
        kind: EngineKind,
        options: EngineOptions,
        key_size: usize,
        value_size: usize,
    ) -> BytesTarget {
        BytesTarget {
            name: twin_name(base, key_size, value_size),
            base: base.to_owned(),
            kind,
            options,
            key_size,
            value_size,
        }
    }
}

/// NSM's block for a request of `n` bytes with 256 KiB pages (an estimate for sizing files).
fn block_estimate(n: u64) -> u64 {
    if n > 128 << 10 {
        n.div_ceil(256 << 10) * (256 << 10)
    } else {
        n.next_power_of_two()
    }
}

impl Target for BytesTarget {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn description(&self) -> String {
        format!(
            "{} under the byte-string layer: {}-byte keys, {}-byte values",
            self.base, self.key_size, self.value_size
        )
    }

    fn persistent(&self) -> bool {
        true
    }

    fn open(&self, env: &TargetEnv) -> Result<Box<dyn TargetInstance>> {
        let page = Options::default().page_size;
        let record = block_estimate((16 + 6 + self.key_size + self.value_size) as u64);
        // Two records per key: copy-on-write keeps the old one until its grace period ends.
        // NBTree's create hands 85% of each node to Calloc for its leaves, so the buckets live
        // in the other 15%: size the node for them to fit there (files are sparse).
        let grabs_most = matches!(self.kind, EngineKind::NbTree | EngineKind::NapNbTree);
        let records = 2 * record * if grabs_most { 7 } else { 1 };
        let per_key = INDEX_BYTES_PER_KEY + records;
        let capacity = env
            .max_keys
            .saturating_mul(per_key)
            .saturating_add(SLACK_BYTES)
            .saturating_add(self.options.min_capacity_per_node(page));
        let capacity = capacity.div_ceil(page) * page;
        let opts = Options::default()
            .page_size(page)
            .nodes(env.topology.node_count())
            .capacity_per_node(capacity)
            .mode(env.persist)
            .topology(Arc::clone(&env.topology))
            .engine(self.options.clone());
        let dir = env.dir.join("store");
        let store =
            BytesStore::create(&dir, self.kind, opts.clone()).map_err(|e| BenchError::Target {
                target: self.name.clone(),
                message: format!("create in {}: {e}", dir.display()),
            })?;
        Ok(Box::new(BytesInstance {
            name: self.name.clone(),
            dir,
            opts,
            index: Some(Arc::new(BytesIndex::new(store, self.key_size, self.value_size))),
        }))
    }
}

/// A bytes store seen as a `u64` [`Index`] through the key and value encoding above.
#[derive(Debug)]
pub struct BytesIndex {
    store: BytesStore,
    name: &'static str,
    key_size: usize,
    value_size: usize,
}

thread_local! {
    /// Key, value and read buffers of the calling thread.
    static BUFS: RefCell<(Vec<u8>, Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

impl BytesIndex {
    /// The adapter over `store`.
    pub fn new(store: BytesStore, key_size: usize, value_size: usize) -> BytesIndex {
        let name = store.kind().name();
        BytesIndex { store, name, key_size, value_size }
    }

    /// The store underneath.
    pub fn store(&self) -> &BytesStore {
        &self.store
    }

    fn into_store(self) -> BytesStore {
        self.store
    }

    fn encode_key(&self, k: u64, buf: &mut Vec<u8>) {
        buf.clear();
        buf.extend_from_slice(&k.to_be_bytes());
        let fill = (k as u8) ^ 0x5a;
        buf.resize(self.key_size, fill);
    }

    fn encode_value(&self, v: u64, buf: &mut Vec<u8>) {
        buf.clear();
        buf.extend_from_slice(&v.to_le_bytes());
        buf.resize(self.value_size, (v as u8) ^ 0xa5);
    }

    /// Runs `f` on the encoded key (and value, when given).
    fn with<R>(
        &self,
        k: u64,
        v: Option<u64>,
        f: impl FnOnce(&[u8], &[u8], &mut Vec<u8>) -> R,
    ) -> R {
        BUFS.with(|b| {
            let mut b = b.borrow_mut();
            let (kb, vb, out) = &mut *b;
            self.encode_key(k, kb);
            match v {
                Some(v) => self.encode_value(v, vb),
                None => vb.clear(),
            }
            f(kb, vb, out)
        })
    }
}

fn decode_value(v: &[u8]) -> u64 {
    v.get(..8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes)
}

impl Index for BytesIndex {
    fn name(&self) -> &'static str {
        self.name
    }
    fn insert(&self, key: u64, value: u64) -> numakv_index::Result<bool> {
        numakv::check_key(key)?;
        self.with(key, Some(value), |k, v, _| self.store.insert(k, v))
    }
    fn upsert(&self, key: u64, value: u64) -> numakv_index::Result<()> {
        numakv::check_key(key)?;
        self.with(key, Some(value), |k, v, _| self.store.put(k, v))
    }
    fn update(&self, key: u64, value: u64) -> numakv_index::Result<bool> {
        numakv::check_key(key)?;
        self.with(key, Some(value), |k, v, _| self.store.update(k, v))
    }
    fn get(&self, key: u64) -> numakv_index::Result<Option<u64>> {
        numakv::check_key(key)?;
        self.with(key, None, |k, _, out| {
            Ok(self.store.get_into(k, out)?.then(|| decode_value(out)))
        })
    }
    fn remove(&self, key: u64) -> numakv_index::Result<bool> {
        numakv::check_key(key)?;
        self.with(key, None, |k, _, _| self.store.delete(k))
    }
    fn scan(
        &self,
        start: u64,
        max: usize,
        out: &mut Vec<(u64, u64)>,
    ) -> numakv_index::Result<usize> {
        let mut kb = Vec::with_capacity(self.key_size);
        self.encode_key(start, &mut kb);
        let mut n = 0;
        for pair in self.store.scan(&kb, None, max) {
            let (k, v) = pair?;
            let key = k.get(..8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_be_bytes);
            out.push((key, decode_value(&v)));
            n += 1;
        }
        Ok(n)
    }
    fn stats(&self) -> EngineStats {
        self.store.stats()
    }
    fn check(&self) -> numakv_index::Result<CheckReport> {
        self.store.check()
    }
}

/// A live store of a [`BytesTarget`].
struct BytesInstance {
    name: String,
    dir: PathBuf,
    opts: Options,
    /// `None` only between a failed reopen and the drop.
    index: Option<Arc<BytesIndex>>,
}

impl BytesInstance {
    fn err(&self, what: &str, e: impl std::fmt::Display) -> BenchError {
        BenchError::Target { target: self.name.clone(), message: format!("{what}: {e}") }
    }
}

impl TargetInstance for BytesInstance {
    fn index(&self) -> Arc<dyn Index> {
        match &self.index {
            Some(i) => Arc::clone(i) as Arc<dyn Index>,
            None => panic!("{}: index() after a failed reopen", self.name),
        }
    }

    fn reopen(&mut self, how: Reopen) -> Result<Option<Duration>> {
        let index = self.index.take().ok_or_else(|| self.err("reopen", "store is gone"))?;
        let index = Arc::try_unwrap(index)
            .map_err(|_| self.err("reopen", "the index is still shared by a worker"))?;
        let (key_size, value_size) = (index.key_size, index.value_size);
        let store = index.into_store();
        match how {
            Reopen::Clean => store.close().map_err(|e| self.err("close", e))?,
            Reopen::Crash => drop(store),
        }
        let start = Instant::now();
        let store =
            BytesStore::open_with(&self.dir, &self.opts).map_err(|e| self.err("open", e))?;
        let elapsed = start.elapsed();
        self.index = Some(Arc::new(BytesIndex::new(store, key_size, value_size)));
        Ok(Some(elapsed))
    }
}

impl Drop for BytesInstance {
    fn drop(&mut self) {
        if let Some(i) = self.index.take().and_then(|i| Arc::try_unwrap(i).ok()) {
            let _ = i.into_store().close();
        }
    }
}

/// `targets` with the byte twin of each engine target (DRAM peers have none) right after it.
pub fn with_twins(
    targets: Vec<Arc<dyn Target>>,
    key_size: usize,
    value_size: usize,
) -> Result<Vec<Arc<dyn Target>>> {
    check_sizes(key_size, value_size)?;
    let mut out = Vec::with_capacity(targets.len() * 2);
    for t in targets {
        let twin = t.bytes_twin(key_size, value_size);
        out.push(t);
        if let Some(twin) = twin {
            out.push(twin);
        }
    }
    Ok(out)
}
