//! The MSET intent files of earlier versions (`serve-mset.N`): read once, then removed.
//!
//! Earlier versions made an MSET all-or-nothing with an intent record in a file of the store
//! directory, replayed by the next `serve`. That replay ran only in `serve` — after any other
//! program had opened the store and written — so it could put an old value back over a later
//! write, and a record of a key the store refuses (1025 bytes, empty) stopped every restart. MSET
//! now goes through the store's own write batch ([`numakv::WriteBatch`]), whose log lives in the
//! pool and is finished by whichever program opens the store next.
//!
//! A store last served by an earlier version may still hold intent files. [`migrate`] runs
//! once when the server starts, before it accepts a connection: a valid record is an MSET the
//! earlier version may have cut short, and is applied as **one batch** (what that version
//! promised: all of its pairs); a record the store refuses (a bad key or value: it could never
//! have been written) or a torn one is dropped; then every intent file is removed (and the
//! directory synced), so nothing is replayed twice. What it did is reported ([`Replayed`]) and
//! printed by `numakv serve`.
//!
//! **Record** (little-endian): `magic: [u8; 8] = "NKVMSET1"`, `len: u64` (payload bytes),
//! `crc: u32` (CRC-32 of `len` and the payload), `pad: u32`, then the payload: `pairs: u32`,
//! then per key and per value `len: u32` and the bytes; a cleared record has its magic zeroed.

use std::fs::File;
use std::io;
use std::path::Path;

use numakv::{ByteMap, WriteBatch};

/// Prefix of the intent files' names in the store directory.
pub const FILE_PREFIX: &str = "serve-mset.";
const MAGIC: [u8; 8] = *b"NKVMSET1";
const HEADER: usize = 24;

/// What [`migrate`] found in the intent files of an earlier version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Valid records: their MSETs were applied (each as one batch).
    pub msets: usize,
    /// Pairs those MSETs put.
    pub pairs: usize,
    /// Records dropped as torn (checksum or length wrong).
    pub torn: usize,
    /// Records dropped because the store refuses one of their arguments (nothing written).
    pub refused: usize,
    /// Intent files removed.
    pub files: usize,
}

/// Applies the valid records of the intent files in `dir` to `map` and removes the files (see
/// the [module docs](self)). An error leaves the files in place (the next start tries again).
pub fn migrate(dir: &Path, map: &dyn ByteMap) -> io::Result<Replayed> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(n) = name.to_str().and_then(|n| n.strip_prefix(FILE_PREFIX)) else {
            continue;
        };
        if let Ok(n) = n.parse::<u64>() {
            found.push((n, entry.path()));
        }
    }
    found.sort();
    let mut replayed = Replayed::default();
    for (_, path) in &found {
        match decode(&std::fs::read(path)?) {
            Ok(None) => {}
            Ok(Some(pairs)) => {
                let mut batch = WriteBatch::new();
                for (k, v) in &pairs {
                    batch.put(k, v);
                }
                if batch.validate().is_err() {
                    replayed.refused += 1;
                    continue;
                }
                map.write_batch(&batch).map_err(|e| {
                    io::Error::other(format!(
                        "applying the MSET recorded in {} by an earlier version: {e}",
                        path.display()
                    ))
                })?;
                replayed.msets += 1;
                replayed.pairs += pairs.len();
            }
            Err(Torn) => replayed.torn += 1,
        }
    }
    // PERSIST: every applied batch is durable (on return) before its record goes.
    for (_, path) in &found {
        std::fs::remove_file(path)?;
        replayed.files += 1;
    }
    if !found.is_empty() {
        // PERSIST: the removals are durable: no later start sees these records again.
        File::open(dir)?.sync_all()?;
    }
    Ok(replayed)
}

/// The record of an MSET of `pairs` (key, value, key, value, ...) as earlier versions wrote it:
/// for tests of [`migrate`].
pub fn encode(pairs: &[&[u8]]) -> Vec<u8> {
    let payload_len = 4 + pairs.iter().map(|a| 4 + a.len()).sum::<usize>();
    let mut buf = Vec::with_capacity(HEADER + payload_len);
    buf.extend_from_slice(&MAGIC);
    buf.extend_from_slice(&(payload_len as u64).to_le_bytes());
    buf.extend_from_slice(&[0; 8]); // crc + pad, filled below
    buf.extend_from_slice(&((pairs.len() / 2) as u32).to_le_bytes());
    for a in pairs {
        buf.extend_from_slice(&(a.len() as u32).to_le_bytes());
        buf.extend_from_slice(a);
    }
    let crc = crc(&buf[8..16], &buf[HEADER..]);
    buf[16..20].copy_from_slice(&crc.to_le_bytes());
    buf
}

fn crc(len: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(len);
    h.update(payload);
    h.finalize()
}

/// An MSET's (key, value) pairs, in its order.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// A record whose checksum or lengths are wrong: torn by a crash while it was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Torn;

/// The pairs of the record at the start of `bytes`: `Ok(None)` for no record (cleared or an
/// empty file), `Err(Torn)` for a torn one.
pub fn decode(bytes: &[u8]) -> Result<Option<Pairs>, Torn> {
    if bytes.len() < HEADER || bytes[..8] != MAGIC {
        return Ok(None);
    }
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
    let len = usize::try_from(word(8)).map_err(|_| Torn)?;
    let payload = bytes.get(HEADER..HEADER.checked_add(len).ok_or(Torn)?).ok_or(Torn)?;
    let stored = u32::from_le_bytes(bytes[16..20].try_into().map_err(|_| Torn)?);
    if crc(&bytes[8..16], payload) != stored {
        return Err(Torn);
    }
    let mut at: usize = 0;
    let mut take = |n: usize| -> Result<&[u8], Torn> {
        let s = payload.get(at..at.checked_add(n).ok_or(Torn)?).ok_or(Torn)?;
        at += n;
        Ok(s)
    };
    let u32_at = |s: &[u8]| u32::from_le_bytes(s.try_into().unwrap_or([0; 4])) as usize;
    let count = u32_at(take(4)?);
    let mut pairs = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let kl = u32_at(take(4)?);
        let k = take(kl)?.to_vec();
        let vl = u32_at(take(4)?);
        let v = take(vl)?.to_vec();
        pairs.push((k, v));
    }
    Ok(Some(pairs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_tears_are_caught() {
        let pairs: [&[u8]; 4] = [b"k1", b"", b"key\x00two", &[0xff; 300]];
        let rec = encode(&pairs);
        let got = decode(&rec).unwrap().unwrap();
        assert_eq!(got, vec![(b"k1".to_vec(), vec![]), (b"key\x00two".to_vec(), vec![0xff; 300])]);
        // Every truncation and every single flipped byte after the magic is caught.
        for cut in HEADER..rec.len() {
            assert_eq!(decode(&rec[..cut]), Err(Torn), "cut {cut}");
        }
        for i in 8..rec.len() {
            let mut bad = rec.clone();
            bad[i] ^= 0x5a;
            if (20..24).contains(&i) {
                continue; // padding
            }
            assert_eq!(decode(&bad), Err(Torn), "byte {i}");
        }
        // A cleared record (magic zeroed) or an empty file is no record; trailing bytes of an
        // older, longer record do not matter.
        let mut cleared = rec.clone();
        cleared[..8].fill(0);
        assert_eq!(decode(&cleared), Ok(None));
        assert_eq!(decode(&[]), Ok(None));
        let mut longer = encode(&pairs[..2]);
        longer.extend_from_slice(&rec);
        assert_eq!(decode(&longer).unwrap().unwrap().len(), 1);
    }
}
