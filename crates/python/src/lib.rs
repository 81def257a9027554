//! `numakv._native`: the Python extension behind the `numakv` package (python/numakv). Stores
//! are the facade's `Store` (int keys) and `BytesStore` (bytes keys); calls release the GIL
//! while the store works, so Python threads run operations in parallel.

use std::sync::Arc;

use facade::{
    BytesStore, EngineKind, Error, IndexError, Options, PersistMode, PoolError, Store, StoreKind,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyKeyError, PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

create_exception!(_native, NumakvError, PyException, "Any numakv failure.");
create_exception!(
    _native,
    InvalidArgument,
    NumakvError,
    "A reserved or empty key, a bad option or engine name."
);
create_exception!(_native, TooLarge, NumakvError, "A key over 1 KiB or a value over 1 MiB.");
create_exception!(_native, OutOfSpace, NumakvError, "The store's persistent memory is full.");
create_exception!(
    _native,
    Corrupted,
    NumakvError,
    "A check found a violated invariant, or a node file is damaged."
);
create_exception!(
    _native,
    StoreIoError,
    NumakvError,
    "The file system failed (no store, a store already there, ...)."
);
create_exception!(
    _native,
    WrongKind,
    NumakvError,
    "An int key on a bytes store, bytes on an int store, or the store opened as the other kind."
);
create_exception!(_native, Closed, NumakvError, "The store was closed.");

fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match &e {
        Error::StoreKind { .. } => WrongKind::new_err(msg),
        Error::NoStore { .. } => StoreIoError::new_err(msg),
        Error::UnknownEngine { .. } | Error::BadEngineOption { .. } => {
            InvalidArgument::new_err(msg)
        }
        Error::Index(i) => match i {
            IndexError::InvalidKey(_)
            | IndexError::EmptyKey { .. }
            | IndexError::InvalidOptions(_) => InvalidArgument::new_err(msg),
            IndexError::TooLarge { .. } => TooLarge::new_err(msg),
            IndexError::Corrupted { .. } => Corrupted::new_err(msg),
            IndexError::Pool(PoolError::OutOfSpace { .. }) => OutOfSpace::new_err(msg),
            IndexError::Pool(
                PoolError::Io { .. } | PoolError::AlreadyExists { .. } | PoolError::Locked { .. },
            ) => StoreIoError::new_err(msg),
            IndexError::Pool(
                PoolError::Corrupted { .. }
                | PoolError::ChecksumMismatch { .. }
                | PoolError::Truncated { .. }
                | PoolError::BadMagic { .. },
            ) => Corrupted::new_err(msg),
            _ => NumakvError::new_err(msg),
        },
        _ => NumakvError::new_err(msg),
    }
}

fn ix(e: IndexError) -> PyErr {
    to_py(Error::from(e))
}

#[derive(Clone)]
enum Kind {
    Int(Arc<Store>),
    Bytes(Arc<BytesStore>),
}

/// A key or value from Python: an int (integer stores) or bytes / str (bytes stores; str is
/// encoded as UTF-8).
enum Key {
    Int(u64),
    Bytes(Vec<u8>),
}

fn key_of(obj: &Bound<'_, PyAny>) -> PyResult<Key> {
    if let Ok(b) = obj.downcast::<PyBytes>() {
        return Ok(Key::Bytes(b.as_bytes().to_vec()));
    }
    if let Ok(s) = obj.extract::<String>() {
        return Ok(Key::Bytes(s.into_bytes()));
    }
    if let Ok(b) = obj.extract::<Vec<u8>>() {
        return Ok(Key::Bytes(b));
    }
    match obj.extract::<u64>() {
        Ok(v) => Ok(Key::Int(v)),
        Err(_) => Err(PyTypeError::new_err(format!(
            "keys and values are ints in 0..2**64 (integer stores) or bytes/str (bytes stores), not {}",
            obj.get_type().name()?
        ))),
    }
}

/// An open numakv store (`Store.create` / `Store.open`; use it in a `with` block or call
/// `close()`).
#[pyclass(module = "numakv._native", name = "Store")]
struct PyStore {
    kind: Option<Kind>,
    engine: String,
}

impl PyStore {
    fn kind(&self) -> PyResult<&Kind> {
        self.kind.as_ref().ok_or_else(|| Closed::new_err("the store is closed"))
    }
    fn int(&self) -> PyResult<Arc<Store>> {
        match self.kind()? {
            Kind::Int(s) => Ok(Arc::clone(s)),
            Kind::Bytes(_) => {
                Err(WrongKind::new_err("this is a bytes store: use bytes or str keys"))
            }
        }
    }
    fn bytes(&self) -> PyResult<Arc<BytesStore>> {
        match self.kind()? {
            Kind::Bytes(s) => Ok(Arc::clone(s)),
            Kind::Int(_) => Err(WrongKind::new_err(
                "this is an integer store: use int keys (Store.create(..., bytes=True) makes a bytes store)",
            )),
        }
    }
}

