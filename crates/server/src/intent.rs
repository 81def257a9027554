//! MSET's intent log: what makes an MSET of several keys all-or-nothing across a crash.
//!
//! The bytes store makes each put atomic and durable, but an MSET is several puts, and a crash
//! between two of them would leave a prefix. So before its first put an MSET writes all its
//! pairs as one record to an intent file in the store directory and makes it durable
//! (`fdatasync`); then it puts the pairs; then it clears the record (durably, again) — all while
//! it holds its keys' stripes exclusively, and before its reply. When the server next opens
//! the store ([`Log::open`], before it accepts a connection), a record still valid in a file is
//! an MSET that may have stopped part-way: its puts are done again, in order, and the record
//! cleared. Replaying is sound because nothing else wrote those keys after the MSET began: it
//! held their stripes until the record was cleared, and a write acknowledged after that cannot
//! be overwritten by a replay, because there is no record left to replay.
//!
//! A record the crash tore (a power loss mid-write) fails its checksum and is dropped: its
//! MSET had not put anything yet (the puts start only after the record is durable).
//!
//! **Durability.** `fdatasync` of an ordinary file is durable against power loss on any file
//! system, DAX or not — at least what the store's own writes get in every row of the README's
//! durability table (on `/dev/shm` it costs nothing and survives a process crash, as the store
//! does). A new intent file is followed by an `fsync` of the directory, so its name is durable
//! before a record in it is relied on.
//!
//! **Files.** `serve-mset.<N>`, one per MSET that was ever in flight at once (a worker runs one
//! command at a time, so about one per worker thread), reused: a record is written at offset
//! 0 over whatever the previous one left; it is cleared by zeroing its magic.
//!
//! **Record** (little-endian): `magic: [u8; 8] = "NKVMSET1"`, `len: u64` (payload bytes),
//! `crc: u32` (CRC-32 of `len` and the payload), `pad: u32`, then the payload: `pairs: u32`,
//! then per key and per value `len: u32` and the bytes.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use numakv::ByteMap;
use parking_lot::Mutex;

/// Prefix of the intent files' names in the store directory.
pub const FILE_PREFIX: &str = "serve-mset.";
const MAGIC: [u8; 8] = *b"NKVMSET1";
const HEADER: usize = 24;

/// One intent file.
#[derive(Debug)]
pub struct Slot {
    file: File,
    path: PathBuf,
}

/// The intent files of a store directory, the free ones ready for the next MSET.
#[derive(Debug)]
pub struct Log {
    dir: PathBuf,
    free: Mutex<Vec<Slot>>,
    next: Mutex<u64>,
}

/// Why an intent could not be written or cleared.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Nothing is recorded: the MSET did not happen and the log is usable.
    #[error("MSET intent log: {0}")]
    Failed(io::Error),
    /// The log may still hold a record that a later open would replay, over any write of its
    /// keys acknowledged after now: the server must stop before acknowledging one.
    #[error("MSET intent log: {0}; the server stops (a record it could not clear would be replayed over later writes)")]
    Fatal(io::Error),
}

/// What [`Log::open`] replayed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// MSETs whose record was valid: their pairs were put again.
    pub msets: usize,
    /// Pairs put.
    pub pairs: usize,
    /// Records dropped as torn (checksum or length wrong).
    pub torn: usize,
}

fn encode(pairs: &[&[u8]]) -> Vec<u8> {
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

impl Log {
    /// Opens the intent files in `dir`, replays every valid record into `map` (then clears
    /// it) and keeps the files for reuse. Runs before the server accepts connections.
    pub fn open(dir: &Path, map: &dyn ByteMap) -> io::Result<(Log, Replayed)> {
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
        let next = found.last().map_or(0, |(n, _)| n + 1);
        let mut replayed = Replayed::default();
        let mut free = Vec::new();
        for (_, path) in found {
            let file = OpenOptions::new().read(true).write(true).open(&path)?;
            let bytes = std::fs::read(&path)?;
            match decode(&bytes) {
                Ok(None) => {}
                Ok(Some(pairs)) => {
                    for (k, v) in &pairs {
                        map.put(k, v).map_err(|e| {
                            io::Error::other(format!(
                                "replaying the MSET recorded in {}: {e}",
                                path.display()
                            ))
                        })?;
                    }
                    replayed.msets += 1;
                    replayed.pairs += pairs.len();
                }
                Err(Torn) => replayed.torn += 1,
            }
            let slot = Slot { file, path };
            // PERSIST: the replayed puts are durable (each put is, on return) before the
            // record that would replay them again is cleared.
            clear(&slot)?;
            free.push(slot);
        }
        Ok((
            Log { dir: dir.to_path_buf(), free: Mutex::new(free), next: Mutex::new(next) },
            replayed,
        ))
    }

    /// Makes the intent of an MSET of `pairs` (key, value, key, value, ...) durable; the MSET
    /// may start its puts when this returns, and must [`end`](Self::end) before its reply.
    pub fn begin(&self, pairs: &[&[u8]]) -> Result<Slot, LogError> {
        let slot = match self.free.lock().pop() {
            Some(s) => s,
            None => self.new_slot().map_err(LogError::Failed)?,
        };
        let rec = encode(pairs);
        // PERSIST: the whole record (checksummed) is durable before the first put: a crash
        // from here on replays all of the MSET, a tear before here is dropped whole.
        match slot.file.write_all_at(&rec, 0).and_then(|()| slot.file.sync_data()) {
            Ok(()) => Ok(slot),
            // The record may have reached the file: clear it, or a later open would apply an
            // MSET that was refused (over writes acknowledged after it).
            Err(e) => match clear(&slot) {
                Ok(()) => {
                    self.free.lock().push(slot);
                    Err(LogError::Failed(e))
                }
                Err(_) => Err(LogError::Fatal(e)),
            },
        }
    }

    /// Clears the MSET's record durably (its puts are all durable) and returns the file to the
    /// pool. An error is [`LogError::Fatal`]: the record may still be there.
    pub fn end(&self, slot: Slot) -> Result<(), LogError> {
        clear(&slot).map_err(LogError::Fatal)?;
        self.free.lock().push(slot);
        Ok(())
    }

    fn new_slot(&self) -> io::Result<Slot> {
        let mut next = self.next.lock();
        let path = self.dir.join(format!("{FILE_PREFIX}{}", *next));
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        *next += 1;
        // PERSIST: the new name is durable before a record in the file is relied on.
        File::open(&self.dir)?.sync_all()?;
        Ok(Slot { file, path })
    }
}

fn clear(slot: &Slot) -> io::Result<()> {
    // PERSIST: the zeroed magic (one 8-byte write at offset 0, within one sector) is durable
    // before the caller replies or serves.
    slot.file.write_all_at(&[0; 8], 0)?;
    slot.file
        .sync_data()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", slot.path.display())))
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
