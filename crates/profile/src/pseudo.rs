//! Pseudo frames: the one vocabulary of a producer's grouping frames, which are not code.
//!
//! Readers of text formats give such frames the kind [`FrameKind::Pseudo`]; depth caps count code
//! frames only, so repair measures depth without them. A frame is pseudo when its kind is
//! [`FrameKind::Pseudo`], or when a reader that only had names gave it one of the names
//! dotnet-trace / TraceEvent use for grouping: `Process64 …`/`Process32 …`, `Threads`, `Thread (N)`,
//! `(Non-Activities)`, `Activities`, `CPU_TIME`, `UNMANAGED_CODE_TIME`, `BLOCKED_TIME`.
//!
//! rootline's own pseudo frames are the repair gap, [`REPAIR_GAP`] (where repair joined a cut stack
//! to a base and no sample shows what lies between, the repaired stack carries this frame at the
//! join), and the off-CPU frames at the leaf of a stack recorded as its thread left the CPU, which
//! say why it left ([`OFF_CPU_SLEEPING`], [`OFF_CPU_PREEMPTED`], …), and the allocation frame at the
//! leaf of an allocation sample's stack, which names the allocated type (`[alloc: System.Byte[]]`,
//! see [`alloc_frame_name`]); a native allocation's frame names the C function called instead
//! (`[alloc: malloc]`, one of [`NATIVE_ALLOC_FUNCTIONS`]).

use crate::{FrameId, FrameKind, Profile};

/// Names that are always pseudo frames, compared exactly.
const PSEUDO_NAMES: &[&str] = &[
    "Threads",
    "(Non-Activities)",
    "Activities",
    "CPU_TIME",
    "UNMANAGED_CODE_TIME",
    "BLOCKED_TIME",
];

/// The frame repair puts between a re-attached base and the frames a depth cap left, when no
/// sample shows which frames were between them (an ambiguous join): frames are unknown here.
pub const REPAIR_GAP: &str = "[repair: frames unknown]";

/// Leaf frame of an off-CPU stack whose thread left the CPU while still runnable (preempted, or
/// it yielded).
pub const OFF_CPU_PREEMPTED: &str = "[off-cpu: preempted]";
/// Leaf frame of an off-CPU stack whose thread slept interruptibly (the kernel's `S` state): a
/// sleep, a pipe, socket or poll, a futex (a lock).
pub const OFF_CPU_SLEEPING: &str = "[off-cpu: sleeping]";
/// Leaf frame of an off-CPU stack whose thread waited uninterruptibly (the kernel's `D` state):
/// disk I/O, a page being read in, `vfork` waiting for the child, a kernel lock.
pub const OFF_CPU_UNINTERRUPTIBLE: &str = "[off-cpu: uninterruptible]";
/// Leaf frame of an off-CPU stack whose thread was stopped by a signal or a tracer (`T`, `t`).
pub const OFF_CPU_STOPPED: &str = "[off-cpu: stopped]";
/// Leaf frame of an off-CPU stack whose thread left the CPU of its own accord, in a state the
/// kernel did not tell (it blocked or slept).
pub const OFF_CPU_BLOCKED: &str = "[off-cpu: blocked]";
/// Leaf frame of an off-CPU stack whose reason for leaving the CPU is not known.
pub const OFF_CPU_UNKNOWN: &str = "[off-cpu]";
/// The only frame of a thread's off-CPU intervals that were shorter than the recording's minimum:
/// their time is counted, their stacks were not unwound.
pub const OFF_CPU_SHORT: &str = "[off-cpu: short, not unwound]";
/// The only frame of a thread's off-CPU intervals whose switches the kernel did not sample (over
/// the recording's rate cap, or throttled): their time is counted, their stacks were not taken.
pub const OFF_CPU_UNSAMPLED: &str = "[off-cpu: over the rate cap, not unwound]";

/// Prefix of the leaf frame of an allocation sample, `[alloc: TYPE]`: the allocated type.
pub const ALLOC_PREFIX: &str = "[alloc: ";
/// The type in an allocation frame whose producer did not say what type was allocated.
pub const ALLOC_UNKNOWN_TYPE: &str = "unknown type";

/// The C allocation functions native allocation samples name, as their leaf frames do
/// (`[alloc: malloc]`): the entry point the program called (C++ `operator new` reaches `malloc`,
/// and its frame stays in the stack above it). `mmap` counts only anonymous mappings above a
/// size that the program asked for itself (not those `malloc` makes for large blocks).
pub const NATIVE_ALLOC_FUNCTIONS: [&str; 9] = [
    "malloc",
    "calloc",
    "realloc",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
    "mmap",
];

/// The leaf frame name of an allocation of `type_name` (`None`: not known): `[alloc: TYPE]`.
pub fn alloc_frame_name(type_name: Option<&str>) -> String {
    format!(
        "{ALLOC_PREFIX}{}]",
        type_name
            .filter(|t| !t.is_empty())
            .unwrap_or(ALLOC_UNKNOWN_TYPE)
    )
}

/// The allocated type an allocation frame name names, or `None` when `name` is not one.
pub fn alloc_type_of(name: &str) -> Option<&str> {
    name.strip_prefix(ALLOC_PREFIX)?.strip_suffix(']')
}

/// Interns the allocation frame of `type_name` (kind [`FrameKind::Pseudo`]), see
/// [`alloc_frame_name`].
pub fn intern_alloc_frame(profile: &mut Profile, type_name: Option<&str>) -> FrameId {
    profile.intern_named_frame(&alloc_frame_name(type_name), FrameKind::Pseudo)
}