fn options(
    kind: EngineKind,
    nodes: usize,
    mode: &str,
    capacity: Option<&str>,
    extra: Option<&Bound<'_, PyDict>>,
) -> PyResult<Options> {
    let mut opts = Options::default().nodes(nodes);
    opts = opts.mode(match mode {
        "adr" => PersistMode::Adr,
        "eadr" => PersistMode::Eadr,
        _ => {
            return Err(InvalidArgument::new_err(format!(
                "mode={mode:?}: expected 'adr' or 'eadr'"
            )))
        }
    });
    if let Some(c) = capacity {
        opts =
            opts.capacity_per_node(facade::size::parse_size(c).map_err(InvalidArgument::new_err)?);
    }
    let mut engine = kind.default_options();
    if let Some(extra) = extra {
        for (k, v) in extra.iter() {
            let k: String = k.extract()?;
            let v =
                if let Ok(b) = v.extract::<bool>() { b.to_string() } else { v.str()?.to_string() };
            engine.set(&k, &v).map_err(to_py)?;
        }
    }
    Ok(opts.engine(engine))
}

#[pymethods]
impl PyStore {
    /// Creates a store in the new directory `dir` with `engine`, `nodes` NUMA nodes (emulated
    /// where the machine has fewer), persistence `mode` ('adr' or 'eadr'), `capacity` per node
    /// ('1G'), integer or `bytes` keys, and engine options as keywords (`leaf_slots=64`).
    #[staticmethod]
    #[pyo3(signature = (dir, engine = "fastfair", nodes = 1, mode = "adr", capacity = None, bytes = false, **options))]
    #[allow(clippy::too_many_arguments)]
    fn create(
        py: Python<'_>,
        dir: std::path::PathBuf,
        engine: &str,
        nodes: usize,
        mode: &str,
        capacity: Option<&str>,
        bytes: bool,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyStore> {
        let kind: EngineKind = engine.parse().map_err(to_py)?;
        let opts = self::options(kind, nodes, mode, capacity, options)?;
        let store = py.allow_threads(|| -> Result<Kind, Error> {
            Ok(if bytes {
                Kind::Bytes(Arc::new(BytesStore::create(&dir, kind, opts)?))
            } else {
                Kind::Int(Arc::new(Store::create(&dir, kind, opts)?))
            })
        });
        Ok(PyStore { kind: Some(store.map_err(to_py)?), engine: kind.to_string() })
    }

    /// Opens the store in `dir` (integer or bytes, as created), recovering it after a crash.
    #[staticmethod]
    fn open(py: Python<'_>, dir: std::path::PathBuf) -> PyResult<PyStore> {
        let kind = py.allow_threads(|| -> Result<Kind, Error> {
            match Store::open(&dir) {
                Ok(s) => Ok(Kind::Int(Arc::new(s))),
                Err(Error::StoreKind { found: StoreKind::Bytes, .. }) => {
                    Ok(Kind::Bytes(Arc::new(BytesStore::open(&dir)?)))
                }
                Err(e) => Err(e),
            }
        });
        let kind = kind.map_err(to_py)?;
        let engine = match &kind {
            Kind::Int(s) => s.kind().to_string(),
            Kind::Bytes(s) => s.kind().to_string(),
        };
        Ok(PyStore { kind: Some(kind), engine })
    }

    /// The engine's name.
    #[getter]
    fn engine(&self) -> String {
        self.engine.clone()
    }

    /// `'int'` or `'bytes'`.
    #[getter]
    fn kind_name(&self) -> PyResult<&'static str> {
        Ok(match self.kind()? {
            Kind::Int(_) => "int",
            Kind::Bytes(_) => "bytes",
        })
    }

    /// The value of `key`, or None.
    fn get(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        match key_of(key)? {
            Key::Int(k) => {
                let s = self.int()?;
                let v = py.allow_threads(|| s.get(k)).map_err(ix)?;
                Ok(v.into_pyobject(py)?.into_any().unbind())
            }
            Key::Bytes(k) => {
                let s = self.bytes()?;
                let v = py.allow_threads(|| s.get(&k)).map_err(ix)?;
                Ok(match v {
                    Some(v) => PyBytes::new(py, &v).into_any().unbind(),
                    None => py.None(),
                })
            }
        }
    }

