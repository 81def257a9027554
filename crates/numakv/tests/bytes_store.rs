//! BytesStore over every engine: create, the scenario (strings, an empty value, a 1 MiB
//! value, prefix scans, delete, reopen), the limits, and the store-kind check both ways.

use numakv::{BytesStore, EngineKind, Error, IndexError, Options, Store, StoreKind};

fn opts() -> Options {
    // 128 MiB: NStore refuses pools below its minimum (a first file per cluster and node plus
    // the GC reserve, about 97 MiB at the defaults); the node files are sparse.
    Options::default().nodes(2).capacity_per_node(128 << 20)
}

#[test]
fn every_engine_serves_byte_strings() {
    for &kind in EngineKind::all() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("b");
        let s = BytesStore::create(&dir, kind, opts()).unwrap();
        s.put(b"user:1", b"hello").unwrap();
        s.put(b"user:2", b"").unwrap();
        let big: Vec<u8> = (0..1 << 20).map(|i| (i * 7) as u8).collect();
        s.put(b"blob", &big).unwrap();
        s.put(b"zzz", b"after").unwrap();
        let users: Vec<_> = s.scan_prefix(b"user:", 10).map(Result::unwrap).collect();
        assert_eq!(
            users,
            [(b"user:1".to_vec(), b"hello".to_vec()), (b"user:2".to_vec(), Vec::new())],
            "{kind}"
        );
        let from: Vec<_> = s.scan(b"user:", None, 10).map(|r| r.unwrap().0).collect();
        assert_eq!(from, [&b"user:1"[..], b"user:2", b"zzz"], "{kind}");
        assert!(matches!(s.put(b"", b"x"), Err(IndexError::EmptyKey { .. })), "{kind}");
        let e = s.put(b"k", &vec![0; (2 << 20) as usize]).unwrap_err();
        assert!(e.to_string().contains("limit is 1048576 bytes"), "{kind}: {e}");
        assert!(s.delete(b"user:1").unwrap(), "{kind}");
        assert_eq!(s.get(b"user:1").unwrap(), None, "{kind}");
        s.close().unwrap();

        // The header says bytes: the integer API refuses it, clearly.
        match Store::open(&dir) {
            Err(
                e @ Error::StoreKind { found: StoreKind::Bytes, wanted: StoreKind::Integer, .. },
            ) => {
                assert!(e.to_string().contains("bytes"), "{e}")
            }
            other => panic!("{kind}: opened a bytes store as integers: {other:?}"),
        }
        assert_eq!(Store::kind_of(&dir).unwrap(), (kind, StoreKind::Bytes));
        let s = BytesStore::open(&dir).unwrap();
        assert_eq!(s.kind(), kind);
        assert_eq!(s.get(b"blob").unwrap().as_deref(), Some(&big[..]), "{kind}");
        assert_eq!(s.get(b"user:2").unwrap().as_deref(), Some(&b""[..]), "{kind}");
        let r = s.fsck().unwrap();
        assert_eq!(r.entries, 3, "{kind}");
        assert_eq!(r.reachable_blocks, r.allocated_blocks, "{kind}: leak");
        let info = s.inspect().unwrap();
        assert_eq!(info.store_kind, StoreKind::Bytes);
        s.close().unwrap();
    }
}

#[test]
fn an_integer_store_is_not_a_bytes_store() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("i");
    let s = Store::create(&dir, EngineKind::FastFair, opts()).unwrap();
    s.upsert(1, 1).unwrap();
    s.close().unwrap();
    match BytesStore::open(&dir) {
        Err(Error::StoreKind { found: StoreKind::Integer, wanted: StoreKind::Bytes, .. }) => {}
        other => panic!("opened an integer store as bytes: {other:?}"),
    }
    let s = Store::open(&dir).unwrap();
    assert_eq!(s.get(1).unwrap(), Some(1));
    s.close().unwrap();
}
