//! ReadyToRun images: .NET assemblies (PE files) that carry precompiled native code, such as
//! `System.Private.CoreLib.dll`. The runtime maps them from the file, and no perf map names
//! their code; this module names it from the image itself.
//!
//! The PE's CLI header points to the ReadyToRun header (`RTR`), whose sections give the code of
//! each method: `RuntimeFunctions` (102) lists code ranges as RVAs, and `MethodDefEntryPoints`
//! (103), a NativeFormat sparse array indexed by MethodDef row, gives the runtime function where
//! each method's code starts; `InstanceMethodEntryPoints` (109), a NativeFormat hashtable of
//! method signatures, does the same for generic instantiations (`List`1[System.__Canon]::Add`).
//! The ECMA-335 metadata of the same image ([`super::ecma`]) names the method. Code ranges no
//! entry point leads to (funclets, cold parts) and instantiations involving other modules'
//! types stay unnamed rather than being guessed.
//!
//! The PE headers are read here (the few fields needed) rather than through the `object`
//! crate's PE support: enabling that feature would make every PE file in a process parse as an
//! unwinding module.

use std::collections::BTreeMap;

use rootline_profile::FrameKind;

use super::ecma::{Metadata, SigReader, Style};
use super::names::JitName;

/// `'RTR'`.
const R2R_SIGNATURE: u32 = 0x0052_5452;
const SECTION_RUNTIME_FUNCTIONS: u32 = 102;
const SECTION_METHODDEF_ENTRY_POINTS: u32 = 103;
const SECTION_INSTANCE_METHOD_ENTRY_POINTS: u32 = 109;

/// Why an image could not be read as ReadyToRun.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum R2rError {
    /// Not a PE32+ file.
    #[error("not a 64-bit PE file: {0}")]
    NotPe(String),
    /// No CLI header or no ReadyToRun header: an IL-only assembly.
    #[error("no ReadyToRun code: {0}")]
    NotReadyToRun(&'static str),
    /// A structure lies outside the file or is malformed; `rva` says where.
    #[error("ReadyToRun image at RVA {rva:#x}: {reason}")]
    Malformed {
        /// Relative virtual address of the problem.
        rva: u32,
        /// What is wrong.
        reason: &'static str,
    },
    /// The metadata is malformed.
    #[error(transparent)]
    Metadata(#[from] super::ecma::MetadataError),
}

/// A precompiled method: its code range (RVAs) and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct R2rMethod {
    /// First code byte, relative to the image base.
    pub start: u32,
    /// One past the last byte of the method's main code range.
    pub end: u32,
    /// `Namespace.Type::Method(params)`.
    pub name: String,
    /// Code of the method outside its main body (an exception handler funclet): not entered
    /// like a function of its own, its frame pointer being the method's.
    pub funclet: bool,
}

/// The precompiled methods of one ReadyToRun image.
#[derive(Debug, Clone)]
pub struct R2rImage {
    /// The assembly's name (`System.Private.CoreLib`).
    pub assembly: String,
    /// Size of the mapped image (`SizeOfImage`).
    pub size: u32,
    /// Methods by start RVA.
    pub methods: Vec<R2rMethod>,
    /// Runtime functions in the image (named or not).
    pub runtime_functions: u32,
}

