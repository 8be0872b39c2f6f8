//! When the raw tables start over, so that a recording that hands its samples over keeps bounded
//! memory however long it runs: past a size limit, or when modules that only the tables still
//! hold weigh on the module budget.

use crate::jit::JitMaps;
use crate::process::Processes;

/// The size limit of the raw tables (none by default).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct TableLimit {
    /// Distinct frames plus stack nodes (plus threads seen) past which the tables start over.
    pub entries: Option<usize>,
}

impl TableLimit {
    /// Whether tables holding `entries` distinct frames and nodes, with `new_threads` threads
    /// seen since they last started over, should start over now; `refused` says whether
    /// something was just refused for the module budget.
    pub fn start_over(
        &self,
        entries: usize,
        new_threads: usize,
        (processes, jit): (&Processes, &JitMaps),
        refused: bool,
    ) -> bool {
        self.entries.is_some_and(|limit| {
            entries + new_threads > limit || modules_held_only_by_tables(processes, jit, refused)
        })
    }
}

/// Whether, under pressure or with something `refused` for the module budget (the sweeps just
/// measured the modules in use and let go of the images no process holds; JIT state is held by
/// its live process), modules no tracked process maps any more, kept alive only by the mappings
/// of recorded frames, hold a quarter of the module budget, or any of the budget's overshoot (a
/// load took the room of binaries only exited processes mapped): starting the tables over frees
/// them.
fn modules_held_only_by_tables(processes: &Processes, jit: &JitMaps, refused: bool) -> bool {
    processes.module_budget().is_some_and(|budget| {
        let live = processes.modules().live_bytes();
        let in_use = processes.module_bytes_in_use() + jit.bytes();
        let unused = live.saturating_sub(in_use);
        ((refused || live > budget / 4 * 3) && unused > budget / 4) || (live > budget && unused > 0)
    })
}
