//! Event metadata records: which provider and event an event id stands for, and its payload fields.

use super::bytes::{Bytes, Result};

/// Nesting limit for `Object` fields; deeper descriptions are rejected as malformed.
const MAX_FIELD_DEPTH: u32 = 16;

/// One payload field as the metadata describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldInfo {
    /// Field name.
    pub name: String,
    /// `System.TypeCode`-style type code (9 = Int32, 18 = UTF-16 string, 19 = array, 1 = object, …).
    pub type_code: u32,
    /// Element type code for arrays.
    pub element_type: Option<u32>,
    /// Nested fields for objects.
    pub fields: Vec<FieldInfo>,
}

/// The description of one kind of event: provider, id, name, version and payload fields.
///
/// Runtime events written by native code (`Microsoft-Windows-DotNETRuntime*`) carry an empty name and
/// no fields; their payloads are known by `(provider, event_id, version)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventMetadata {
    /// The metadata id events refer to.
    pub id: u32,
    /// Provider name, e.g. `Microsoft-DotNETCore-SampleProfiler`.
    pub provider: String,
    /// Event id within the provider.
    pub event_id: u32,
    /// Event name (often empty for runtime events).
    pub name: String,
    /// Keywords the event belongs to.
    pub keywords: u64,
    /// Event version.
    pub version: u32,
    /// Event level (1 critical … 5 verbose).
    pub level: u32,
    /// Opcode, when the metadata names one (format V5+).
    pub opcode: Option<u8>,
    /// Payload fields (V2 fields when the metadata has them, else V1 fields).
    pub fields: Vec<FieldInfo>,
}

/// Parses a format V4/V5 metadata payload (the payload of an event in a MetadataBlock).
pub(crate) fn parse_v5(b: &mut Bytes<'_>) -> Result<EventMetadata> {
    let mut m = EventMetadata {
        id: b.u32("metadata id")?,
        provider: b.utf16z("metadata provider name")?,
        ..EventMetadata::default()
    };
    if b.is_empty() {
        // Some early writers end the record after the provider for events without a description.
        return Ok(m);
    }
    m.event_id = b.u32("metadata event id")?;
    m.name = b.utf16z("metadata event name")?;
    m.keywords = b.u64("metadata keywords")?;
    m.version = b.u32("metadata version")?;
    m.level = b.u32("metadata level")?;
    if b.is_empty() {
        return Ok(m);
    }
    let count = b.u32("metadata field count")?;
    m.fields = fields_v1(b, count, 0)?;
    // Format V5: optional tags follow the V1 fields.
    while b.remaining() >= 5 {
        let size = b.u32("metadata tag size")? as usize;
        let kind = b.u8("metadata tag kind")?;
        let payload = b.take(size, "metadata tag payload")?;
        let mut t = Bytes::new(payload, b.offset() - size as u64);
        match kind {
            1 => m.opcode = Some(t.u8("metadata opcode")?),
            2 => {
                let count = t.u32("V2 field count")?;
                m.fields = fields_v2(&mut t, count, 0)?;
            }
            _ => {}
        }
    }
    Ok(m)
}

fn fields_v1(b: &mut Bytes<'_>, count: u32, depth: u32) -> Result<Vec<FieldInfo>> {
    if depth > MAX_FIELD_DEPTH {
        return Err(b.malformed("metadata fields nest too deep"));
    }
    let mut fields = Vec::new();
    for _ in 0..count {
        let type_code = b.u32("field type code")?;
        let nested = if type_code == 1 {
            let n = b.u32("object field count")?;
            fields_v1(b, n, depth + 1)?
        } else {
            Vec::new()
        };
        let name = b.utf16z("field name")?;
        fields.push(FieldInfo {
            name,
            type_code,
            element_type: None,
            fields: nested,
        });
    }
    Ok(fields)
}

