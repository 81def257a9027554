//! Encoding replies: RESP2 frames written with `redis_protocol`'s encoder into the connection's
//! output buffer (borrowed frames: a GET's value is encoded straight from the read buffer).
//!
//! After `HELLO 3` a connection speaks RESP3, which differs from RESP2 only where our replies
//! use it: the null is `_` (not `$-1`), and maps (HELLO, CONFIG GET) are `%` frames (not flat
//! arrays). Everything else — simple strings, errors, integers, bulk strings, arrays — is
//! encoded the same in both.

use bytes::BytesMut;
use redis_protocol::resp2::encode::extend_encode_borrowed;
use redis_protocol::resp2::types::BorrowedFrame;

/// A connection's pending replies.
#[derive(Debug, Default)]
pub struct Out {
    /// Encoded bytes not yet written to the socket.
    pub buf: BytesMut,
    /// The connection switched to RESP3 (`HELLO 3`).
    pub resp3: bool,
}

impl Out {
    /// Appends one frame.
    pub fn frame(&mut self, f: &BorrowedFrame<'_>) {
        // Encoding into a BytesMut sizes the buffer first and cannot run out of room; if the
        // encoder ever refused a frame, the client still gets a well-formed reply.
        if extend_encode_borrowed(&mut self.buf, f, false).is_err() {
            self.buf.extend_from_slice(b"-ERR reply encoding failed\r\n");
        }
    }

    /// `+OK`: every SET's reply, copied as is (through the encoder it cost 1.5% of a SET
    /// benchmark's server CPU, measured with perf).
    pub fn ok(&mut self) {
        self.buf.extend_from_slice(b"+OK\r\n");
    }

    /// A simple string.
    pub fn simple(&mut self, s: &str) {
        self.frame(&BorrowedFrame::SimpleString(s.as_bytes()));
    }

    /// An error; `msg` starts with its code (`ERR ...`). CR/LF in it would break the frame, so
    /// they become spaces.
    pub fn err(&mut self, msg: &str) {
        if msg.contains(['\r', '\n']) {
            let clean = msg.replace(['\r', '\n'], " ");
            self.frame(&BorrowedFrame::Error(&clean));
        } else {
            self.frame(&BorrowedFrame::Error(msg));
        }
    }

    /// An integer.
    pub fn int(&mut self, n: i64) {
        self.frame(&BorrowedFrame::Integer(n));
    }

    /// A bulk string.
    pub fn bulk(&mut self, b: &[u8]) {
        self.frame(&BorrowedFrame::BulkString(b));
    }

    /// The null: RESP2's null bulk string `$-1`, RESP3's `_` (copied as is, like [`Out::ok`]).
    pub fn null(&mut self) {
        self.buf.extend_from_slice(if self.resp3 { b"_\r\n" } else { b"$-1\r\n" });
    }

    /// The null array (EXEC aborted by WATCH): RESP2's `*-1`, RESP3's `_`.
    pub fn null_array(&mut self) {
        self.buf.extend_from_slice(if self.resp3 { b"_\r\n" } else { b"*-1\r\n" });
    }

    /// The header of a map of `pairs` entries: RESP3's `%`, or in RESP2 an array of twice as
    /// many elements (key, value, ...); the caller appends the keys and values.
    pub fn map_header(&mut self, pairs: usize) {
        let (tag, n) = if self.resp3 { ('%', pairs) } else { ('*', 2 * pairs) };
        self.buf.extend_from_slice(format!("{tag}{n}\r\n").as_bytes());
    }

    /// An array of bulk strings.
    pub fn bulks<B: AsRef<[u8]>>(&mut self, items: &[B]) {
        let frames: Vec<BorrowedFrame<'_>> =
            items.iter().map(|b| BorrowedFrame::BulkString(b.as_ref())).collect();
        self.frame(&BorrowedFrame::Array(&frames));
    }

    /// An array of bulk strings or nulls (each null as [`Out::null`] writes it).
    pub fn opt_bulks(&mut self, items: &[Option<Vec<u8>>]) {
        self.buf.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
        for b in items {
            match b {
                Some(b) => self.bulk(b),
                None => self.null(),
            }
        }
    }
}
