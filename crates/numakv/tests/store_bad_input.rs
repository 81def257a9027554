//! The facade's own failure modes: no store, a store of an unknown engine, damaged headers,
//! reserved keys, a second create, a crash (drop without close), options for the wrong store.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use numakv::{EngineKind, Error, Options, PoolError, Store};
use numakv_pmem::{node_path, EngineId, Pool, PoolConfig};

const CAP: u64 = 16 << 20;

fn opts() -> Options {
    Options::default().capacity_per_node(CAP)
}

#[test]
fn missing_directory_and_empty_directory_are_no_store() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let err = Store::open(&missing).unwrap_err();
    assert!(matches!(err, Error::NoStore { .. }), "{err:?}");
    assert!(err.to_string().contains("directory not found"), "{err}");
    let err = Store::open(dir.path()).unwrap_err();
    assert!(matches!(err, Error::NoStore { .. }), "{err:?}");
    assert!(err.to_string().contains("node0.pm"), "{err}");
    assert!(!err.is_corruption());
}

#[test]
fn a_store_of_an_unknown_engine_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let pool =
        Pool::create(dir.path(), PoolConfig::new(EngineId::new("btree9000", 1), CAP)).unwrap();
    pool.close().unwrap();
    drop(pool);
    let err = Store::open(dir.path()).unwrap_err();
    match &err {
        Error::UnknownStoredEngine { name, .. } => assert_eq!(name, "btree9000"),
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("fastfair"), "names the known engines: {err}");
    assert!(matches!(Store::engine_of(dir.path()), Err(Error::UnknownStoredEngine { .. })));
}

#[test]
fn another_engine_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let kind = EngineKind::FastFair;
    let id = EngineId::new(kind.name(), kind.format_version() + 1);
    let pool = Pool::create(dir.path(), PoolConfig::new(id, CAP)).unwrap();
    pool.close().unwrap();
    drop(pool);
    let err = Store::open(dir.path()).unwrap_err();
    assert!(matches!(err.pool_error(), Some(PoolError::EngineMismatch { .. })), "{err:?}");
}

#[test]
fn damaged_headers_are_corruption_errors() {
    let dir = tempfile::tempdir().unwrap();
    Store::create(dir.path(), EngineKind::FastFair, opts()).unwrap().close().unwrap();
    let path = node_path(dir.path(), 0);
    let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
    // Flip a byte of the node count: inside the checksummed part.
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, 36).unwrap();
    f.write_all_at(&[b[0] ^ 0xff], 36).unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert!(matches!(err.pool_error(), Some(PoolError::ChecksumMismatch { .. })), "{err:?}");
    assert!(err.is_corruption());

    f.write_all_at(b"garbage!", 0).unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert!(matches!(err.pool_error(), Some(PoolError::BadMagic { .. })), "{err:?}");
    assert!(err.is_corruption());
}

#[test]
fn a_truncated_node_file_is_a_corruption_error() {
    let dir = tempfile::tempdir().unwrap();
    Store::create(dir.path(), EngineKind::FastFair, opts()).unwrap().close().unwrap();
    let f = OpenOptions::new().write(true).open(node_path(dir.path(), 0)).unwrap();
    f.set_len(CAP / 2).unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert!(matches!(err.pool_error(), Some(PoolError::Truncated { .. })), "{err:?}");
    assert!(err.is_corruption());
}

#[test]
fn create_refuses_an_existing_store_and_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path(), EngineKind::FastFair, opts()).unwrap();
    store.upsert(1, 2).unwrap();
    store.close().unwrap();
    let err = Store::create(dir.path(), EngineKind::FastFair, opts()).unwrap_err();
    assert!(matches!(err.pool_error(), Some(PoolError::AlreadyExists { .. })), "{err:?}");
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.get(1).unwrap(), Some(2));
    store.close().unwrap();
}

#[test]
fn reserved_keys_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path(), EngineKind::FastFair, opts()).unwrap();
    for key in [0, u64::MAX] {
        let err = store.insert(key, 1).unwrap_err();
        assert!(matches!(err, numakv_index::Error::InvalidKey(k) if k == key), "{err:?}");
        assert!(store.get(key).is_err());
        assert!(store.remove(key).is_err());
    }
    assert!(store.insert(numakv::MAX_KEY, u64::MAX).unwrap());
    assert_eq!(store.get(numakv::MAX_KEY).unwrap(), Some(u64::MAX));
    store.close().unwrap();
}

#[test]
fn drop_without_close_is_recovered_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path(), EngineKind::FastFair, opts()).unwrap();
    assert!(store.recovery().is_none());
    for k in 1..=50 {
        store.insert(k, k).unwrap();
    }
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    let report = store.recovery().unwrap();
    assert!(!report.was_clean);
    assert!(!store.inspect().unwrap().was_clean);
    assert_eq!(store.fsck().unwrap().entries, 50);
    store.close().unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert!(store.recovery().unwrap().was_clean);
    store.close().unwrap();
}

#[test]
fn inspect_reports_shape_and_space_per_node() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(
        dir.path(),
        EngineKind::FastFair,
        opts().nodes(2).mode(numakv::PersistMode::Eadr),
    )
    .unwrap();
    for k in 1..=1000 {
        store.insert(k, k).unwrap();
    }
    let info = store.inspect().unwrap();
    assert_eq!(info.engine, EngineKind::FastFair);
    assert_eq!(info.nodes, 2);
    assert_eq!(info.mode, numakv::PersistMode::Eadr);
    assert_eq!(info.capacity_per_node, CAP);
    assert_eq!(info.space.len(), 2);
    assert_eq!(info.uuid.len(), 32);
    let used: u64 = info.space.iter().map(|s| s.used_bytes).sum();
    assert!(used > 0, "1000 entries use some PM");
    for s in &info.space {
        assert!(s.used_pages <= s.heap_pages);
        assert_eq!(s.used_bytes, s.used_pages * info.page_size);
        assert!(s.engine_bytes <= s.used_bytes, "{s:?}");
    }
    assert_eq!(store.header().node_count, 2);
    store.close().unwrap();
}

#[test]
fn engine_options_that_cannot_work_leave_no_store_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = EngineKind::FastFair.default_options();
    engine.set("node_size", "8").unwrap();
    let err = Store::create(dir.path(), EngineKind::FastFair, opts().engine(engine)).unwrap_err();
    assert!(matches!(err, Error::Index(numakv_index::Error::InvalidOptions(_))), "{err:?}");
    assert!(!node_path(dir.path(), 0).exists(), "a failed create leaves no node file");
    // The directory is usable for a good create afterwards.
    Store::create(dir.path(), EngineKind::FastFair, opts()).unwrap().close().unwrap();

    // A directory the failed create made is removed again.
    let fresh = dir.path().join("fresh");
    let mut engine = EngineKind::FastFair.default_options();
    engine.set("node_size", "100").unwrap();
    assert!(Store::create(&fresh, EngineKind::FastFair, opts().engine(engine)).is_err());
    assert!(!fresh.exists());
}
