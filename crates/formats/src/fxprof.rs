//! The Firefox Profiler's processed profile format (`.fxprof.json`, gzipped `.fxprof.json.gz`),
//! written with `fxprof-processed-profile`, the writer samply uses. Write only; the files load in
//! `profiler.firefox.com` (Load a profile from file) and in its `profiler-cli`.
//!
//! Each rootline process becomes a process and each thread a thread; the thread whose tid is its
//! pid is the process's main thread and, as the profiler shows main threads, takes the process's
//! name. Frames are labels (already symbolicated) in a category per
//! [`FrameKind`]: Native, Kernel, JIT, Managed, Truncated, and Other for producer pseudo-frames;
//! JIT and managed frames are flagged as script frames so the profiler's "JavaScript" filter
//! shows only them. A frame with a code tier (`QuickJitted`, `OptimizedTier1OSR`, …) is in its
//! category's subcategory of that name, which the profiler shows in the frame's tooltip and
//! sidebar.
//!
//! **Weights**: a count column (`samples`, or unit `count`) gives each sample its count; else a
//! `bytes` column gives byte weights; else a nanosecond column is divided by the greatest common
//! divisor of its values, which becomes the sampling interval (so weight × interval is the time
//! exactly). A `cpu` nanosecond column next to the weight becomes the samples' CPU deltas. Weights
//! beyond 32 bits are split over several samples at the same time.

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use flate2::Compression;
use flate2::write::GzEncoder;
use fxprof_processed_profile::{
    CategoryColor, CategoryHandle, CategoryPairHandle, CpuDelta, Frame, FrameFlags, FrameInfo,
    ProcessHandle, Profile as FxProfile, ReferenceTimestamp, SamplingInterval, StackHandle,
    ThreadHandle, Timestamp, WeightType,
};
use rootline_profile::{FrameId, FrameKind, Profile, StackId, StringId, ThreadId};

use crate::error::FormatError;

/// Start times at or after this many nanoseconds are taken as Unix time (2001-09-09), earlier ones
/// as a monotonic clock with no known date.
const UNIX_TIME_FLOOR_NS: u64 = 1_000_000_000_000_000_000;

/// Writes `profile` as Firefox Profiler processed-profile JSON.
pub fn write(profile: &Profile, writer: impl Write) -> Result<(), FormatError> {
    let fx = convert(profile);
    let mut w = std::io::BufWriter::new(writer);
    serde_json::to_writer(&mut w, &fx).map_err(|e| FormatError::Io(e.into()))?;
    w.flush()?;
    Ok(())
}

/// Writes `profile` as gzipped Firefox Profiler processed-profile JSON.
pub fn write_gz(profile: &Profile, writer: impl Write) -> Result<(), FormatError> {
    let mut encoder = GzEncoder::new(writer, Compression::default());
    write(profile, &mut encoder)?;
    encoder.finish()?.flush()?;
    Ok(())
}

/// Which value column weighs the samples and how.
struct Weights {
    /// The column, or `None` when each sample counts 1.
    column: Option<usize>,
    /// Values are divided by this (nanosecond columns: the gcd of the values).
    divisor: i64,
    /// Byte weights rather than sample counts.
    bytes: bool,
    /// The declared sampling interval.
    interval: SamplingInterval,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

fn choose_weights(profile: &Profile) -> Weights {
    let types = profile.sample_types();
    let interval = profile
        .metadata
        .sample_rate_hz
        .filter(|&hz| hz > 0)
        .map_or(SamplingInterval::from_millis(1), |hz| {
            SamplingInterval::from_nanos(1_000_000_000 / u64::from(hz))
        });
    let plain = |column, bytes| Weights {
        column,
        divisor: 1,
        bytes,
        interval,
    };
    if let Some(c) = types
        .iter()
        .position(|t| t.name == "samples")
        .or_else(|| types.iter().position(|t| t.unit == "count"))
    {
        return plain(Some(c), false);
    }
    if let Some(c) = types.iter().position(|t| t.unit == "bytes") {
        return plain(Some(c), true);
    }
    if let Some(c) = types.iter().position(|t| t.unit == "nanoseconds") {
        let divisor = profile.samples().values[c]
            .iter()
            .fold(0, |g, &v| gcd(g, v.unsigned_abs()))
            .max(1);
        return Weights {
            column: Some(c),
            divisor: i64::try_from(divisor).unwrap_or(1),
            bytes: false,
            interval: SamplingInterval::from_nanos(divisor),
        };
    }
    plain(None, false)
}

/// The categories of frame kinds.
struct Categories {
    by_kind: [CategoryHandle; FrameKind::ALL.len()],
    /// Subcategories named after code tiers, by kind and tier.
    by_tier: HashMap<(FrameKind, StringId), CategoryPairHandle>,
}

impl Categories {
    fn new(fx: &mut FxProfile) -> Categories {
        let mut by_kind = [CategoryHandle::OTHER; FrameKind::ALL.len()];
        by_kind[FrameKind::Native as usize] = fx.add_category("Native", CategoryColor::Blue);
        by_kind[FrameKind::Kernel as usize] = fx.add_category("Kernel", CategoryColor::Orange);
        by_kind[FrameKind::Jit as usize] = fx.add_category("JIT", CategoryColor::Green);
        by_kind[FrameKind::Managed as usize] = fx.add_category("Managed", CategoryColor::Purple);
        by_kind[FrameKind::Truncated as usize] = fx.add_category("Truncated", CategoryColor::Red);
        Categories {
            by_kind,
            by_tier: HashMap::new(),
        }
    }

