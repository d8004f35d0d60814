//! The msgpack cursor as of 8479738, before the decoder's fast paths: the reference for
//! `decoder_differential.rs`. Kept verbatim apart from imports and its own unit tests.
//!
//! A minimal zero-copy MessagePack cursor over a byte slice.
//!
//! Why not `rmpv::Value`: decoding a batch into a value tree allocates one node per token id
//! (16 per block), which alone would cost most of the ingestion budget (>= 1M blocks/s on one
//! core). This reader walks the bytes in place, hands out borrowed `&str`/`&[u8]`, and never
//! allocates. Every read is bounds-checked and returns a typed error, never panics; `skip`
//! is iterative, so hostile nesting cannot overflow the stack.

use kvroute_kv::vllm::DecodeError;

/// An integer as msgpack carries it: non-negative ints are `U`, negative ones `I`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Int {
    U(u64),
    I(i64),
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn set_pos(&mut self, pos: usize) {
        self.pos = pos.min(self.buf.len());
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn truncated(&self) -> DecodeError {
        DecodeError::Truncated { offset: self.pos }
    }

    pub(crate) fn peek(&self) -> Result<u8, DecodeError> {
        self.buf.get(self.pos).copied().ok_or_else(|| self.truncated())
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        let b = self.peek()?;
        self.pos += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| self.truncated())?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn be(&mut self, n: usize) -> Result<u64, DecodeError> {
        Ok(self.take(n)?.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn unexpected(&self, expected: &'static str, marker: u8) -> DecodeError {
        DecodeError::UnexpectedType { expected, marker, offset: self.pos.saturating_sub(1) }
    }

    /// Consumes a nil and returns true, or leaves the cursor alone and returns false.
    pub(crate) fn nil(&mut self) -> Result<bool, DecodeError> {
        if self.peek()? == 0xc0 {
            self.pos += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// Length of an array header; capped by the bytes left (each element takes >= 1 byte),
    /// so a lying header cannot make callers over-allocate.
    pub(crate) fn array_len(&mut self) -> Result<usize, DecodeError> {
        let m = self.byte()?;
        let n = match m {
            0x90..=0x9f => usize::from(m & 0x0f),
            0xdc => self.be(2)? as usize,
            0xdd => self.be(4)? as usize,
            _ => return Err(self.unexpected("array", m)),
        };
        self.check_count(n)
    }

    pub(crate) fn map_len(&mut self) -> Result<usize, DecodeError> {
        let m = self.byte()?;
        let n = match m {
            0x80..=0x8f => usize::from(m & 0x0f),
            0xde => self.be(2)? as usize,
            0xdf => self.be(4)? as usize,
            _ => return Err(self.unexpected("map", m)),
        };
        self.check_count(n)
    }

    fn check_count(&self, n: usize) -> Result<usize, DecodeError> {
        if n > self.remaining() {
            return Err(self.truncated());
        }
        Ok(n)
    }

    pub(crate) fn str(&mut self) -> Result<&'a str, DecodeError> {
        let m = self.byte()?;
        let n = match m {
            0xa0..=0xbf => usize::from(m & 0x1f),
            0xd9 => self.be(1)? as usize,
            0xda => self.be(2)? as usize,
            0xdb => self.be(4)? as usize,
            _ => return Err(self.unexpected("str", m)),
        };
        let at = self.pos;
        std::str::from_utf8(self.take(n)?).map_err(|_| DecodeError::InvalidUtf8 { offset: at })
    }

    pub(crate) fn bin(&mut self) -> Result<&'a [u8], DecodeError> {
        let m = self.byte()?;
        let n = match m {
            0xc4 => self.be(1)? as usize,
            0xc5 => self.be(2)? as usize,
            0xc6 => self.be(4)? as usize,
            _ => return Err(self.unexpected("bin", m)),
        };
        self.take(n)
    }

    pub(crate) fn int(&mut self) -> Result<Int, DecodeError> {
        let m = self.byte()?;
        Ok(match m {
            0x00..=0x7f => Int::U(u64::from(m)),
            0xe0..=0xff => Int::I(i64::from(m as i8)),
            0xcc => Int::U(self.be(1)?),
            0xcd => Int::U(self.be(2)?),
            0xce => Int::U(self.be(4)?),
            0xcf => Int::U(self.be(8)?),
            0xd0 => signed(self.be(1)? as u8 as i8 as i64),
            0xd1 => signed(self.be(2)? as u16 as i16 as i64),
            0xd2 => signed(self.be(4)? as u32 as i32 as i64),
            0xd3 => signed(self.be(8)? as i64),
            _ => return Err(self.unexpected("int", m)),
        })
    }

    /// A float (f32 or f64) or an integer, as f64.
    pub(crate) fn number(&mut self) -> Result<f64, DecodeError> {
        match self.peek()? {
            0xca => {
                self.pos += 1;
                Ok(f64::from(f32::from_bits(self.be(4)? as u32)))
            }
            0xcb => {
                self.pos += 1;
                Ok(f64::from_bits(self.be(8)?))
            }
            _ => Ok(match self.int()? {
                Int::U(u) => u as f64,
                Int::I(i) => i as f64,
            }),
        }
    }

    /// Skips one complete value of any type, iteratively.
    pub(crate) fn skip(&mut self) -> Result<(), DecodeError> {
        let mut pending: usize = 1;
        while pending > 0 {
            pending -= 1;
            let m = self.byte()?;
            let (data, children) = match m {
                0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
                0x80..=0x8f => (0, 2 * usize::from(m & 0x0f)),
                0x90..=0x9f => (0, usize::from(m & 0x0f)),
                0xa0..=0xbf => (usize::from(m & 0x1f), 0),
                0xc4 | 0xd9 => (self.be(1)? as usize, 0),
                0xc5 | 0xda => (self.be(2)? as usize, 0),
                0xc6 | 0xdb => (self.be(4)? as usize, 0),
                0xc7 => (self.be(1)? as usize + 1, 0),
                0xc8 => (self.be(2)? as usize + 1, 0),
                0xc9 => (self.be(4)? as usize + 1, 0),
                0xca => (4, 0),
                0xcb => (8, 0),
                0xcc | 0xd0 => (1, 0),
                0xcd | 0xd1 => (2, 0),
                0xce | 0xd2 => (4, 0),
                0xcf | 0xd3 => (8, 0),
                0xd4 => (2, 0),
                0xd5 => (3, 0),
                0xd6 => (5, 0),
                0xd7 => (9, 0),
                0xd8 => (17, 0),
                0xdc => (0, self.be(2)? as usize),
                0xdd => (0, self.be(4)? as usize),
                0xde => (0, 2 * self.be(2)? as usize),
                0xdf => (0, 2 * self.be(4)? as usize),
                0xc1 => return Err(DecodeError::InvalidMarker { marker: m, offset: self.pos - 1 }),
            };
            self.take(data)?;
            pending = pending.checked_add(self.check_count(children)?).ok_or_else(|| self.truncated())?;
        }
        Ok(())
    }
}

fn signed(v: i64) -> Int {
    if v >= 0 {
        Int::U(v as u64)
    } else {
        Int::I(v)
    }
}
