//! ECMA-335 metadata (Partition II §24): just enough to name the methods of an assembly —
//! the `#~` table stream's layout, the TypeDef, MethodDef, TypeRef, NestedClass and TypeSpec
//! tables, the `#Strings` and `#Blob` heaps, and method signatures.
//!
//! Names are formatted the way CoreCLR writes them into its perf map, so that a method named
//! here (precompiled code) and the same method named by the runtime (JIT code) read alike:
//! `System.Text.StringBuilder::Append(char*,int32)`, parameters as in IL (``valuetype
//! System.Span`1<char>``, `class [System.Runtime]System.IO.Stream`, `!0`, `!!0`, `int32&`,
//! nested types as `Outer/Inner`). Signatures are read and spelled in `signature`.

mod signature;

pub(crate) use signature::{SigReader, Style};

/// A metadata problem, with the byte offset (from the start of the metadata) where it was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ECMA-335 metadata at byte {offset}: {reason}")]
pub struct MetadataError {
    /// Byte offset from the start of the metadata root.
    pub offset: usize,
    /// What is wrong.
    pub reason: &'static str,
}

const MODULE: usize = 0x00;
const TYPE_REF: usize = 0x01;
const TYPE_DEF: usize = 0x02;
const FIELD: usize = 0x04;
const METHOD_DEF: usize = 0x06;
const PARAM: usize = 0x08;
const INTERFACE_IMPL: usize = 0x09;
const MEMBER_REF: usize = 0x0A;
const DECL_SECURITY: usize = 0x0E;
const STAND_ALONE_SIG: usize = 0x11;
const EVENT: usize = 0x14;
const PROPERTY: usize = 0x17;
const MODULE_REF: usize = 0x1A;
const TYPE_SPEC: usize = 0x1B;
const ASSEMBLY: usize = 0x20;
const ASSEMBLY_REF: usize = 0x23;
const FILE: usize = 0x26;
const EXPORTED_TYPE: usize = 0x27;
const MANIFEST_RESOURCE: usize = 0x28;
const NESTED_CLASS: usize = 0x29;
const GENERIC_PARAM: usize = 0x2A;
const METHOD_SPEC: usize = 0x2B;
const GENERIC_PARAM_CONSTRAINT: usize = 0x2C;
const TABLES: usize = 0x2D;

