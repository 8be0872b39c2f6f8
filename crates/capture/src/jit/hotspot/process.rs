//! A process's side of asking: whether it is a JVM, which of its code addresses missed, naming a
//! frame by asking, and what the recording reports.

use std::time::Instant;

use super::{PerfMapAsker, Ticket, is_hotspot};
use crate::jit::{JitMaps, JitProcess, JitSymbol};

/// Most code addresses remembered per JVM as missing from its perf map.
const MISSES_KEPT: usize = 1 << 14;

/// The perf-map asking of one process's JIT state: whether it is a JVM, its asker, and which
/// code addresses were missing.
#[derive(Debug, Default)]
pub struct JvmPerfMap {
    checked: bool,
    asker: Option<PerfMapAsker>,
    /// Answers already read.
    seen: u64,
    /// Answers after which samples set aside for this JVM were unwound again.
    replayed: u64,
    /// Code addresses missing from the perf map, with the answers received when first missed.
    misses: std::collections::HashMap<u64, u64>,
}

impl JvmPerfMap {
    /// Asking state for a process not seen yet; with `ask` false, no JVM is asked.
    pub fn new(ask: bool) -> JvmPerfMap {
        JvmPerfMap {
            checked: !ask,
            ..JvmPerfMap::default()
        }
    }

    /// A code address of process `pid` has no symbol: the first time, find out whether it is a
    /// HotSpot JVM and start asking it; later, ask again — unless an answer asked for after the
    /// address was first missed did not name it either (then it never will).
    pub fn missed(&mut self, pid: u32, addr: u64) {
        if !self.checked {
            self.checked = true;
            if is_hotspot(pid) {
                self.asker = Some(PerfMapAsker::start(pid));
            }
            return;
        }
        let Some(asker) = &self.asker else {
            return;
        };
        let answers = asker.answers();
        if self.misses.len() >= MISSES_KEPT {
            self.misses.clear();
        }
        let first = *self.misses.entry(addr).or_insert(answers);
        // The answer in flight when the address was first missed may predate its code.
        if answers < first + 2 {
            asker.want();
        }
    }

    /// The asker, when a fresh answer may still name `addr`: no answer asked for after the
    /// address was first missed has arrived yet.
    fn may_still_name(&self, addr: u64) -> Option<&PerfMapAsker> {
        let asker = self.asker.as_ref().filter(|a| a.stopped().is_none())?;
        let answers = asker.answers();
        let first = self.misses.get(&addr).copied().unwrap_or(answers);
        (answers < first + 2).then_some(asker)
    }

    /// Whether the process is a JVM being asked: its perf map changes only with an answer (one
    /// given up on may still have it written otherwise, and it is read as it grows).
    pub fn asking(&self) -> bool {
        self.asker.as_ref().is_some_and(|a| a.stopped().is_none())
    }

    /// Whether a new answer arrived since the last call (the perf map was rewritten whole).
    pub fn rewritten(&mut self) -> bool {
        let answers = self.asker.as_ref().map_or(0, PerfMapAsker::answers);
        let new = answers > self.seen;
        self.seen = answers;
        new
    }

    /// The asker, for a JVM.
    pub fn asker(&self) -> Option<&PerfMapAsker> {
        self.asker.as_ref()
    }
}

impl JitProcess {
    /// Whether a fresh perf map of this JVM may still name `addr`, which has no symbol now; if
    /// so, the JVM is asked at once.
    pub fn jvm_may_name(&mut self, addr: u64) -> bool {
        if self.symbol(addr).is_some() {
            return false;
        }
        self.jvm
            .may_still_name(addr)
            .map(PerfMapAsker::ask_now)
            .is_some()
    }

    /// The symbol at `addr`, for naming a frame: when a JVM's perf map misses it and a fresh
    /// answer may still name it, asks the JVM at once and waits for the answer until `deadline`.
    pub fn symbol_or_ask(&mut self, addr: u64, deadline: Instant) -> Option<&JitSymbol> {
        if self.symbol(addr).is_none()
            && Instant::now() < deadline
            && let Some(asker) = self.jvm.may_still_name(addr)
        {
            asker.wait(asker.ask_now(), deadline);
            self.refresh();
        }
        self.symbol(addr)
    }

    /// Why a JIT address of this process has no name, for the record summary.
    pub fn unnamed_reason(&self) -> String {
        if let Some(why) = self.jvm.asker().and_then(PerfMapAsker::stopped) {
            return why;
        }
        if self.jvm.asking() {
            return "JVM code missing from its perf map (freed, or compiled after the last answer)"
                .into();
        }
        if let Some(why) = &self.refused {
            return why.clone();
        }
        if self.map.is_none() && self.dump.is_none() {
            return "no perf map or jitdump file (the runtime was not asked or told to write one)"
                .into();
        }
        "code missing from the runtime's perf map or jitdump file".into()
    }
}

impl JitMaps {
    /// Asks every JVM being asked for a last perf map, waiting for the answers until
    /// `deadline` (the end of a recording, before its last frames are named).
    pub fn ask_jvms_again(&mut self, deadline: Instant) {
        let asked: Vec<(&PerfMapAsker, Ticket)> = self
            .procs
            .values()
            .filter_map(|p| p.jvm.asker())
            .filter(|a| a.stopped().is_none())
            .map(|a| (a, a.ask_now()))
            .collect();
        for (asker, answers) in asked {
            asker.wait(answers, deadline);
        }
    }

    /// The JVMs that answered since the last call.
    pub fn answered_jvms(&mut self) -> Vec<u32> {
        self.procs
            .iter_mut()
            .filter_map(|(&pid, p)| {
                let answers = p.jvm.asker()?.answers();
                let new = answers > p.jvm.replayed;
                p.jvm.replayed = answers;
                new.then_some(pid)
            })
            .collect()
    }

    /// Why JVMs are not asked for perf maps, one line each.
    pub fn jvm_notes(&self) -> Vec<String> {
        let mut notes: Vec<String> = self
            .procs
            .iter()
            .filter_map(|(pid, p)| Some(format!("JVM {pid}: {}", p.jvm.asker()?.note()?)))
            .collect();
        notes.sort();
        notes
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use crate::jit::PerfMap;

    #[test]
    fn a_perf_map_rewritten_whole_is_read_again_and_merged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("perf-1.map");
        std::fs::write(
            &path,
            "0x7f0000001000 0x100 int A.a()\n0x7f0000002000 0x100 int A.b()\n",
        )
        .unwrap();
        let mut map = PerfMap::new(File::open(&path).unwrap());
        map.read_more().unwrap();
        // The JVM's next answer: A.a freed, A.b kept, A.c new, longer lines before the old end.
        std::fs::write(
            &path,
            "0x00007f0000002000 0x0000000000000100 int A.b()\n\
             0x00007f0000003000 0x0000000000000100 int A.c()\n",
        )
        .unwrap();
        map.rewind();
        map.read_more().unwrap();
        assert!(map.bad_lines.is_empty(), "{:?}", map.bad_lines);
        let names: Vec<String> = [0x7f00_0000_1010, 0x7f00_0000_2010, 0x7f00_0000_3010]
            .iter()
            .map(|&a| map.symbols.lookup(a).unwrap().name.name.clone())
            .collect();
        // Frames already sampled in freed code keep their names.
        assert_eq!(names, ["A.a()", "A.b()", "A.c()"]);
        assert_eq!(map.symbols.len(), 3);
    }
}
