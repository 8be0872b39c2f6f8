//! The legacy binary CPU profile of gperftools and of Go before 1.9, which `go tool pprof` still
//! reads: machine words (32 or 64 bits, either byte order) `0, 3, 0, period_µs, 0`, then records
//! `count, depth, pc…` (leaf first), an end record `0, 1, 0`, then the text of `/proc/self/maps`.
//!
//! Reading follows pprof's own reader so both give the same stacks: return addresses (every pc but
//! the leaf) are moved back by one byte onto their call instruction; a leaf duplicated by the signal
//! handler (the next pc equals the leaf plus one) is dropped; and a second-from-leaf address shared
//! by nearly all samples (all but one in 32) is the signal handler's own frame and is removed, at
//! most twice. Addresses get no names (these files carry no symbols): each frame is named `0x…` and
//! placed in the executable mapping of the maps text that holds it.

use std::collections::HashMap;

use rootline_profile::{
    Frame, FrameKind, Function, Mapping, MappingId, Profile, SampleType, TruncateReason,
};

use crate::error::{FormatError, Position};

/// True when `bytes` start with the legacy CPU profile header in any word size and byte order.
pub(super) fn is_legacy(bytes: &[u8]) -> bool {
    WORDS.iter().any(|&w| header(bytes, w).is_some())
}

/// Word size in bytes and byte order.
#[derive(Clone, Copy)]
struct Word {
    size: usize,
    big_endian: bool,
}

const WORDS: [Word; 4] = [
    Word {
        size: 4,
        big_endian: false,
    },
    Word {
        size: 4,
        big_endian: true,
    },
    Word {
        size: 8,
        big_endian: false,
    },
    Word {
        size: 8,
        big_endian: true,
    },
];

fn word(bytes: &[u8], at: usize, w: Word) -> Option<u64> {
    let b = bytes.get(at..at.checked_add(w.size)?)?;
    let mut v = 0u64;
    if w.big_endian {
        for &x in b {
            v = (v << 8) | u64::from(x);
        }
    } else {
        for &x in b.iter().rev() {
            v = (v << 8) | u64::from(x);
        }
    }
    Some(v)
}

/// The sampling period in microseconds, when the header matches word format `w`.
fn header(bytes: &[u8], w: Word) -> Option<u64> {
    let h: Vec<u64> = (0..5)
        .map(|i| word(bytes, i * w.size, w))
        .collect::<Option<_>>()?;
    (h[0] == 0 && h[1] == 3 && h[2] == 0 && h[3] > 0 && h[4] == 0).then_some(h[3])
}

fn invalid(at: usize, message: impl Into<String>) -> FormatError {
    FormatError::invalid(Position::Byte(at as u64), message)
}