/// A column of a metadata table.
#[derive(Clone, Copy)]
enum Col {
    U16,
    U32,
    Str,
    Guid,
    Blob,
    /// An index into one table.
    Idx(usize),
    /// A coded index: tag bits and the tables it may point into.
    Coded(u32, &'static [usize]),
}

const NONE: usize = usize::MAX;
const TYPE_DEF_OR_REF: &[usize] = &[TYPE_DEF, TYPE_REF, TYPE_SPEC];
const HAS_CONSTANT: &[usize] = &[FIELD, PARAM, PROPERTY];
const HAS_CUSTOM_ATTRIBUTE: &[usize] = &[
    METHOD_DEF,
    FIELD,
    TYPE_REF,
    TYPE_DEF,
    PARAM,
    INTERFACE_IMPL,
    MEMBER_REF,
    MODULE,
    DECL_SECURITY,
    PROPERTY,
    EVENT,
    STAND_ALONE_SIG,
    MODULE_REF,
    TYPE_SPEC,
    ASSEMBLY,
    ASSEMBLY_REF,
    FILE,
    EXPORTED_TYPE,
    MANIFEST_RESOURCE,
    GENERIC_PARAM,
    GENERIC_PARAM_CONSTRAINT,
    METHOD_SPEC,
];
const HAS_FIELD_MARSHAL: &[usize] = &[FIELD, PARAM];
const HAS_DECL_SECURITY: &[usize] = &[TYPE_DEF, METHOD_DEF, ASSEMBLY];
const MEMBER_REF_PARENT: &[usize] = &[TYPE_DEF, TYPE_REF, MODULE_REF, METHOD_DEF, TYPE_SPEC];
const HAS_SEMANTICS: &[usize] = &[EVENT, PROPERTY];
const METHOD_DEF_OR_REF: &[usize] = &[METHOD_DEF, MEMBER_REF];
const MEMBER_FORWARDED: &[usize] = &[FIELD, METHOD_DEF];
const IMPLEMENTATION: &[usize] = &[FILE, ASSEMBLY_REF, EXPORTED_TYPE];
const CUSTOM_ATTRIBUTE_TYPE: &[usize] = &[NONE, NONE, METHOD_DEF, MEMBER_REF, NONE];
const RESOLUTION_SCOPE: &[usize] = &[MODULE, MODULE_REF, ASSEMBLY_REF, TYPE_REF];
const TYPE_OR_METHOD_DEF: &[usize] = &[TYPE_DEF, METHOD_DEF];

/// The columns of every table up to GenericParamConstraint (Partition II §22).
fn schema(table: usize) -> &'static [Col] {
    use Col::*;
    match table {
        0x00 => &[U16, Str, Guid, Guid, Guid],
        0x01 => &[Coded(2, RESOLUTION_SCOPE), Str, Str],
        0x02 => &[
            U32,
            Str,
            Str,
            Coded(2, TYPE_DEF_OR_REF),
            Idx(FIELD),
            Idx(METHOD_DEF),
        ],
        0x03 => &[Idx(FIELD)],
        0x04 => &[U16, Str, Blob],
        0x05 => &[Idx(METHOD_DEF)],
        0x06 => &[U32, U16, U16, Str, Blob, Idx(PARAM)],
        0x07 => &[Idx(PARAM)],
        0x08 => &[U16, U16, Str],
        0x09 => &[Idx(TYPE_DEF), Coded(2, TYPE_DEF_OR_REF)],
        0x0A => &[Coded(3, MEMBER_REF_PARENT), Str, Blob],
        0x0B => &[U16, Coded(2, HAS_CONSTANT), Blob],
        0x0C => &[
            Coded(5, HAS_CUSTOM_ATTRIBUTE),
            Coded(3, CUSTOM_ATTRIBUTE_TYPE),
            Blob,
        ],
        0x0D => &[Coded(1, HAS_FIELD_MARSHAL), Blob],
        0x0E => &[U16, Coded(2, HAS_DECL_SECURITY), Blob],
        0x0F => &[U16, U32, Idx(TYPE_DEF)],
        0x10 => &[U32, Idx(FIELD)],
        0x11 => &[Blob],
        0x12 => &[Idx(TYPE_DEF), Idx(EVENT)],
        0x13 => &[Idx(EVENT)],
        0x14 => &[U16, Str, Coded(2, TYPE_DEF_OR_REF)],
        0x15 => &[Idx(TYPE_DEF), Idx(PROPERTY)],
        0x16 => &[Idx(PROPERTY)],
        0x17 => &[U16, Str, Blob],
        0x18 => &[U16, Idx(METHOD_DEF), Coded(1, HAS_SEMANTICS)],
        0x19 => &[
            Idx(TYPE_DEF),
            Coded(1, METHOD_DEF_OR_REF),
            Coded(1, METHOD_DEF_OR_REF),
        ],
        0x1A => &[Str],
        0x1B => &[Blob],
        0x1C => &[U16, Coded(1, MEMBER_FORWARDED), Str, Idx(MODULE_REF)],
        0x1D => &[U32, Idx(FIELD)],
        0x1E => &[U32, U32],
        0x1F => &[U32],
        0x20 => &[U32, U16, U16, U16, U16, U32, Blob, Str, Str],
        0x21 => &[U32],
        0x22 => &[U32, U32, U32],
        0x23 => &[U16, U16, U16, U16, U32, Blob, Str, Str, Blob],
        0x24 => &[U32, Idx(ASSEMBLY_REF)],
        0x25 => &[U32, U32, U32, Idx(ASSEMBLY_REF)],
        0x26 => &[U32, Str, Blob],
        0x27 => &[U32, U32, Str, Str, Coded(2, IMPLEMENTATION)],
        0x28 => &[U32, U32, Str, Coded(2, IMPLEMENTATION)],
        0x29 => &[Idx(TYPE_DEF), Idx(TYPE_DEF)],
        0x2A => &[U16, U16, Coded(1, TYPE_OR_METHOD_DEF), Str],
        0x2B => &[Coded(1, METHOD_DEF_OR_REF), Blob],
        0x2C => &[Idx(GENERIC_PARAM), Coded(2, TYPE_DEF_OR_REF)],
        _ => &[],
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The most columns a table has (Assembly, AssemblyRef).
const MAX_COLUMNS: usize = 9;

/// One table's place in the `#~` stream.
#[derive(Debug, Clone, Copy, Default)]
struct Table {
    rows: u32,
    /// Offset of the first row, from the start of the metadata.
    start: usize,
    row_size: usize,
    /// Width in bytes (2 or 4) of each column of [`schema`], 0 past the last.
    widths: [u8; MAX_COLUMNS],
}

/// Parsed metadata of one assembly, borrowing its bytes.
#[derive(Debug)]
pub struct Metadata<'a> {
    data: &'a [u8],
    strings: &'a [u8],
    blobs: &'a [u8],
    tables: [Table; TABLES],
    /// The assembly's name (the Assembly table), when it has one.
    pub assembly_name: Option<String>,
}

impl<'a> Metadata<'a> {
    /// Parses the metadata root (`BSJB`), its stream headers and the table stream's layout.
    pub fn parse(data: &'a [u8]) -> Result<Metadata<'a>, MetadataError> {
        let err = |offset, reason| MetadataError { offset, reason };
        if u32_at(data, 0) != Some(0x424A_5342) {
            return Err(err(0, "no BSJB signature"));
        }
        let version_len = u32_at(data, 12).ok_or(err(12, "truncated root"))? as usize;
        let mut at = 16usize
            .checked_add(version_len)
            .ok_or(err(12, "version length overflows"))?;
        let streams = u16_at(data, at + 2).ok_or(err(at, "truncated root"))?;
        at += 4;
        let (mut tables_stream, mut strings, mut blobs) = (None, &[][..], &[][..]);
        for _ in 0..streams {
            let off = u32_at(data, at).ok_or(err(at, "truncated stream header"))? as usize;
            let size = u32_at(data, at + 4).ok_or(err(at, "truncated stream header"))? as usize;
            let name_start = at + 8;
            let name_len = data
                .get(name_start..)
                .and_then(|n| n.iter().take(32).position(|&b| b == 0))
                .ok_or(err(name_start, "stream name without its NUL"))?;
            let name = &data[name_start..name_start + name_len];
            let body = off
                .checked_add(size)
                .and_then(|end| data.get(off..end))
                .ok_or(err(at, "stream outside the metadata"))?;
            match name {
                b"#~" | b"#-" => tables_stream = Some((off, body)),
                b"#Strings" => strings = body,
                b"#Blob" => blobs = body,
                _ => {}
            }
            at = name_start + (name_len + 4) / 4 * 4;
        }
        let (ts, tbody) = tables_stream.ok_or(err(at, "no table stream"))?;
        let heap_sizes = *tbody.get(6).ok_or(err(ts, "truncated table stream"))?;
        let valid = u64_at(tbody, 8).ok_or(err(ts + 8, "truncated table stream"))?;
        let mut at = 24;
        let mut rows = [0u32; 64];
        for (t, r) in rows.iter_mut().enumerate() {
            if valid & (1 << t) != 0 {
                *r = u32_at(tbody, at).ok_or(err(ts + at, "truncated row counts"))?;
                at += 4;
            }
        }
        if heap_sizes & 0x40 != 0 {
            at += 4; // Extra data after the row counts (uncompressed streams).
        }
        if valid >> TABLES != 0 {
            return Err(err(ts + 8, "tables beyond GenericParamConstraint"));
        }
        let str_size = if heap_sizes & 1 != 0 { 4 } else { 2 };
        let guid_size = if heap_sizes & 2 != 0 { 4 } else { 2 };
        let blob_size = if heap_sizes & 4 != 0 { 4 } else { 2 };
        let idx_size = |t: usize| if rows[t] < 1 << 16 { 2 } else { 4 };
        let coded_size = |bits: u32, tables: &[usize]| {
            let max = tables
                .iter()
                .map(|&t| if t == NONE { 0 } else { rows[t] })
                .max()
                .unwrap_or(0);
            if max < 1 << (16 - bits) { 2 } else { 4 }
        };
        let width = |c: Col| match c {
            Col::U16 => 2,
            Col::U32 => 4,
            Col::Str => str_size,
            Col::Guid => guid_size,
            Col::Blob => blob_size,
            Col::Idx(t) => idx_size(t),
            Col::Coded(bits, ts) => coded_size(bits, ts),
        };
        let mut tables = [Table::default(); TABLES];
        let mut offset = ts + at;
        for (t, table) in tables.iter_mut().enumerate() {
            let mut widths = [0u8; MAX_COLUMNS];
            for (w, &c) in widths.iter_mut().zip(schema(t)) {
                *w = width(c);
            }
            let row_size = widths.iter().map(|&w| usize::from(w)).sum();
            *table = Table {
                rows: rows[t],
                start: offset,
                row_size,
                widths,
            };
            offset = (rows[t] as usize)
                .checked_mul(row_size)
                .and_then(|n| offset.checked_add(n))
                .ok_or(err(ts, "table sizes overflow"))?;
        }
        if offset > ts + tbody.len() {
            return Err(err(ts, "tables run past the table stream"));
        }
        let mut md = Metadata {
            data,
            strings,
            blobs,
            tables,
            assembly_name: None,
        };
        md.assembly_name = (md.tables[ASSEMBLY].rows > 0)
            .then(|| md.string(md.cell(ASSEMBLY, 1, 7)?))
            .flatten()
            .map(str::to_string);
        Ok(md)
    }

    /// Rows of `table`.
    fn rows(&self, table: usize) -> u32 {
        self.tables[table].rows
    }

    /// Column `col` of row `rid` (1-based) of `table`.
    fn cell(&self, table: usize, rid: u32, col: usize) -> Option<u32> {
        let t = self.tables.get(table)?;
        if rid == 0 || rid > t.rows {
            return None;
        }
        let width = *t.widths.get(col)?;
        let before: usize = t.widths[..col].iter().map(|&w| usize::from(w)).sum();
        let at = t.start + (rid as usize - 1) * t.row_size + before;
        match width {
            2 => u16_at(self.data, at).map(u32::from),
            4 => u32_at(self.data, at),
            _ => None,
        }
    }

    fn string(&self, index: u32) -> Option<&'a str> {
        let s = self.strings.get(index as usize..)?;
        let end = s.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&s[..end]).ok()
    }

