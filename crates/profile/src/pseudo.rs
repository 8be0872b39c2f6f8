//! Pseudo frames: the one vocabulary of a producer's grouping frames, which are not code.
//!
//! Readers of text formats give such frames the kind [`FrameKind::Pseudo`]; depth caps count code
//! frames only, so repair measures depth without them. A frame is pseudo when its kind is
//! [`FrameKind::Pseudo`], or when a reader that only had names gave it one of the names
//! dotnet-trace / TraceEvent use for grouping: `Process64 …`/`Process32 …`, `Threads`, `Thread (N)`,
//! `(Non-Activities)`, `Activities`, `CPU_TIME`, `UNMANAGED_CODE_TIME`, `BLOCKED_TIME`.

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

/// True when a frame name is one of dotnet-trace's grouping frames (see the module doc).
pub fn is_pseudo_name(name: &str) -> bool {
    if PSEUDO_NAMES.contains(&name) {
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
        ] {
            assert!(is_pseudo_name(name), "{name}");
        }
        for name in [
            "Thread ()",
            "Thread (x)",
            "App!Threads.Run()",
            "System.Private.CoreLib!System.Threading.Thread.StartCallback()",
            "Process",
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
}