/// Reads a legacy CPU profile.
pub(super) fn read(bytes: &[u8]) -> Result<Profile, FormatError> {
    let (w, period_us) = WORDS
        .iter()
        .find_map(|&w| header(bytes, w).map(|p| (w, p)))
        .ok_or_else(|| invalid(0, "not a legacy CPU profile header"))?;
    let period_ns = i64::try_from(period_us)
        .ok()
        .and_then(|p| p.checked_mul(1000))
        .ok_or_else(|| invalid(3 * w.size, "the sampling period is too large"))?;

    let mut stacks: Vec<(i64, Vec<u64>)> = Vec::new();
    let mut at = 5 * w.size;
    let short = |at: usize| invalid(at, "a sample record is cut short");
    while at < bytes.len() {
        let start = at;
        let count = word(bytes, at, w).ok_or_else(|| short(start))?;
        let depth = word(bytes, at + w.size, w).ok_or_else(|| short(start))?;
        at += 2 * w.size;
        let remaining = (bytes.len() - at) / w.size;
        let depth = usize::try_from(depth)
            .ok()
            .filter(|&d| d <= remaining)
            .ok_or_else(|| {
                invalid(
                    start,
                    format!("a sample claims {depth} addresses but only {remaining} words remain"),
                )
            })?;
        let mut pcs = Vec::with_capacity(depth);
        for i in 0..depth {
            let pc = word(bytes, at, w).ok_or_else(|| short(start))?;
            at += w.size;
            pcs.push(if i > 0 { pc.wrapping_sub(1) } else { pc });
        }
        if count == 0 && depth == 1 && pcs[0] == 0 {
            break; // end of samples; the maps text follows
        }
        let count = i64::try_from(count)
            .ok()
            .filter(|c| c.checked_mul(period_ns).is_some())
            .ok_or_else(|| invalid(start, format!("the sample count {count} is too large")))?;
        stacks.push((count, pcs));
    }
    strip_signal_frames(&mut stacks);
    for (_, pcs) in &mut stacks {
        if pcs.len() > 1 && pcs[0] == pcs[1].wrapping_add(1) {
            pcs.remove(1);
        }
    }

    let mut profile = Profile::new(vec![SampleType::samples(), SampleType::cpu_nanoseconds()]);
    let meta = &mut profile.metadata;
    meta.producer = "legacy CPU profile".into();
    meta.sample_rate_hz = u32::try_from(1_000_000 / period_us)
        .ok()
        .filter(|&hz| hz > 0);
    meta.extra
        .insert("pprof.period_type".into(), "cpu/nanoseconds".into());
    meta.extra
        .insert("pprof.period".into(), period_ns.to_string());
    let maps = String::from_utf8_lossy(&bytes[at.min(bytes.len())..]);
    let mappings = executable_mappings(&mut profile, &maps);
    let thread = profile.intern_thread(0, 0);
    let mut frames: HashMap<u64, rootline_profile::FrameId> = HashMap::new();
    for (count, pcs) in stacks {
        let mut parent = None;
        for &pc in pcs.iter().rev() {
            let frame = *frames.entry(pc).or_insert_with(|| {
                let name = profile.intern_string(&format!("0x{pc:x}"));
                let function = profile.intern_function(Function::new(name, None));
                let mapping = mappings
                    .iter()
                    .find(|(start, end, _)| (*start..*end).contains(&pc))
                    .map(|&(_, _, id)| id);
                profile.intern_frame(Frame {
                    function,
                    mapping,
                    address: pc,
                    line: None,
                    inline_depth: 0,
                    kind: FrameKind::Native,
                    from_live_memory: false,
                })
            });
            parent = Some(profile.intern_stack(parent, frame));
        }
        let stack = match parent {
            Some(stack) => stack,
            None => {
                let marker = profile.intern_truncated(TruncateReason::NoStackInInput);
                profile.intern_stack(None, marker)
            }
        };
        profile
            .push_sample(0, thread, stack, &[count, count * period_ns])
            .map_err(|e| invalid(0, e.to_string()))?;
    }
    Ok(profile)
}

/// Removes the signal handler's frame: a second-from-leaf address found in all samples but one in
/// 32 (checked twice, as pprof does).
fn strip_signal_frames(stacks: &mut [(i64, Vec<u64>)]) {
    let margin = stacks.len() / 32;
    for _ in 0..2 {
        let mut seen: HashMap<u64, usize> = HashMap::new();
        for (_, pcs) in stacks.iter() {
            if pcs.len() > 1 {
                *seen.entry(pcs[1]).or_default() += 1;
            }
        }
        let Some((&pc, _)) = seen
            .iter()
            .filter(|&(_, &n)| n >= stacks.len() - margin)
            .min_by_key(|&(&pc, _)| pc)
        else {
            continue;
        };
        for (_, pcs) in stacks.iter_mut() {
            if pcs.len() > 1 && pcs[1] == pc {
                pcs.remove(1);
            }
        }
    }
}

/// The executable mappings of `/proc/self/maps` text: `(start, end, id)`.
fn executable_mappings(profile: &mut Profile, maps: &str) -> Vec<(u64, u64, MappingId)> {
    let mut out = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms), Some(offset)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let hex = |s: &str| u64::from_str_radix(s, 16).ok();
        let (Some(start), Some(end), Some(offset)) = (hex(start), hex(end), hex(offset)) else {
            continue;
        };
        if !perms.contains('x') {
            continue;
        }
        let path = fields.nth(2).unwrap_or("");
        let path = profile.intern_string(path);
        let id = profile.intern_mapping(Mapping {
            start,
            end,
            file_offset: offset,
            path,
            build_id: None,
        });
        out.push((start, end, id));
    }
    out
}
