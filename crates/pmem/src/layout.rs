//! Byte-level layout of a node file (see docs/design.md, "Pool file format").
//!
//! ```text
//! offset   size  field                       notes
//! 0        8     magic  "NUMAKVPM"
//! 8        4     format_version              FORMAT_VERSION
//! 12       4     header_len                  4096
//! 16       16    store_uuid                  random at create; equal in every node file
//! 32       4     node_id                     0..node_count
//! 36       4     node_count
//! 40       8     capacity                    bytes of this file
//! 48       8     page_size                   page-heap page size (power of two)
//! 56       32    engine_name                 UTF-8, NUL padded
//! 88       4     engine_version              the engine's own format version
//! 92       4     persist_mode                1 = ADR, 2 = eADR
//! 96       4     checksum                    CRC-32 (IEEE) of bytes 0..96
//! 100      28    reserved (zero)
//! --- mutable words, each an 8-byte atomic, outside the checksum ---
//! 128      8     clean_shutdown              CLEAN_MAGIC after a clean close, 0 while open
//! 136      8     open_generation             +1 at every open
//! 144      112   reserved (zero)
//! 256      512   root slots                  ROOT_SLOTS × u64 for engines (node 0 only is used)
//! 768      3328  reserved (zero)
//! 4096     8×P   page descriptors            one u64 per heap page (see heap.rs)
//! D        P×S   heap pages                  D = round_up(4096 + 8×P, S), S = page_size
//! ```
//! All integers are little-endian.

use crate::error::{PoolError, Result};
use crate::persist::PersistMode;
use std::path::Path;

/// "NUMAKVPM".
pub const MAGIC: [u8; 8] = *b"NUMAKVPM";
/// On-media format version of the pool file.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of the header block.
pub const HEADER_LEN: usize = 4096;
/// Bytes covered by the checksum.
pub const CHECKSUMMED_LEN: usize = 96;
/// Offset of the checksum.
pub const CHECKSUM_OFF: usize = 96;
/// Offset of the clean-shutdown word.
pub const CLEAN_OFF: usize = 128;
/// Offset of the open-generation word.
pub const GENERATION_OFF: usize = 136;
/// Offset of the first engine root slot.
pub const ROOTS_OFF: usize = 256;
/// Number of engine root slots.
pub const ROOT_SLOTS: usize = 64;
/// Value of the clean-shutdown word after a clean close ("CLEAN" + version 1).
pub const CLEAN_MAGIC: u64 = 0x434c_4541_4e00_0001;
/// Longest engine name, in bytes.
pub const ENGINE_NAME_MAX: usize = 32;
/// Offset of the page-descriptor table.
pub const DESCRIPTORS_OFF: usize = HEADER_LEN;

const _: () = assert!(ROOTS_OFF + ROOT_SLOTS * 8 <= HEADER_LEN);
const _: () = assert!(CHECKSUM_OFF + 4 <= CLEAN_OFF);

/// Identity of the engine that owns a store, checked at open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineId {
    /// Engine name, at most [`ENGINE_NAME_MAX`] bytes of UTF-8 without NUL.
    pub name: String,
    /// The engine's own on-media format version.
    pub version: u32,
}

impl EngineId {
    /// Convenience constructor.
    pub fn new(name: impl Into<String>, version: u32) -> EngineId {
        EngineId { name: name.into(), version }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.name.is_empty() || self.name.len() > ENGINE_NAME_MAX || self.name.contains('\0') {
            return Err(PoolError::InvalidArgument(format!(
                "engine name {:?} must be 1..={ENGINE_NAME_MAX} bytes without NUL",
                self.name
            )));
        }
        Ok(())
    }
}

/// The immutable, checksummed part of a node header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Store identity shared by all node files.
    pub uuid: [u8; 16],
    /// This file's node.
    pub node_id: u32,
    /// Node files in the store.
    pub node_count: u32,
    /// Size of this file in bytes.
    pub capacity: u64,
    /// Page-heap page size.
    pub page_size: u64,
    /// Owning engine.
    pub engine: EngineId,
    /// Persistence mode chosen at create.
    pub mode: PersistMode,
}

