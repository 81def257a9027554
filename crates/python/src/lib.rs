//! `numakv._native`: the Python extension behind the `numakv` package (python/numakv). Stores
//! are the facade's `Store` (int keys) and `BytesStore` (bytes keys); calls release the GIL
//! while the store works, so Python threads run operations in parallel.
//!
//! A `Store` is a frozen pyclass (every method takes `&self`): the open store sits behind a
//! lock that a call holds only long enough to clone its `Arc`, so `close()` from one thread
//! while others are inside calls waits for those calls instead of failing with "Already
//! borrowed". Scan iterators are counted; `close()` refuses (`Busy`) while any is open.
//!
//! One process per store: a `pthread_atfork` child handler bumps a fork generation; a store (and
//! its iterators) used in a fork child raises `Forked`, and a store collected in the child is
//! not closed (closing would mark the parent's store clean while the parent writes).

use std::ffi::CString;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};

use facade::{
    BytesStore, EngineKind, Error, IndexError, LatencyModel, Options, PersistMode, PoolError,
    Store, StoreKind, WriteBatch,
};
use pyo3::exceptions::{
    PyException, PyKeyError, PyOSError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyInt, PyMemoryView, PyString, PyTuple, PyType};

// --- exceptions ------------------------------------------------------------------------------

/// The package's exception classes, made at import: `NumakvError` and subclasses that also
/// derive from the builtin exception they mean (`except ValueError` catches a bad key).
struct Exceptions {
    base: Py<PyType>,
    invalid: Py<PyType>,
    too_large: Py<PyType>,
    out_of_space: Py<PyType>,
    corrupted: Py<PyType>,
    io: Py<PyType>,
    wrong_kind: Py<PyType>,
    closed: Py<PyType>,
    busy: Py<PyType>,
    forked: Py<PyType>,
}

static EXCEPTIONS: GILOnceCell<Exceptions> = GILOnceCell::new();

/// `class name(*bases): __doc__ = doc` in module `numakv`.
fn class<'py>(
    py: Python<'py>,
    name: &str,
    bases: Vec<Bound<'py, PyAny>>,
    doc: &str,
) -> PyResult<Py<PyType>> {
    let dict = PyDict::new(py);
    dict.set_item("__doc__", doc)?;
    dict.set_item("__module__", "numakv")?;
    let ty = py.get_type::<PyType>().call1((name, PyTuple::new(py, bases)?, dict))?;
    Ok(ty.downcast_into::<PyType>()?.unbind())
}

fn exceptions(py: Python<'_>) -> PyResult<&Exceptions> {
    EXCEPTIONS.get_or_try_init(py, || {
        let base = class(
            py,
            "NumakvError",
            vec![py.get_type::<PyException>().into_any()],
            "Any numakv failure.",
        )?;
        let b = || base.bind(py).clone().into_any();
        let value = || py.get_type::<PyValueError>().into_any();
        let os = || py.get_type::<PyOSError>().into_any();
        let runtime = || py.get_type::<PyRuntimeError>().into_any();
        let ty = || py.get_type::<PyTypeError>().into_any();
        Ok(Exceptions {
            invalid: class(
                py,
                "InvalidArgument",
                vec![b(), value()],
                "A reserved or empty key, a bad option, engine name or node (also a ValueError).",
            )?,
            too_large: class(
                py,
                "TooLarge",
                vec![b(), value()],
                "A key over 1 KiB or a value over 1 MiB (also a ValueError).",
            )?,
            out_of_space: class(
                py,
                "OutOfSpace",
                vec![b(), os()],
                "The store's persistent memory is full (also an OSError).",
            )?,
            corrupted: class(
                py,
                "Corrupted",
                vec![b(), os()],
                "A check found a violated invariant, or a node file is damaged (also an OSError).",
            )?,
            io: class(
                py,
                "StoreIoError",
                vec![b(), os()],
                "The file system failed: no store, a store already there, ... (also an OSError).",
            )?,
            wrong_kind: class(
                py,
                "WrongKind",
                vec![b(), ty()],
                "An int key on a bytes store, bytes on an int store (also a TypeError).",
            )?,
            closed: class(
                py,
                "Closed",
                vec![b(), value()],
                "The store or iterator was closed (also a ValueError, like a closed file).",
            )?,
            busy: class(
                py,
                "Busy",
                vec![b(), runtime()],
                "close() while scan iterators of the store are open (also a RuntimeError).",
            )?,
            forked: class(
                py,
                "Forked",
                vec![b(), runtime()],
                "A store used in a fork child of the process that opened it (also a RuntimeError).",
            )?,
            base,
        })
    })
}

/// Which of the package's exceptions.
#[derive(Clone, Copy)]
enum Exc {
    Base,
    Invalid,
    TooLarge,
    OutOfSpace,
    Corrupted,
    Io,
    WrongKind,
    Closed,
    Busy,
    Forked,
}

fn exc(which: Exc, msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    Python::with_gil(|py| match exceptions(py) {
        Ok(e) => {
            let ty = match which {
                Exc::Base => &e.base,
                Exc::Invalid => &e.invalid,
                Exc::TooLarge => &e.too_large,
                Exc::OutOfSpace => &e.out_of_space,
                Exc::Corrupted => &e.corrupted,
                Exc::Io => &e.io,
                Exc::WrongKind => &e.wrong_kind,
                Exc::Closed => &e.closed,
                Exc::Busy => &e.busy,
                Exc::Forked => &e.forked,
            };
            PyErr::from_type(ty.bind(py).clone(), msg)
        }
        Err(e) => e,
    })
}

fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    let which = match &e {
        Error::StoreKind { .. } => Exc::WrongKind,
        Error::NoStore { .. } => Exc::Io,
        Error::UnknownEngine { .. } | Error::BadEngineOption { .. } => Exc::Invalid,
        Error::Index(i) => match i {
            IndexError::InvalidKey(_)
            | IndexError::EmptyKey { .. }
            | IndexError::InvalidOptions(_) => Exc::Invalid,
            IndexError::TooLarge { .. } => Exc::TooLarge,
            IndexError::Corrupted { .. } => Exc::Corrupted,
            IndexError::Pool(PoolError::OutOfSpace { .. }) => Exc::OutOfSpace,
            IndexError::Pool(
                PoolError::Io { .. } | PoolError::AlreadyExists { .. } | PoolError::Locked { .. },
            ) => Exc::Io,
            IndexError::Pool(
                PoolError::Corrupted { .. }
                | PoolError::ChecksumMismatch { .. }
                | PoolError::Truncated { .. }
                | PoolError::BadMagic { .. },
            ) => Exc::Corrupted,
            IndexError::Pool(PoolError::InvalidArgument(_)) => Exc::Invalid,
            _ => Exc::Base,
        },
        _ => Exc::Base,
    };
    exc(which, msg)
}

fn ix(e: IndexError) -> PyErr {
    to_py(Error::from(e))
}

// --- one process -----------------------------------------------------------------------------

static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);
static ATFORK: Once = Once::new();

extern "C" fn forked_child() {
    // ORDERING: Relaxed; the child is single-threaded right after fork and its later threads
    // are created after this store (thread creation synchronizes).
    FORK_GENERATION.fetch_add(1, Ordering::Relaxed);
}

fn fork_generation() -> u64 {
    ATFORK.call_once(|| {
        // SAFETY: registers a plain `extern "C" fn()` that only touches an atomic
        // (async-signal-safe, as a fork child handler must be).
        unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    });
    // ORDERING: Relaxed; see forked_child.
    FORK_GENERATION.load(Ordering::Relaxed)
}

fn is_forked(generation: u64) -> bool {
    // ORDERING: Relaxed; see forked_child.
    FORK_GENERATION.load(Ordering::Relaxed) != generation
}

fn forked_err(pid: u32, what: &str) -> PyErr {
    exc(
        Exc::Forked,
        format!(
            "this {what} was opened by process {pid}; process {} is a fork child of it and may \
             not use it (nothing was done): open the store in the child after the parent closed it",
            std::process::id()
        ),
    )
}

// --- keys and values -------------------------------------------------------------------------

#[derive(Clone)]
enum Kind {
    Int(Arc<Store>),
    Bytes(Arc<BytesStore>),
}

/// A key or value from Python: an int (integer stores) or bytes-like / str (bytes stores; str
/// is encoded as UTF-8; bytearray, memoryview and other buffer objects are copied in one go).
enum Key {
    Int(u64),
    Bytes(Vec<u8>),
}

fn key_of(obj: &Bound<'_, PyAny>) -> PyResult<Key> {
    if let Ok(b) = obj.downcast::<PyBytes>() {
        return Ok(Key::Bytes(b.as_bytes().to_vec()));
    }
    if let Ok(b) = obj.downcast::<PyByteArray>() {
        return Ok(Key::Bytes(b.to_vec()));
    }
    if let Ok(s) = obj.downcast::<PyString>() {
        return Ok(Key::Bytes(s.to_cow()?.as_bytes().to_vec()));
    }
    if obj.is_instance_of::<PyInt>() {
        return match obj.extract::<u64>() {
            Ok(v) => Ok(Key::Int(v)),
            Err(_) => Err(exc(Exc::Invalid, format!("{obj} is not in 0..2**64"))),
        };
    }
    // Any other buffer object (memoryview, array.array, numpy arrays): one copy through
    // memoryview.tobytes(), never an element-by-element sequence walk.
    let py = obj.py();
    let view = if obj.is_instance_of::<PyMemoryView>() {
        Ok(obj.clone())
    } else {
        py.get_type::<PyMemoryView>().call1((obj,))
    };
    match view {
        Ok(view) => {
            let bytes = view.call_method0("tobytes")?;
            Ok(Key::Bytes(bytes.downcast::<PyBytes>()?.as_bytes().to_vec()))
        }
        Err(_) => Err(PyTypeError::new_err(format!(
            "keys and values are ints in 0..2**64 (integer stores) or bytes-like/str (bytes stores), not {}",
            obj.get_type().name()?
        ))),
    }
}

// --- the store -------------------------------------------------------------------------------

/// What a `Store` holds while open.
struct Open {
    kind: Kind,
}

/// An open numakv store (`Store.create` / `Store.open`; use it in a `with` block or call
/// `close()`; a store collected while open is closed then, with a `ResourceWarning`, or, when
/// scan iterators of it are still open, by the last of them to end or be collected).
#[pyclass(module = "numakv._native", name = "Store", frozen)]
struct PyStore {
    open: Mutex<Option<Open>>,
    /// Whether opening it ran recovery (None: created by this session).
    recovered: Option<bool>,
    engine: String,
    kind_name: &'static str,
    nodes: usize,
    /// Scan iterators alive (not closed, not collected), and the store they close when it was
    /// collected before them.
    iters: Arc<Iters>,
    generation: u64,
    pid: u32,
}

