//! Rows of the profile tables. Each row is a plain value; equality of all fields is its identity.

use crate::ids::{FrameId, FunctionId, MappingId, StackId, StringId};

/// A contiguous region of a process's address space backed by a file or by JIT/anonymous memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mapping {
    /// First address of the region.
    pub start: u64,
    /// One past the last address of the region.
    pub end: u64,
    /// Offset in the backing file that `start` maps.
    pub file_offset: u64,
    /// Path of the backing file, or a pseudo name such as `[anon:jit]`.
    pub path: StringId,
    /// Hex GNU build id of the backing file, when known.
    pub build_id: Option<StringId>,
}

/// A function: a display name and, when known, its source file, the name the runtime gave it and
/// the code tier it ran at.
///
/// The display name is what folded output and flame graphs show; two functions that differ only
/// in `system_name` or `tier` (one .NET method at two code tiers) display alike and merge there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Function {
    /// Demangled display name, e.g. `main` or `Rec!Rec.Main(string[])`.
    pub name: StringId,
    /// Source file, when known.
    pub file: Option<StringId>,
    /// The name exactly as the runtime or symbol table wrote it, when it differs from `name`
    /// (e.g. `[Async] Async+<Level>d__3::MoveNext()[OptimizedTier1]` for the `async` method
    /// `Async::Level`).
    pub system_name: Option<StringId>,
    /// The code tier a JIT compiled this code at, when the runtime says (.NET: `QuickJitted`,
    /// `InstrumentedTier`, `OptimizedTier1`, `OptimizedTier1OSR`, `ReadyToRun`, …).
    pub tier: Option<StringId>,
}

impl Function {
    /// A function known by its display name and, optionally, its source file.
    pub fn new(name: StringId, file: Option<StringId>) -> Function {
        Function {
            name,
            file,
            system_name: None,
            tier: None,
        }
    }
}

/// Where a frame's code comes from; decides how viewers colour it and how repair treats it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum FrameKind {
    /// Ahead-of-time compiled user-space code.
    Native = 0,
    /// Kernel code.
    Kernel = 1,
    /// JIT-compiled code named through a perf map or jitdump.
    Jit = 2,
    /// Managed (runtime-described) code, e.g. .NET methods from EventPipe.
    Managed = 3,
    /// A producer's grouping frame, e.g. `Threads` or `CPU_TIME`, not real code.
    Pseudo = 4,
    /// An explicit marker that the stack below this point could not be read: `[truncated: reason]`.
    Truncated = 5,
}

impl FrameKind {
    /// All kinds, in discriminant order.
    pub const ALL: [FrameKind; 6] = [
        FrameKind::Native,
        FrameKind::Kernel,
        FrameKind::Jit,
        FrameKind::Managed,
        FrameKind::Pseudo,
        FrameKind::Truncated,
    ];

    /// The kind with the given discriminant, if any.
    pub fn from_u8(value: u8) -> Option<FrameKind> {
        FrameKind::ALL.get(value as usize).copied()
    }

    /// A short lower-case name: `native`, `kernel`, `jit`, `managed`, `pseudo`, `truncated`.
    pub fn as_str(self) -> &'static str {
        match self {
            FrameKind::Native => "native",
            FrameKind::Kernel => "kernel",
            FrameKind::Jit => "jit",
            FrameKind::Managed => "managed",
            FrameKind::Pseudo => "pseudo",
            FrameKind::Truncated => "truncated",
        }
    }
}

/// One entry of a call stack: a function at an address, in a mapping, of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The function this frame executes.
    pub function: FunctionId,
    /// The mapping holding `address`, when known.
    pub mapping: Option<MappingId>,
    /// Instruction address (0 when the producer gave only a name).
    pub address: u64,
    /// Source line, when known.
    pub line: Option<u32>,
    /// 0 for a physical frame; n > 0 for the n-th inlined frame at the same address.
    pub inline_depth: u8,
    /// Where the code comes from.
    pub kind: FrameKind,
    /// True when the unwinder found this frame in memory read from the live process after the
    /// sample (past the stack bytes copied with it), rather than in the sample's own copy. Part
    /// of the frame's identity, so a reader can tell such frames apart.
    pub from_live_memory: bool,
}

