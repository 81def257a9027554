//! Byte sizes as people write them: `4096`, `256K`, `512M`, `1G`, `1GiB`, `2T`.
//!
//! Suffixes are binary (K = 1024) whether written `K`, `KB` or `KiB`, case-insensitive, because
//! PM capacities and page sizes are powers of two.
//!
//! ```
//! use numakv::size::{format_bytes, parse_size};
//!
//! assert_eq!(parse_size("512M").unwrap(), 512 << 20);
//! assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
//! assert_eq!(parse_size("4096").unwrap(), 4096);
//! assert!(parse_size("1X").is_err());
//! assert_eq!(format_bytes(3 << 29), "1.5 GiB");
//! ```

/// Parses a byte size: a decimal integer with an optional binary suffix `K`, `M`, `G`, `T`
/// (also written `KB`/`KiB`, any case) or `B`. The error says what is accepted.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit() && c != '_').unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    let bad = || {
        format!("invalid size {s:?}: expected a number of bytes with an optional suffix K, M, G or T (binary: 1K = 1024), e.g. 4096, 256K, 512M, 1G")
    };
    if num.is_empty() {
        return Err(bad());
    }
    let n: u64 = num.replace('_', "").parse().map_err(|_| bad())?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("size {s:?} does not fit in 64 bits"))
}

/// Formats a byte count with a binary unit, one decimal: `512 B`, `1.5 KiB`, `64.0 MiB`.
pub fn format_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert_eq!(parse_size("1KB"), Ok(1024));
        assert_eq!(parse_size(" 64 MiB "), Ok(64 << 20));
        assert_eq!(parse_size("1_000"), Ok(1000));
        assert_eq!(parse_size("2t"), Ok(2 << 40));
        for bad in ["", "G", "-1", "1.5G", "1Q", "0x10"] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_size("16777216T").unwrap_err().contains("64 bits"));
    }

    #[test]
    fn bytes_format() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1024), "1.0 KiB");
        assert_eq!(format_bytes(256 << 10), "256.0 KiB");
        assert_eq!(format_bytes(u64::MAX), "16384.0 PiB");
    }
}
