//! NativeFormat (CoreCLR's `nativeformatreader.h`): the variable-length integers, sparse arrays
//! and hashtables ReadyToRun images index their entry points with. Offsets are RVAs.

/// Reads NativeFormat data (CoreCLR's `nativeformatreader.h`) at RVAs of an image.
pub(super) struct NativeReader<'a> {
    pub(super) at: &'a dyn Fn(u32) -> Option<&'a [u8]>,
}

impl NativeReader<'_> {
    pub(super) fn bytes(&self, rva: u32, n: usize) -> Option<&[u8]> {
        (self.at)(rva)?.get(..n)
    }

    /// A variable-length unsigned integer: returns the offset after it and its value.
    pub(super) fn unsigned(&self, rva: u32) -> Option<(u32, u32)> {
        let b0 = u32::from(*self.bytes(rva, 1)?.first()?);
        let read = |n: usize| self.bytes(rva, n);
        if b0 & 1 == 0 {
            Some((rva.checked_add(1)?, b0 >> 1))
        } else if b0 & 2 == 0 {
            let b = read(2)?;
            Some((rva.checked_add(2)?, (b0 >> 2) | u32::from(b[1]) << 6))
        } else if b0 & 4 == 0 {
            let b = read(3)?;
            Some((
                rva.checked_add(3)?,
                (b0 >> 3) | u32::from(b[1]) << 5 | u32::from(b[2]) << 13,
            ))
        } else if b0 & 8 == 0 {
            let b = read(4)?;
            Some((
                rva.checked_add(4)?,
                (b0 >> 4) | u32::from(b[1]) << 4 | u32::from(b[2]) << 12 | u32::from(b[3]) << 20,
            ))
        } else if b0 & 16 == 0 {
            let b = read(5)?;
            Some((
                rva.checked_add(5)?,
                u32::from_le_bytes([b[1], b[2], b[3], b[4]]),
            ))
        } else {
            None
        }
    }
}

impl NativeReader<'_> {
    /// A variable-length signed integer: returns the offset after it and its value.
    pub(super) fn signed(&self, rva: u32) -> Option<(u32, i32)> {
        let b0 = u32::from(*self.bytes(rva, 1)?.first()?);
        let read = |n: usize| self.bytes(rva, n);
        let sx = |b: u8| i32::from(b as i8);
        if b0 & 1 == 0 {
            Some((rva.checked_add(1)?, i32::from(b0 as u8 as i8) >> 1))
        } else if b0 & 2 == 0 {
            let b = read(2)?;
            Some((rva.checked_add(2)?, (b0 >> 2) as i32 | sx(b[1]) << 6))
        } else if b0 & 4 == 0 {
            let b = read(3)?;
            Some((
                rva.checked_add(3)?,
                (b0 >> 3 | u32::from(b[1]) << 5) as i32 | sx(b[2]) << 13,
            ))
        } else if b0 & 8 == 0 {
            let b = read(4)?;
            Some((
                rva.checked_add(4)?,
                (b0 >> 4 | u32::from(b[1]) << 4 | u32::from(b[2]) << 12) as i32 | sx(b[3]) << 20,
            ))
        } else if b0 & 16 == 0 {
            let b = read(5)?;
            Some((
                rva.checked_add(5)?,
                i32::from_le_bytes([b[1], b[2], b[3], b[4]]),
            ))
        } else {
            None
        }
    }
}

/// A NativeFormat sparse array: blocks of 16 entries, each a small binary tree.
pub(super) struct NativeArray {
    base: u32,
    len: u32,
    entry_index_size: u32,
}

const BLOCK_SIZE: u32 = 16;

impl NativeArray {
    pub(super) fn new(r: &NativeReader<'_>, rva: u32) -> Option<NativeArray> {
        let (base, val) = r.unsigned(rva)?;
        Some(NativeArray {
            base,
            len: val >> 2,
            entry_index_size: val & 3,
        })
    }

    /// The offset (RVA) of element `index`'s data, if the element is present.
    pub(super) fn get(&self, r: &NativeReader<'_>, index: u32) -> Option<u32> {
        if index >= self.len {
            return None;
        }
        let block = index / BLOCK_SIZE;
        let rel = match self.entry_index_size {
            0 => u32::from(r.bytes(self.base.checked_add(block)?, 1)?[0]),
            1 => {
                let b = r.bytes(self.base.checked_add(2 * block)?, 2)?;
                u32::from(u16::from_le_bytes([b[0], b[1]]))
            }
            _ => {
                let b = r.bytes(self.base.checked_add(4 * block)?, 4)?;
                u32::from_le_bytes([b[0], b[1], b[2], b[3]])
            }
        };
        let mut offset = self.base.checked_add(rel)?;
        let mut bit = BLOCK_SIZE >> 1;
        while bit > 0 {
            let (next, val) = r.unsigned(offset)?;
            if index & bit != 0 {
                if val & 2 != 0 {
                    offset = offset.checked_add(val >> 2)?;
                    bit >>= 1;
                    continue;
                }
            } else if val & 1 != 0 {
                offset = next;
                bit >>= 1;
                continue;
            }
            // A leaf: present only when it is this index.
            if val & 3 == 0 && (val >> 2) == index & (BLOCK_SIZE - 1) {
                return Some(next);
            }
            return None;
        }
        Some(offset)
    }
}