impl R2rImage {
    /// Reads the methods of the ReadyToRun image `data` (the whole PE file).
    pub fn parse(data: &[u8]) -> Result<R2rImage, R2rError> {
        let pe = Pe::parse(data)?;
        let at = |rva: u32| pe.at(data, rva);
        let malformed = |rva, reason| R2rError::Malformed { rva, reason };
        let u32_at = |rva: u32| -> Result<u32, R2rError> {
            at(rva)
                .and_then(|b| b.get(..4))
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or(malformed(rva, "outside the image"))
        };
        let size = pe.size_of_image;
        let cli_rva = pe.cli_header;
        if cli_rva == 0 {
            return Err(R2rError::NotReadyToRun("no CLI header"));
        }
        let md_rva = u32_at(cli_rva + 8)?;
        let md_size = u32_at(cli_rva + 12)?;
        let native_rva = u32_at(cli_rva + 64)?;
        if native_rva == 0 {
            return Err(R2rError::NotReadyToRun("no ManagedNativeHeader"));
        }
        if u32_at(native_rva)? != R2R_SIGNATURE {
            return Err(R2rError::NotReadyToRun("ManagedNativeHeader is not RTR"));
        }
        let count = u32_at(native_rva + 12)?;
        let mut runtime_functions = None;
        let mut entry_points = None;
        let mut instance_entry_points = None;
        for i in 0..count.min(256) {
            let s = native_rva + 16 + i * 12;
            let (ty, rva, len) = (u32_at(s)?, u32_at(s + 4)?, u32_at(s + 8)?);
            match ty {
                SECTION_RUNTIME_FUNCTIONS => runtime_functions = Some((rva, len)),
                SECTION_METHODDEF_ENTRY_POINTS => entry_points = Some(rva),
                SECTION_INSTANCE_METHOD_ENTRY_POINTS => instance_entry_points = Some(rva),
                _ => {}
            }
        }
        // A facade assembly (only type forwards) has no code at all.
        let (rf_rva, rf_len) = runtime_functions.unwrap_or((0, 0));
        let rf = if rf_len == 0 {
            &[][..]
        } else {
            at(rf_rva)
                .and_then(|b| b.get(..rf_len as usize))
                .ok_or(malformed(rf_rva, "RuntimeFunctions outside the image"))?
        };
        let functions: Vec<(u32, u32)> = rf
            .chunks_exact(12)
            .map(|c| {
                (
                    u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                    u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
                )
            })
            .collect();
        let md = metadata_at(&pe, data, md_rva, md_size)?;
        let assembly = md
            .assembly_name
            .clone()
            .ok_or(R2rError::NotReadyToRun("no Assembly row"))?;
        let mut methods = Vec::new();
        let reader = NativeReader { at: &at };
        let owners = md.method_owners();
        let enclosing = md.enclosing_types();
        // For each runtime function: the name of the method entered there, None for an entry
        // point whose method is not named here, absent for code that is not an entry point.
        let mut entries: BTreeMap<u32, Option<String>> = BTreeMap::new();
        let mut unparsed = 0u32;
        let code_of = |offset: u32, id: u32| -> Result<u32, R2rError> {
            let index = if id & 1 != 0 { id >> 2 } else { id >> 1 };
            let Some(&(start, end)) = functions.get(index as usize) else {
                return Err(malformed(offset, "entry point past RuntimeFunctions"));
            };
            if start >= end || end > size {
                return Err(malformed(offset, "entry point with an empty code range"));
            }
            Ok(index)
        };
        if let Some(ep_rva) = entry_points {
            let array = NativeArray::new(&reader, ep_rva)
                .ok_or(malformed(ep_rva, "MethodDefEntryPoints header"))?;
            for rid in 1..=md.method_count() {
                let Some(offset) = array.get(&reader, rid - 1) else {
                    continue;
                };
                let Some((_, id)) = reader.unsigned(offset) else {
                    continue;
                };
                let index = code_of(offset, id)?;
                let name = md.method_name(rid, &owners, &enclosing);
                add_entry(&mut entries, index, name);
            }
        }
        if let Some(rva) = instance_entry_points {
            let table = NativeHashtable::new(&reader, rva)
                .ok_or(malformed(rva, "InstanceMethodEntryPoints header"))?;
            for entry in table.entries(&reader) {
                let Some(blob) = at(entry) else {
                    return Err(malformed(entry, "instance entry point outside the image"));
                };
                let mut sig = SigReader::new(blob);
                let Some(name) = instance_method_name(&md, &mut sig, &owners, &enclosing) else {
                    // Where its code starts is unknown, so no code can be told apart from it.
                    unparsed += 1;
                    continue;
                };
                let after = entry + sig.position() as u32;
                let Some((_, id)) = reader.unsigned(after) else {
                    return Err(malformed(after, "instance entry point without its code"));
                };
                let index = code_of(after, id)?;
                add_entry(&mut entries, index, Some(name));
            }
        }
        // A runtime function no entry point leads to belongs to the closest entry before it
        // (how the runtime itself finds a funclet's method) — but only when every entry point
        // is known, so that none can lie in between.
        let mut owner: Option<&String> = None;
        for (index, &(start, end)) in functions.iter().enumerate() {
            match entries.get(&(index as u32)) {
                Some(name) => {
                    owner = name.as_ref();
                    if let Some(name) = name {
                        let name = name.clone();
                        methods.push(R2rMethod {
                            start,
                            end,
                            name,
                            funclet: false,
                        });
                    }
                }
                None if unparsed == 0 && start < end && end <= size => {
                    if let Some(name) = owner {
                        let name = name.clone();
                        methods.push(R2rMethod {
                            start,
                            end,
                            name,
                            funclet: true,
                        });
                    }
                }
                None => {}
            }
        }
        methods.sort_by_key(|m| m.start);
        Ok(R2rImage {
            assembly,
            size,
            methods,
            runtime_functions: functions.len() as u32,
        })
    }

