//! Reading requests: RESP2 multibulk arrays of bulk strings (what every client sends) and inline
//! commands (what `nc`/telnet users type), with limits checked on the declared lengths, before any
//! buffer is grown for them.
//!
//! The request side is hand-written rather than `redis_protocol::resp2::decode`: that decoder
//! accepts any frame type at any depth and recurses once per nested array with no bound, so a
//! single request of `*1\r\n` repeated (4 bytes per level) grows the worker's stack until the
//! whole server process dies; it also re-parses from the start of the buffer on every read and
//! learns a bulk length only by waiting for the bulk. A request is a flat array of bulk strings,
//! and a scanner of that grammar checks every length as soon as its header line is complete.
//! Replies are encoded with `redis_protocol` ([`crate::reply`]).

use bytes::BytesMut;

/// Limits on one request.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest bulk string (argument) in bytes.
    pub max_bulk: usize,
    /// Most arguments in one request.
    pub max_args: usize,
    /// Largest whole request in bytes (the sum of its declared lengths and headers).
    pub max_request: usize,
    /// Longest inline command or header line.
    pub max_inline: usize,
}

/// A request that cannot be read: the connection gets `-ERR Protocol error: <message>` and is
/// closed (as Redis does), other connections are not affected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

fn perr(msg: impl Into<String>) -> ProtocolError {
    ProtocolError(msg.into())
}

/// The position of the `\r\n` ending the line that starts at `from`, if it has arrived.
fn line_end(buf: &[u8], from: usize) -> Option<usize> {
    memchr_crlf(&buf[from..]).map(|i| from + i)
}

fn memchr_crlf(s: &[u8]) -> Option<usize> {
    s.windows(2).position(|w| w == b"\r\n")
}

/// Parses a decimal length like Redis's `string2ll` (optional '-', digits, no spaces).
fn parse_len(s: &[u8]) -> Option<i64> {
    std::str::from_utf8(s).ok()?.parse::<i64>().ok()
}

/// One complete request at the front of the input buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// A multibulk request of `len` bytes; its arguments are the spans the parser left in its
    /// `spans` argument (offsets into the buffer). The caller runs it straight from the buffer,
    /// then drops the `len` bytes ([`bytes::Buf::advance`]): no copy, allocation or reference
    /// count per argument.
    Spans {
        /// Bytes the request takes in the buffer.
        len: usize,
    },
    /// An inline command of `len` bytes; its arguments are unquoted copies.
    Inline {
        /// Bytes the line takes in the buffer.
        len: usize,
        /// The arguments (empty for a blank line).
        args: Vec<Vec<u8>>,
    },
}

/// Finds the complete request at the front of `buf` without consuming it: `Ok(Some(..))`,
/// `Ok(None)` when more bytes are needed (the buffer may have been grown to hold a declared
/// bulk), or the protocol error that ends the connection. For [`Request::Spans`], `spans`
/// holds the argument spans (it is cleared first; empty for `*0`).
pub fn parse(
    buf: &mut BytesMut,
    lim: &Limits,
    spans: &mut Vec<(usize, usize)>,
) -> Result<Option<Request>, ProtocolError> {
    spans.clear();
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] != b'*' {
        return parse_inline(buf, lim);
    }
    let Some(eol) = line_end(buf, 1) else {
        if buf.len() > lim.max_inline {
            return Err(perr("too big mbulk count string"));
        }
        return Ok(None);
    };
    let count = match parse_len(&buf[1..eol]) {
        Some(n) if n <= lim.max_args as i64 => n,
        _ => return Err(perr("invalid multibulk length")),
    };
    if count <= 0 {
        return Ok(Some(Request::Spans { len: eol + 2 }));
    }
    // Check every header and find where the request ends, without copying.
    let mut pos = eol + 2;
    for _ in 0..count {
        if pos >= buf.len() {
            return Ok(None);
        }
        if buf[pos] != b'$' {
            let got = buf[pos] as char;
            return Err(perr(format!("expected '$', got '{}'", got.escape_default())));
        }
        let Some(eol) = line_end(buf, pos + 1) else {
            if buf.len() - pos > lim.max_inline {
                return Err(perr("too big bulk count string"));
            }
            return Ok(None);
        };
        let len = match parse_len(&buf[pos + 1..eol]) {
            Some(n) if n >= 0 && n as u64 <= lim.max_bulk as u64 => n as usize,
            _ => return Err(perr("invalid bulk length")),
        };
        let start = eol + 2;
        let end = start + len;
        if end + 2 > lim.max_request {
            return Err(perr(format!("request larger than {} bytes", lim.max_request)));
        }
        if end + 2 > buf.len() {
            // The bulk has not all arrived: make room for it once (bounded by max_request).
            buf.reserve(end + 2 - buf.len());
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(perr("bulk string not terminated by CRLF"));
        }
        spans.push((start, end));
        pos = end + 2;
    }
    Ok(Some(Request::Spans { len: pos }))
}