/// True when a frame name is one of the off-CPU pseudo frames.
pub fn is_off_cpu_name(name: &str) -> bool {
    [
        OFF_CPU_PREEMPTED,
        OFF_CPU_SLEEPING,
        OFF_CPU_UNINTERRUPTIBLE,
        OFF_CPU_STOPPED,
        OFF_CPU_BLOCKED,
        OFF_CPU_UNKNOWN,
        OFF_CPU_SHORT,
        OFF_CPU_UNSAMPLED,
    ]
    .contains(&name)
}

/// True when a frame name is the repair gap, [`REPAIR_GAP`].
pub fn is_repair_gap_name(name: &str) -> bool {
    name == REPAIR_GAP
}

/// True when the frame `id` of `profile` is the repair gap (by name; its kind is
/// [`FrameKind::Pseudo`] when repair made it, whatever a reader gave it).
pub fn is_repair_gap(profile: &Profile, id: FrameId) -> bool {
    is_repair_gap_name(profile.frame_name(id))
}

/// Interns the repair gap frame ([`REPAIR_GAP`], kind [`FrameKind::Pseudo`]).
pub fn intern_repair_gap(profile: &mut Profile) -> FrameId {
    profile.intern_named_frame(REPAIR_GAP, FrameKind::Pseudo)
}

/// True when a frame name is one of dotnet-trace's grouping frames (see the module doc), the
/// repair gap, an off-CPU frame or an allocation frame.
pub fn is_pseudo_name(name: &str) -> bool {
    if PSEUDO_NAMES.contains(&name)
        || is_repair_gap_name(name)
        || is_off_cpu_name(name)
        || alloc_type_of(name).is_some()
    {
        return true;
    }
    if name.starts_with("Process64 ") || name.starts_with("Process32 ") {
        return true;
    }
    // `Thread (1234)`, optionally followed by a name: `Thread (1234) worker`.
    if let Some(rest) = name.strip_prefix("Thread (")
        && let Some(close) = rest.find(')')
    {
        return close > 0 && rest[..close].bytes().all(|b| b.is_ascii_digit());
    }
    false
}

/// True when the frame `id` of `profile` is a pseudo frame, by kind or by name.
pub fn is_pseudo_frame(profile: &Profile, id: FrameId) -> bool {
    profile.frame(id).kind == FrameKind::Pseudo || is_pseudo_name(profile.frame_name(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_dotnet_trace_grouping_frames() {
        for name in [
            "Process64 Process(4242) (4242) Args:  App.dll",
            "Threads",
            "Thread (17)",
            "Thread (17) worker",
            "(Non-Activities)",
            "CPU_TIME",
            "UNMANAGED_CODE_TIME",
            REPAIR_GAP,
            OFF_CPU_BLOCKED,
            OFF_CPU_SLEEPING,
            OFF_CPU_UNINTERRUPTIBLE,
            OFF_CPU_SHORT,
            OFF_CPU_UNSAMPLED,
            "[alloc: System.Byte[]]",
        ] {
            assert!(is_pseudo_name(name), "{name}");
        }
        for name in [
            "Thread ()",
            "Thread (x)",
            "App!Threads.Run()",
            "System.Private.CoreLib!System.Threading.Thread.StartCallback()",
            "Process",
            "[repair: frames unknown] ",
            "[truncated: depth cap 100]",
        ] {
            assert!(!is_pseudo_name(name), "{name}");
        }
    }

    #[test]
    fn kind_pseudo_counts_whatever_the_name() {
        let mut p = Profile::new(vec![]);
        let a = p.intern_named_frame("group", FrameKind::Pseudo);
        let b = p.intern_named_frame("group", FrameKind::Managed);
        let c = p.intern_named_frame("CPU_TIME", FrameKind::Managed);
        assert!(is_pseudo_frame(&p, a));
        assert!(!is_pseudo_frame(&p, b));
        assert!(is_pseudo_frame(&p, c));
    }

    #[test]
    fn allocation_frames_name_their_type() {
        assert_eq!(
            alloc_frame_name(Some("System.Byte[]")),
            "[alloc: System.Byte[]]"
        );
        assert_eq!(alloc_frame_name(None), "[alloc: unknown type]");
        assert_eq!(alloc_frame_name(Some("")), "[alloc: unknown type]");
        assert_eq!(
            alloc_type_of("[alloc: System.Byte[]]"),
            Some("System.Byte[]")
        );
        assert_eq!(alloc_type_of("[alloc: x"), None);
        assert_eq!(alloc_type_of("alloc"), None);
        let mut p = Profile::new(vec![]);
        let f = intern_alloc_frame(&mut p, Some("System.String"));
        assert_eq!(intern_alloc_frame(&mut p, Some("System.String")), f);
        assert!(is_pseudo_frame(&p, f));
    }

    #[test]
    fn the_repair_gap_is_one_pseudo_frame() {
        let mut p = Profile::new(vec![]);
        let gap = intern_repair_gap(&mut p);
        assert_eq!(intern_repair_gap(&mut p), gap);
        assert_eq!(p.frame_name(gap), "[repair: frames unknown]");
        assert!(is_repair_gap(&p, gap) && is_pseudo_frame(&p, gap));
        let other = p.intern_named_frame("Main", FrameKind::Managed);
        assert!(!is_repair_gap(&p, other));
    }
}