    /// `store[key]`: the value, or KeyError.
    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        let v = self.get(py, key)?;
        if v.is_none(py) {
            return Err(PyKeyError::new_err(key.clone().unbind()));
        }
        Ok(v)
    }

    /// Inserts or overwrites `key → value`.
    fn put(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.write(py, key, Some(value), Op::Put).map(|_| ())
    }

    /// `store[key] = value`.
    fn __setitem__(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.put(py, key, value)
    }

    /// Inserts `key → value` if absent; whether it did.
    fn insert(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.write(py, key, Some(value), Op::Insert)
    }

    /// Overwrites `key`'s value if present; whether it did.
    fn update(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.write(py, key, Some(value), Op::Update)
    }

    /// Removes `key`; whether it was present.
    fn delete(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.write(py, key, None, Op::Delete)
    }

    /// Pairs in ascending key order from `start` (inclusive) to `end` (exclusive, bytes stores;
    /// None: no bound), at most `limit`; an iterator that fetches in batches.
    #[pyo3(signature = (start = None, end = None, limit = None))]
    fn scan(
        &self,
        start: Option<&Bound<'_, PyAny>>,
        end: Option<&Bound<'_, PyAny>>,
        limit: Option<usize>,
    ) -> PyResult<ScanIter> {
        let left = limit.unwrap_or(usize::MAX);
        let state = match self.kind()? {
            Kind::Int(s) => {
                let from = match start.map(key_of).transpose()? {
                    None => 1,
                    Some(Key::Int(k)) => k,
                    Some(Key::Bytes(_)) => {
                        return Err(WrongKind::new_err("an integer store scans from an int"))
                    }
                };
                if end.is_some() {
                    return Err(InvalidArgument::new_err("end is for bytes stores; use limit"));
                }
                ScanState::Int { store: Arc::clone(s), next: Some(from), buf: Vec::new() }
            }
            Kind::Bytes(s) => {
                let bytes_arg = |o: Option<&Bound<'_, PyAny>>| -> PyResult<Option<Vec<u8>>> {
                    match o.map(key_of).transpose()? {
                        None => Ok(None),
                        Some(Key::Bytes(b)) => Ok(Some(b)),
                        Some(Key::Int(_)) => {
                            Err(WrongKind::new_err("a bytes store scans from bytes or str"))
                        }
                    }
                };
                ScanState::Bytes {
                    store: Arc::clone(s),
                    next: Some(bytes_arg(start)?.unwrap_or_default()),
                    end: bytes_arg(end)?,
                    buf: Vec::new(),
                }
            }
        };
        Ok(ScanIter { state, left })
    }

    /// Space and engine counters: {'engine', 'kind', 'pm_bytes', 'pm_bytes_per_node',
    /// 'dram_bytes', 'counters': {...}}.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (kind, st) = match self.kind()? {
            Kind::Int(s) => ("int", s.stats()),
            Kind::Bytes(s) => ("bytes", s.stats()),
        };
        let d = PyDict::new(py);
        d.set_item("engine", &self.engine)?;
        d.set_item("kind", kind)?;
        d.set_item("pm_bytes", st.pm_bytes())?;
        d.set_item("pm_bytes_per_node", st.pm_bytes_per_node.clone())?;
        d.set_item("dram_bytes", st.dram_bytes)?;
        let c = PyDict::new(py);
        for (k, v) in &st.counters {
            c.set_item(*k, *v)?;
        }
        d.set_item("counters", c)?;
        Ok(d)
    }

    /// Structural check of the whole store; the number of pairs. Run it while nothing writes.
    fn check(&self, py: Python<'_>) -> PyResult<u64> {
        let k = self.kind()?.clone();
        let r = py.allow_threads(|| match &k {
            Kind::Int(s) => s.fsck(),
            Kind::Bytes(s) => s.fsck(),
        });
        Ok(r.map_err(to_py)?.entries)
    }

    /// Places the calling thread on NUMA node `node` for placement and accounting.
    #[staticmethod]
    fn set_thread_node(node: usize) {
        numakv_numa::set_current_node(node);
    }

    /// Closes the store cleanly (the next open needs no recovery). Idempotent; fails while scan
    /// iterators are still alive.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        let Some(kind) = self.kind.take() else { return Ok(()) };
        let r = match kind {
            Kind::Int(s) => match Arc::try_unwrap(s) {
                Ok(s) => py.allow_threads(|| s.close()),
                Err(s) => {
                    self.kind = Some(Kind::Int(s));
                    return Err(PyRuntimeError::new_err(
                        "scan iterators of this store are still alive",
                    ));
                }
            },
            Kind::Bytes(s) => match Arc::try_unwrap(s) {
                Ok(s) => py.allow_threads(|| s.close()),
                Err(s) => {
                    self.kind = Some(Kind::Bytes(s));
                    return Err(PyRuntimeError::new_err(
                        "scan iterators of this store are still alive",
                    ));
                }
            },
        };
        r.map_err(to_py)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &mut self,
        py: Python<'_>,
        _t: PyObject,
        _v: PyObject,
        _tb: PyObject,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = match &self.kind {
            None => "closed",
            Some(Kind::Int(_)) => "int",
            Some(Kind::Bytes(_)) => "bytes",
        };
        format!("<numakv.Store {} {state}>", self.engine)
    }
}