/// A NativeFormat hashtable: buckets of (low hash byte, relative offset) entries.
pub(super) struct NativeHashtable {
    base: u32,
    bucket_mask: u32,
    entry_index_size: u32,
}

impl NativeHashtable {
    pub(super) fn new(r: &NativeReader<'_>, rva: u32) -> Option<NativeHashtable> {
        let header = u32::from(*r.bytes(rva, 1)?.first()?);
        let shift = header >> 2;
        if shift > 31 || header & 3 > 2 {
            return None;
        }
        Some(NativeHashtable {
            base: rva.checked_add(1)?,
            bucket_mask: (1u32 << shift) - 1,
            entry_index_size: header & 3,
        })
    }

    /// Start and end offsets of bucket `i`'s entries.
    fn bucket(&self, r: &NativeReader<'_>, i: u32) -> Option<(u32, u32)> {
        let (start, end) = match self.entry_index_size {
            0 => {
                let b = r.bytes(self.base.checked_add(i)?, 2)?;
                (u32::from(b[0]), u32::from(b[1]))
            }
            1 => {
                let b = r.bytes(self.base.checked_add(i.checked_mul(2)?)?, 4)?;
                (
                    u32::from(u16::from_le_bytes([b[0], b[1]])),
                    u32::from(u16::from_le_bytes([b[2], b[3]])),
                )
            }
            _ => {
                let b = r.bytes(self.base.checked_add(i.checked_mul(4)?)?, 8)?;
                (
                    u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                    u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
                )
            }
        };
        Some((self.base.checked_add(start)?, self.base.checked_add(end)?))
    }

    /// The offset of every entry, bucket by bucket; stops at the first malformed bucket. The
    /// buckets' entries follow each other, so a bucket starting before the previous one's end is
    /// malformed (it would let a small table list the same entries again for every bucket).
    pub(super) fn entries(&self, r: &NativeReader<'_>) -> Vec<u32> {
        let mut out = Vec::new();
        let mut reached = self.base;
        for i in 0..=self.bucket_mask {
            let Some((mut at, end)) = self.bucket(r, i) else {
                break;
            };
            if at < reached {
                break;
            }
            reached = end.max(at);
            while at < end {
                // Skip the low byte of the hash code; then a signed offset relative to itself.
                let Some(pos) = at.checked_add(1) else {
                    return out;
                };
                let Some((next, delta)) = r.signed(pos) else {
                    return out;
                };
                match pos.checked_add_signed(delta) {
                    Some(entry) => out.push(entry),
                    None => return out,
                }
                at = next;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_unsigned_integers() {
        let cases: [(&[u8], u32, u32); 5] = [
            (&[0x04], 1, 2),
            (&[0x01 | (5 << 2), 0x01], 2, 5 | 1 << 6),
            (&[0x03 | (1 << 3), 0x02, 0x01], 3, 1 | 2 << 5 | 1 << 13),
            (&[0x07, 0, 0, 0x01], 4, 1 << 20),
            (&[0x0F, 0x78, 0x56, 0x34, 0x12], 5, 0x1234_5678),
        ];
        for (bytes, len, want) in cases {
            let f = |rva: u32| bytes.get(rva as usize..);
            let r = NativeReader { at: &f };
            assert_eq!(r.unsigned(0), Some((len, want)), "{bytes:x?}");
        }
        let f = |rva: u32| [0x1Fu8, 0, 0, 0, 0].get(rva as usize..);
        assert_eq!(NativeReader { at: &f }.unsigned(0), None);
        let f = |rva: u32| [0x01u8].get(rva as usize..);
        assert_eq!(NativeReader { at: &f }.unsigned(0), None, "truncated");
    }

    #[test]
    fn native_signed_integers_and_hashtable_entries() {
        let cases: [(&[u8], u32, i32); 4] = [
            (&[0xFC], 1, -2),
            (&[0x06], 1, 3),
            (&[0x01 | (3 << 2), 0xFF], 2, -61),
            (&[0x0F, 0xFE, 0xFF, 0xFF, 0xFF], 5, -2),
        ];
        for (bytes, len, want) in cases {
            let f = |rva: u32| bytes.get(rva as usize..);
            let r = NativeReader { at: &f };
            assert_eq!(r.signed(0), Some((len, want)), "{bytes:x?}");
        }
        // One bucket (entries from byte 3 to 7), two entries: -2 from byte 4, +3 from byte 6.
        let table = [0x00u8, 0x02, 0x06, 0xAA, 0xFC, 0xBB, 0x06];
        let f = |rva: u32| table.get(rva as usize..);
        let r = NativeReader { at: &f };
        let t = NativeHashtable::new(&r, 0).unwrap();
        assert_eq!(t.entries(&r), vec![2, 9]);
        // Four buckets whose offsets go back (6, 8, 6, 8, 8): the third would list the first's
        // entry again; the walk stops there.
        let table = [0x08u8, 6, 8, 6, 8, 8, 0, 0xAA, 0x04];
        let f = |rva: u32| table.get(rva as usize..);
        let r = NativeReader { at: &f };
        assert_eq!(NativeHashtable::new(&r, 0).unwrap().entries(&r), vec![10]);
        // A header with an index size of 3 is refused.
        let bad = [0x03u8];
        let f = |rva: u32| bad.get(rva as usize..);
        assert!(NativeHashtable::new(&NativeReader { at: &f }, 0).is_none());
    }
}
