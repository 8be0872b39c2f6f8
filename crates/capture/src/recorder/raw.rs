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
    node_index: FastMap<(u32, u32), u32>,
    /// Lengths of the three tables at the last [`RawTables::take_new`].
    sent: (usize, usize, usize),
}

impl RawTables {
    /// Empty tables.
    pub fn new() -> RawTables {
        RawTables {
            mapping_index: FastMap::new(),
            frame_index: FastMap::new(),
            node_index: FastMap::new(),
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
        let f = match self.frame_index.get(&frame) {
            Some(&f) => f,
            None => {
                let f = self.frames.len() as u32;
                self.frames.push(frame);
                self.frame_index.insert(frame, f);
                f
            }
        };
        *self.node_index.entry((parent, f)).or_insert_with(|| {
            self.nodes.push((parent, f));
            (self.nodes.len() - 1) as u32
        })
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
        self.sent = (0, 0, 0);
    }
}
