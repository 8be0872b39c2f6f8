//! Signatures (Partition II §23.2): compressed integers, method signatures and types, spelled
//! the way CoreCLR spells them in perf maps ([`Style`]).

use super::{Metadata, TYPE_SPEC};

/// The longest type name spelled (bytes): TypeSpecs nest, so a few damaged rows could otherwise
/// ask for a name with billions of parts.
const MAX_TYPE_NAME: usize = 1 << 16;

impl Metadata<'_> {
    /// The parameter list of a MethodDefSig.
    pub(super) fn method_params(&self, sig: &[u8], enclosing: &[u32]) -> Option<String> {
        let mut r = SigReader { b: sig, at: 0 };
        let conv = r.byte()?;
        if conv & 0x10 != 0 {
            r.compressed()?; // Generic parameter count.
        }
        let count = r.compressed()?;
        let mut out = String::new();
        self.sig_type(&mut r, &mut String::new(), enclosing, Style::Il, 0)?; // Return type.
        for i in 0..count {
            if i > 0 {
                out.push(',');
            }
            self.sig_type(&mut r, &mut out, enclosing, Style::Il, 0)?;
        }
        Some(out)
    }

    /// Appends one type of a signature to `out`, spelled in `style`. Also reads the
    /// ReadyToRun extensions: `System.__Canon` (0x3E); a type of another module (0x3F) has no
    /// name here. None past 32 levels of nesting or [`MAX_TYPE_NAME`] bytes of `out`.
    pub(crate) fn sig_type(
        &self,
        r: &mut SigReader<'_>,
        out: &mut String,
        enclosing: &[u32],
        style: Style,
        depth: u32,
    ) -> Option<()> {
        if depth > 32 || out.len() > MAX_TYPE_NAME {
            return None;
        }
        let et = r.byte()?;
        if style == Style::Reflection
            && let Some(name) = reflection_primitive(et)
        {
            out.push_str(name);
            return Some(());
        }
        let simple = match et {
            0x01 => Some("void"),
            0x02 => Some("bool"),
            0x03 => Some("char"),
            0x04 => Some("int8"),
            0x05 => Some("uint8"),
            0x06 => Some("int16"),
            0x07 => Some("uint16"),
            0x08 => Some("int32"),
            0x09 => Some("uint32"),
            0x0A => Some("int64"),
            0x0B => Some("uint64"),
            0x0C => Some("float32"),
            0x0D => Some("float64"),
            0x0E => Some("string"),
            0x16 => Some("typedbyref"),
            0x18 => Some("native int"),
            0x19 => Some("native uint"),
            0x1C => Some("object"),
            0x3E => Some("System.__Canon"),
            _ => None,
        };
        if let Some(s) = simple {
            out.push_str(s);
            return Some(());
        }
        match et {
            // PTR, BYREF
            0x0F | 0x10 => {
                self.sig_type(r, out, enclosing, style, depth + 1)?;
                out.push(if et == 0x0F { '*' } else { '&' });
            }
            // VALUETYPE, CLASS
            0x11 | 0x12 => {
                if style == Style::Il {
                    out.push_str(if et == 0x11 { "valuetype " } else { "class " });
                }
                let coded = r.compressed()?;
                self.type_def_or_ref(coded, out, enclosing, style, depth)?;
            }
            // VAR, MVAR
            0x13 | 0x1E => {
                let n = r.compressed()?;
                out.push_str(if et == 0x13 { "!" } else { "!!" });
                out.push_str(&n.to_string());
            }
            // ARRAY: type rank numsizes sizes… numlobounds lobounds…
            0x14 => {
                self.sig_type(r, out, enclosing, style, depth + 1)?;
                let rank = r.compressed()?;
                for _ in 0..r.compressed()? {
                    r.compressed()?;
                }
                for _ in 0..r.compressed()? {
                    r.compressed()?;
                }
                out.push('[');
                for _ in 1..rank.min(32) {
                    out.push(',');
                }
                out.push(']');
            }
            // GENERICINST (CLASS|VALUETYPE) type count args…
            0x15 => {
                // The generic type itself, without its `class`/`valuetype` keyword in
                // reflection style.
                self.sig_type(r, out, enclosing, style, depth + 1)?;
                let (open, close) = match style {
                    Style::Il => ('<', '>'),
                    Style::Reflection => ('[', ']'),
                };
                out.push(open);
                let n = r.compressed()?;
                for i in 0..n {
                    if i > 0 {
                        out.push(',');
                    }
                    self.sig_type(r, out, enclosing, style, depth + 1)?;
                }
                out.push(close);
            }
            // FNPTR: a method signature.
            0x1B => {
                let conv = r.byte()?;
                if conv & 0x10 != 0 {
                    r.compressed()?;
                }
                let n = r.compressed()?;
                let mut ret = String::new();
                self.sig_type(r, &mut ret, enclosing, style, depth + 1)?;
                out.push_str("method ");
                out.push_str(&ret);
                out.push_str(" *(");
                for i in 0..n {
                    if i > 0 {
                        out.push(',');
                    }
                    self.sig_type(r, out, enclosing, style, depth + 1)?;
                }
                out.push(')');
            }
            // SZARRAY
            0x1D => {
                self.sig_type(r, out, enclosing, style, depth + 1)?;
                out.push_str("[]");
            }
            // CMOD_REQD, CMOD_OPT: a type token, then the modified type.
            0x1F | 0x20 => {
                r.compressed()?;
                self.sig_type(r, out, enclosing, style, depth + 1)?;
            }
            // PINNED, SENTINEL: a prefix.
            0x45 | 0x41 => self.sig_type(r, out, enclosing, style, depth + 1)?,
            _ => return None,
        }
        Some(())
    }

    /// Appends the name of a TypeDefOrRefOrSpec coded index in a signature to `out` (a
    /// TypeSpec's into the same `out`, so that [`MAX_TYPE_NAME`] bounds the whole name).
    fn type_def_or_ref(
        &self,
        coded: u32,
        out: &mut String,
        enclosing: &[u32],
        style: Style,
        depth: u32,
    ) -> Option<()> {
        let row = coded >> 2;
        match coded & 3 {
            0 => out.push_str(&self.type_def_name(row, enclosing, style.nested(), 0)?),
            1 => out.push_str(&self.type_ref_name(row, style, 0)?),
            2 => {
                let sig = self.blob(self.cell(TYPE_SPEC, row, 0)?)?;
                let mut r = SigReader::new(sig);
                self.sig_type(&mut r, out, enclosing, style, depth + 1)?;
            }
            _ => return None,
        }
        Some(())
    }
}

