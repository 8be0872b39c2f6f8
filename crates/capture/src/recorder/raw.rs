//! The raw stack tables: distinct mappings, frames and trie nodes of unwound stacks, interned as
//! addresses (not yet symbolized), and the batch of what is new that goes to the
//! [`super::builder::Builder`].

use std::sync::Arc;

use foldhash::{HashMap as FastMap, HashMapExt};

use crate::jit::JitName;
use crate::process::BinaryFile;
use crate::unwind::{Region, TruncateReason};

use super::alloc::{AllocKind, AllocWeight};
use super::off_cpu::{OffReason, OffWeight};
use super::stats::Stats;

/// What a raw frame's address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum RawKind {
    /// User code in raw mapping `u32`; `true` for a return address (symbolized at address - 1).
    User(u32, bool),
    /// An address in no known mapping.
    Unknown,
    /// Kernel code.
    Kernel,
    /// Time in the kernel without a callchain (kernel threads without `--kernel`).
    KernelOnly,
    /// Time in `execve` after recording began but before the new image: the user registers
    /// still describe the old image, which is not profiled.
    Exec,
    /// The explicit end of a stack that could not be unwound further.
    Truncated(TruncateReason),
    /// The leaf of an off-CPU stack: why the thread left the CPU.
    OffCpu(OffReason),
    /// The leaf of an allocation stack: the allocation function called.
    Alloc(AllocKind),
}

/// A distinct frame of raw stacks: an address of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RawFrame {
    pub kind: RawKind,
    pub address: u64,
    /// Unwound from live memory past the sample's copied stack.
    pub live: bool,
}

/// A mapping raw frames refer to.
#[derive(Debug, Clone)]
pub(crate) struct RawMapping {
    /// The process it was first seen in (JIT code is named through that process's maps).
    pub pid: u32,
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    pub binary: Arc<BinaryFile>,
}

/// A sample waiting for its stack to be translated.
pub(crate) struct Pending {
    pub time: u64,
    pub pid: u32,
    pub tid: u32,
    pub node: u32,
    /// On-CPU nanoseconds (a CPU sample), or off-CPU nanoseconds (when `off_cpu`).
    pub nanos: i64,
    /// Set for a sample taken as the thread left the CPU.
    pub off_cpu: Option<OffWeight>,
    /// Set for an allocation sample (then `nanos` is 0).
    pub alloc: Option<AllocWeight>,
}

/// Everything new since the previous batch. Indexes continue across batches.
#[derive(Default)]
pub(crate) struct Batch {
    pub mappings: Vec<RawMapping>,
    pub frames: Vec<RawFrame>,
    /// For each new frame in code without a file image: its JIT map name, looked up when the
    /// frame was first seen (maps change as code is compiled and freed).
    pub jit_names: Vec<Option<JitName>>,
    /// Trie nodes `(parent or NO_NODE, frame)`.
    pub nodes: Vec<(u32, u32)>,
    pub samples: Vec<Pending>,
    /// Thread names `(pid, tid, name)`, in order; `pid == tid` also names the process.
    pub names: Vec<(u32, u32, String)>,
    pub stats: Stats,
    /// The pipeline started its tables over after this batch: the next one's ids start at 0.
    pub start_over: bool,
}

/// The parent of a root node.
pub(crate) const NO_NODE: u32 = u32::MAX;

/// The new entries of [`RawTables`] since the previous [`RawTables::take_new`].
pub(crate) struct NewEntries {
    pub mappings: Vec<RawMapping>,
    pub frames: Vec<RawFrame>,
    pub nodes: Vec<(u32, u32)>,
}

/// Interned raw mappings, frames and stack-trie nodes; ids are dense and only grow until
/// [`RawTables::clear`].
#[derive(Default)]
pub(crate) struct RawTables {
    mappings: Vec<RawMapping>,
    mapping_index: FastMap<(u64, usize), u32>,
    frames: Vec<RawFrame>,
    frame_index: FastMap<RawFrame, u32>,
    nodes: Vec<(u32, u32)>,
    /// Each node by its parent and its frame (not the frame's id: one lookup finds a node
    /// met before).
    node_index: FastMap<(u32, RawFrame), u32>,
    /// Lengths of the three tables at the last [`RawTables::take_new`].
    sent: (usize, usize, usize),
    /// Per thread, the trie path of its last user stack (see [`RawTables::node_on_path`]), and
    /// the steps they hold together (at most [`MAX_PATH_STEPS`]).
    paths: FastMap<u32, Vec<PathStep>>,
    path_steps: usize,
}

/// Most steps the threads' last paths hold together (8 MiB): past it, a thread's path is not
/// kept, and its next stack is interned frame by frame.
const MAX_PATH_STEPS: usize = 256 * 1024;

/// One step of a thread's last trie path: parent node, frame, and the node they make.
pub(crate) type PathStep = (u32, RawFrame, u32);

