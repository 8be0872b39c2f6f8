//! A bounds-checked little-endian cursor over one block's bytes; errors carry stream offsets.

use crate::error::{ErrorKind, NetTraceError};

/// A cursor over `data`, which starts at stream offset `base`.
#[derive(Debug, Clone)]
pub(crate) struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
    base: u64,
}

pub(crate) type Result<T> = std::result::Result<T, NetTraceError>;

impl<'a> Bytes<'a> {
    pub(crate) fn new(data: &'a [u8], base: u64) -> Bytes<'a> {
        Bytes { data, pos: 0, base }
    }

    /// Stream offset of the next byte.
    pub(crate) fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    pub(crate) fn malformed(&self, msg: impl Into<String>) -> NetTraceError {
        NetTraceError::new(self.offset(), ErrorKind::Malformed(msg.into()))
    }

    fn eof(&self, what: &'static str) -> NetTraceError {
        NetTraceError::new(self.offset(), ErrorKind::UnexpectedEof { what })
    }

    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.eof(what));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub(crate) fn skip(&mut self, n: usize, what: &'static str) -> Result<()> {
        self.take(n, what).map(|_| ())
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn guid(&mut self, what: &'static str) -> Result<[u8; 16]> {
        self.array(what)
    }

    /// A pointer-sized unsigned value (4 or 8 bytes).
    pub(crate) fn pointer(&mut self, size: u8, what: &'static str) -> Result<u64> {
        if size == 4 {
            self.u32(what).map(u64::from)
        } else {
            self.u64(what)
        }
    }

    /// A LEB128-style unsigned varint of at most `max_bits` bits.
    pub(crate) fn varuint(&mut self, max_bits: u32, what: &'static str) -> Result<u64> {
        let start = self.offset();
        let too_wide = || {
            NetTraceError::new(
                start,
                ErrorKind::Malformed(format!("{what}: varint wider than {max_bits} bits")),
            )
        };
        let mut value = 0u64;
        for i in 0..max_bits.div_ceil(7) {
            let b = self.u8(what)?;
            let part = u64::from(b & 0x7f);
            let shift = 7 * i;
            if (part << shift) >> shift != part {
                return Err(too_wide());
            }
            value |= part << shift;
            if b & 0x80 == 0 {
                if max_bits < 64 && value >> max_bits != 0 {
                    return Err(too_wide());
                }
                return Ok(value);
            }
        }
        Err(too_wide())
    }

    pub(crate) fn varuint32(&mut self, what: &'static str) -> Result<u32> {
        // Checked to fit in 32 bits by `varuint`.
        self.varuint(32, what).map(|v| v as u32)
    }

    pub(crate) fn varuint64(&mut self, what: &'static str) -> Result<u64> {
        self.varuint(64, what)
    }

    /// A null-terminated UTF-16LE string.
    pub(crate) fn utf16z(&mut self, what: &'static str) -> Result<String> {
        let start = self.pos;
        loop {
            if self.u16(what)? == 0 {
                break;
            }
        }
        let units: Vec<u16> = self.data[start..self.pos - 2]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        Ok(String::from_utf16_lossy(&units))
    }

    /// A varuint32-length-prefixed UTF-8 string (format V6).
    pub(crate) fn utf8_varlen(&mut self, what: &'static str) -> Result<String> {
        let len = self.varuint32(what)? as usize;
        let s = self.take(len, what)?;
        Ok(String::from_utf8_lossy(s).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varuint_decodes_and_rejects_overlong() {
        let mut b = Bytes::new(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0x05], 0);
        assert_eq!(b.varuint32("x").unwrap(), u32::MAX);
        assert_eq!(b.varuint32("x").unwrap(), 5);
        let mut b = Bytes::new(&[0xff, 0xff, 0xff, 0xff, 0x1f], 10);
        let e = b.varuint32("x").unwrap_err();
        assert_eq!(e.offset, 10);
        let mut b = Bytes::new(&[0x80, 0x80], 3);
        let e = b.varuint64("x").unwrap_err();
        assert!(e.is_truncated());
        assert_eq!(e.offset, 5);
        let mut b = Bytes::new(&[0xff; 11], 0);
        assert!(b.varuint64("x").is_err());
    }

    #[test]
    fn utf16z_reads_to_terminator() {
        let mut b = Bytes::new(&[b'h', 0, b'i', 0, 0, 0, 7], 0);
        assert_eq!(b.utf16z("s").unwrap(), "hi");
        assert_eq!(b.remaining(), 1);
        let mut b = Bytes::new(&[b'h', 0, b'i'], 0);
        assert!(b.utf16z("s").unwrap_err().is_truncated());
    }
}
