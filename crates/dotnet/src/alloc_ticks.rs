//! GC allocation ticks of a live process alongside another recording (`record --alloc`, the
//! agent): an EventPipe session that asks only for the ticks and the events that name their
//! methods, kept in an unlinked temporary file while it runs, then read and its ticks appended to
//! the other recording's profile.
//!
//! A tick keeps the stack EventPipe walked for it, named as `dotnet collect` names it, with the
//! `[alloc: TYPE]` leaf: the managed frames from the thread's managed root to the allocation.
//! CPU samples are left to the other recording.

use std::fs::File;
use std::io::{BufReader, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use rootline_profile::{
    Frame, FrameId, FrameKind, Function, Profile, SampleType, StackId, StringId, TruncateReason,
};

use crate::collect::{CollectOptions, CollectSummary, collect_session};
use crate::convert::{ConvertStats, EVENTPIPE_DEPTH_CAP, read_profile_with_stats};
use crate::discover::find_socket;
use crate::error::NetTraceError;
use crate::events::RUNTIME;
use crate::ipc::{DiagnosticsClient, IpcError, Provider, SessionConfig};

/// The runtime provider's keywords for allocation ticks and the names of their methods: GC (the
/// ticks, at verbose level), Loader (modules) and Jit (methods compiled while the session runs);
/// the rundown at the end names the rest.
pub const KEYWORDS: u64 = Provider::GC_KEYWORD | 0x8 | 0x10;

/// Numbers the temporary files of this process's sessions.
static NEXT_FILE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Errors of an allocation-tick session.
#[derive(Debug, thiserror::Error)]
pub enum AllocTicksError {
    /// Talking to the runtime failed.
    #[error(transparent)]
    Ipc(#[from] IpcError),
    /// The temporary file for the trace failed.
    #[error("the trace's temporary file {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The trace could not be read.
    #[error("reading the allocation trace: {0}")]
    Trace(#[from] NetTraceError),
    /// The session's thread panicked.
    #[error("the allocation session's thread panicked")]
    Panicked,
    /// The profile to append to has no `alloc-bytes` and `alloc-count` columns.
    #[error("the profile has no alloc-bytes and alloc-count columns")]
    NoColumns,
}

/// A running EventPipe session collecting allocation ticks from one process.
pub struct AllocTicks {
    pid: u32,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<(File, CollectSummary), AllocTicksError>>,
}

/// What a finished session gives: the ticks as a profile of their own, with what the conversion
/// and the session saw.
pub struct Collected {
    /// The trace as `dotnet collect` reads it (allocation ticks, no thread samples).
    pub profile: Profile,
    /// What the conversion saw (ticks, ticks at the depth cap, dropped events…).
    pub stats: ConvertStats,
    /// How the session went (whether the rundown arrived, why it stopped).
    pub summary: CollectSummary,
}

impl AllocTicks {
    /// The session's providers: the runtime provider with [`KEYWORDS`] at verbose level.
    pub fn providers() -> Vec<Provider> {
        vec![Provider {
            name: RUNTIME.into(),
            keywords: KEYWORDS,
            level: Provider::VERBOSE,
            arguments: None,
        }]
    }

    /// Starts collecting from process `pid` (a runtime buffer of `buffer_mb` MB); fails at once
    /// when the process has no diagnostics socket (it is not .NET, or is gone) or the runtime
    /// refuses the session. [`AllocTicks::finish`] waits up to `rundown_timeout` for the rundown.
    pub fn start(
        pid: u32,
        buffer_mb: u32,
        rundown_timeout: std::time::Duration,
    ) -> Result<AllocTicks, AllocTicksError> {
        let client = DiagnosticsClient::new(find_socket(pid)?);
        let path = std::env::temp_dir().join(format!(
            "rootline-alloc-{}-{pid}-{}.nettrace",
            std::process::id(),
            NEXT_FILE.fetch_add(1, Ordering::Relaxed)
        ));
        let file_error = |source| AllocTicksError::File {
            path: path.clone(),
            source,
        };
        let mut file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(file_error)?;
        // Unlinked at once: the trace lives as long as the descriptor, whatever happens to us.
        std::fs::remove_file(&path).map_err(file_error)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let options = CollectOptions {
            session: SessionConfig {
                circular_buffer_mb: buffer_mb,
                request_rundown: true,
                providers: AllocTicks::providers(),
            },
            rundown_timeout,
            ..CollectOptions::default()
        };
        // Started here, so that the caller knows the runtime took the session.
        let session = client.start_session(&options.session)?;
        let thread = std::thread::Builder::new()
            .name("rootline-alloc-ticks".into())
            .spawn(move || {
                let summary = collect_session(&client, session, &options, &mut file, &flag)?;
                Ok((file, summary))
            })
            .map_err(file_error)?;
        Ok(AllocTicks { pid, stop, thread })
    }

    /// The process traced.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Stops the session (the runtime sends its rundown, which names the methods) and reads the
    /// trace.
    pub fn finish(self) -> Result<Collected, AllocTicksError> {
        self.stop.store(true, Ordering::Release);
        let (mut file, summary) = self
            .thread
            .join()
            .map_err(|_| AllocTicksError::Panicked)??;
        file.seek(SeekFrom::Start(0))
            .map_err(|source| AllocTicksError::File {
                path: PathBuf::from("(unlinked)"),
                source,
            })?;
        let (profile, stats) = read_profile_with_stats(BufReader::with_capacity(1 << 20, file))?;
        Ok(Collected {
            profile,
            stats,
            summary,
        })
    }
}

/// What [`append_ticks`] added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Appended {
    /// Ticks appended.
    pub ticks: u64,
    /// Their bytes.
    pub bytes: i64,
}

/// Appends the allocation ticks of `trace` (a profile [`read_profile_with_stats`] made) to
/// `into` as samples of the threads of process `pid`, each with its stack copied whole (frames,
/// names, tiers, the `[alloc: TYPE]` leaf), its bytes and count in `into`'s `alloc-bytes` and
/// `alloc-count` columns and 0 in the others. `clock_offset_ns` is subtracted from the trace's
/// times (wall-clock nanoseconds) to bring them to `into`'s clock; only ticks whose time then
/// falls in `window` are appended (sessions that overlap split their ticks there). A stack that
/// EventPipe cut at its depth cap, still [`EVENTPIPE_DEPTH_CAP`] frames deep with no
/// truncation frame at its root, gets a `[truncated: depth cap 100]` root: it does not reach the
/// thread's managed root.
pub fn append_ticks(
    trace: &Profile,
    into: &mut Profile,
    pid: u32,
    clock_offset_ns: i64,
    window: std::ops::Range<u64>,
) -> Result<Appended, AllocTicksError> {
    let column = |p: &Profile, t: &SampleType| p.sample_types().iter().position(|s| s == t);
    let (Some(to_bytes), Some(to_count)) = (
        column(into, &SampleType::alloc_bytes()),
        column(into, &SampleType::alloc_count()),
    ) else {
        return Err(AllocTicksError::NoColumns);
    };
    let (Some(from_bytes), Some(from_count)) = (
        column(trace, &SampleType::alloc_bytes()),
        column(trace, &SampleType::alloc_count()),
    ) else {
        // No tick in the trace.
        return Ok(Appended::default());
    };
    let mut copier = Copier::default();
    let mut values = vec![0i64; into.sample_types().len()];
    let mut appended = Appended::default();
    let samples = trace.samples();
    for i in 0..samples.len() {
        let (bytes, count) = (samples.values[from_bytes][i], samples.values[from_count][i]);
        if count == 0 {
            continue;
        }
        let time = i128::from(samples.times[i]) - i128::from(clock_offset_ns);
        let time = time.clamp(0, i128::from(u64::MAX)) as u64;
        if !window.contains(&time) {
            continue;
        }
        let stack = copier.stack(trace, into, samples.stacks[i]);
        let tid = trace.thread(samples.threads[i]).tid;
        let thread = into.intern_thread(pid, tid);
        values[to_bytes] = bytes;
        values[to_count] = count;
        // The thread and stack come from `into` and `values` has one entry per column.
        let _ = into.push_sample(time, thread, stack, &values);
        appended.ticks += 1;
        appended.bytes = appended.bytes.saturating_add(bytes);
    }
    Ok(appended)
}

/// Copies stacks between profiles, each node once.
#[derive(Default)]
struct Copier {
    stacks: std::collections::HashMap<StackId, StackId>,
    frames: std::collections::HashMap<FrameId, FrameId>,
}

impl Copier {
    fn stack(&mut self, from: &Profile, into: &mut Profile, id: StackId) -> StackId {
        // Root first, iteratively: stacks may be deep.
        let mut path = Vec::new();
        let mut next = Some(id);
        while let Some(s) = next {
            if self.stacks.contains_key(&s) {
                break;
            }
            path.push(s);
            next = from.stack(s).parent;
        }
        let mut parent = next.map(|s| self.stacks[&s]);
        if next.is_none()
            && let Some(&root) = path.last()
        {
            // The whole stack is new: is it cut at EventPipe's cap (its frames, the allocation
            // frame aside)?
            let depth = from.stack_frames(id).count().saturating_sub(1);
            let root_frame = from.frame(from.stack(root).frame);
            if depth == EVENTPIPE_DEPTH_CAP as usize && root_frame.kind != FrameKind::Truncated {
                let cut = into.intern_truncated(TruncateReason::DepthCap(EVENTPIPE_DEPTH_CAP));
                parent = Some(into.intern_stack(None, cut));
            }
        }
        for &s in path.iter().rev() {
            let frame = self.frame(from, into, from.stack(s).frame);
            let copied = into.intern_stack(parent, frame);
            self.stacks.insert(s, copied);
            parent = Some(copied);
        }
        self.stacks[&id]
    }

    fn frame(&mut self, from: &Profile, into: &mut Profile, id: FrameId) -> FrameId {
        if let Some(&f) = self.frames.get(&id) {
            return f;
        }
        let frame = *from.frame(id);
        let function = *from.function(frame.function);
        let string = |into: &mut Profile, s: StringId| into.intern_string(from.string(s));
        let function = Function {
            name: string(into, function.name),
            file: function.file.map(|s| string(into, s)),
            system_name: function.system_name.map(|s| string(into, s)),
            tier: function.tier.map(|s| string(into, s)),
        };
        let function = into.intern_function(function);
        let copied = into.intern_frame(Frame {
            function,
            // EventPipe frames carry no mapping.
            mapping: None,
            ..frame
        });
        self.frames.insert(id, copied);
        copied
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rootline_profile::{FrameKind, pseudo};

    #[test]
    fn ticks_are_copied_with_their_stacks_into_the_allocation_columns() {
        let mut trace = Profile::new(vec![
            SampleType::samples(),
            SampleType::wall_nanoseconds(),
            SampleType::alloc_bytes(),
            SampleType::alloc_count(),
        ]);
        let t = trace.intern_thread(7, 70);
        let main = trace.intern_named_frame("App!Main()", FrameKind::Managed);
        let big = trace.intern_named_frame("App!Big()", FrameKind::Managed);
        let leaf = pseudo::intern_alloc_frame(&mut trace, Some("System.Byte[]"));
        let s = trace.intern_stack_root_first([main, big, leaf]).unwrap();
        let cpu = trace.intern_stack_root_first([main]).unwrap();
        trace.push_sample(1_000, t, s, &[0, 0, 100_000, 1]).unwrap();
        trace
            .push_sample(2_000, t, cpu, &[1, 1_000_000, 0, 0])
            .unwrap();
        trace.push_sample(3_000, t, s, &[0, 0, 200_000, 1]).unwrap();

        let mut into = Profile::new(vec![
            SampleType::samples(),
            SampleType::cpu_nanoseconds(),
            SampleType::alloc_bytes(),
            SampleType::alloc_count(),
        ]);
        into.intern_named_frame("other", FrameKind::Native);
        let got = append_ticks(&trace, &mut into, 7, 500, 0..u64::MAX).unwrap();
        assert_eq!(
            got,
            Appended {
                ticks: 2,
                bytes: 300_000
            }
        );
        let samples = into.samples();
        assert_eq!(samples.times, [500, 2_500]);
        assert_eq!(samples.values[2], [100_000, 200_000]);
        assert_eq!(samples.values[3], [1, 1]);
        assert_eq!(samples.values[0], [0, 0]);
        assert_eq!(samples.stacks[0], samples.stacks[1]);
        let names: Vec<&str> = into
            .stack_frames(samples.stacks[0])
            .map(|f| into.frame_name(f))
            .collect();
        assert_eq!(names, ["[alloc: System.Byte[]]", "App!Big()", "App!Main()"]);
        let thread = into.thread(samples.threads[0]);
        assert_eq!((thread.pid, thread.tid), (7, 70));
        // A window keeps only the ticks inside it.
        let got = append_ticks(&trace, &mut into, 7, 500, 1_000..3_000).unwrap();
        assert_eq!(got.ticks, 1);
        assert_eq!(into.samples().times[2], 2_500);

        // A stack at EventPipe's cap gets a truncation root; one below it does not.
        let mut deep = trace.clone();
        let frames: Vec<FrameId> = (0..EVENTPIPE_DEPTH_CAP)
            .map(|n| deep.intern_named_frame(&format!("App!F{n}()"), FrameKind::Managed))
            .chain([leaf])
            .collect();
        let cut = deep
            .intern_stack_root_first(frames.iter().copied())
            .unwrap();
        let whole = deep
            .intern_stack_root_first(frames[1..].iter().copied())
            .unwrap();
        deep.push_sample(4_000, t, cut, &[0, 0, 1, 1]).unwrap();
        deep.push_sample(4_000, t, whole, &[0, 0, 1, 1]).unwrap();
        let mut into = Profile::new(vec![SampleType::alloc_bytes(), SampleType::alloc_count()]);
        append_ticks(&deep, &mut into, 7, 0, 4_000..4_001).unwrap();
        let roots: Vec<&str> = into
            .samples()
            .stacks
            .iter()
            .map(|&s| into.frame_name(into.stack_frames(s).last().unwrap()))
            .collect();
        assert_eq!(roots, ["[truncated: depth cap 100]", "App!F1()"]);

        let mut no_columns = Profile::new(vec![SampleType::samples()]);
        assert!(matches!(
            append_ticks(&trace, &mut no_columns, 7, 0, 0..u64::MAX),
            Err(AllocTicksError::NoColumns)
        ));
    }
}