/// A step at a depth the thread's last stack started past: its parent is no node.
const HOLE: PathStep = (
    NO_NODE - 1,
    RawFrame {
        kind: RawKind::Unknown,
        address: 0,
        live: false,
    },
    NO_NODE,
);

impl RawTables {
    /// Empty tables.
    pub fn new() -> RawTables {
        RawTables {
            mapping_index: FastMap::new(),
            frame_index: FastMap::new(),
            node_index: FastMap::new(),
            paths: FastMap::new(),
            ..RawTables::default()
        }
    }

    /// The kind of a user address found in `region` of `binary` (None: in no known mapping),
    /// interning the mapping; the mapping remembers `pid` for naming JIT code.
    pub fn user_kind(
        &mut self,
        found: Option<(&Region, &Arc<BinaryFile>)>,
        pid: u32,
        is_return: bool,
    ) -> RawKind {
        let Some((region, binary)) = found else {
            return RawKind::Unknown;
        };
        let key = (region.start, Arc::as_ptr(binary) as usize);
        if let Some(&m) = self.mapping_index.get(&key) {
            return RawKind::User(m, is_return);
        }
        let m = self.mappings.len() as u32;
        self.mappings.push(RawMapping {
            pid,
            start: region.start,
            end: region.end,
            file_offset: region.file_offset,
            binary: binary.clone(),
        });
        self.mapping_index.insert(key, m);
        RawKind::User(m, is_return)
    }

    /// The mapping `m` (an id from [`RawTables::user_kind`]).
    pub fn mapping(&self, m: u32) -> &RawMapping {
        &self.mappings[m as usize]
    }

    /// The trie node of `frame` called from `parent` ([`NO_NODE`] for a root).
    pub fn node(&mut self, parent: u32, frame: RawFrame) -> u32 {
        // Keyed by the frame itself, so that a step taken before costs one lookup.
        if let Some(&node) = self.node_index.get(&(parent, frame)) {
            return node;
        }
        let f = match self.frame_index.get(&frame) {
            Some(&f) => f,
            None => {
                let f = self.frames.len() as u32;
                self.frames.push(frame);
                self.frame_index.insert(frame, f);
                f
            }
        };
        let node = self.nodes.len() as u32;
        self.nodes.push((parent, f));
        self.node_index.insert((parent, frame), node);
        node
    }

    /// [`RawTables::node`] for the `depth`-th frame (from the root) of a stack interned root
    /// first, where `path` is the thread's last stack's path (from [`RawTables::take_path`]):
    /// a step its last stack made at the same depth from the same parent with the same frame
    /// gives the same node without the two hash lookups (successive stacks of a thread share
    /// most outer frames). A stack may start past the root (from a node that holds its outer
    /// frames): `depth` still counts from the root, so that stacks starting at different depths
    /// meet on the same steps.
    pub fn node_on_path(
        &mut self,
        path: &mut Vec<PathStep>,
        depth: usize,
        parent: u32,
        frame: RawFrame,
    ) -> u32 {
        if let Some(&(p, f, node)) = path.get(depth)
            && p == parent
            && f == frame
        {
            return node;
        }
        let node = self.node(parent, frame);
        path.truncate(depth);
        path.resize(depth, HOLE);
        path.push((parent, frame, node));
        node
    }

    /// Thread `tid`'s last trie path (empty if none), to pass to [`RawTables::node_on_path`]
    /// and give back with [`RawTables::put_path`].
    pub fn take_path(&mut self, tid: u32) -> Vec<PathStep> {
        let path = self.paths.remove(&tid).unwrap_or_default();
        self.path_steps -= path.len();
        path
    }

    /// Keeps `path` as thread `tid`'s last, if the paths have room.
    pub fn put_path(&mut self, tid: u32, path: Vec<PathStep>) {
        if self.path_steps + path.len() <= MAX_PATH_STEPS {
            self.path_steps += path.len();
            self.paths.insert(tid, path);
        }
    }

    /// Forgets a thread's last path (it exited).
    pub fn forget_path(&mut self, tid: u32) {
        drop(self.take_path(tid));
    }

    /// Distinct frames plus trie nodes held.
    pub fn entries(&self) -> usize {
        self.frames.len() + self.nodes.len()
    }

    /// Everything interned since the previous call.
    pub fn take_new(&mut self) -> NewEntries {
        let (m, f, n) = self.sent;
        self.sent = (self.mappings.len(), self.frames.len(), self.nodes.len());
        NewEntries {
            mappings: self.mappings[m..].to_vec(),
            frames: self.frames[f..].to_vec(),
            nodes: self.nodes[n..].to_vec(),
        }
    }