/// How types are spelled: as in IL signatures (`int32`, `class System.String`,
/// ``valuetype System.Span`1<char>``, nested `Outer/Inner`), which CoreCLR's perf maps use for
/// parameters, or as reflection names (`System.Int32`,
/// ``System.Collections.Generic.List`1[System.__Canon]``, nested `Outer+Inner`), which they use
/// for the instantiated type a method belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    /// IL signature spelling.
    Il,
    /// Reflection spelling.
    Reflection,
}

impl Style {
    pub(super) fn nested(self) -> char {
        match self {
            Style::Il => '/',
            Style::Reflection => '+',
        }
    }
}

/// The reflection name of a primitive element type.
fn reflection_primitive(et: u8) -> Option<&'static str> {
    Some(match et {
        0x01 => "System.Void",
        0x02 => "System.Boolean",
        0x03 => "System.Char",
        0x04 => "System.SByte",
        0x05 => "System.Byte",
        0x06 => "System.Int16",
        0x07 => "System.UInt16",
        0x08 => "System.Int32",
        0x09 => "System.UInt32",
        0x0A => "System.Int64",
        0x0B => "System.UInt64",
        0x0C => "System.Single",
        0x0D => "System.Double",
        0x0E => "System.String",
        0x16 => "System.TypedReference",
        0x18 => "System.IntPtr",
        0x19 => "System.UIntPtr",
        0x1C => "System.Object",
        0x3E => "System.__Canon",
        _ => return None,
    })
}

/// Reads a signature blob.
pub(crate) struct SigReader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> SigReader<'a> {
    /// A reader at the start of `b`.
    pub(crate) fn new(b: &'a [u8]) -> SigReader<'a> {
        SigReader { b, at: 0 }
    }

    /// Bytes read so far.
    pub(crate) fn position(&self) -> usize {
        self.at
    }

    pub(crate) fn byte(&mut self) -> Option<u8> {
        let v = *self.b.get(self.at)?;
        self.at += 1;
        Some(v)
    }

    /// A compressed unsigned integer (Partition II §23.2).
    pub(crate) fn compressed(&mut self) -> Option<u32> {
        let b0 = u32::from(self.byte()?);
        if b0 & 0x80 == 0 {
            Some(b0)
        } else if b0 & 0xC0 == 0x80 {
            Some((b0 & 0x3F) << 8 | u32::from(self.byte()?))
        } else if b0 & 0xE0 == 0xC0 {
            let (b1, b2, b3) = (self.byte()?, self.byte()?, self.byte()?);
            Some((b0 & 0x1F) << 24 | u32::from(b1) << 16 | u32::from(b2) << 8 | u32::from(b3))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressed_integers() {
        let read = |b: &[u8]| SigReader { b, at: 0 }.compressed();
        assert_eq!(read(&[0x03]), Some(3));
        assert_eq!(read(&[0x80, 0x80]), Some(0x80));
        assert_eq!(read(&[0xBF, 0xFF]), Some(0x3FFF));
        assert_eq!(read(&[0xC0, 0x00, 0x40, 0x00]), Some(0x4000));
        assert_eq!(read(&[0xDF, 0xFF, 0xFF, 0xFF]), Some(0x1FFF_FFFF));
        assert_eq!(read(&[0xE0]), None);
        assert_eq!(read(&[0x80]), None);
    }
}
