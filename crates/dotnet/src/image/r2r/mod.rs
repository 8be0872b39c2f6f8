//! ReadyToRun images: .NET assemblies (PE files) that carry precompiled native code, such as
//! `System.Private.CoreLib.dll`. The runtime maps them from the file, and no perf map names
//! their code; this module names it from the image itself.
//!
//! The PE's CLI header points to the ReadyToRun header (`RTR`), whose sections give the code of
//! each method: `RuntimeFunctions` (102) lists code ranges as RVAs, and `MethodDefEntryPoints`
//! (103), a NativeFormat sparse array indexed by MethodDef row, gives the runtime function where
//! each method's code starts; `InstanceMethodEntryPoints` (109), a NativeFormat hashtable of
//! method signatures, does the same for generic instantiations (``List`1[System.__Canon]::Add``).
//! The ECMA-335 metadata of the same image ([`super::ecma`]) names the method. Code ranges no
//! entry point leads to (funclets, cold parts) and instantiations involving other modules'
//! types stay unnamed rather than being guessed.
//!
//! The PE headers are read in `pe`, the NativeFormat structures in `native_format`.

use std::collections::BTreeMap;

use super::ecma::{Metadata, SigReader, Style};

mod native_format;
mod pe;

use native_format::{NativeArray, NativeHashtable, NativeReader};
use pe::Pe;

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
        let u32_at = |rva: u32| word(&pe, data, rva);
        let size = pe.size_of_image;
        let md_rva = cli_word(&pe, data, 8)?;
        let md_size = cli_word(&pe, data, 12)?;
        let native_rva = cli_word(&pe, data, 64)?;
        if native_rva == 0 {
            return Err(R2rError::NotReadyToRun("no ManagedNativeHeader"));
        }
        if u32_at(native_rva)? != R2R_SIGNATURE {
            return Err(R2rError::NotReadyToRun("ManagedNativeHeader is not RTR"));
        }
        let count = u32_at(offset(native_rva, 12)?)?;
        let mut runtime_functions = None;
        let mut entry_points = None;
        let mut instance_entry_points = None;
        for i in 0..count.min(256) {
            let s = offset(native_rva, 16 + i * 12)?;
            let (ty, rva, len) = (u32_at(s)?, u32_at(offset(s, 4)?)?, u32_at(offset(s, 8)?)?);
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
                let after = offset(entry, sig.position() as u32)?;
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
        methods.shrink_to_fit();
        Ok(R2rImage {
            assembly,
            size,
            methods,
            runtime_functions: functions.len() as u32,
        })
    }

    /// Memory the image's tables hold, in bytes.
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of::<R2rImage>()
            + self.assembly.capacity()
            + self.methods.capacity() * std::mem::size_of::<R2rMethod>()
            + self
                .methods
                .iter()
                .map(|m| m.name.capacity())
                .sum::<usize>()
    }

    /// The method whose main code range holds `rva`.
    pub fn method_at(&self, rva: u32) -> Option<&R2rMethod> {
        let i = self.methods.partition_point(|m| m.start <= rva);
        let m = self.methods.get(i.checked_sub(1)?)?;
        (rva < m.end).then_some(m)
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
/// ``Owner`1[Args]::Method(formal params)``. None when the method is not named by this module's
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

/// `n` bytes on from the structure at `rva` (file values may overflow).
fn offset(rva: u32, n: u32) -> Result<u32, R2rError> {
    rva.checked_add(n).ok_or(R2rError::Malformed {
        rva,
        reason: "structure runs past 4 GiB",
    })
}

/// The little-endian word at `rva` of image `data`.
fn word(pe: &Pe, data: &[u8], rva: u32) -> Result<u32, R2rError> {
    pe.at(data, rva)
        .and_then(|b| b.get(..4))
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(R2rError::Malformed {
            rva,
            reason: "outside the image",
        })
}

/// The word `n` bytes into the CLI header of image `data` (a PE file without one is not a .NET
/// assembly).
fn cli_word(pe: &Pe, data: &[u8], n: u32) -> Result<u32, R2rError> {
    if pe.cli_header == 0 {
        return Err(R2rError::NotReadyToRun("no CLI header"));
    }
    word(pe, data, offset(pe.cli_header, n)?)
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
    let md = metadata_at(&pe, data, cli_word(&pe, data, 8)?, cli_word(&pe, data, 12)?)?;
    let (owners, enclosing) = (md.method_owners(), md.enclosing_types());
    Ok((1..=md.method_count())
        .filter_map(|rid| md.method_name(rid, &owners, &enclosing))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_elf_file_is_not_a_readytorun_image() {
        let me = std::fs::read("/proc/self/exe").unwrap();
        assert!(matches!(R2rImage::parse(&me), Err(R2rError::NotPe(_))));
    }
}