    /// The method whose main code range holds `rva`.
    pub fn method_at(&self, rva: u32) -> Option<&R2rMethod> {
        let i = self.methods.partition_point(|m| m.start <= rva);
        let m = self.methods.get(i.checked_sub(1)?)?;
        (rva < m.end).then_some(m)
    }

    /// The JIT-style name of a method of this image.
    pub fn jit_name(&self, method: &R2rMethod) -> JitName {
        JitName {
            name: method.name.clone(),
            module: Some(self.assembly.clone()),
            file: None,
            kind: FrameKind::Managed,
            single_function: !method.funclet,
            pushed_returns: false,
            precompiled: true,
        }
    }
}

/// Records the method entered at runtime function `index`; several methods entered at the same
/// code (folded stubs) are named together, `A | B`.
fn add_entry(entries: &mut BTreeMap<u32, Option<String>>, index: u32, name: Option<String>) {
    match (entries.get_mut(&index), name) {
        (Some(Some(first)), Some(name)) => {
            if !first.split(" | ").any(|n| n == name) {
                first.push_str(" | ");
                first.push_str(&name);
            }
        }
        (Some(slot), None) => *slot = None,
        (Some(slot @ None), Some(_)) => *slot = None,
        (None, name) => {
            entries.insert(index, name);
        }
    }
}

/// ReadyToRun method signature flags (`ENCODE_METHOD_SIG_*`).
const SIG_METHOD_INSTANTIATION: u32 = 0x04;
const SIG_SLOT_INSTEAD_OF_TOKEN: u32 = 0x08;
const SIG_MEMBER_REF_TOKEN: u32 = 0x10;
const SIG_CONSTRAINED: u32 = 0x20;
const SIG_OWNER_TYPE: u32 = 0x40;
const SIG_UPDATE_CONTEXT: u32 = 0x80;

/// Reads a ReadyToRun method signature (flags, owner type, MethodDef token, method
/// instantiation, constraint) and names the method as CoreCLR's perf map does:
/// `Owner`1[Args]::Method(formal params)`. None when the method is not named by this module's
/// metadata (a MemberRef, a slot, another module's context or types).
fn instance_method_name(
    md: &Metadata<'_>,
    sig: &mut SigReader<'_>,
    owners: &[u32],
    enclosing: &[u32],
) -> Option<String> {
    let flags = sig.compressed()?;
    if flags & SIG_UPDATE_CONTEXT != 0 {
        return None;
    }
    let owner = if flags & SIG_OWNER_TYPE != 0 {
        let mut s = String::new();
        md.sig_type(sig, &mut s, enclosing, Style::Reflection, 0)?;
        Some(s)
    } else {
        None
    };
    if flags & (SIG_SLOT_INSTEAD_OF_TOKEN | SIG_MEMBER_REF_TOKEN) != 0 {
        return None;
    }
    let rid = sig.compressed()?;
    if flags & SIG_METHOD_INSTANTIATION != 0 {
        for _ in 0..sig.compressed()? {
            md.sig_type(sig, &mut String::new(), enclosing, Style::Reflection, 0)?;
        }
    }
    if flags & SIG_CONSTRAINED != 0 {
        md.sig_type(sig, &mut String::new(), enclosing, Style::Reflection, 0)?;
    }
    let tail = md.method_tail(rid, enclosing)?;
    match owner {
        Some(owner) => Some(format!("{owner}::{tail}")),
        None => md.method_name(rid, owners, enclosing),
    }
}