    fn blob(&self, index: u32) -> Option<&'a [u8]> {
        let b = self.blobs.get(index as usize..)?;
        let mut r = SigReader::new(b);
        let len = r.compressed()? as usize;
        let at = r.position();
        b.get(at..at.checked_add(len)?)
    }

    /// Number of methods (MethodDef rows).
    pub fn method_count(&self) -> u32 {
        self.rows(METHOD_DEF)
    }

    /// For each method (index `rid - 1`), the TypeDef row that owns it (0 if none).
    pub fn method_owners(&self) -> Vec<u32> {
        let n = self.rows(METHOD_DEF) as usize;
        let mut owners = vec![0u32; n];
        let types = self.rows(TYPE_DEF);
        for t in 1..=types {
            let first = self.cell(TYPE_DEF, t, 5).unwrap_or(0) as usize;
            let next = if t < types {
                self.cell(TYPE_DEF, t + 1, 5).unwrap_or(0) as usize
            } else {
                n + 1
            };
            for m in first.max(1)..next.min(n + 1) {
                owners[m - 1] = t;
            }
        }
        owners
    }

    /// Enclosing type of each nested TypeDef (index `rid - 1`; 0 when not nested).
    pub fn enclosing_types(&self) -> Vec<u32> {
        let mut enclosing = vec![0u32; self.rows(TYPE_DEF) as usize];
        for r in 1..=self.rows(NESTED_CLASS) {
            if let (Some(nested), Some(outer)) =
                (self.cell(NESTED_CLASS, r, 0), self.cell(NESTED_CLASS, r, 1))
                && let Some(slot) = enclosing.get_mut((nested as usize).wrapping_sub(1))
            {
                *slot = outer;
            }
        }
        enclosing
    }

    /// `Namespace.Name` of TypeDef `rid`, with enclosing types joined by `sep`.
    fn type_def_name(&self, rid: u32, enclosing: &[u32], sep: char, depth: u32) -> Option<String> {
        let name = self.string(self.cell(TYPE_DEF, rid, 1)?)?;
        let outer = enclosing.get(rid as usize - 1).copied().unwrap_or(0);
        if outer != 0 && outer != rid && depth < 16 {
            let outer = self.type_def_name(outer, enclosing, sep, depth + 1)?;
            return Some(format!("{outer}{sep}{name}"));
        }
        let ns = self.string(self.cell(TYPE_DEF, rid, 2)?)?;
        Some(if ns.is_empty() {
            name.to_string()
        } else {
            format!("{ns}.{name}")
        })
    }

    fn type_ref_name(&self, rid: u32, style: Style, depth: u32) -> Option<String> {
        let scope = self.cell(TYPE_REF, rid, 0)?;
        let name = self.string(self.cell(TYPE_REF, rid, 1)?)?;
        let ns = self.string(self.cell(TYPE_REF, rid, 2)?)?;
        let (tag, row) = (scope & 3, scope >> 2);
        if tag == 3 && depth < 16 {
            // Nested in another TypeRef.
            let outer = self.type_ref_name(row, style, depth + 1)?;
            return Some(format!("{outer}{}{name}", style.nested()));
        }
        let full = if ns.is_empty() {
            name.to_string()
        } else {
            format!("{ns}.{name}")
        };
        if tag == 2
            && style == Style::Il
            && let Some(asm) = self.cell(ASSEMBLY_REF, row, 6).and_then(|i| self.string(i))
        {
            return Some(format!("[{asm}]{full}"));
        }
        Some(full)
    }

    /// The name of method `rid` as CoreCLR writes it in perf maps, without the return type:
    /// `Namespace.Type::Method(params)`.
    pub fn method_name(&self, rid: u32, owners: &[u32], enclosing: &[u32]) -> Option<String> {
        let owner = *owners.get((rid as usize).checked_sub(1)?)?;
        let ty = if owner == 0 {
            String::new()
        } else {
            self.type_def_name(owner, enclosing, '+', 0)?
        };
        Some(format!("{ty}::{}", self.method_tail(rid, enclosing)?))
    }

    /// `Method(params)` of method `rid`: its name and formal parameter list.
    pub fn method_tail(&self, rid: u32, enclosing: &[u32]) -> Option<String> {
        let name = self.string(self.cell(METHOD_DEF, rid, 3)?)?;
        let sig = self.blob(self.cell(METHOD_DEF, rid, 4)?)?;
        let params = self.method_params(sig, enclosing)?;
        Some(format!("{name}({params})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_fits_the_column_widths() {
        let most = (0..TABLES).map(|t| schema(t).len()).max();
        assert_eq!(most, Some(MAX_COLUMNS));
    }

    #[test]
    fn nested_type_specs_cannot_make_a_name_explode() {
        // TypeSpec k (1..=15): GENERICINST object<TypeSpec k+1, ×4>; TypeSpec 16: object. In
        // full, TypeSpec 1's name would have 4^15 parts.
        let (mut data, mut blobs) = (Vec::new(), vec![0u8]);
        for k in 1..=16u8 {
            data.extend_from_slice(&(blobs.len() as u16).to_le_bytes());
            let mut sig = vec![0x1C];
            if k < 16 {
                sig = vec![0x15, 0x1C, 4];
                for _ in 0..4 {
                    sig.extend_from_slice(&[0x12, (k + 1) << 2 | 2]);
                }
            }
            blobs.push(sig.len() as u8);
            blobs.extend_from_slice(&sig);
        }
        let mut tables = [Table::default(); TABLES];
        let mut widths = [0; MAX_COLUMNS];
        widths[0] = 2;
        tables[TYPE_SPEC] = Table {
            rows: 16,
            start: 0,
            row_size: 2,
            widths,
        };
        let md = Metadata {
            data: &data,
            strings: &[],
            blobs: &blobs,
            tables,
            assembly_name: None,
        };
        let name = |row: u8| {
            let mut out = String::new();
            let sig = [0x12, row << 2 | 2];
            md.sig_type(&mut SigReader::new(&sig), &mut out, &[], Style::Il, 0)
                .map(|()| out)
        };
        assert_eq!(
            name(15).as_deref(),
            Some("class object<class object,class object,class object,class object>")
        );
        assert_eq!(name(1), None);
    }

    #[test]
    fn garbage_is_an_error_with_a_position() {
        assert_eq!(Metadata::parse(b"nope").unwrap_err().offset, 0);
        let mut root = b"BSJB".to_vec();
        root.extend_from_slice(&[1, 0, 1, 0, 0, 0, 0, 0]);
        root.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Metadata::parse(&root).is_err());
    }
}
