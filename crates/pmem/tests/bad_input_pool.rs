//! Bad input: real node files corrupted on disk, bad configurations, bad pointers and
//! exhausted heaps. Every failure must be the documented `PoolError` variant, never a panic, and
//! an intact store must still open afterwards.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use numakv_pmem::heap::{HEAD_TAG, OWNER_ENGINE};
use numakv_pmem::layout::{self, CHECKSUMMED_LEN, CHECKSUM_OFF, CLEAN_OFF, DESCRIPTORS_OFF};
use numakv_pmem::{
    node_path, EngineId, OpenConfig, PPtr, PmU64, Pool, PoolConfig, PoolError, LOCK_FILE,
    ROOT_SLOTS,
};

const CAP: u64 = 2 << 20;
const PAGE: u64 = 64 << 10;
/// Marker written into root slot 1 and into the first allocated page of every test store.
const MARK: u64 = 0x0bad_1d0e_5eed_0001;

fn engine() -> EngineId {
    EngineId::new("badinput", 3)
}

fn cfg(nodes: usize) -> PoolConfig {
    let mut c = PoolConfig::new(engine(), CAP);
    c.nodes = nodes;
    c.page_size = PAGE;
    c
}

fn open(dir: &Path) -> Result<Arc<Pool>, PoolError> {
    Pool::open(dir, OpenConfig::new(engine()))
}

/// Creates a closed store with `nodes` nodes: root slot 0 points at a one-page extent on the last
/// node holding `MARK`, root slot 1 holds `MARK`.
fn make_store(dir: &Path, nodes: usize) {
    let pool = Pool::create(dir, cfg(nodes)).expect("create");
    let page = pool.alloc_pages(nodes - 1, 1, OWNER_ENGINE, 7).expect("alloc");
    let w: &PmU64 = pool.get(page).expect("get");
    w.store(MARK, Ordering::Release);
    pool.persist_obj(w);
    pool.root(0).unwrap().store(page.raw(), Ordering::Release);
    pool.root(1).unwrap().store(MARK, Ordering::Release);
    pool.persist_obj(pool.root(0).unwrap());
    pool.persist_obj(pool.root(1).unwrap());
    pool.close().expect("close");
}

/// Opens `dir` and checks the marker of `make_store` is intact, then closes it again.
fn assert_intact(dir: &Path) {
    let pool = open(dir).expect("an intact store must open");
    assert!(pool.was_clean());
    assert_eq!(pool.root(1).unwrap().load(Ordering::Acquire), MARK);
    let page = PPtr::from_raw(pool.root(0).unwrap().load(Ordering::Acquire));
    assert_eq!(pool.get::<PmU64>(page).unwrap().load(Ordering::Acquire), MARK);
    for n in 0..pool.nodes() {
        pool.check_heap(n).expect("heap fsck");
    }
    pool.close().unwrap();
}

fn read_at(path: &Path, off: u64, len: usize) -> Vec<u8> {
    let f = fs::File::open(path).unwrap();
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, off).unwrap();
    b
}

fn write_at(path: &Path, off: u64, bytes: &[u8]) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, off).unwrap();
    f.sync_all().unwrap();
}

/// Writes `bytes` at `off` of `path`, runs `check` on the result of opening `dir`, restores the
/// original bytes and checks the store opens intact again.
fn corrupt_and_restore(
    dir: &Path,
    path: &Path,
    off: u64,
    bytes: &[u8],
    check: impl FnOnce(Result<Arc<Pool>, PoolError>),
) {
    let orig = read_at(path, off, bytes.len());
    write_at(path, off, bytes);
    check(open(dir));
    write_at(path, off, &orig);
    assert_intact(dir);
}