impl PyStore {
    fn new(kind: Kind) -> PyStore {
        let (engine, kind_name, nodes, report) = match &kind {
            Kind::Int(s) => (s.kind().to_string(), "int", s.pool().nodes(), s.recovery().cloned()),
            Kind::Bytes(s) => {
                (s.kind().to_string(), "bytes", s.pool().nodes(), s.recovery().cloned())
            }
        };
        PyStore {
            open: Mutex::new(Some(Open { kind })),
            recovered: report.map(|r| !r.was_clean),
            engine,
            kind_name,
            nodes,
            iters: Arc::new(Iters { open: AtomicUsize::new(0), orphan: Mutex::new(None) }),
            generation: fork_generation(),
            pid: std::process::id(),
        }
    }

    /// The open store (a clone of its `Arc`), or `Closed` / `Forked`.
    fn kind(&self) -> PyResult<Kind> {
        if is_forked(self.generation) {
            return Err(forked_err(self.pid, "store"));
        }
        let open = self.open.lock().map_err(|_| exc(Exc::Base, "store lock poisoned"))?;
        match open.as_ref() {
            Some(o) => Ok(o.kind.clone()),
            None => Err(exc(Exc::Closed, "the store is closed")),
        }
    }
    /// As [`kind`](Self::kind), for a new scan iterator: counted in `iters` under the same lock
    /// `close` takes, so a close never misses an iterator being made.
    fn kind_counted(&self) -> PyResult<Kind> {
        if is_forked(self.generation) {
            return Err(forked_err(self.pid, "store"));
        }
        let open = self.open.lock().map_err(|_| exc(Exc::Base, "store lock poisoned"))?;
        match open.as_ref() {
            Some(o) => {
                self.iters.open.fetch_add(1, Ordering::AcqRel);
                Ok(o.kind.clone())
            }
            None => Err(exc(Exc::Closed, "the store is closed")),
        }
    }
    fn int(&self) -> PyResult<Arc<Store>> {
        match self.kind()? {
            Kind::Int(s) => Ok(s),
            Kind::Bytes(_) => {
                Err(exc(Exc::WrongKind, "this is a bytes store: use bytes or str keys"))
            }
        }
    }
    fn bytes(&self) -> PyResult<Arc<BytesStore>> {
        match self.kind()? {
            Kind::Bytes(s) => Ok(s),
            Kind::Int(_) => Err(exc(
                Exc::WrongKind,
                "this is an integer store: use int keys (Store.create(..., bytes=True) makes a bytes store)",
            )),
        }
    }

    /// Takes the store out (later calls see it closed), after checking that no iterator is
    /// open; `None` when it was already closed.
    fn take(&self) -> PyResult<Option<Kind>> {
        let mut open = self.open.lock().map_err(|_| exc(Exc::Base, "store lock poisoned"))?;
        if open.is_none() {
            return Ok(None);
        }
        let n = self.iters.open.load(Ordering::Acquire);
        if n > 0 {
            return Err(exc(
                Exc::Busy,
                format!(
                    "{n} scan iterator(s) of this store are still open: close them (it.close(), a \
                     with block, or let them finish) before closing the store"
                ),
            ));
        }
        Ok(open.take().map(|o| o.kind))
    }
}

/// The open scan iterators of a store, and the store itself once the `Store` object was
/// collected while some were open: the last iterator to go then closes it (cleanly), rather
/// than its drop ending the store as a crash.
struct Iters {
    open: AtomicUsize,
    orphan: Mutex<Option<Kind>>,
}

impl Iters {
    /// The collected `Store`'s store: kept for the last iterator when one is open (`None`
    /// returned), else given back to be closed now. Under `orphan`'s lock, as
    /// [`release`](Self::release), so exactly one of them closes it.
    fn adopt(&self, kind: Kind) -> Option<Kind> {
        let mut orphan = self.orphan.lock().unwrap_or_else(|p| p.into_inner());
        if self.open.load(Ordering::Acquire) > 0 {
            *orphan = Some(kind);
            return None;
        }
        Some(kind)
    }

    /// One iterator fewer (its store reference already dropped); the orphaned store when this
    /// was the last one.
    fn release(&self) -> Option<Kind> {
        let mut orphan = self.orphan.lock().unwrap_or_else(|p| p.into_inner());
        if self.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            return orphan.take();
        }
        None
    }
}

/// Waits until calls of other threads that still hold `kind` have returned, then closes it.
/// The store was taken out of its `PyStore`, so no new call can start on it.
fn close_kind(kind: Kind) -> Result<(), Error> {
    match kind {
        Kind::Int(s) => close_when_alone(s, |s| s.close()),
        Kind::Bytes(s) => close_when_alone(s, |s| s.close()),
    }
}

fn close_when_alone<T>(
    mut s: Arc<T>,
    close: impl FnOnce(T) -> Result<(), Error>,
) -> Result<(), Error> {
    loop {
        match Arc::try_unwrap(s) {
            Ok(inner) => return close(inner),
            Err(still) => {
                // Another thread is inside a call (it cloned the Arc before the store was taken
                // out); calls are short, so yield until it returns.
                s = still;
                std::thread::yield_now();
            }
        }
    }
}