#[derive(Clone, Copy)]
enum Op {
    Put,
    Insert,
    Update,
    Delete,
}

impl PyStore {
    fn write(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: Option<&Bound<'_, PyAny>>,
        op: Op,
    ) -> PyResult<bool> {
        let value = value.map(key_of).transpose()?;
        match (key_of(key)?, value) {
            (Key::Int(k), v) => {
                let v = match v {
                    None => 0,
                    Some(Key::Int(v)) => v,
                    Some(Key::Bytes(_)) => {
                        return Err(WrongKind::new_err("an integer store holds int values"))
                    }
                };
                let s = self.int()?;
                py.allow_threads(|| match op {
                    Op::Put => s.upsert(k, v).map(|()| true),
                    Op::Insert => s.insert(k, v),
                    Op::Update => s.update(k, v),
                    Op::Delete => s.remove(k),
                })
                .map_err(ix)
            }
            (Key::Bytes(k), v) => {
                let v = match v {
                    None => Vec::new(),
                    Some(Key::Bytes(v)) => v,
                    Some(Key::Int(_)) => {
                        return Err(WrongKind::new_err("a bytes store holds bytes or str values"))
                    }
                };
                let s = self.bytes()?;
                py.allow_threads(|| match op {
                    Op::Put => s.put(&k, &v).map(|()| true),
                    Op::Insert => s.insert(&k, &v),
                    Op::Update => s.update(&k, &v),
                    Op::Delete => s.delete(&k),
                })
                .map_err(ix)
            }
        }
    }
}

/// Pairs an iterator fetches at a time.
const BATCH: usize = 256;

enum ScanState {
    Int {
        store: Arc<Store>,
        next: Option<u64>,
        buf: Vec<(u64, u64)>,
    },
    Bytes {
        store: Arc<BytesStore>,
        next: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
        buf: Vec<(Vec<u8>, Vec<u8>)>,
    },
}

/// An ascending scan; yields `(key, value)` tuples.
#[pyclass(module = "numakv._native")]
struct ScanIter {
    state: ScanState,
    left: usize,
}

#[pymethods]
impl ScanIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<PyObject>> {
        if self.left == 0 {
            return Ok(None);
        }
        let item = match &mut self.state {
            ScanState::Int { store, next, buf } => {
                if buf.is_empty() {
                    let Some(from) = next.take() else { return Ok(None) };
                    let s = Arc::clone(store);
                    let mut got = Vec::with_capacity(BATCH);
                    py.allow_threads(|| s.scan(from, BATCH, &mut got)).map_err(ix)?;
                    if got.len() == BATCH {
                        *next = got[BATCH - 1].0.checked_add(1);
                    }
                    got.reverse(); // popped from the back
                    *buf = got;
                }
                let Some((k, v)) = buf.pop() else { return Ok(None) };
                (k, v).into_pyobject(py)?.into_any().unbind()
            }
            ScanState::Bytes { store, next, end, buf } => {
                if buf.is_empty() {
                    let Some(from) = next.take() else { return Ok(None) };
                    let s = Arc::clone(store);
                    let end = end.clone();
                    let got = py
                        .allow_threads(|| {
                            s.scan(&from, end.as_deref(), BATCH).collect::<Result<Vec<_>, _>>()
                        })
                        .map_err(ix)?;
                    if got.len() == BATCH {
                        // Just after the last key: that key followed by a 0 byte.
                        let mut after = got[BATCH - 1].0.clone();
                        after.push(0);
                        *next = Some(after);
                    }
                    let mut got = got;
                    got.reverse();
                    *buf = got;
                }
                let Some((k, v)) = buf.pop() else { return Ok(None) };
                (PyBytes::new(py, &k), PyBytes::new(py, &v)).into_pyobject(py)?.into_any().unbind()
            }
        };
        self.left -= 1;
        Ok(Some(item))
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyStore>()?;
    m.add_class::<ScanIter>()?;
    m.add("NumakvError", py.get_type::<NumakvError>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    m.add("TooLarge", py.get_type::<TooLarge>())?;
    m.add("OutOfSpace", py.get_type::<OutOfSpace>())?;
    m.add("Corrupted", py.get_type::<Corrupted>())?;
    m.add("StoreIoError", py.get_type::<StoreIoError>())?;
    m.add("WrongKind", py.get_type::<WrongKind>())?;
    m.add("Closed", py.get_type::<Closed>())?;
    m.add("ENGINES", EngineKind::all().iter().map(|k| k.to_string()).collect::<Vec<_>>())?;
    Ok(())
}
