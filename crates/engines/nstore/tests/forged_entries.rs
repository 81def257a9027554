//! Client bytes never come back as log entries (issue 34, defect 2). A value is stored in a
//! variable-length log file as it is; once GC frees that file and a new file takes its page, the
//! value's bytes lie where the new file's entries go. An entry is valid when its stamp matches
//! its file's id, and ids are predictable, so a value holding entries stamped with the next id
//! was read by recovery as entries of the new file: an acknowledged write replaced, a key that
//! was never written present. New files are zeroed before their header is durable
//! (docs/design.md, "NStore", Nlog files), and `check()` reports a slot beyond a file's tail that
//! is not zero.

use std::collections::BTreeSet;
use std::path::Path;

use numakv_index::{Engine, Index};
use numakv_nstore::layout::{meta_word, var_meta_word, var_size_word, Op, AUX_LOG};
use numakv_nstore::{NStore, NStoreOptions};
use numakv_pmem::{CrashOptions, OpenConfig, PPtr, PersistMode, PmU64, Pool, PoolConfig, SimMode};

/// One node, one cluster, one-page files, no GC threads.
fn opts() -> NStoreOptions {
    NStoreOptions {
        clusters: 1,
        log_file_size: 4096,
        gc_threads_per_node: 0,
        recovery_threads: 1,
        ..Default::default()
    }
}

fn create(dir: &Path, mode: PersistMode) -> NStore {
    let mut cfg = PoolConfig::new(NStore::engine_id(), 512 << 10);
    cfg.page_size = 4096;
    cfg.mode = mode;
    cfg.sim = SimMode::Shadow;
    NStore::create(Pool::create(dir, cfg).unwrap(), &opts()).unwrap()
}

fn crash_and_reopen(s: NStore, dir: &Path) -> NStore {
    let pool = s.pool().clone();
    pool.crash(CrashOptions::STRICT).unwrap();
    drop(s);
    drop(pool);
    let mut oc = OpenConfig::new(NStore::engine_id());
    oc.sim = SimMode::Shadow;
    NStore::open(Pool::open(dir, oc).unwrap(), &opts()).unwrap().0
}

fn log_extents(s: &NStore) -> BTreeSet<u64> {
    let pool = s.pool();
    pool.extents(0).unwrap().iter().filter(|x| x.aux == AUX_LOG).map(|x| x.ptr.raw()).collect()
}

fn files_created(s: &NStore) -> u64 {
    s.stats().counter("files_created").unwrap_or(0)
}

/// The file id in the header of the log extent at `p`.
fn file_id(s: &NStore, p: u64) -> u64 {
    let w: &PmU64 = s.pool().get(PPtr::from_raw(p).add(8).unwrap()).unwrap();
    w.load(std::sync::atomic::Ordering::Acquire)
}

