//! The clean-shutdown snapshot (papers/nstore.txt §III-G): at `close()` the volatile index is
//! copied into PM and a flag set beside it, so that the next open loads it instead of scanning
//! every log file.
//!
//! One page-heap extent on node 0 (aux `AUX_SNAPSHOT`) of little-endian words:
//!
//! ```text
//! word 0      SNAP_MAGIC
//! word 1      clusters
//! word 2      files      (n_f)
//! word 3      pairs      (n_p)
//! word 4      crc32 of words 8.. (the body)
//! word 5      variable-length pairs (n_b)
//! word 6      words of the variable-length pairs (w_b)
//! word 7      0
//! body        versions[clusters]             next version of every cluster
//!             files[n_f] × (node << 32 | id, tail, dead)
//!             pairs[n_p] × (key, v_addr)    ascending keys
//!             bytes pairs[n_b] × (k_len, v_addr, key bytes padded to 8)   (w_b words in all)
//! ```
//!
//! The flag is root slot `SLOT_SNAPSHOT` holding the extent's pointer. It is set only after the
//! whole extent is durable, and open resets it (durably) before the store changes again, so a
//! set flag always describes the log exactly. A crash while writing leaves an extent without the
//! flag, which the next open frees; a snapshot that cannot be allocated (pool full) is skipped
//! and the next open scans.

use std::sync::atomic::Ordering;

use numakv_index::Result;
use numakv_pmem::{PPtr, Pool};

use crate::layout::{
    VAddr, AUX_SNAPSHOT, OWNER_ENGINE, SLOT_SNAPSHOT, SNAP_HEADER_WORDS, SNAP_MAGIC,
};
use crate::Inner;

/// Bytes written per chunk.
const CHUNK_WORDS: usize = 1 << 16;