/// A count or index from Python: an int in `0..=usize::MAX`; a negative or too large one is
/// `InvalidArgument` (not `OverflowError`), anything but an int a `TypeError`.
fn int_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    if !obj.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{what} is an int, not {}",
            obj.get_type().name()?
        )));
    }
    obj.extract::<usize>()
        .map_err(|_| exc(Exc::Invalid, format!("{what}={obj}: out of range (a count from 0)")))
}

fn parse_capacity(c: &Bound<'_, PyAny>) -> PyResult<u64> {
    if c.is_instance_of::<PyInt>() {
        return c.extract::<u64>().map_err(|_| {
            exc(Exc::Invalid, format!("capacity={c}: bytes per node, a positive int"))
        });
    }
    if let Ok(s) = c.downcast::<PyString>() {
        return facade::size::parse_size(&s.to_cow()?).map_err(|e| exc(Exc::Invalid, e));
    }
    Err(PyTypeError::new_err("capacity is an int (bytes per node) or a size string such as '1G'"))
}

fn session_options(
    opts: Options,
    accounting: Option<bool>,
    latency: Option<&str>,
) -> PyResult<Options> {
    let mut opts = opts;
    if let Some(on) = accounting {
        opts = opts.accounting(on);
    }
    if let Some(l) = latency {
        opts = opts.latency(l.parse::<LatencyModel>().map_err(|e| exc(Exc::Invalid, e))?);
    }
    Ok(opts)
}

fn engine_options(
    kind: EngineKind,
    extra: Option<&Bound<'_, PyDict>>,
) -> PyResult<facade::EngineOptions> {
    let mut engine = kind.default_options();
    if let Some(extra) = extra {
        for (k, v) in extra.iter() {
            let k: String = k.extract()?;
            let v =
                if let Ok(b) = v.extract::<bool>() { b.to_string() } else { v.str()?.to_string() };
            engine.set(&k, &v).map_err(to_py)?;
        }
    }
    Ok(engine)
}

/// The store's nodes on this machine, by the bench's rule (real and bound when there are that
/// many, else emulated).
fn topology_for(nodes: usize) -> PyResult<Arc<numakv_numa::Topology>> {
    numakv_numa::Topology::with_nodes(nodes.max(1))
        .map(Arc::new)
        .map_err(|e| exc(Exc::Base, e.to_string()))
}

#[pymethods]
impl PyStore {
    /// Creates a store in the new directory `dir` with `engine`, `nodes` NUMA nodes (1..=256,
    /// else InvalidArgument; emulated where the machine has fewer, bound to the real ones
    /// otherwise), persistence `mode`
    /// ('adr' or 'eadr'), `capacity` per node (bytes as an int, or '1G'), integer or `bytes`
    /// keys, `accounting` / `latency` ('none', 'optane') session knobs and engine options as
    /// keywords (`leaf_slots=64`).
    #[staticmethod]
    #[pyo3(signature = (dir, engine = "fastfair", nodes = None, mode = "adr", capacity = None, bytes = false, accounting = None, latency = None, **options))]
    #[allow(clippy::too_many_arguments)]
    fn create(
        py: Python<'_>,
        dir: std::path::PathBuf,
        engine: &str,
        nodes: Option<&Bound<'_, PyAny>>,
        mode: &str,
        capacity: Option<&Bound<'_, PyAny>>,
        bytes: bool,
        accounting: Option<bool>,
        latency: Option<&str>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyStore> {
        let kind: EngineKind = engine.parse().map_err(to_py)?;
        let nodes = nodes.map(|n| int_arg(n, "nodes")).transpose()?.unwrap_or(1);
        if !(1..=numakv_numa::MAX_NODES).contains(&nodes) {
            return Err(exc(
                Exc::Invalid,
                format!("nodes={nodes}: a store has 1..={} nodes", numakv_numa::MAX_NODES),
            ));
        }
        let mut opts = Options::default().nodes(nodes);
        opts = opts.mode(match mode {
            "adr" => PersistMode::Adr,
            "eadr" => PersistMode::Eadr,
            _ => return Err(exc(Exc::Invalid, format!("mode={mode:?}: expected 'adr' or 'eadr'"))),
        });
        if let Some(c) = capacity {
            opts = opts.capacity_per_node(parse_capacity(c)?);
        }
        let opts = session_options(opts, accounting, latency)?
            .engine(engine_options(kind, options)?)
            .topology(topology_for(nodes)?);
        let store = py.allow_threads(|| -> Result<Kind, Error> {
            Ok(if bytes {
                Kind::Bytes(Arc::new(BytesStore::create(&dir, kind, opts)?))
            } else {
                Kind::Int(Arc::new(Store::create(&dir, kind, opts)?))
            })
        });
        Ok(PyStore::new(store.map_err(to_py)?))
    }

    /// Opens the store in `dir` (integer or bytes, as created), recovering it after a crash;
    /// `accounting`, `latency` and engine session options as keywords (`recovery='eager'`).
    #[staticmethod]
    #[pyo3(signature = (dir, accounting = None, latency = None, **options))]
    fn open(
        py: Python<'_>,
        dir: std::path::PathBuf,
        accounting: Option<bool>,
        latency: Option<&str>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyStore> {
        let (engine, found) = Store::kind_of(&dir).map_err(to_py)?;
        let header = Store::read_header(&dir).map_err(to_py)?;
        let opts = session_options(Options::default(), accounting, latency)?
            .engine(engine_options(engine, options)?)
            .topology(topology_for(header.node_count as usize)?);
        let kind = py.allow_threads(|| -> Result<Kind, Error> {
            Ok(match found {
                StoreKind::Integer => Kind::Int(Arc::new(Store::open_with(&dir, &opts)?)),
                StoreKind::Bytes => Kind::Bytes(Arc::new(BytesStore::open_with(&dir, &opts)?)),
            })
        });
        Ok(PyStore::new(kind.map_err(to_py)?))
    }

    /// The engine's name.
    #[getter]
    fn engine(&self) -> String {
        self.engine.clone()
    }

    /// `'int'` or `'bytes'`.
    #[getter]
    fn kind_name(&self) -> &'static str {
        self.kind_name
    }

    /// The store's NUMA nodes (node files).
    #[getter]
    fn nodes(&self) -> usize {
        self.nodes
    }

    /// Whether opening the store had to recover it (it was not closed cleanly); None for a
    /// store this session created.
    #[getter]
    fn recovered(&self) -> Option<bool> {
        self.recovered
    }

    /// Whether the store is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.open.lock().map(|o| o.is_none()).unwrap_or(true)
    }