fn set_len(path: &Path, len: u64) {
    OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

#[test]
fn bad_magic() {
    let d = tempfile::tempdir().unwrap();
    make_store(d.path(), 2);
    for node in 0..2 {
        let p = node_path(d.path(), node);
        corrupt_and_restore(d.path(), &p, 0, b"NOTAPOOL", |r| {
            assert!(matches!(r, Err(PoolError::BadMagic { ref path }) if *path == p), "{r:?}");
        });
    }
    // A foreign file shorter than the header is "not ours", not "truncated".
    let p = node_path(d.path(), 0);
    let orig = fs::read(&p).unwrap();
    fs::write(&p, b"#!/bin/sh\necho hello\n").unwrap();
    assert!(matches!(open(d.path()), Err(PoolError::BadMagic { .. })));
    assert!(matches!(Pool::read_header(&p), Err(PoolError::BadMagic { .. })));
    fs::write(&p, &orig).unwrap();
    assert_intact(d.path());
}

#[test]
fn other_format_version() {
    let d = tempfile::tempdir().unwrap();
    make_store(d.path(), 1);
    let p = node_path(d.path(), 0);
    let mut hdr = read_at(&p, 0, CHECKSUM_OFF + 4);
    hdr[8..12].copy_from_slice(&(layout::FORMAT_VERSION + 1).to_le_bytes());
    let crc = crc32fast::hash(&hdr[..CHECKSUMMED_LEN]);
    hdr[CHECKSUM_OFF..CHECKSUM_OFF + 4].copy_from_slice(&crc.to_le_bytes());
    corrupt_and_restore(d.path(), &p, 0, &hdr, |r| {
        assert!(
            matches!(
                r,
                Err(PoolError::FormatVersion { found, expected, .. })
                    if found == layout::FORMAT_VERSION + 1 && expected == layout::FORMAT_VERSION
            ),
            "{r:?}"
        );
    });
    // Without the checksum fix-up the version check still fires first (it precedes the CRC).
    corrupt_and_restore(d.path(), &p, 8, &0u32.to_le_bytes(), |r| {
        assert!(matches!(r, Err(PoolError::FormatVersion { found: 0, .. })), "{r:?}");
    });
}

#[test]
fn engine_mismatch_name_and_version() {
    let d = tempfile::tempdir().unwrap();
    make_store(d.path(), 1);
    for other in [EngineId::new("otherengine", 3), EngineId::new("badinput", 4)] {
        let r = Pool::open(d.path(), OpenConfig::new(other.clone()));
        assert!(
            matches!(
                r,
                Err(PoolError::EngineMismatch {
                    ref expected_name, expected_version, ref found_name, found_version
                }) if *expected_name == other.name && expected_version == other.version
                    && found_name == "badinput" && found_version == 3
            ),
            "{r:?}"
        );
    }
    assert_intact(d.path());
}

#[test]
fn node_files_of_two_stores_mixed() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    make_store(a.path(), 2);
    make_store(b.path(), 2);
    let a1 = node_path(a.path(), 1);
    let saved = fs::read(&a1).unwrap();
    fs::copy(node_path(b.path(), 1), &a1).unwrap();
    let r = open(a.path());
    assert!(matches!(r, Err(PoolError::StoreMismatch { ref path, .. }) if *path == a1), "{r:?}");
    fs::write(&a1, &saved).unwrap();
    assert_intact(a.path());
    assert_intact(b.path());
}

#[test]
fn missing_node_file() {
    let d = tempfile::tempdir().unwrap();
    make_store(d.path(), 3);
    for node in [1, 2, 0] {
        let p = node_path(d.path(), node);
        let moved = d.path().join("moved.pm");
        fs::rename(&p, &moved).unwrap();
        let r = open(d.path());
        assert!(
            matches!(r, Err(PoolError::MissingNodeFile { ref path, .. }) if *path == p),
            "node {node}: {r:?}"
        );
        fs::rename(&moved, &p).unwrap();
        assert_intact(d.path());
    }
    // An empty directory is a missing node 0, a missing directory an I/O error.
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(open(empty.path()), Err(PoolError::MissingNodeFile { .. })));
    assert!(matches!(open(&empty.path().join("nope")), Err(PoolError::Io { .. })));
}

#[test]
fn extra_node_file() {
    let two = tempfile::tempdir().unwrap();
    let one = tempfile::tempdir().unwrap();
    make_store(two.path(), 2);
    make_store(one.path(), 1);
    let extra = node_path(one.path(), 1);
    fs::copy(node_path(two.path(), 1), &extra).unwrap();
    let r = open(one.path());
    assert!(
        matches!(r, Err(PoolError::UnexpectedNodeFile { ref path, nodes: 1 }) if *path == extra),
        "{r:?}"
    );
    fs::remove_file(&extra).unwrap();
    assert_intact(one.path());
}