/// Writes the snapshot and sets the flag. Background threads must be stopped.
pub(crate) fn write(inner: &Inner) -> Result<()> {
    let pool = &inner.pool;
    let mut pairs = Vec::with_capacity(inner.index.len());
    inner.index.scan(1, usize::MAX, &mut pairs);
    let files = inner.nlog.all_files();
    let versions = inner.nlog.version_words();
    let mut body: Vec<u64> = Vec::with_capacity(versions.len() + 3 * files.len());
    body.extend(&versions);
    for f in &files {
        body.push(((f.info.node as u64) << 32) | u64::from(f.info.id));
        body.push(u64::from(f.tail.load(Ordering::Acquire)));
        body.push(u64::from(f.dead.load(Ordering::Acquire)));
    }
    let mut bytes_body: Vec<u64> = Vec::new();
    let bytes_pairs = inner.bindex.pairs();
    for (k, va) in &bytes_pairs {
        bytes_body.push(k.len() as u64);
        bytes_body.push(va.0);
        bytes_body.extend(k.chunks(8).map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        }));
    }
    let words =
        SNAP_HEADER_WORDS + body.len() as u64 + 2 * pairs.len() as u64 + bytes_body.len() as u64;
    let pages = (words * 8).div_ceil(pool.page_size());
    let p = match pool.alloc_pages(0, pages, OWNER_ENGINE, AUX_SNAPSHOT) {
        Ok(p) => p,
        // No room: the next open scans the log instead.
        Err(numakv_pmem::PoolError::OutOfSpace { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let bytes = pool.bytes(p, (words * 8) as usize)?;
    let mut crc = crc32fast::Hasher::new();
    let mut off = (SNAP_HEADER_WORDS * 8) as usize;
    let mut put = |chunk: &[u64], off: &mut usize| {
        let buf: Vec<u8> = chunk.iter().flat_map(|w| w.to_le_bytes()).collect();
        crc.update(&buf);
        // SAFETY: the extent was just allocated by this thread and nothing else refers to it.
        unsafe { bytes.write(*off, &buf) };
        *off += buf.len();
    };
    put(&body, &mut off);
    for chunk in pairs.chunks(CHUNK_WORDS / 2) {
        let flat: Vec<u64> = chunk.iter().flat_map(|&(k, va)| [k, va.0]).collect();
        put(&flat, &mut off);
    }
    put(&bytes_body, &mut off);
    let header = [
        SNAP_MAGIC,
        u64::from(inner.nlog.clusters),
        files.len() as u64,
        pairs.len() as u64,
        u64::from(crc.finalize()),
        bytes_pairs.len() as u64,
        bytes_body.len() as u64,
        0,
    ];
    let buf: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
    // SAFETY: as above.
    unsafe { bytes.write(0, &buf) };
    // PERSIST: the whole snapshot is durable before the flag names it.
    pool.persist(bytes.as_ptr(), bytes.len());
    let flag = pool.root(SLOT_SNAPSHOT)?;
    flag.store(p.raw(), Ordering::Release);
    // PERSIST: the flag is durable before the pool's clean-shutdown flag (set by pool.close()).
    pool.persist_obj(flag);
    Ok(())
}

/// A loaded snapshot.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub versions: Vec<u64>,
    /// `(node, id, tail, dead)`.
    pub files: Vec<(usize, u32, u32, u32)>,
    pub pairs: Vec<(u64, VAddr)>,
    pub bytes_pairs: Vec<(Vec<u8>, VAddr)>,
}

/// Reads and validates the snapshot at `p`; `Err` says why it cannot be used (the caller then
/// scans the log).
pub(crate) fn load(pool: &Pool, p: PPtr, clusters: u32) -> std::result::Result<Snapshot, String> {
    let info = pool.page_info(p).ok_or("snapshot pointer is not in an allocated extent")?;
    if info.extent != p || info.owner != OWNER_ENGINE || info.aux != AUX_SNAPSHOT {
        return Err("snapshot pointer does not name a snapshot extent".into());
    }
    let read_words = |off: u64, n: u64| -> std::result::Result<Vec<u64>, String> {
        let len = usize::try_from(n * 8).map_err(|_| "snapshot too large")?;
        let b = pool.bytes(p.add(off * 8).ok_or("overflow")?, len).map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; len];
        // SAFETY: open runs alone; nothing writes the snapshot extent concurrently.
        if !unsafe { b.read(0, &mut buf) } {
            return Err("snapshot read out of range".into());
        }
        Ok(buf
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect())
    };
    let h = read_words(0, SNAP_HEADER_WORDS)?;
    if h[0] != SNAP_MAGIC || h[1] != u64::from(clusters) {
        return Err("bad snapshot magic or cluster count".into());
    }
    let (nf, np, nb, wb) = (h[2], h[3], h[5], h[6]);
    let body_words = u64::from(clusters)
        .checked_add(nf.checked_mul(3).ok_or("overflow")?)
        .and_then(|x| x.checked_add(np.checked_mul(2)?))
        .and_then(|x| x.checked_add(wb))
        .ok_or("snapshot counts overflow")?;
    // Bound the read by the extent (a corrupted count must not read past it).
    let extent_bytes = pool
        .extents(0)
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|x| x.ptr == p)
        .map(|x| x.pages * pool.page_size())
        .ok_or("snapshot extent vanished")?;
    if (SNAP_HEADER_WORDS + body_words) * 8 > extent_bytes {
        return Err("snapshot counts exceed its extent".into());
    }
    let body = read_words(SNAP_HEADER_WORDS, body_words)?;
    let mut crc = crc32fast::Hasher::new();
    for w in &body {
        crc.update(&w.to_le_bytes());
    }
    if u64::from(crc.finalize()) != h[4] {
        return Err("snapshot checksum mismatch".into());
    }
    let c = clusters as usize;
    let versions = body[..c].to_vec();
    let files = body[c..c + 3 * nf as usize]
        .chunks_exact(3)
        .map(|w| ((w[0] >> 32) as usize, w[0] as u32, w[1] as u32, w[2] as u32))
        .collect();
    let pstart = c + 3 * nf as usize;
    let bstart = pstart + 2 * np as usize;
    let pairs = body[pstart..bstart].chunks_exact(2).map(|w| (w[0], VAddr(w[1]))).collect();
    let mut bytes_pairs = Vec::with_capacity(nb.min(1 << 20) as usize);
    let mut rest = &body[bstart..];
    for _ in 0..nb {
        let [k_len, va, tail @ ..] = rest else { return Err("bytes pairs truncated".into()) };
        let k_len = usize::try_from(*k_len).map_err(|_| "key length out of range")?;
        let kw = k_len.div_ceil(8);
        if k_len == 0 || k_len > crate::layout::MAX_VAR_LEN || tail.len() < kw {
            return Err("bad bytes pair".into());
        }
        let mut key: Vec<u8> = tail[..kw].iter().flat_map(|w| w.to_le_bytes()).collect();
        key.truncate(k_len);
        bytes_pairs.push((key, VAddr(*va)));
        rest = &tail[kw..];
    }
    if !rest.is_empty() {
        return Err("bytes pairs do not fill their words".into());
    }
    Ok(Snapshot { versions, files, pairs, bytes_pairs })
}