    /// The value of `key`, or `default`.
    #[pyo3(signature = (key, default = None))]
    fn get(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        default: Option<PyObject>,
    ) -> PyResult<PyObject> {
        Ok(self.lookup(py, key)?.unwrap_or_else(|| default.unwrap_or_else(|| py.None())))
    }

    /// `store[key]`: the value, or KeyError.
    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        match self.lookup(py, key)? {
            Some(v) => Ok(v),
            None => Err(PyKeyError::new_err(key.clone().unbind())),
        }
    }

    /// `key in store`.
    fn __contains__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self.lookup(py, key)?.is_some())
    }

    /// Inserts or overwrites `key → value`.
    fn put(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.write_op(py, key, Some(value), Op::Put).map(|_| ())
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

    /// `del store[key]`: KeyError when absent.
    fn __delitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.write_op(py, key, None, Op::Delete)? {
            Ok(())
        } else {
            Err(PyKeyError::new_err(key.clone().unbind()))
        }
    }

    /// Inserts `key → value` if absent; whether it did.
    fn insert(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.write_op(py, key, Some(value), Op::Insert)
    }

    /// Overwrites `key`'s value if present; whether it did.
    fn update(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.write_op(py, key, Some(value), Op::Update)
    }

    /// Removes `key`; whether it was present.
    fn delete(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.write_op(py, key, None, Op::Delete)
    }

    /// Pairs in ascending key order from `start` (inclusive) to `end` (exclusive; None: no
    /// bound), at most `limit`, or the keys starting with `prefix` (bytes stores); an iterator
    /// that fetches in batches. Close it (`close()`, a `with` block, or by exhausting it) to let
    /// the store close.
    #[pyo3(signature = (start = None, end = None, limit = None, prefix = None))]
    fn scan(
        &self,
        start: Option<&Bound<'_, PyAny>>,
        end: Option<&Bound<'_, PyAny>>,
        limit: Option<usize>,
        prefix: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<ScanIter> {
        self.iterate(start, end, limit, prefix, Yield::Pairs)
    }

    /// The keys in ascending order (an iterator, like `scan`).
    fn keys(&self) -> PyResult<ScanIter> {
        self.iterate(None, None, None, None, Yield::Keys)
    }

    /// The values in key order (an iterator, like `scan`).
    fn values(&self) -> PyResult<ScanIter> {
        self.iterate(None, None, None, None, Yield::Values)
    }

    /// `(key, value)` pairs in key order (an iterator, like `scan`).
    fn items(&self) -> PyResult<ScanIter> {
        self.iterate(None, None, None, None, Yield::Pairs)
    }

    /// `iter(store)`, `for k in store`, `list(store)`: the keys in ascending order.
    fn __iter__(&self) -> PyResult<ScanIter> {
        self.keys()
    }

    /// `len(store)`: the number of pairs, counted by a full scan (O(n)); a call like any other
    /// (`close()` from another thread waits for it; it is not an open scan iterator).
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        // Not a scan iterator of the caller's: a call, which close() waits for, not counted.
        let mut it = self.iterate_as(None, None, None, None, Yield::Count, false)?;
        let mut n = 0;
        while it.fetch(py)? {
            n += it.buffered();
            it.drop_buffer();
        }
        it.release();
        Ok(n)
    }

    /// Applies `batch` (a `WriteBatch`) to a bytes store all or nothing, durable when it
    /// returns; False when one of its `require_absent` keys was present (nothing written).
    fn write(&self, py: Python<'_>, batch: &Bound<'_, PyWriteBatch>) -> PyResult<bool> {
        let s = self.bytes()?;
        let b = batch.borrow().batch.clone();
        let outcome = py.allow_threads(|| s.write_batch(&b)).map_err(ix)?;
        Ok(outcome.applied)
    }

    /// A `WriteBatch` bound to this store: `with s.write_batch() as b: b.put(k, v)` applies it
    /// when the block ends without an exception (and drops it when one was raised).
    fn write_batch(slf: &Bound<'_, Self>) -> PyWriteBatch {
        PyWriteBatch { batch: WriteBatch::new(), store: Some(slf.clone().unbind()) }
    }

    /// Space and engine counters: {'engine', 'kind', 'nodes', 'pm_bytes', 'pm_bytes_per_node',
    /// 'dram_bytes', 'counters': {...}}.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (kind, st) = match self.kind()? {
            Kind::Int(s) => ("int", s.stats()),
            Kind::Bytes(s) => ("bytes", s.stats()),
        };
        let d = PyDict::new(py);
        d.set_item("engine", &self.engine)?;
        d.set_item("kind", kind)?;
        d.set_item("nodes", self.nodes)?;
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
        let k = self.kind()?;
        let r = py.allow_threads(|| match &k {
            Kind::Int(s) => s.fsck(),
            Kind::Bytes(s) => s.fsck(),
        });
        Ok(r.map_err(to_py)?.entries)
    }

    /// Places the calling thread on the store's NUMA node `node` (`0..nodes`, else
    /// InvalidArgument) for placement and accounting; `pin=True` also restricts the thread to
    /// the node's CPUs. The node is the thread's, for every store.
    #[pyo3(signature = (node, pin = false))]
    fn set_thread_node(&self, node: &Bound<'_, PyAny>, pin: bool) -> PyResult<()> {
        self.kind()?;
        let node = int_arg(node, "node")?;
        if node >= self.nodes {
            return Err(exc(
                Exc::Invalid,
                format!("node {node} is out of range: the store has {} node(s)", self.nodes),
            ));
        }
        if pin {
            let topology = topology_for(self.nodes)?;
            let cpus = topology.node(node).map(|n| n.cpus.clone()).unwrap_or_default();
            numakv_numa::pin_current_thread_to(&cpus).map_err(|e| exc(Exc::Base, e.to_string()))?;
        }
        numakv_numa::set_current_node(node);
        Ok(())
    }

    /// Closes the store cleanly (the next open needs no recovery). Idempotent. Waits for calls
    /// other threads are making on it to return; raises `Busy` while scan iterators are open,
    /// `Forked` in a fork child.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if is_forked(self.generation) {
            return Err(forked_err(self.pid, "store"));
        }
        let Some(kind) = self.take()? else { return Ok(()) };
        py.allow_threads(|| close_kind(kind)).map_err(to_py)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Closes the store; when the block raised, a failure to close does not replace that
    /// exception (the store is then closed when collected).
    #[pyo3(signature = (t = None, _v = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        t: Option<PyObject>,
        _v: Option<PyObject>,
        _tb: Option<PyObject>,
    ) -> PyResult<bool> {
        match self.close(py) {
            Ok(()) => Ok(false),
            Err(_) if t.is_some() => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { "closed" } else { self.kind_name };
        format!("<numakv.Store {} {state}>", self.engine)
    }
}

