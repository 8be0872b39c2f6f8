//! Samples of a HotSpot JVM whose stack stopped short in code its perf map does not name yet
//! (compiled since the JVM last answered): set aside while the JVM is asked at once, and unwound
//! again when it answers — without the code's bounds, code without frame pointers cannot be
//! unwound.

use super::Pipeline;
use crate::unwind::StackEnd;

impl Pipeline {
    /// Whether the unwind just made (into `addrs`, in address space `space` of process `pid`)
    /// ended early in JIT code that the JVM's next perf map may still name; if so, the JVM is
    /// asked at once.
    pub(super) fn waits_for_jvm(&mut self, space: u32, pid: u32, end: StackEnd) -> bool {
        if self.deferrals.force || !matches!(end, StackEnd::Truncated(_)) {
            return false;
        }
        let processes = &self.processes;
        let jit_code: Vec<u64> = self
            .unwinder
            .addrs
            .iter()
            .enumerate()
            .map(|(i, &a)| if i > 0 { a.wrapping_sub(1) } else { a })
            .filter(|&a| {
                processes
                    .binary_at(space, a)
                    .is_some_and(|(_, b)| b.module.is_none())
            })
            .collect();
        if jit_code.is_empty() {
            return false;
        }
        let jit = self.jit.process(pid);
        jit_code.into_iter().any(|a| jit.jvm_may_name(a))
    }

    /// Unwinds again the set-aside samples of the JVMs that answered since the last call.
    pub(super) fn replay_answered_jvms(&mut self) {
        let answered = self.jit.answered_jvms();
        if !answered.is_empty() {
            self.replay_if(|d| answered.contains(&d.space));
        }
    }
}