#[test]
fn extra_node_file_after_a_gap() {
    // node0 + node1 belong to the store; node3.pm is a file the store does not account for.
    let d = tempfile::tempdir().unwrap();
    make_store(d.path(), 2);
    let extra = node_path(d.path(), 3);
    fs::copy(node_path(d.path(), 1), &extra).unwrap();
    let r = open(d.path());
    assert!(
        matches!(r, Err(PoolError::UnexpectedNodeFile { ref path, nodes: 2 }) if *path == extra),
        "an unaccounted node file must be refused: {r:?}"
    );
    drop(r);
    fs::remove_file(&extra).unwrap();
    assert_intact(d.path());
}

#[test]
fn swapped_node_files() {
    let d = tempfile::tempdir().unwrap();
    make_store(d.path(), 2);
    let (p0, p1, tmp) = (node_path(d.path(), 0), node_path(d.path(), 1), d.path().join("t"));
    let swap = || {
        fs::rename(&p0, &tmp).unwrap();
        fs::rename(&p1, &p0).unwrap();
        fs::rename(&tmp, &p1).unwrap();
    };
    swap();
    let r = open(d.path());
    assert!(matches!(r, Err(PoolError::Corrupted { .. })), "{r:?}");
    drop(r);
    swap();
    assert_intact(d.path());
}

/// Node 1's header claims half of node 0's capacity (checksum valid, file sized to match).
/// Every node file of a store has the capacity the store was created with; the heap of every
/// node is laid out from node 0's capacity, so a smaller node file must be refused at open.
#[test]
fn node_file_with_another_capacity() {
    let d = tempfile::tempdir().unwrap();
    make_store(d.path(), 2);
    let p = node_path(d.path(), 1);
    let saved = fs::read(&p).unwrap();
    let mut h = Pool::read_header(&p).unwrap();
    assert_eq!(h.capacity, CAP);
    h.capacity = CAP / 2;
    write_at(&p, 0, &h.encode());
    set_len(&p, CAP / 2);
    assert_eq!(Pool::read_header(&p).unwrap().capacity, CAP / 2, "the header itself is valid");
    let r = open(d.path());
    assert!(
        matches!(r, Err(PoolError::Corrupted { .. })),
        "node 1 maps {} bytes but its heap would be laid out over {CAP}: {:?}",
        CAP / 2,
        r.as_ref().map(|pool| pool.heap_usage(1))
    );
    drop(r);
    fs::write(&p, &saved).unwrap();
    assert_intact(d.path());
}

#[test]
fn truncated_files() {
    let d = tempfile::tempdir().unwrap();
    make_store(d.path(), 2);
    let p = node_path(d.path(), 1);
    let saved = fs::read(&p).unwrap();
    assert_eq!(saved.len() as u64, CAP);
    // Shorter than its capacity.
    for len in [CAP - 1, CAP - PAGE, 2000] {
        set_len(&p, len);
        let r = open(d.path());
        assert!(
            matches!(r, Err(PoolError::Truncated { ref path, expected, found })
                if *path == p && expected == CAP && found == len),
            "len {len}: {r:?}"
        );
    }
    // Shorter than the header's checksummed part, and empty.
    for len in [60, 7, 0] {
        set_len(&p, len);
        let r = open(d.path());
        assert!(matches!(r, Err(PoolError::Truncated { ref path, .. }) if *path == p), "{r:?}");
        assert!(matches!(Pool::read_header(&p), Err(PoolError::Truncated { .. })));
    }
    fs::write(&p, &saved).unwrap();
    assert_intact(d.path());
}