impl Drop for PyStore {
    fn drop(&mut self) {
        if is_forked(self.generation) {
            // The parent's store, in a fork child: closing (or dropping) it would act on the
            // parent's files and join threads the child does not have. Leak it.
            if let Ok(mut open) = self.open.lock() {
                std::mem::forget(open.take());
            }
            return;
        }
        let Ok(mut open) = self.open.lock() else { return };
        let Some(o) = open.take() else { return };
        drop(open);
        Python::with_gil(|py| {
            let msg = CString::new(format!(
                "numakv store ({}) was not closed: closing it now; use a with block or close()",
                self.engine
            ))
            .unwrap_or_default();
            let warned = PyErr::warn(
                py,
                py.get_type::<pyo3::exceptions::PyResourceWarning>().as_any(),
                &msg,
                1,
            );
            if let Err(e) = warned {
                // A warning turned into an error (-W error): report it, the store is closed anyway.
                e.write_unraisable(py, None);
            }
            // Open iterators hold the store too: the last of them closes it then. Otherwise
            // close now (waiting only for calls in flight on other threads).
            let Some(kind) = self.iters.adopt(o.kind) else { return };
            if let Err(e) = py.allow_threads(|| close_kind(kind)) {
                to_py(e).write_unraisable(py, None);
            }
        });
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
    fn lookup(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<PyObject>> {
        match key_of(key)? {
            Key::Int(k) => {
                let s = self.int()?;
                let v = py.allow_threads(|| s.get(k)).map_err(ix)?;
                Ok(match v {
                    Some(v) => Some(v.into_pyobject(py)?.into_any().unbind()),
                    None => None,
                })
            }
            Key::Bytes(k) => {
                let s = self.bytes()?;
                let v = py.allow_threads(|| s.get(&k)).map_err(ix)?;
                Ok(v.map(|v| PyBytes::new(py, &v).into_any().unbind()))
            }
        }
    }

    fn write_op(
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
                        return Err(exc(Exc::WrongKind, "an integer store holds int values"))
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
                        return Err(exc(
                            Exc::WrongKind,
                            "a bytes store holds bytes-like or str values",
                        ))
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

    fn iterate(
        &self,
        start: Option<&Bound<'_, PyAny>>,
        end: Option<&Bound<'_, PyAny>>,
        limit: Option<usize>,
        prefix: Option<&Bound<'_, PyAny>>,
        yields: Yield,
    ) -> PyResult<ScanIter> {
        self.iterate_as(start, end, limit, prefix, yields, true)
    }

    /// As [`iterate`](Self::iterate); `counted` false for an iterator that lives only inside
    /// one call (`len`), which `close()` waits for like any call instead of refusing.
    fn iterate_as(
        &self,
        start: Option<&Bound<'_, PyAny>>,
        end: Option<&Bound<'_, PyAny>>,
        limit: Option<usize>,
        prefix: Option<&Bound<'_, PyAny>>,
        yields: Yield,
        counted: bool,
    ) -> PyResult<ScanIter> {
        let left = limit.unwrap_or(usize::MAX);
        let kind = if counted { self.kind_counted()? } else { self.kind()? };
        // Counted from here: `it` gives the count back if building the scan fails.
        let mut it = ScanIter {
            state: None,
            counted,
            left,
            yields,
            iters: Arc::clone(&self.iters),
            generation: self.generation,
            pid: self.pid,
        };
        let state = match kind {
            Kind::Int(s) => {
                let int_arg = |o: Option<&Bound<'_, PyAny>>, default: u64| -> PyResult<u64> {
                    match o.map(key_of).transpose()? {
                        None => Ok(default),
                        Some(Key::Int(k)) => Ok(k),
                        Some(Key::Bytes(_)) => {
                            Err(exc(Exc::WrongKind, "an integer store scans over ints"))
                        }
                    }
                };
                if prefix.is_some() {
                    return Err(exc(Exc::Invalid, "prefix is for bytes stores; use start and end"));
                }
                let from = int_arg(start, 1)?.max(1);
                let end = int_arg(end, u64::MAX)?;
                ScanState::Int {
                    store: s,
                    next: (from < end).then_some(from),
                    end,
                    buf: Vec::new(),
                }
            }
            Kind::Bytes(s) => {
                let bytes_arg = |o: Option<&Bound<'_, PyAny>>| -> PyResult<Option<Vec<u8>>> {
                    match o.map(key_of).transpose()? {
                        None => Ok(None),
                        Some(Key::Bytes(b)) => Ok(Some(b)),
                        Some(Key::Int(_)) => {
                            Err(exc(Exc::WrongKind, "a bytes store scans over bytes or str"))
                        }
                    }
                };
                let (start, end) = match bytes_arg(prefix)? {
                    Some(p) => {
                        if start.is_some() || end.is_some() {
                            return Err(exc(Exc::Invalid, "give prefix, or start/end, not both"));
                        }
                        let end = p.iter().rposition(|&b| b != 0xff).map(|last| {
                            let mut e = p[..=last].to_vec();
                            e[last] += 1;
                            e
                        });
                        (p, end)
                    }
                    None => (bytes_arg(start)?.unwrap_or_default(), bytes_arg(end)?),
                };
                ScanState::Bytes { store: s, next: Some(start), end, buf: Vec::new() }
            }
        };
        it.state = Some(state);
        Ok(it)
    }
}

// --- write batches -------------------------------------------------------------------------

/// Puts, deletes and absent-key preconditions for a bytes store, applied all or nothing by
/// `Store.write(batch)` (or at the end of `with store.write_batch() as batch:`).
#[pyclass(module = "numakv._native", name = "WriteBatch")]
struct PyWriteBatch {
    batch: WriteBatch,
    store: Option<Py<PyStore>>,
}

fn batch_key(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u8>> {
    match key_of(obj)? {
        Key::Bytes(b) => Ok(b),
        Key::Int(_) => {
            Err(exc(Exc::WrongKind, format!("a write batch takes bytes-like or str {what}s")))
        }
    }
}

#[pymethods]
impl PyWriteBatch {
    #[new]
    fn new() -> PyWriteBatch {
        PyWriteBatch { batch: WriteBatch::new(), store: None }
    }

    /// Adds a put of `key → value`.
    fn put(&mut self, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let (k, v) = (batch_key(key, "key")?, batch_key(value, "value")?);
        self.batch.put(&k, &v);
        Ok(())
    }

    /// Adds a delete of `key` (absent: nothing to do).
    fn delete(&mut self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let k = batch_key(key, "key")?;
        self.batch.delete(&k);
        Ok(())
    }

    /// The batch applies only if `key` is absent when it runs.
    fn require_absent(&mut self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let k = batch_key(key, "key")?;
        self.batch.require_absent(&k);
        Ok(())
    }

    /// Forgets every operation and precondition.
    fn clear(&mut self) {
        self.batch.clear();
    }

    /// The number of puts and deletes.
    fn __len__(&self) -> usize {
        self.batch.len()
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Applies the batch to its store when the block ended without an exception.
    #[pyo3(signature = (t = None, _v = None, _tb = None))]
    fn __exit__(
        slf: &Bound<'_, Self>,
        t: Option<PyObject>,
        _v: Option<PyObject>,
        _tb: Option<PyObject>,
    ) -> PyResult<bool> {
        if t.is_some() {
            return Ok(false);
        }
        let store = slf.borrow().store.as_ref().map(|s| s.clone_ref(slf.py()));
        let Some(store) = store else {
            return Err(exc(Exc::Invalid, "this batch has no store: use store.write(batch)"));
        };
        store.get().write(slf.py(), slf)?;
        Ok(false)
    }
}

// --- scans -----------------------------------------------------------------------------------

/// Pairs an iterator fetches at a time.
const BATCH: usize = 256;

enum ScanState {
    Int {
        store: Arc<Store>,
        next: Option<u64>,
        /// Exclusive; u64::MAX (a reserved key) means no bound.
        end: u64,
        buf: Vec<(u64, u64)>,
    },
    Bytes {
        store: Arc<BytesStore>,
        next: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
        buf: Vec<(Vec<u8>, Vec<u8>)>,
    },
}

#[derive(Clone, Copy)]
enum Yield {
    Pairs,
    Keys,
    Values,
    Count,
}

/// An ascending scan; yields `(key, value)` tuples (or keys, or values). `close()` it, use it
/// in a `with` block, or exhaust it: an open iterator keeps its store from closing.
#[pyclass(module = "numakv._native")]
struct ScanIter {
    state: Option<ScanState>,
    /// Whether this iterator still counts in its store's `iters`.
    counted: bool,
    left: usize,
    yields: Yield,
    iters: Arc<Iters>,
    generation: u64,
    pid: u32,
}

impl ScanIter {
    /// Gives the store back (once): the iterator is closed.
    fn release(&mut self) {
        let forked = is_forked(self.generation);
        if let Some(state) = self.state.take() {
            if forked {
                std::mem::forget(state); // the parent's store: never dropped in a child
            }
        }
        if std::mem::take(&mut self.counted) {
            if let Some(kind) = self.iters.release() {
                // The last iterator of a collected `Store`: close it as its drop would have.
                if forked {
                    std::mem::forget(kind);
                } else if let Err(e) = close_kind(kind) {
                    Python::with_gil(|py| to_py(e).write_unraisable(py, None));
                }
            }
        }
    }

    fn buffered(&self) -> usize {
        match &self.state {
            Some(ScanState::Int { buf, .. }) => buf.len(),
            Some(ScanState::Bytes { buf, .. }) => buf.len(),
            None => 0,
        }
    }

    fn drop_buffer(&mut self) {
        match &mut self.state {
            Some(ScanState::Int { buf, .. }) => buf.clear(),
            Some(ScanState::Bytes { buf, .. }) => buf.clear(),
            None => {}
        }
    }

    /// Refills an empty buffer (reversed, popped from the back); whether it holds pairs.
    fn fetch(&mut self, py: Python<'_>) -> PyResult<bool> {
        if is_forked(self.generation) {
            return Err(forked_err(self.pid, "scan iterator"));
        }
        match &mut self.state {
            None => Ok(false),
            Some(ScanState::Int { store, next, end, buf }) => {
                if buf.is_empty() {
                    let Some(from) = next.take() else { return Ok(false) };
                    let s = Arc::clone(store);
                    let mut got = Vec::with_capacity(BATCH);
                    py.allow_threads(|| s.scan(from, BATCH, &mut got)).map_err(ix)?;
                    if got.len() == BATCH {
                        *next = got[BATCH - 1].0.checked_add(1).filter(|n| n < end);
                    }
                    let bound = *end;
                    got.retain(|&(k, _)| k < bound);
                    got.reverse();
                    *buf = got;
                }
                Ok(!buf.is_empty())
            }
            Some(ScanState::Bytes { store, next, end, buf }) => {
                if buf.is_empty() {
                    let Some(from) = next.take() else { return Ok(false) };
                    let s = Arc::clone(store);
                    let end = end.clone();
                    let mut got = py
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
                    got.reverse();
                    *buf = got;
                }
                Ok(!buf.is_empty())
            }
        }
    }
}

impl Drop for ScanIter {
    fn drop(&mut self) {
        self.release();
    }
}

#[pymethods]
impl ScanIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<PyObject>> {
        if self.left == 0 || !self.fetch(py)? {
            self.release();
            return Ok(None);
        }
        let item = match &mut self.state {
            Some(ScanState::Int { buf, .. }) => {
                let Some((k, v)) = buf.pop() else { return Ok(None) };
                match self.yields {
                    Yield::Keys => k.into_pyobject(py)?.into_any().unbind(),
                    Yield::Values => v.into_pyobject(py)?.into_any().unbind(),
                    Yield::Pairs | Yield::Count => (k, v).into_pyobject(py)?.into_any().unbind(),
                }
            }
            Some(ScanState::Bytes { buf, .. }) => {
                let Some((k, v)) = buf.pop() else { return Ok(None) };
                match self.yields {
                    Yield::Keys => PyBytes::new(py, &k).into_any().unbind(),
                    Yield::Values => PyBytes::new(py, &v).into_any().unbind(),
                    Yield::Pairs | Yield::Count => (PyBytes::new(py, &k), PyBytes::new(py, &v))
                        .into_pyobject(py)?
                        .into_any()
                        .unbind(),
                }
            }
            None => return Ok(None),
        };
        self.left -= 1;
        Ok(Some(item))
    }

    /// Ends the scan and lets the store close; idempotent.
    fn close(&mut self) {
        self.release();
    }

    /// Whether the scan is closed (by `close()`, a `with` block, or exhaustion).
    #[getter]
    fn closed(&self) -> bool {
        self.state.is_none()
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (_t = None, _v = None, _tb = None))]
    fn __exit__(
        &mut self,
        _t: Option<PyObject>,
        _v: Option<PyObject>,
        _tb: Option<PyObject>,
    ) -> bool {
        self.release();
        false
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyStore>()?;
    m.add_class::<ScanIter>()?;
    m.add_class::<PyWriteBatch>()?;
    let e = exceptions(py)?;
    m.add("NumakvError", e.base.bind(py))?;
    m.add("InvalidArgument", e.invalid.bind(py))?;
    m.add("TooLarge", e.too_large.bind(py))?;
    m.add("OutOfSpace", e.out_of_space.bind(py))?;
    m.add("Corrupted", e.corrupted.bind(py))?;
    m.add("StoreIoError", e.io.bind(py))?;
    m.add("WrongKind", e.wrong_kind.bind(py))?;
    m.add("Closed", e.closed.bind(py))?;
    m.add("Busy", e.busy.bind(py))?;
    m.add("Forked", e.forked.bind(py))?;
    m.add("ENGINES", EngineKind::all().iter().map(|k| k.to_string()).collect::<Vec<_>>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