/// A node of the stack trie: a frame called from the stack `parent` (none for a root frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StackNode {
    /// The caller's node; `None` when `frame` is the outermost (root) frame.
    pub parent: Option<StackId>,
    /// The frame at this depth.
    pub frame: FrameId,
}

/// A process seen in the profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// Process id (host namespace when known).
    pub pid: u32,
    /// Short command name (`comm`), when known.
    pub name: Option<StringId>,
    /// Full command line, when known.
    pub command_line: Option<StringId>,
}

/// A thread seen in the profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Thread {
    /// Id of the owning process.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Thread name, when known.
    pub name: Option<StringId>,
}

/// What one sample value column measures: a name and a unit, in pprof's style.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SampleType {
    /// What is measured: `cpu`, `wall`, `samples`, `alloc-bytes`, `alloc-count`, …
    pub name: String,
    /// Unit of the values: `nanoseconds`, `count`, `bytes`.
    pub unit: String,
}

impl SampleType {
    /// A type with the given name and unit.
    pub fn new(name: impl Into<String>, unit: impl Into<String>) -> SampleType {
        SampleType {
            name: name.into(),
            unit: unit.into(),
        }
    }

    /// On-CPU time in nanoseconds.
    pub fn cpu_nanoseconds() -> SampleType {
        SampleType::new("cpu", "nanoseconds")
    }

    /// Time off the CPU (blocked, sleeping or preempted) in nanoseconds, as pprof names it.
    pub fn off_cpu_nanoseconds() -> SampleType {
        SampleType::new("off_cpu", "nanoseconds")
    }

    /// Wall-clock time in nanoseconds.
    pub fn wall_nanoseconds() -> SampleType {
        SampleType::new("wall", "nanoseconds")
    }

    /// A plain sample count.
    pub fn samples() -> SampleType {
        SampleType::new("samples", "count")
    }

    /// Bytes allocated.
    pub fn alloc_bytes() -> SampleType {
        SampleType::new("alloc-bytes", "bytes")
    }

    /// Number of allocations (or of allocation events, where a producer reports one event per
    /// so many bytes, e.g. a .NET GC allocation tick).
    pub fn alloc_count() -> SampleType {
        SampleType::new("alloc-count", "count")
    }

    /// The name pprof readers know this type by: Go's `alloc_space` for `alloc-bytes` and
    /// `alloc_objects` for `alloc-count`; other types keep their name.
    pub fn pprof_name(&self) -> &str {
        match (self.name.as_str(), self.unit.as_str()) {
            ("alloc-bytes", "bytes") => "alloc_space",
            ("alloc-count", "count") => "alloc_objects",
            (name, _) => name,
        }
    }

    /// The type a pprof sample type `name`/`unit` stands for: the inverse of
    /// [`SampleType::pprof_name`].
    pub fn from_pprof(name: &str, unit: &str) -> SampleType {
        match (name, unit) {
            ("alloc_space", "bytes") => SampleType::alloc_bytes(),
            ("alloc_objects", "count") => SampleType::alloc_count(),
            _ => SampleType::new(name, unit),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SampleType;

    #[test]
    fn allocation_types_take_go_names_in_pprof() {
        for (t, name) in [
            (SampleType::alloc_bytes(), "alloc_space"),
            (SampleType::alloc_count(), "alloc_objects"),
            (SampleType::off_cpu_nanoseconds(), "off_cpu"),
            (SampleType::new("alloc-bytes", "count"), "alloc-bytes"),
        ] {
            assert_eq!(t.pprof_name(), name);
            assert_eq!(SampleType::from_pprof(t.pprof_name(), &t.unit), t);
        }
    }
}