#[test]
fn checksum_mismatch() {
    let d = tempfile::tempdir().unwrap();
    make_store(d.path(), 2);
    for node in 0..2 {
        let p = node_path(d.path(), node);
        // Byte 57 is inside the engine name ("badinput").
        let b = read_at(&p, 57, 1)[0] ^ 0x20;
        corrupt_and_restore(d.path(), &p, 57, &[b], |r| {
            assert!(
                matches!(r, Err(PoolError::ChecksumMismatch { ref path, stored, computed })
                    if *path == p && stored != computed),
                "node {node}: {r:?}"
            );
        });
    }
}

#[test]
fn corrupted_clean_shutdown_word() {
    let d = tempfile::tempdir().unwrap();
    make_store(d.path(), 1);
    let p = node_path(d.path(), 0);
    corrupt_and_restore(d.path(), &p, CLEAN_OFF as u64, &0xdead_beef_u64.to_le_bytes(), |r| {
        assert!(matches!(r, Err(PoolError::Corrupted { .. })), "{r:?}");
    });
}

#[test]
fn corrupted_page_descriptors() {
    let d = tempfile::tempdir().unwrap();
    make_store(d.path(), 2);
    let (pages, _) = layout::geometry(CAP, PAGE).unwrap();
    let desc = |page: u64| DESCRIPTORS_OFF as u64 + 8 * page;
    let head = |len: u64| HEAD_TAG | (u64::from(OWNER_ENGINE) << 8) | (len << 32);
    // make_store allocated page 0 of the last node (node 1); node 0's heap is empty.
    for node in 0..2 {
        let p = node_path(d.path(), node);
        let cases: Vec<(&str, u64, u64)> = vec![
            ("bad tag", desc(5), 0x1234_5600 | 0x5a),
            ("no owner", desc(5), HEAD_TAG | (1 << 32)),
            ("zero length", desc(5), HEAD_TAG | (u64::from(OWNER_ENGINE) << 8)),
            ("overruns the table", desc(pages - 2), head(3)),
            ("huge length", desc(3), head(u64::from(u32::MAX))),
            // An extent over pages 2..6 and a head inside it at page 4.
            ("overlap", desc(4), head(1)),
        ];
        for (what, off, word) in cases {
            let extra = (what == "overlap").then(|| (desc(2), head(4)));
            let saved_extra = extra.map(|(o, _)| read_at(&p, o, 8));
            if let Some((o, w)) = extra {
                write_at(&p, o, &w.to_le_bytes());
            }
            corrupt_and_restore(d.path(), &p, off, &word.to_le_bytes(), |r| {
                assert!(matches!(r, Err(PoolError::Corrupted { .. })), "node {node} {what}: {r:?}");
            });
            if let (Some((o, _)), Some(s)) = (extra, saved_extra) {
                write_at(&p, o, &s);
                assert_intact(d.path());
            }
        }
    }
}

#[test]
fn opening_twice_is_locked() {
    let d = tempfile::tempdir().unwrap();
    make_store(d.path(), 1);
    let first = open(d.path()).unwrap();
    let r = open(d.path());
    assert!(
        matches!(r, Err(PoolError::Locked { ref path }) if *path == d.path().join(LOCK_FILE)),
        "{r:?}"
    );
    // create over an open store is refused too, without touching it.
    assert!(matches!(Pool::create(d.path(), cfg(1)), Err(PoolError::Locked { .. })));
    assert_eq!(first.root(1).unwrap().load(Ordering::Acquire), MARK);
    first.close().unwrap();
    drop(first);
    assert_intact(d.path());
}

#[test]
fn create_over_existing_store() {
    let d = tempfile::tempdir().unwrap();
    make_store(d.path(), 2);
    for nodes in [1, 2, 3] {
        let r = Pool::create(d.path(), cfg(nodes));
        assert!(
            matches!(r, Err(PoolError::AlreadyExists { ref path }) if *path == d.path()),
            "{r:?}"
        );
    }
    assert_intact(d.path());
}