/// The metadata of image `data` whose CLI header says it is at `rva`, `size` bytes long.
fn metadata_at<'a>(pe: &Pe, data: &'a [u8], rva: u32, size: u32) -> Result<Metadata<'a>, R2rError> {
    let bytes = pe
        .at(data, rva)
        .and_then(|b| b.get(..size as usize))
        .ok_or(R2rError::Malformed {
            rva,
            reason: "metadata outside the image",
        })?;
    Ok(Metadata::parse(bytes)?)
}

/// The name of every method an assembly defines (with or without precompiled code), spelled as
/// [`R2rImage`] spells them; for IL-only assemblies too.
pub fn method_names(data: &[u8]) -> Result<Vec<String>, R2rError> {
    let pe = Pe::parse(data)?;
    let cli = pe.cli_header;
    let word = |rva| {
        pe.at(data, rva)
            .and_then(|b| b.get(..4))
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or(R2rError::Malformed {
                rva,
                reason: "outside the image",
            })
    };
    if cli == 0 {
        return Err(R2rError::NotReadyToRun("no CLI header"));
    }
    let md = metadata_at(&pe, data, word(cli + 8)?, word(cli + 12)?)?;
    let (owners, enclosing) = (md.method_owners(), md.enclosing_types());
    Ok((1..=md.method_count())
        .filter_map(|rid| md.method_name(rid, &owners, &enclosing))
        .collect())
}

/// The PE32+ headers: where each section's bytes are, the image size and the CLI header.
struct Pe {
    /// `(rva, virtual size, file offset, file size)` of each section.
    sections: Vec<(u32, u32, u32, u32)>,
    size_of_image: u32,
    /// RVA of the CLI header (data directory 14), 0 if none.
    cli_header: u32,
}

impl Pe {
    fn parse(data: &[u8]) -> Result<Pe, R2rError> {
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
                Some((
                    u32_at(s + 12)?,
                    u32_at(s + 8)?,
                    u32_at(s + 20)?,
                    u32_at(s + 16)?,
                ))
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
    fn at<'a>(&self, data: &'a [u8], rva: u32) -> Option<&'a [u8]> {
        self.sections.iter().find_map(|&(va, vsize, off, fsize)| {
            let rel = rva.checked_sub(va)?;
            if rel >= vsize.max(fsize) || rel >= fsize {
                return None;
            }
            let start = off.checked_add(rel)? as usize;
            let end = (off as usize).checked_add(fsize as usize)?;
            data.get(start..end.min(data.len()))
        })
    }
}

/// Reads NativeFormat data (CoreCLR's `nativeformatreader.h`) at RVAs of an image.
struct NativeReader<'a> {
    at: &'a dyn Fn(u32) -> Option<&'a [u8]>,
}

impl NativeReader<'_> {
    fn bytes(&self, rva: u32, n: usize) -> Option<&[u8]> {
        (self.at)(rva)?.get(..n)
    }

    /// A variable-length unsigned integer: returns the offset after it and its value.
    fn unsigned(&self, rva: u32) -> Option<(u32, u32)> {
        let b0 = u32::from(*self.bytes(rva, 1)?.first()?);
        let read = |n: usize| self.bytes(rva, n);
        if b0 & 1 == 0 {
            Some((rva + 1, b0 >> 1))
        } else if b0 & 2 == 0 {
            let b = read(2)?;
            Some((rva + 2, (b0 >> 2) | u32::from(b[1]) << 6))
        } else if b0 & 4 == 0 {
            let b = read(3)?;
            Some((
                rva + 3,
                (b0 >> 3) | u32::from(b[1]) << 5 | u32::from(b[2]) << 13,
            ))
        } else if b0 & 8 == 0 {
            let b = read(4)?;
            Some((
                rva + 4,
                (b0 >> 4) | u32::from(b[1]) << 4 | u32::from(b[2]) << 12 | u32::from(b[3]) << 20,
            ))
        } else if b0 & 16 == 0 {
            let b = read(5)?;
            Some((rva + 5, u32::from_le_bytes([b[1], b[2], b[3], b[4]])))
        } else {
            None
        }
    }
}