/// An inline command: one line, arguments separated by blanks. Double and single quotes group
/// words, with `\"`-style escapes inside double quotes (a subset of Redis's `sdssplitargs`).
fn parse_inline(buf: &BytesMut, lim: &Limits) -> Result<Option<Request>, ProtocolError> {
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > lim.max_inline {
            return Err(perr("too big inline request"));
        }
        return Ok(None);
    };
    if nl > lim.max_inline {
        return Err(perr("too big inline request"));
    }
    let mut line = &buf[..nl];
    if line.last() == Some(&b'\r') {
        line = &line[..line.len() - 1];
    }
    match split_args(line) {
        Some(args) => Ok(Some(Request::Inline { len: nl + 1, args })),
        None => Err(perr("unbalanced quotes in request")),
    }
}

fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut args = Vec::new();
    let mut i = 0;
    while i < line.len() {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == line.len() {
            break;
        }
        let mut cur = Vec::new();
        match line[i] {
            q @ (b'"' | b'\'') => {
                i += 1;
                loop {
                    let c = *line.get(i)?;
                    i += 1;
                    if c == q {
                        break;
                    }
                    if c == b'\\' && q == b'"' {
                        let e = *line.get(i)?;
                        i += 1;
                        cur.push(match e {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'0' => 0,
                            other => other,
                        });
                    } else {
                        cur.push(c);
                    }
                }
                // A closing quote must be followed by a blank or the end, as in Redis.
                if i < line.len() && !line[i].is_ascii_whitespace() {
                    return None;
                }
            }
            _ => {
                while i < line.len() && !line[i].is_ascii_whitespace() {
                    cur.push(line[i]);
                    i += 1;
                }
            }
        }
        args.push(cur);
    }
    Some(args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Buf;

    const LIM: Limits = Limits { max_bulk: 16, max_args: 4, max_request: 64, max_inline: 32 };

    /// Takes the next request off `b` as owned arguments (what the server runs).
    fn take(b: &mut BytesMut) -> Result<Option<Vec<Vec<u8>>>, ProtocolError> {
        let mut spans = Vec::new();
        Ok(match parse(b, &LIM, &mut spans)? {
            None => None,
            Some(Request::Spans { len }) => {
                let args = spans.iter().map(|&(s, e)| b[s..e].to_vec()).collect();
                b.advance(len);
                Some(args)
            }
            Some(Request::Inline { len, args }) => {
                b.advance(len);
                Some(args)
            }
        })
    }

    fn p(s: &[u8]) -> Result<Option<Vec<Vec<u8>>>, ProtocolError> {
        take(&mut BytesMut::from(s))
    }

    #[test]
    fn multibulk_and_pipelined() {
        let mut b = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n"[..]);
        assert_eq!(take(&mut b).unwrap().unwrap(), vec![&b"GET"[..], b"k"]);
        assert_eq!(take(&mut b).unwrap().unwrap(), vec![&b"PING"[..]]);
        assert!(b.is_empty());
        assert_eq!(take(&mut b).unwrap(), None);
    }

    #[test]
    fn incomplete_at_every_cut() {
        let full = b"*2\r\n$3\r\nSET\r\n$0\r\n\r\n";
        for cut in 0..full.len() {
            let mut b = BytesMut::from(&full[..cut]);
            assert_eq!(take(&mut b).unwrap(), None, "cut {cut}");
            assert_eq!(b.len(), cut, "nothing consumed at cut {cut}");
        }
        assert_eq!(p(full).unwrap().unwrap(), vec![&b"SET"[..], &b""[..]]);
    }

    #[test]
    fn limits_checked_on_the_header() {
        // The bulk's bytes never arrive: the declared length alone is refused.
        let e = p(b"*1\r\n$17\r\n").unwrap_err();
        assert_eq!(e.to_string(), "Protocol error: invalid bulk length");
        assert_eq!(p(b"*1\r\n$99999999999999999999\r\n").unwrap_err().0, "invalid bulk length");
        assert_eq!(p(b"*5\r\n").unwrap_err().0, "invalid multibulk length");
        assert_eq!(p(b"*x\r\n").unwrap_err().0, "invalid multibulk length");
        assert_eq!(p(b"*1\r\n$-1\r\n").unwrap_err().0, "invalid bulk length");
        assert!(p(b"*4\r\n$16\r\n0123456789abcdef\r\n$16\r\n0123456789abcdef\r\n$16\r\n")
            .unwrap_err()
            .0
            .starts_with("request larger than"));
        assert_eq!(p(b"*1\r\n:1\r\n").unwrap_err().0, "expected '$', got ':'");
        assert_eq!(p(b"*1\r\n*1\r\n").unwrap_err().0, "expected '$', got '*'");
        assert_eq!(p(b"*1\r\n$1\r\nab\r\n").unwrap_err().0, "bulk string not terminated by CRLF");
        assert_eq!(p(&[b'*'; 40]).unwrap_err().0, "too big mbulk count string");
    }

    #[test]
    fn inline() {
        assert_eq!(p(b"PING\r\n").unwrap().unwrap(), vec![&b"PING"[..]]);
        assert_eq!(p(b"set k \"a b\\n\"\n").unwrap().unwrap(), vec![&b"set"[..], b"k", b"a b\n"]);
        assert_eq!(p(b"  \r\n").unwrap().unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(p(b"get 'x\r\n").unwrap_err().0, "unbalanced quotes in request");
        assert_eq!(p(b"PING").unwrap(), None);
        assert_eq!(p(&[b'a'; 40]).unwrap_err().0, "too big inline request");
    }
}