#[test]
fn invalid_configs() {
    let d = tempfile::tempdir().unwrap();
    let mut bad = Vec::new();
    let mut c = cfg(1);
    c.nodes = 0;
    bad.push(("0 nodes", c));
    let mut c = cfg(1);
    c.nodes = 257;
    bad.push(("257 nodes", c));
    for ps in [0, 3000, 4095, (64 << 10) + 4096, 2048] {
        let mut c = cfg(1);
        c.page_size = ps;
        bad.push(("page size", c));
    }
    for cap in [0, 4096, 4096 + PAGE, PAGE] {
        let mut c = cfg(1);
        c.capacity_per_node = cap;
        bad.push(("capacity too small", c));
    }
    let mut c = cfg(1);
    c.capacity_per_node = u64::MAX;
    bad.push(("capacity too large", c));
    for name in ["", "a-name-that-is-much-longer-than-32-bytes", "nul\0inside"] {
        let mut c = cfg(1);
        c.engine = EngineId::new(name, 1);
        bad.push(("engine name", c));
    }
    for (i, (what, c)) in bad.into_iter().enumerate() {
        let sub = d.path().join(format!("s{i}"));
        let r = Pool::create(&sub, c.clone());
        assert!(matches!(r, Err(PoolError::InvalidArgument(_))), "create {what}: {r:?}");
        assert!(!node_path(&sub, 0).exists(), "{what}: a refused create left a node file");
        let r = Pool::volatile(c);
        assert!(matches!(r, Err(PoolError::InvalidArgument(_))), "volatile {what}: {r:?}");
    }
    // The smallest valid geometry works.
    let mut c = cfg(1);
    c.capacity_per_node = 2 * PAGE;
    let pool = Pool::volatile(c).unwrap();
    assert_eq!(pool.heap_usage(0).unwrap(), (0, 1));
}

#[test]
fn bad_pointers_and_root_slots() {
    let pool = Pool::volatile(cfg(2)).unwrap();
    let page = pool.alloc_pages(1, 1, OWNER_ENGINE, 0).unwrap();
    let (_, data_off) = layout::geometry(CAP, PAGE).unwrap();
    assert_eq!(page.offset(), data_off);
    let bad = |p: Option<PPtr>| {
        let p = p.unwrap();
        let r = pool.get::<PmU64>(p);
        assert!(matches!(r, Err(PoolError::BadPointer { .. })), "{p}: {r:?}");
    };
    bad(Some(PPtr::NULL));
    bad(PPtr::new(0, 8)); // header
    bad(PPtr::new(1, layout::ROOTS_OFF as u64)); // header of node 1
    bad(PPtr::new(0, DESCRIPTORS_OFF as u64 + 16)); // descriptor table
    bad(PPtr::new(0, data_off - 8));
    bad(PPtr::new(0, CAP)); // one past the end
    bad(PPtr::new(0, CAP - 4)); // straddles the end
    bad(PPtr::new(1, 1 << 50)); // far out of range
    bad(PPtr::new(2, data_off)); // node out of range
    bad(PPtr::new(255, data_off));
    bad(page.add(1)); // misaligned
    bad(page.add(4));
    assert!(matches!(pool.bytes(PPtr::NULL, 1), Err(PoolError::BadPointer { .. })));
    assert!(matches!(pool.bytes(page, usize::MAX), Err(PoolError::BadPointer { .. })));
    assert!(matches!(pool.bytes(page, CAP as usize), Err(PoolError::BadPointer { .. })));
    // The good ones around the bad ones.
    assert!(pool.get::<PmU64>(page).is_ok());
    assert!(pool.get::<PmU64>(PPtr::new(0, CAP - 8).unwrap()).is_ok());
    assert_eq!(pool.bytes(page, 3).unwrap().len(), 3);

    for slot in [ROOT_SLOTS, ROOT_SLOTS + 1, usize::MAX] {
        assert!(matches!(pool.root(slot), Err(PoolError::InvalidArgument(_))));
    }
    assert!(pool.root(ROOT_SLOTS - 1).is_ok());

    // Freeing what is not an extent head is refused and changes nothing.
    for p in [PPtr::NULL, page.add(8).unwrap(), page.add(PAGE).unwrap()] {
        assert!(matches!(pool.free_pages(p), Err(PoolError::BadPointer { .. })), "{p}");
    }
    assert!(matches!(
        pool.free_pages(PPtr::new(9, data_off).unwrap()),
        Err(PoolError::InvalidArgument(_) | PoolError::BadPointer { .. })
    ));
    assert_eq!(pool.heap_usage(1).unwrap().0, 1);
    pool.free_pages(page).unwrap();
    assert!(matches!(pool.free_pages(page), Err(PoolError::BadPointer { .. })), "double free");
    assert_eq!(pool.heap_usage(1).unwrap().0, 0);
    pool.check_heap(1).unwrap();

    // Bad allocation arguments.
    for (node, pages, owner) in [(0, 0, OWNER_ENGINE), (0, 1, 0), (2, 1, OWNER_ENGINE)] {
        let r = pool.alloc_pages(node, pages, owner, 0);
        assert!(matches!(r, Err(PoolError::InvalidArgument(_))), "{node} {pages} {owner}: {r:?}");
    }
    assert!(matches!(
        pool.alloc_pages(0, 1 << 32, OWNER_ENGINE, 0),
        Err(PoolError::InvalidArgument(_))
    ));
}

