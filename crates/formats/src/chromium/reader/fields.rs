//! The keys of a trace event the reader looks at, and reading their values.

use std::io::Read;

use super::super::scan::{Kind, Scanner};
use crate::error::{FormatError, Position};

/// The keys the reader looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Field {
    Ph,
    Name,
    Cat,
    Ts,
    Dur,
    Tdur,
    Weight,
    Pid,
    Tid,
    Sf,
    Args,
    Producer,
    DepthCap,
    TsUnit,
    Other,
}

impl Field {
    /// The field a key names. Keys are compared as packed integers: a match on byte strings costs
    /// a `memcmp` call per candidate, and this runs for every key of every event.
    pub(super) fn of(key: &[u8]) -> Field {
        const fn pack(key: &[u8]) -> u64 {
            let mut v = 0u64;
            let mut i = 0;
            while i < key.len() {
                v |= (key[i] as u64) << (8 * i);
                i += 1;
            }
            v
        }
        const PH: u64 = pack(b"ph");
        const NAME: u64 = pack(b"name");
        const CAT: u64 = pack(b"cat");
        const TS: u64 = pack(b"ts");
        const DUR: u64 = pack(b"dur");
        const TDUR: u64 = pack(b"tdur");
        const WEIGHT: u64 = pack(b"weight");
        const PID: u64 = pack(b"pid");
        const TID: u64 = pack(b"tid");
        const SF: u64 = pack(b"sf");
        const ARGS: u64 = pack(b"args");
        const PRODUCER: u64 = pack(b"producer");
        const DEPTH_CAP: u64 = pack(b"depthCap");
        const TS_UNIT: u64 = pack(b"tsUnit");
        if key.is_empty() || key.len() > 8 {
            return Field::Other;
        }
        match pack(key) {
            PH => Field::Ph,
            NAME => Field::Name,
            CAT => Field::Cat,
            TS => Field::Ts,
            DUR => Field::Dur,
            TDUR => Field::Tdur,
            WEIGHT => Field::Weight,
            PID => Field::Pid,
            TID => Field::Tid,
            SF => Field::Sf,
            ARGS => Field::Args,
            PRODUCER => Field::Producer,
            DEPTH_CAP => Field::DepthCap,
            TS_UNIT => Field::TsUnit,
            _ => Field::Other,
        }
    }
}

pub(super) fn id_value<R: Read>(sc: &mut Scanner<R>, what: &str) -> Result<u32, FormatError> {
    let at = sc.offset();
    let d = sc.number_or_numeric_string(what)?;
    let v = d.integer().ok_or_else(|| {
        FormatError::invalid(Position::Byte(at), format!("{what} must be an integer"))
    })?;
    // Negative ids (e.g. `"tid": "-1"` on process metadata) keep their 32-bit pattern.
    if let Ok(v) = u32::try_from(v) {
        Ok(v)
    } else if let Ok(v) = i32::try_from(v) {
        Ok(v as u32)
    } else {
        Err(FormatError::invalid(
            Position::Byte(at),
            format!("{what} {v} is out of the 32-bit range"),
        ))
    }
}

/// Reads an `sf`/`parent` reference (number or string) as its canonical text into `out`.
pub(super) fn sf_value<R: Read>(sc: &mut Scanner<R>, out: &mut String) -> Result<(), FormatError> {
    out.clear();
    match sc.kind()? {
        Kind::String => {
            sc.string()?;
            out.push_str(sc.text_str());
        }
        Kind::Number => {
            let at = sc.offset();
            let v = sc.number()?.integer().ok_or_else(|| {
                FormatError::invalid(Position::Byte(at), "a stack frame id must be an integer")
            })?;
            out.push_str(itoa::Buffer::new().format(v));
        }
        _ => return Err(sc.error("a stack frame id must be a number or a string")),
    }
    Ok(())
}

pub(super) fn string_field<R: Read>(sc: &mut Scanner<R>, what: &str) -> Result<(), FormatError> {
    if sc.kind()? != Kind::String {
        return Err(sc.error(format!("{what} must be a string")));
    }
    sc.string()
}
