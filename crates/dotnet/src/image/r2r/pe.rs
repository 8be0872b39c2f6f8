//! The few PE32+ header fields a ReadyToRun image is read with: its sections (to turn RVAs into
//! file offsets), `SizeOfImage` and the CLI header's RVA. Read by hand: enabling the `object`
//! crate's PE support would make every PE file in a process parse as an unwinding module.

use super::R2rError;

/// The PE32+ headers: where each section's bytes are, the image size and the CLI header.
pub(super) struct Pe {
    /// `(rva, file offset, file size)` of each section.
    sections: Vec<(u32, u32, u32)>,
    pub(super) size_of_image: u32,
    /// RVA of the CLI header (data directory 14), 0 if none.
    pub(super) cli_header: u32,
}

impl Pe {
    pub(super) fn parse(data: &[u8]) -> Result<Pe, R2rError> {
        let bad = |what: &str| R2rError::NotPe(what.to_string());
        let u16_at = |at: usize| {
            data.get(at..at + 2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
        };
        let u32_at = |at: usize| {
            data.get(at..at + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        if data.get(..2) != Some(b"MZ") {
            return Err(bad("no MZ signature"));
        }
        let nt = u32_at(0x3C).ok_or(bad("truncated DOS header"))? as usize;
        if data.get(nt..nt.saturating_add(4)) != Some(b"PE\0\0") {
            return Err(bad("no PE signature"));
        }
        let coff = nt + 4;
        let sections = u16_at(coff + 2).ok_or(bad("truncated COFF header"))?;
        let optional_size = u16_at(coff + 16).ok_or(bad("truncated COFF header"))? as usize;
        let opt = coff + 20;
        if u16_at(opt) != Some(0x20B) {
            return Err(bad("not PE32+"));
        }
        let size_of_image = u32_at(opt + 56).ok_or(bad("truncated optional header"))?;
        let directories = u32_at(opt + 108).ok_or(bad("truncated optional header"))?;
        let cli_header = if directories > 14 && 112 + 15 * 8 <= optional_size {
            u32_at(opt + 112 + 14 * 8).ok_or(bad("truncated data directories"))?
        } else {
            0
        };
        let table = opt + optional_size;
        let sections = (0..usize::from(sections))
            .map(|i| {
                let s = table + i * 40;
                Some((u32_at(s + 12)?, u32_at(s + 20)?, u32_at(s + 16)?))
            })
            .collect::<Option<Vec<_>>>()
            .ok_or(bad("truncated section table"))?;
        Ok(Pe {
            sections,
            size_of_image,
            cli_header,
        })
    }

    /// The file's bytes from `rva` to the end of the section's data that holds it.
    pub(super) fn at<'a>(&self, data: &'a [u8], rva: u32) -> Option<&'a [u8]> {
        self.sections.iter().find_map(|&(va, off, fsize)| {
            let rel = rva.checked_sub(va)?;
            if rel >= fsize {
                return None;
            }
            let start = off.checked_add(rel)? as usize;
            let end = (off as usize).checked_add(fsize as usize)?;
            data.get(start..end.min(data.len()))
        })
    }
}
