//! Naming frames in code without a file image (JIT code, .NET images) through their process's
//! JIT maps, at the moment a frame is first seen: the maps change as code is compiled and freed.

use crate::jit::{JitMaps, JitName};

use super::raw::{RawFrame, RawKind, RawTables};

/// The JIT map name of each of `frames` that lies in code without a file image (None for the
/// others, and for addresses no map names).
pub(crate) fn jit_names(
    jit: &mut JitMaps,
    tables: &RawTables,
    frames: &[RawFrame],
) -> Vec<Option<JitName>> {
    frames.iter().map(|&f| jit_name(jit, tables, f)).collect()
}

fn jit_name(jit: &mut JitMaps, tables: &RawTables, frame: RawFrame) -> Option<JitName> {
    let RawKind::User(m, is_return) = frame.kind else {
        return None;
    };
    let mapping = tables.mapping(m);
    if mapping.binary.module.is_some() {
        return None;
    }
    let lookup = if is_return {
        frame.address - 1
    } else {
        frame.address
    };
    jit.process(mapping.pid)
        .symbol(lookup)
        .map(|s| s.name.clone())
}