fn words(ws: &[u64]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Byte-key garbage (put then delete) until a new log file was created: the variable-length
/// active file is sealed.
fn seal_var_file(s: &NStore) {
    let n = files_created(s);
    for i in 0u32.. {
        assert!(i < 10_000);
        let g = format!("garbage {i}");
        s.put_bytes(g.as_bytes(), &[0; 100]).unwrap();
        s.delete_bytes(g.as_bytes()).unwrap();
        if files_created(s) > n {
            return;
        }
    }
}

/// Forged fixed-size entries (key 1 → 666 over an acknowledged `upsert(1, 1)`, key 424242 →
/// 777 never written) in a byte value; GC frees its file, a fixed-size file takes the page, a
/// crash: recovery must not read them.
#[test]
fn forged_fixed_entries_in_a_value_never_validate() {
    for mode in [PersistMode::Adr, PersistMode::Eadr] {
        let dir = tempfile::tempdir().unwrap();
        let s = create(dir.path(), mode);
        s.upsert(1, 1).unwrap(); // fixed file F1 (id 1)
        let before = log_extents(&s);
        // The value of the first entry of a variable-length file starts 40 bytes after its
        // header (4 head words, a 1-word key): exactly slot 1 of a fixed file at the same base.
        // Forge slots 1.. for every id the next fixed file may get.
        let next = files_created(&s) + 2; // V now, V's successor, then the fixed file
        let mut forged = Vec::new();
        for id in next..next + 4 {
            let id = id as u32;
            forged.extend(words(&[meta_word(Op::Upd, id), 1 << 40, 0, 1, 666]));
            forged.extend(words(&[meta_word(Op::Ins, id), 1 << 40, 0, 424_242, 777]));
        }
        s.put_bytes(b"f", &forged).unwrap();
        let v: Vec<u64> = log_extents(&s).difference(&before).copied().collect();
        assert_eq!(v.len(), 1, "{mode:?}: the value went to a new variable-length file");
        let v = v[0];
        assert!(s.delete_bytes(b"f").unwrap());
        seal_var_file(&s);
        assert!(s.gc_quiesce(std::time::Duration::from_secs(20)).unwrap());
        assert!(!log_extents(&s).contains(&v), "{mode:?}: GC freed the value's file");
        // Fill F1; the next fixed file takes the freed page.
        let n = files_created(&s);
        let mut k = 1;
        while files_created(&s) == n {
            k += 1;
            s.insert(k, k * 3).unwrap();
        }
        assert!(log_extents(&s).contains(&v), "{mode:?}: the new fixed file reuses the page");
        let id = file_id(&s, v);
        assert!((next..next + 4).contains(&id), "{mode:?}: file id {id} was not forged");
        let s = crash_and_reopen(s, dir.path());
        assert_eq!(s.get(1).unwrap(), Some(1), "{mode:?}: acknowledged upsert(1, 1) replaced");
        assert_eq!(s.get(424_242).unwrap(), None, "{mode:?}: a key never written is present");
        for j in 2..=k {
            assert_eq!(s.get(j).unwrap(), Some(j * 3), "{mode:?}: key {j}");
        }
        let r = s.check().unwrap_or_else(|e| panic!("{mode:?}: check: {e}"));
        assert_eq!(r.entries, k);
    }
}

/// Forged variable-length entries ("victim" → "evil" over an acknowledged "good", "ghost" never
/// written) in a byte value, placed where the next variable-length file's second entry goes.
#[test]
fn forged_variable_length_entries_in_a_value_never_validate() {
    for mode in [PersistMode::Adr, PersistMode::Eadr] {
        let dir = tempfile::tempdir().unwrap();
        let s = create(dir.path(), mode);
        // V (id 1), its successor (id 2), then W (id 3) on V's page.
        let w_id = 3u32;
        let entry = |key: &[u8; 8], klen: usize, value: &[u8; 8], vlen: usize| {
            words(&[
                var_meta_word(Op::Upd, klen, vlen, w_id),
                1 << 40,
                0,
                var_size_word(6, w_id),
                u64::from_le_bytes(*key),
                u64::from_le_bytes(*value),
            ])
        };
        let mut forged = entry(b"victim\0\0", 6, b"evil\0\0\0\0", 4);
        forged.extend(entry(b"ghost\0\0\0", 5, b"boo\0\0\0\0\0", 3));
        // The value starts at word 5 of V: where W's second entry goes when its first one has
        // 5 words (a 1-byte key, an empty value).
        s.put_bytes(b"f", &forged).unwrap();
        assert_eq!(files_created(&s), 1);
        let v = *log_extents(&s).iter().next().unwrap();
        assert!(s.delete_bytes(b"f").unwrap());
        seal_var_file(&s);
        s.put_bytes(b"victim", b"good").unwrap();
        assert!(s.gc_quiesce(std::time::Duration::from_secs(20)).unwrap());
        assert!(!log_extents(&s).contains(&v), "{mode:?}: GC freed the value's file");
        assert_eq!(files_created(&s), 2);
        while files_created(&s) == 2 {
            s.put_bytes(b"x", b"").unwrap();
        }
        assert!(log_extents(&s).contains(&v), "{mode:?}: the new file reuses the page");
        assert_eq!(file_id(&s, v), u64::from(w_id), "{mode:?}: the forged stamp");
        let s = crash_and_reopen(s, dir.path());
        assert_eq!(s.get_bytes(b"victim").unwrap().as_deref(), Some(&b"good"[..]), "{mode:?}");
        assert_eq!(s.get_bytes(b"ghost").unwrap(), None, "{mode:?}: never written");
        assert_eq!(s.get_bytes(b"x").unwrap(), Some(Vec::new()), "{mode:?}");
        let r = s.check().unwrap_or_else(|e| panic!("{mode:?}: check: {e}"));
        assert_eq!(r.entries, 2);
    }
}

/// `check()` reports a forged entry planted beyond the tail of a fixed-size file and of a
/// variable-length file (where recovery would read it): files are zero there.
#[test]
fn check_reports_a_planted_forged_entry() {
    for var in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let s = create(dir.path(), PersistMode::Eadr);
        let before = log_extents(&s);
        if var {
            s.put_bytes(b"a", b"").unwrap(); // 5 words
        } else {
            for k in 1..=10 {
                s.upsert(k, k).unwrap();
            }
        }
        s.check().unwrap();
        let base: Vec<u64> = log_extents(&s).difference(&before).copied().collect();
        let base = PPtr::from_raw(base[0]);
        let id = file_id(&s, base.raw()) as u32;
        let (at, forged) = if var {
            let e = [
                var_meta_word(Op::Ins, 5, 0, id),
                1 << 40,
                0,
                var_size_word(5, id),
                u64::from_le_bytes(*b"ghost\0\0\0"),
            ];
            (64 + 5 * 8, e.to_vec())
        } else {
            (64 + 12 * 40, vec![meta_word(Op::Ins, id), 1 << 40, 0, 424_242, 777])
        };
        for (i, w) in forged.iter().enumerate() {
            let p: &PmU64 = s.pool().get(base.add(at + 8 * i as u64).unwrap()).unwrap();
            p.store(*w, std::sync::atomic::Ordering::Release);
        }
        let e = s.check().expect_err("check() accepted a forged entry beyond a file's tail");
        assert!(e.to_string().contains("beyond its tail"), "var {var}: {e}");
    }
}