    fn frame_info(&mut self, fx: &mut FxProfile, profile: &Profile, frame: FrameId) -> FrameInfo {
        let kind = profile.frame(frame).kind;
        let category_pair = match profile.function(profile.frame(frame).function).tier {
            Some(tier) => *self.by_tier.entry((kind, tier)).or_insert_with(|| {
                fx.add_subcategory(self.by_kind[kind as usize], profile.string(tier))
            }),
            None => self.by_kind[kind as usize].into(),
        };
        let flags = if matches!(kind, FrameKind::Jit | FrameKind::Managed) {
            FrameFlags::IS_JS
        } else {
            FrameFlags::empty()
        };
        FrameInfo {
            frame: Frame::Label(fx.intern_string(profile.frame_name(frame))),
            category_pair,
            flags,
        }
    }
}

/// Builds the Firefox Profiler profile of `profile`.
fn convert(profile: &Profile) -> FxProfile {
    let meta = &profile.metadata;
    let start = meta.start_time_ns;
    let reference = if start >= UNIX_TIME_FLOOR_NS {
        ReferenceTimestamp::from_duration_since_unix_epoch(Duration::from_nanos(start))
    } else {
        ReferenceTimestamp::from_millis_since_unix_epoch(0.0)
    };
    let weights = choose_weights(profile);
    let product = if meta.producer.is_empty() {
        "rootline"
    } else {
        &meta.producer
    };
    let mut fx = FxProfile::new(product, reference, weights.interval);
    fx.set_symbolicated(true);
    let mut categories = Categories::new(&mut fx);
    let at = |time: u64| Timestamp::from_nanos_since_reference(time.saturating_sub(start));

    let samples = profile.samples();
    let mut per_thread: Vec<Vec<usize>> = vec![Vec::new(); profile.threads().len()];
    for (i, t) in samples.threads.iter().enumerate() {
        per_thread[t.index()].push(i);
    }
    let cpu = profile
        .sample_types()
        .iter()
        .position(|t| t.name == "cpu" && t.unit == "nanoseconds")
        .filter(|&c| Some(c) != weights.column);

    let mut processes: HashMap<u32, ProcessHandle> = HashMap::new();
    for (t, list) in per_thread.iter_mut().enumerate() {
        let id = ThreadId(t as u32);
        let thread = profile.thread(id);
        list.sort_by_key(|&i| samples.times[i]);
        let first = list.first().map_or(start, |&i| samples.times[i]);
        let process = *processes.entry(thread.pid).or_insert_with(|| {
            let name = profile
                .process_name(thread.pid)
                .map_or_else(|| format!("pid {}", thread.pid), str::to_owned);
            fx.add_process(&name, thread.pid, at(first))
        });
        let handle = fx.add_thread(process, thread.tid, at(first), thread.tid == thread.pid);
        let name = profile
            .thread_name(id)
            .or_else(|| profile.process_name(thread.pid))
            .map_or_else(|| format!("tid {}", thread.tid), str::to_owned);
        fx.set_thread_name(handle, &name);
        let kind = if weights.bytes {
            WeightType::Bytes
        } else {
            WeightType::Samples
        };
        fx.set_thread_samples_weight_type(handle, kind);
        add_samples(
            &mut fx,
            profile,
            &mut categories,
            handle,
            list,
            &weights,
            cpu,
            at,
        );
    }
    fx
}

#[allow(clippy::too_many_arguments)]
fn add_samples(
    fx: &mut FxProfile,
    profile: &Profile,
    categories: &mut Categories,
    thread: ThreadHandle,
    list: &[usize],
    weights: &Weights,
    cpu: Option<usize>,
    at: impl Fn(u64) -> Timestamp,
) {
    let samples = profile.samples();
    let mut stacks: HashMap<StackId, Option<StackHandle>> = HashMap::new();
    let mut root_first = Vec::new();
    for &i in list {
        let stack = *stacks.entry(samples.stacks[i]).or_insert_with(|| {
            profile.stack_frames_root_first(samples.stacks[i], &mut root_first);
            let frames: Vec<FrameInfo> = root_first
                .iter()
                .map(|&f| categories.frame_info(fx, profile, f))
                .collect();
            fx.intern_stack_frames(thread, frames.into_iter())
        });
        let mut weight = weights
            .column
            .map_or(1, |c| samples.values[c][i] / weights.divisor);
        let mut cpu_delta = cpu.map_or(CpuDelta::ZERO, |c| {
            CpuDelta::from_nanos(samples.values[c][i].max(0).unsigned_abs())
        });
        let time = at(samples.times[i]);
        // A weight beyond 32 bits is split over samples at the same time, the CPU delta on the first.
        loop {
            let part = weight.clamp(i64::from(i32::MIN), i64::from(i32::MAX));
            fx.add_sample(thread, time, stack, cpu_delta, part as i32);
            weight -= part;
            cpu_delta = CpuDelta::ZERO;
            if weight == 0 {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gcd_of_sample_times() {
        assert_eq!(gcd(0, 1_000_000), 1_000_000);
        assert_eq!(gcd(3_000_000, 1_000_000), 1_000_000);
        assert_eq!(gcd(7, 5), 1);
    }
}