fn fields_v2(b: &mut Bytes<'_>, count: u32, depth: u32) -> Result<Vec<FieldInfo>> {
    if depth > MAX_FIELD_DEPTH {
        return Err(b.malformed("metadata fields nest too deep"));
    }
    let mut fields = Vec::new();
    for _ in 0..count {
        let base = b.offset();
        let size = b.u32("V2 field size")? as usize;
        if size < 4 {
            return Err(b.malformed(format!("V2 field size {size} is below 4")));
        }
        let body = b.take(size - 4, "V2 field")?;
        let mut f = Bytes::new(body, base + 4);
        let name = f.utf16z("V2 field name")?;
        let type_code = f.u32("V2 field type code")?;
        let element_type = if type_code == 19 {
            Some(f.u32("V2 array element type")?)
        } else {
            None
        };
        let object_code = element_type.unwrap_or(type_code);
        let nested = if object_code == 1 {
            let n = f.u32("V2 object field count")?;
            fields_v2(&mut f, n, depth + 1)?
        } else {
            Vec::new()
        };
        fields.push(FieldInfo {
            name,
            type_code,
            element_type,
            fields: nested,
        });
    }
    Ok(fields)
}

/// Parses one format V6 metadata row (after its `Size` field).
pub(crate) fn parse_v6(b: &mut Bytes<'_>) -> Result<EventMetadata> {
    let mut m = EventMetadata {
        id: b.varuint32("metadata id")?,
        provider: b.utf8_varlen("metadata provider name")?,
        event_id: b.varuint32("metadata event id")?,
        name: b.utf8_varlen("metadata event name")?,
        ..EventMetadata::default()
    };
    m.fields = fields_v6(b, 0)?;
    let size = b.u16("optional metadata size")? as usize;
    let opt = b.take(size, "optional metadata")?;
    let mut o = Bytes::new(opt, b.offset() - size as u64);
    while !o.is_empty() {
        match o.u8("optional metadata kind")? {
            1 => m.opcode = Some(o.u8("opcode")?),
            3 => m.keywords = o.u64("keywords")?,
            4 | 5 => {
                o.utf8_varlen("message template or description")?;
            }
            6 => {
                o.utf8_varlen("key")?;
                o.utf8_varlen("value")?;
            }
            7 => {
                o.guid("provider guid")?;
            }
            8 => m.level = u32::from(o.u8("level")?),
            9 => m.version = u32::from(o.u8("version")?),
            k => return Err(o.malformed(format!("unknown optional metadata kind {k}"))),
        }
    }
    Ok(m)
}

fn fields_v6(b: &mut Bytes<'_>, depth: u32) -> Result<Vec<FieldInfo>> {
    if depth > MAX_FIELD_DEPTH {
        return Err(b.malformed("metadata fields nest too deep"));
    }
    let count = b.u16("field count")?;
    let mut fields = Vec::new();
    for _ in 0..count {
        let size = b.u16("field size")? as usize;
        let body = b.take(size, "field description")?;
        let mut f = Bytes::new(body, b.offset() - size as u64);
        let name = f.utf8_varlen("field name")?;
        let (type_code, element_type, nested) = type_v6(&mut f, depth)?;
        fields.push(FieldInfo {
            name,
            type_code,
            element_type,
            fields: nested,
        });
    }
    Ok(fields)
}

type TypeV6 = (u32, Option<u32>, Vec<FieldInfo>);

fn type_v6(f: &mut Bytes<'_>, depth: u32) -> Result<TypeV6> {
    if depth > MAX_FIELD_DEPTH {
        return Err(f.malformed("metadata types nest too deep"));
    }
    let code = u32::from(f.u8("type code")?);
    match code {
        1 => Ok((code, None, fields_v6(f, depth + 1)?)),
        19 | 22 | 24 | 25 => {
            let (element, _, nested) = type_v6(f, depth + 1)?;
            if code == 22 {
                f.u16("fixed array length")?;
            }
            Ok((code, Some(element), nested))
        }
        _ => Ok((code, None, Vec::new())),
    }
}
