//! Qualified names for Rust closures.
//!
//! Rust's legacy symbol mangling (stable rustc's default) names every closure `{{closure}}`: the
//! demangled names of two closures in one function are the same string, told apart only by the
//! hash that demangling drops. Their DWARF says which closure each is: the subprogram's
//! `DW_AT_name` is `{closure#N}` and its parents are the namespaces of the function it is in. A
//! [`ClosureNames`] index, read once per binary when a closure is first met, maps each closure's
//! linkage name to its demangled name with the `{{closure}}` segments numbered from DWARF
//! (`rootline::demo::hash_block::{closure#0}`), so distinct closures never share a name.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use gimli::{EndianSlice, LittleEndian};
use object::elf::FileHeader64;
use object::read::elf::{FileHeader, SectionHeader};
use object::{Endianness, ReadCache, ReadRef, elf};

/// What a closure's segment looks like in a legacy-mangled symbol (`{{closure}}` escaped).
const MANGLED_CLOSURE: &str = "$u7b$$u7b$closure$u7d$$u7d$";
/// The segment legacy demangling gives a closure.
const CLOSURE: &str = "{{closure}}";

/// Whether `linkage` is a legacy-mangled Rust name of a closure (or of something in one).
pub(super) fn is_legacy_closure(linkage: &str) -> bool {
    linkage.starts_with("_ZN") && linkage.contains(MANGLED_CLOSURE)
}

/// Numbered names of one binary's closures, by linkage name (see the module documentation).
#[derive(Debug, Default)]
pub(super) struct ClosureNames {
    names: HashMap<String, String>,
}

impl ClosureNames {
    /// Reads the closures of the ELF file at `path` from its DWARF. None when the file cannot be
    /// read or its DWARF is compressed (then names stay as demangling gives them).
    pub fn read(path: &Path) -> Option<ClosureNames> {
        let file = File::open(path).ok()?;
        let cache = ReadCache::new(&file);
        let dwarf = load(&cache)?;
        let mut names = HashMap::new();
        let mut units = dwarf.units();
        while let Ok(Some(header)) = units.next() {
            let Ok(unit) = dwarf.unit(header) else {
                continue;
            };
            if unit_closures(&dwarf, &unit, &mut names).is_err() {
                continue;
            }
        }
        Some(ClosureNames { names })
    }

    /// The numbered name of the closure whose linkage name is `linkage`, when known.
    pub fn get(&self, linkage: &str) -> Option<&str> {
        self.names.get(linkage).map(String::as_str)
    }
}

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// The DWARF sections closures' names need, read through `cache`; None for a file that is not
/// little-endian ELF64 or whose debug sections are compressed.
fn load<'a, R: ReadRef<'a>>(data: R) -> Option<gimli::Dwarf<Slice<'a>>> {
    let header = FileHeader64::<Endianness>::parse(data).ok()?;
    let endian = header.endian().ok()?;
    if endian != Endianness::Little {
        return None;
    }
    let sections = header.sections(endian, data).ok()?;
    let section = |id: gimli::SectionId| -> Result<Slice<'a>, ()> {
        let Some((_, s)) = sections.section_by_name(endian, id.name().as_bytes()) else {
            return Ok(EndianSlice::new(&[], LittleEndian));
        };
        if s.sh_flags(endian) & u64::from(elf::SHF_COMPRESSED) != 0 {
            return Err(());
        }
        let bytes = s.data(endian, data).map_err(|_| ())?;
        Ok(EndianSlice::new(bytes, LittleEndian))
    };
    gimli::Dwarf::load(section).ok()
}

/// Adds the closures of one unit to `names`, with the namespaces they are in.
fn unit_closures(
    dwarf: &gimli::Dwarf<Slice<'_>>,
    unit: &gimli::Unit<Slice<'_>>,
    names: &mut HashMap<String, String>,
) -> gimli::Result<()> {
    if unit
        .entries()
        .next_dfs()?
        .and_then(|cu| cu.attr_value(gimli::DW_AT_language))
        .is_none_or(|l| l != gimli::AttributeValue::Language(gimli::DW_LANG_Rust))
    {
        return Ok(());
    }
    // The names of the scopes the cursor is in, by depth.
    let mut scopes: Vec<(isize, String)> = Vec::new();
    let mut entries = unit.entries();
    while let Some(entry) = entries.next_dfs()? {
        let depth = entry.depth();
        while scopes.last().is_some_and(|(d, _)| *d >= depth) {
            scopes.pop();
        }
        let string = |at| {
            entry
                .attr_value(at)
                .and_then(|v| dwarf.attr_string(unit, v).ok())
                .map(|s| s.to_string_lossy().into_owned())
        };
        let tag = entry.tag();
        if matches!(
            tag,
            gimli::DW_TAG_namespace
                | gimli::DW_TAG_structure_type
                | gimli::DW_TAG_union_type
                | gimli::DW_TAG_enumeration_type
                | gimli::DW_TAG_subprogram
        ) {
            let name = string(gimli::DW_AT_name).unwrap_or_default();
            if tag == gimli::DW_TAG_subprogram
                && let Some(linkage) = string(gimli::DW_AT_linkage_name)
                && is_legacy_closure(&linkage)
            {
                let path: Vec<&str> = scopes
                    .iter()
                    .map(|(_, s)| s.as_str())
                    .chain([name.as_str()])
                    .collect();
                let demangled = super::demangle_symbol(&linkage);
                if let Some(numbered) = number_closures(&demangled, &path) {
                    names.insert(linkage, numbered);
                }
            }
            scopes.push((depth, name));
        }
    }
    Ok(())
}

/// `demangled` (a legacy-demangled name with `{{closure}}` segments) with each closure segment
/// replaced, from the last, by the DWARF path's closure segments (`{closure#N}`, generic
/// arguments dropped). None when the path has fewer closure segments than the name.
pub(super) fn number_closures(demangled: &str, path: &[&str]) -> Option<String> {
    let mut numbered = path
        .iter()
        .rev()
        .map(|s| s.split('<').next().unwrap_or(s))
        .filter(|s| s.starts_with("{closure#") && s.ends_with('}'));
    let mut parts: Vec<&str> = demangled.split(CLOSURE).collect();
    let closures = parts.len() - 1;
    if closures == 0 {
        return None;
    }
    let mut out = String::with_capacity(demangled.len() + 4 * closures);
    let mut segments: Vec<&str> = (0..closures)
        .map(|_| numbered.next())
        .collect::<Option<_>>()?;
    segments.reverse();
    let last = parts.pop().unwrap_or_default();
    for (part, segment) in parts.iter().zip(segments) {
        out.push_str(part);
        out.push_str(segment);
    }
    out.push_str(last);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closures_are_numbered_from_the_dwarf_path() {
        assert_eq!(
            number_closures("t::alpha::{{closure}}", &["t", "alpha", "{closure#1}"]).as_deref(),
            Some("t::alpha::{closure#1}")
        );
        assert_eq!(
            number_closures(
                "t::f::{{closure}}::{{closure}}",
                &["t", "f", "{closure#2}", "{closure#0}<u8>"]
            )
            .as_deref(),
            Some("t::f::{closure#2}::{closure#0}")
        );
        assert_eq!(
            number_closures("t::f::{{closure}}", &["t", "f"]),
            None,
            "a path without closures names nothing"
        );
        assert_eq!(number_closures("t::f", &["t", "f"]), None);
    }
}