#[test]
fn out_of_space_leaves_the_pool_usable() {
    let d = tempfile::tempdir().unwrap();
    let pool = Pool::create(d.path(), cfg(1)).unwrap();
    let (_, total) = pool.heap_usage(0).unwrap();
    assert_eq!(total, layout::geometry(CAP, PAGE).unwrap().0);
    let r = pool.alloc_pages(0, total + 1, OWNER_ENGINE, 0);
    assert!(
        matches!(r, Err(PoolError::OutOfSpace { node: 0, requested }) if requested == (total + 1) * PAGE),
        "{r:?}"
    );
    let r = pool.alloc_pages(0, u64::from(u32::MAX), OWNER_ENGINE, 0);
    assert!(matches!(r, Err(PoolError::OutOfSpace { .. })), "{r:?}");
    // Fill the heap one page at a time, tagging each page with its index.
    let mut pages = Vec::new();
    for i in 0..total {
        let p = pool.alloc_pages(0, 1, OWNER_ENGINE, i as u16).unwrap();
        let w: &PmU64 = pool.get(p).unwrap();
        w.store(i, Ordering::Release);
        pool.persist_obj(w);
        pages.push(p);
    }
    let r = pool.alloc_pages(0, 1, OWNER_ENGINE, 0);
    assert!(matches!(r, Err(PoolError::OutOfSpace { node: 0, .. })), "{r:?}");
    assert_eq!(pool.heap_usage(0).unwrap(), (total, total));
    pool.check_heap(0).unwrap();
    // Free every other page: plenty of free pages, but no two contiguous.
    for p in pages.iter().step_by(2) {
        pool.free_pages(*p).unwrap();
    }
    let free = total.div_ceil(2);
    assert_eq!(pool.heap_usage(0).unwrap().0, total - free);
    let r = pool.alloc_pages(0, 2, OWNER_ENGINE, 0);
    assert!(matches!(r, Err(PoolError::OutOfSpace { .. })), "fragmented heap: {r:?}");
    pool.check_heap(0).unwrap();
    // Single pages still fit, lowest address first.
    let again = pool.alloc_pages(0, 1, OWNER_ENGINE, 999).unwrap();
    assert_eq!(again, pages[0]);
    let w: &PmU64 = pool.get(again).unwrap();
    w.store(0xfeed, Ordering::Release);
    pool.persist_obj(w);
    pool.check_heap(0).unwrap();
    pool.close().unwrap();
    drop(pool);

    let pool = open(d.path()).unwrap();
    assert!(pool.was_clean());
    pool.check_heap(0).unwrap();
    assert_eq!(pool.heap_usage(0).unwrap().0, total - free + 1);
    assert_eq!(pool.get::<PmU64>(again).unwrap().load(Ordering::Acquire), 0xfeed);
    for (i, p) in pages.iter().enumerate().skip(1).step_by(2) {
        assert_eq!(pool.get::<PmU64>(*p).unwrap().load(Ordering::Acquire), i as u64);
    }
    let ext = pool.extents(0).unwrap();
    assert_eq!(ext.len() as u64, total - free + 1);
    assert!(ext.iter().any(|e| e.ptr == again && e.aux == 999 && e.pages == 1));
    pool.close().unwrap();
}