    /// Forgets everything: the next ids start at 0.
    pub fn clear(&mut self) {
        self.mappings.clear();
        self.mapping_index.clear();
        self.frames.clear();
        self.frame_index.clear();
        self.nodes.clear();
        self.node_index.clear();
        self.paths.clear();
        self.path_steps = 0;
        self.sent = (0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(address: u64) -> RawFrame {
        RawFrame {
            kind: RawKind::Unknown,
            address,
            live: false,
        }
    }

    /// Interns `stack` (root first) on thread `tid`'s path from `root`; its leaf's node.
    fn intern(t: &mut RawTables, tid: u32, root: u32, stack: &[u64]) -> u32 {
        let mut path = t.take_path(tid);
        let mut node = root;
        for (depth, &a) in stack.iter().enumerate() {
            node = t.node_on_path(&mut path, depth, node, frame(a));
        }
        t.put_path(tid, path);
        node
    }

    #[test]
    fn a_threads_last_path_gives_the_nodes_the_trie_would() {
        let mut t = RawTables::new();
        let a = intern(&mut t, 1, NO_NODE, &[10, 20, 30]);
        let b = intern(&mut t, 1, NO_NODE, &[10, 20, 40]);
        // Another thread, and a stack under another root with the same frames.
        let c = intern(&mut t, 2, NO_NODE, &[10, 20, 30]);
        let root = t.node(NO_NODE, frame(5));
        let d = intern(&mut t, 1, root, &[10, 20, 30]);
        let mut direct = RawTables::new();
        let leaf = |t: &mut RawTables, root: u32, stack: &[u64]| {
            stack.iter().fold(root, |n, &a| t.node(n, frame(a)))
        };
        let (a2, b2) = (
            leaf(&mut direct, NO_NODE, &[10, 20, 30]),
            leaf(&mut direct, NO_NODE, &[10, 20, 40]),
        );
        let root2 = direct.node(NO_NODE, frame(5));
        let d2 = leaf(&mut direct, root2, &[10, 20, 30]);
        assert_eq!((a, b, c, d), (a2, b2, a2, d2));
        assert_eq!(t.nodes, direct.nodes);
        assert_eq!(t.path_steps, 3 + 3);
        t.forget_path(1);
        assert_eq!(t.path_steps, 3);
        t.clear();
        assert_eq!((t.paths.len(), t.path_steps), (0, 0));
        // After a clear the ids start again: no step of an old path is reused.
        assert_eq!(intern(&mut t, 2, NO_NODE, &[10]), 0);
    }

    #[test]
    fn paths_past_their_budget_are_not_kept() {
        let mut t = RawTables::new();
        let deep: Vec<u64> = (0..MAX_PATH_STEPS as u64).collect();
        intern(&mut t, 1, NO_NODE, &deep);
        intern(&mut t, 2, NO_NODE, &[1, 2]);
        assert_eq!((t.paths.len(), t.path_steps), (1, MAX_PATH_STEPS));
        t.forget_path(1);
        intern(&mut t, 2, NO_NODE, &[1, 2]);
        assert_eq!(t.path_steps, 2);
    }

    #[test]
    fn stacks_starting_past_the_root_share_the_path_at_the_same_depths() {
        let mut t = RawTables::new();
        // The nodes the trie holds for a stack, looked up frame by frame.
        let leaf = |t: &mut RawTables, stack: &[u64]| {
            stack.iter().fold(NO_NODE, |n, &a| t.node(n, frame(a)))
        };
        let intern_at = |t: &mut RawTables, tid: u32, from: u32, depth: usize, stack: &[u64]| {
            let mut path = t.take_path(tid);
            let mut node = from;
            for (step, &a) in stack.iter().enumerate() {
                node = t.node_on_path(&mut path, depth + step, node, frame(a));
            }
            t.put_path(tid, path);
            node
        };
        intern(&mut t, 1, NO_NODE, &[10, 20, 30, 40]);
        let at_20 = leaf(&mut t, &[10, 20]);
        // From the node of [10, 20]: its frames are at depths 2 and 3.
        let a = intern_at(&mut t, 1, at_20, 2, &[30, 50]);
        assert_eq!(t.paths[&1].len(), 4);
        let b = intern(&mut t, 1, NO_NODE, &[10, 20, 30, 60]);
        // A thread whose first stack starts past the root.
        let c = intern_at(&mut t, 2, at_20, 2, &[30]);
        assert_eq!(&t.paths[&2][..2], &[HOLE, HOLE]);
        assert_eq!(t.paths[&2][2].0, at_20);
        let d = intern(&mut t, 2, NO_NODE, &[10, 20, 30, 70]);
        assert_eq!(
            [a, b, c, d],
            [
                leaf(&mut t, &[10, 20, 30, 50]),
                leaf(&mut t, &[10, 20, 30, 60]),
                leaf(&mut t, &[10, 20, 30]),
                leaf(&mut t, &[10, 20, 30, 70]),
            ]
        );
    }
}