impl NativeReader<'_> {
    /// A variable-length signed integer: returns the offset after it and its value.
    fn signed(&self, rva: u32) -> Option<(u32, i32)> {
        let b0 = u32::from(*self.bytes(rva, 1)?.first()?);
        let read = |n: usize| self.bytes(rva, n);
        let sx = |b: u8| i32::from(b as i8);
        if b0 & 1 == 0 {
            Some((rva + 1, i32::from(b0 as u8 as i8) >> 1))
        } else if b0 & 2 == 0 {
            let b = read(2)?;
            Some((rva + 2, (b0 >> 2) as i32 | sx(b[1]) << 6))
        } else if b0 & 4 == 0 {
            let b = read(3)?;
            Some((
                rva + 3,
                (b0 >> 3 | u32::from(b[1]) << 5) as i32 | sx(b[2]) << 13,
            ))
        } else if b0 & 8 == 0 {
            let b = read(4)?;
            Some((
                rva + 4,
                (b0 >> 4 | u32::from(b[1]) << 4 | u32::from(b[2]) << 12) as i32 | sx(b[3]) << 20,
            ))
        } else if b0 & 16 == 0 {
            let b = read(5)?;
            Some((rva + 5, i32::from_le_bytes([b[1], b[2], b[3], b[4]])))
        } else {
            None
        }
    }
}

/// A NativeFormat sparse array: blocks of 16 entries, each a small binary tree.
struct NativeArray {
    base: u32,
    len: u32,
    entry_index_size: u32,
}

const BLOCK_SIZE: u32 = 16;

impl NativeArray {
    fn new(r: &NativeReader<'_>, rva: u32) -> Option<NativeArray> {
        let (base, val) = r.unsigned(rva)?;
        Some(NativeArray {
            base,
            len: val >> 2,
            entry_index_size: val & 3,
        })
    }

    /// The offset (RVA) of element `index`'s data, if the element is present.
    fn get(&self, r: &NativeReader<'_>, index: u32) -> Option<u32> {
        if index >= self.len {
            return None;
        }
        let block = index / BLOCK_SIZE;
        let rel = match self.entry_index_size {
            0 => u32::from(r.bytes(self.base + block, 1)?[0]),
            1 => {
                let b = r.bytes(self.base + 2 * block, 2)?;
                u32::from(u16::from_le_bytes([b[0], b[1]]))
            }
            _ => {
                let b = r.bytes(self.base + 4 * block, 4)?;
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
struct NativeHashtable {
    base: u32,
    bucket_mask: u32,
    entry_index_size: u32,
}

impl NativeHashtable {
    fn new(r: &NativeReader<'_>, rva: u32) -> Option<NativeHashtable> {
        let header = u32::from(*r.bytes(rva, 1)?.first()?);
        let shift = header >> 2;
        if shift > 31 || header & 3 > 2 {
            return None;
        }
        Some(NativeHashtable {
            base: rva + 1,
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

    /// The offset of every entry, bucket by bucket; stops at the first malformed bucket.
    fn entries(&self, r: &NativeReader<'_>) -> Vec<u32> {
        let mut out = Vec::new();
        for i in 0..=self.bucket_mask {
            let Some((mut at, end)) = self.bucket(r, i) else {
                break;
            };
            while at < end {
                // Skip the low byte of the hash code; then a signed offset relative to itself.
                let pos = at + 1;
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
        // A header with an index size of 3 is refused.
        let bad = [0x03u8];
        let f = |rva: u32| bad.get(rva as usize..);
        assert!(NativeHashtable::new(&NativeReader { at: &f }, 0).is_none());
    }

    #[test]
    fn an_elf_file_is_not_a_readytorun_image() {
        let me = std::fs::read("/proc/self/exe").unwrap();
        assert!(matches!(R2rImage::parse(&me), Err(R2rError::NotPe(_))));
    }
}