impl Header {
    /// Serialises the checksummed part, checksum included (bytes 0..100).
    pub fn encode(&self) -> [u8; CHECKSUM_OFF + 4] {
        let mut b = [0u8; CHECKSUM_OFF + 4];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        b[32..36].copy_from_slice(&self.node_id.to_le_bytes());
        b[36..40].copy_from_slice(&self.node_count.to_le_bytes());
        b[40..48].copy_from_slice(&self.capacity.to_le_bytes());
        b[48..56].copy_from_slice(&self.page_size.to_le_bytes());
        let name = self.engine.name.as_bytes();
        b[56..56 + name.len()].copy_from_slice(name);
        b[88..92].copy_from_slice(&self.engine.version.to_le_bytes());
        b[92..96].copy_from_slice(&self.mode.code().to_le_bytes());
        let crc = crc32fast::hash(&b[..CHECKSUMMED_LEN]);
        b[CHECKSUM_OFF..CHECKSUM_OFF + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and validates the first bytes of a node file. `path` is only used in errors.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Header> {
        let truncated = || PoolError::Truncated {
            path: path.to_path_buf(),
            expected: HEADER_LEN as u64,
            found: bytes.len() as u64,
        };
        if bytes.len() < CHECKSUM_OFF + 4 {
            // Too short to even hold the header: distinguish "not ours" from "cut short".
            if bytes.len() >= 8 && bytes[0..8] != MAGIC {
                return Err(PoolError::BadMagic { path: path.to_path_buf() });
            }
            return Err(truncated());
        }
        if bytes[0..8] != MAGIC {
            return Err(PoolError::BadMagic { path: path.to_path_buf() });
        }
        let u32_at =
            |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        let u64_at = |o: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[o..o + 8]);
            u64::from_le_bytes(w)
        };
        let version = u32_at(8);
        if version != FORMAT_VERSION {
            return Err(PoolError::FormatVersion {
                path: path.to_path_buf(),
                found: version,
                expected: FORMAT_VERSION,
            });
        }
        let stored = u32_at(CHECKSUM_OFF);
        let computed = crc32fast::hash(&bytes[..CHECKSUMMED_LEN]);
        if stored != computed {
            return Err(PoolError::ChecksumMismatch { path: path.to_path_buf(), stored, computed });
        }
        let corrupt = |what: &str| PoolError::corrupted(format!("{}: {what}", path.display()));
        if u32_at(12) as usize != HEADER_LEN {
            return Err(corrupt("header length"));
        }
        let name_bytes = &bytes[56..88];
        let name_len = name_bytes.iter().position(|&c| c == 0).unwrap_or(ENGINE_NAME_MAX);
        let name = std::str::from_utf8(&name_bytes[..name_len])
            .map_err(|_| corrupt("engine name is not UTF-8"))?
            .to_string();
        let mode = PersistMode::from_code(u32_at(92)).ok_or_else(|| corrupt("persistence mode"))?;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&bytes[16..32]);
        let header = Header {
            uuid,
            node_id: u32_at(32),
            node_count: u32_at(36),
            capacity: u64_at(40),
            page_size: u64_at(48),
            engine: EngineId { name, version: u32_at(88) },
            mode,
        };
        if header.node_count == 0 || header.node_id >= header.node_count {
            return Err(corrupt("node id / node count"));
        }
        if !header.page_size.is_power_of_two() || header.page_size < 4096 {
            return Err(corrupt("page size"));
        }
        if geometry(header.capacity, header.page_size).is_none() {
            return Err(corrupt("capacity too small for its page size"));
        }
        Ok(header)
    }

    /// The store UUID as hex, for messages.
    pub fn uuid_string(&self) -> String {
        uuid_hex(&self.uuid)
    }
}

pub(crate) fn uuid_hex(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

/// Heap geometry of a node file: `(page_count, data_offset)`, or `None` when not even one page
/// fits after the header and descriptor table.
pub fn geometry(capacity: u64, page_size: u64) -> Option<(u64, u64)> {
    let ps = page_size;
    let mut pages = capacity.checked_sub(HEADER_LEN as u64)? / (ps + 8);
    loop {
        if pages == 0 {
            return None;
        }
        let data = (HEADER_LEN as u64 + 8 * pages).div_ceil(ps) * ps;
        if data + pages * ps <= capacity {
            return Some((pages, data));
        }
        pages -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            uuid: [7; 16],
            node_id: 1,
            node_count: 2,
            capacity: 8 << 20,
            page_size: 256 << 10,
            engine: EngineId::new("fastfair", 3),
            mode: PersistMode::Eadr,
        }
    }

    #[test]
    fn round_trip() {
        let h = sample();
        let b = h.encode();
        assert_eq!(&b[..8], b"NUMAKVPM");
        assert_eq!(Header::decode(&b, Path::new("x")).unwrap(), h);
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let b = sample().encode();
        for i in 0..b.len() {
            let mut c = b;
            c[i] ^= 0x40;
            assert!(Header::decode(&c, Path::new("x")).is_err(), "flip at byte {i} undetected");
        }
    }

    #[test]
    fn geometry_fits() {
        for cap in [1u64 << 20, 8 << 20, 64 << 20, (1 << 30) + 12345] {
            for ps in [4096u64, 64 << 10, 256 << 10] {
                if let Some((pages, data)) = geometry(cap, ps) {
                    assert!(data >= HEADER_LEN as u64 + 8 * pages);
                    assert_eq!(data % ps, 0);
                    assert!(data + pages * ps <= cap);
                    // Maximal: one more page would not fit.
                    let more = (HEADER_LEN as u64 + 8 * (pages + 1)).div_ceil(ps) * ps;
                    assert!(more + (pages + 1) * ps > cap);
                }
            }
        }
        assert_eq!(geometry(4096, 4096), None);
        assert_eq!(geometry(100, 4096), None);
    }
}
