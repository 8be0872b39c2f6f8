//! Naming frames in code without a file image (JIT code, .NET images) through their process's
//! JIT maps, at the moment a frame is first seen: the maps change as code is compiled and freed.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::jit::{JitMaps, JitName};

use super::raw::{RawFrame, RawKind, RawTables};

/// The JIT map name of each of `frames` that lies in code without a file image (None for the
/// others, and for addresses no map names). A JVM that does not name code yet is asked again,
/// waiting until `deadline` at most; each JIT frame left unnamed is counted in `unnamed` by why.
pub(crate) fn jit_names(
    jit: &mut JitMaps,
    tables: &RawTables,
    frames: &[RawFrame],
    deadline: Instant,
    unnamed: &mut BTreeMap<String, u64>,
) -> Vec<Option<JitName>> {
    frames
        .iter()
        .map(|&f| jit_name(jit, tables, f, deadline, unnamed))
        .collect()
}

fn jit_name(
    jit: &mut JitMaps,
    tables: &RawTables,
    frame: RawFrame,
    deadline: Instant,
    unnamed: &mut BTreeMap<String, u64>,
) -> Option<JitName> {
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
    let jit = jit.process(mapping.pid);
    let name = jit.symbol_or_ask(lookup, deadline).map(|s| s.name.clone());
    if name.is_none() {
        *unnamed.entry(jit.unnamed_reason()).or_default() += 1;
    }
    name
}
