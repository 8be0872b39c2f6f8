//! [`Profile`]: the interned tables, the stack trie and the columnar samples.

use std::collections::HashMap;

/// The hash map behind every interning index: foldhash is several times faster than the default
/// SipHash on these small keys and still seeds itself per map, so crafted inputs can't force
/// collisions. Identity never rests on the hash: keys are always compared in full.
type Index<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

use crate::ids::{FrameId, FunctionId, MappingId, StackId, StringId, ThreadId};
use crate::metadata::Metadata;
use crate::model::{Frame, FrameKind, Function, Mapping, Process, SampleType, StackNode, Thread};
use crate::truncation::TruncateReason;

mod checkpoint;

/// Errors from building a profile with inconsistent input.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProfileError {
    /// A sample carried a different number of values than the profile has sample types.
    #[error("sample has {got} values but the profile has {expected} sample types")]
    ValueCount {
        /// Number of sample types.
        expected: usize,
        /// Number of values given.
        got: usize,
    },
    /// An id referred past the end of its table.
    #[error("{table} id {id} is out of range ({len} rows)")]
    BadId {
        /// Which table.
        table: &'static str,
        /// The offending id.
        id: u32,
        /// Rows in the table.
        len: usize,
    },
}

/// Columnar samples: the n-th sample is `(times[n], threads[n], stacks[n], values[k][n] for each type k)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Samples {
    /// Sample times in nanoseconds (same clock as the metadata's start/end).
    pub times: Vec<u64>,
    /// The thread each sample was taken on.
    pub threads: Vec<ThreadId>,
    /// The leaf stack node of each sample.
    pub stacks: Vec<StackId>,
    /// One column per sample type, each as long as `times`.
    pub values: Vec<Vec<i64>>,
}

impl Samples {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.times.len()
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.times.is_empty()
    }
}

/// A profile: interned tables, a stack trie and columnar samples, plus [`Metadata`].
///
/// All tables are append-only; ids stay valid for the life of the profile.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    /// Facts about the whole profile.
    pub metadata: Metadata,
    strings: Vec<Box<str>>,
    string_index: Index<Box<str>, StringId>,
    mappings: Vec<Mapping>,
    mapping_index: Index<Mapping, MappingId>,
    functions: Vec<Function>,
    function_index: Index<Function, FunctionId>,
    frames: Vec<Frame>,
    frame_index: Index<Frame, FrameId>,
    stacks: Vec<StackNode>,
    stack_depths: Vec<u32>,
    stack_index: Index<StackNode, StackId>,
    threads: Vec<Thread>,
    thread_index: Index<(u32, u32), ThreadId>,
    processes: Vec<Process>,
    process_index: Index<u32, usize>,
    sample_types: Vec<SampleType>,
    samples: Samples,
    samples_taken: u64,
}

fn next_id(len: usize, table: &'static str) -> u32 {
    u32::try_from(len).unwrap_or_else(|_| panic!("{table} table exceeds u32::MAX rows"))
}

impl Profile {
    /// An empty profile whose samples carry one value per entry of `sample_types`.
    pub fn new(sample_types: Vec<SampleType>) -> Profile {
        let mut profile = Profile {
            samples: Samples {
                values: vec![Vec::new(); sample_types.len()],
                ..Samples::default()
            },
            sample_types,
            ..Profile::default()
        };
        // String 0 is always the empty string, as in pprof.
        profile.intern_string("");
        profile
    }

    // ----- strings -----

    /// Interns `s`, returning the id of the equal string if one exists.
    pub fn intern_string(&mut self, s: &str) -> StringId {
        if let Some(&id) = self.string_index.get(s) {
            return id;
        }
        let id = StringId(next_id(self.strings.len(), "string"));
        self.strings.push(s.into());
        self.string_index.insert(s.into(), id);
        id
    }

    /// The string with id `id` (the empty string for an unknown id).
    pub fn string(&self, id: StringId) -> &str {
        self.strings.get(id.index()).map_or("", |s| s)
    }

    /// All strings in id order.
    pub fn strings(&self) -> &[Box<str>] {
        &self.strings
    }

    // ----- mappings, functions, frames -----

    /// Interns a mapping by its full key.
    pub fn intern_mapping(&mut self, mapping: Mapping) -> MappingId {
        intern(
            &mut self.mappings,
            &mut self.mapping_index,
            mapping,
            MappingId,
            "mapping",
        )
    }

    /// The mapping with id `id`.
    pub fn mapping(&self, id: MappingId) -> &Mapping {
        &self.mappings[id.index()]
    }

    /// All mappings in id order.
    pub fn mappings(&self) -> &[Mapping] {
        &self.mappings
    }

    /// Interns a function by its full key.
    pub fn intern_function(&mut self, function: Function) -> FunctionId {
        intern(
            &mut self.functions,
            &mut self.function_index,
            function,
            FunctionId,
            "function",
        )
    }

    /// The function with id `id`.
    pub fn function(&self, id: FunctionId) -> &Function {
        &self.functions[id.index()]
    }

    /// All functions in id order.
    pub fn functions(&self) -> &[Function] {
        &self.functions
    }

    /// Interns a frame by its full key.
    pub fn intern_frame(&mut self, frame: Frame) -> FrameId {
        intern(
            &mut self.frames,
            &mut self.frame_index,
            frame,
            FrameId,
            "frame",
        )
    }

    /// Interns a frame known only by name (no mapping, address 0), as text formats give them.
    pub fn intern_named_frame(&mut self, name: &str, kind: FrameKind) -> FrameId {
        let name = self.intern_string(name);
        let function = self.intern_function(Function::new(name, None));
        self.intern_frame(Frame {
            function,
            mapping: None,
            address: 0,
            line: None,
            inline_depth: 0,
            kind,
            from_live_memory: false,
        })
    }

    /// Interns the frame that ends a stack cut short for `reason` (`[truncated: <reason>]`, kind
    /// [`FrameKind::Truncated`]): the one way any producer writes a truncation.
    pub fn intern_truncated(&mut self, reason: TruncateReason) -> FrameId {
        self.intern_named_frame(&reason.frame_name(), FrameKind::Truncated)
    }

    /// The reason a truncation frame stands for; None for any other frame, and for a
    /// truncation frame whose text no reason spells (another producer's own words).
    pub fn truncate_reason(&self, id: FrameId) -> Option<TruncateReason> {
        if self.frame(id).kind != FrameKind::Truncated {
            return None;
        }
        TruncateReason::parse_frame_name(self.frame_name(id))
    }

    /// The frame with id `id`.
    pub fn frame(&self, id: FrameId) -> &Frame {
        &self.frames[id.index()]
    }

    /// All frames in id order.
    pub fn frames(&self) -> &[Frame] {
        &self.frames
    }

    /// The display name of a frame's function.
    pub fn frame_name(&self, id: FrameId) -> &str {
        self.string(self.frame_name_id(id))
    }

    /// The id of the display name of a frame's function: frames whose names are equal have the
    /// same id (strings are interned), so it stands for the name where names are counted.
    pub fn frame_name_id(&self, id: FrameId) -> StringId {
        self.function(self.frame(id).function).name
    }

    // ----- stack trie -----

    /// Interns the stack node `frame` called from `parent` (None: `frame` is a root frame).
    pub fn intern_stack(&mut self, parent: Option<StackId>, frame: FrameId) -> StackId {
        let node = StackNode { parent, frame };
        if let Some(&id) = self.stack_index.get(&node) {
            return id;
        }
        let depth = parent.map_or(1, |p| self.stack_depths[p.index()] + 1);
        let id = StackId(next_id(self.stacks.len(), "stack"));
        self.stacks.push(node);
        self.stack_depths.push(depth);
        self.stack_index.insert(node, id);
        id
    }

    /// Interns a whole stack given root first; `None` for an empty stack.
    pub fn intern_stack_root_first<I>(&mut self, frames: I) -> Option<StackId>
    where
        I: IntoIterator<Item = FrameId>,
    {
        frames
            .into_iter()
            .fold(None, |parent, frame| Some(self.intern_stack(parent, frame)))
    }

    /// The trie node with id `id`.
    pub fn stack(&self, id: StackId) -> &StackNode {
        &self.stacks[id.index()]
    }

    /// All trie nodes in id order (a parent always has a smaller id than its children).
    pub fn stacks(&self) -> &[StackNode] {
        &self.stacks
    }

    /// Number of frames in the stack ending at `id`.
    pub fn stack_depth(&self, id: StackId) -> u32 {
        self.stack_depths[id.index()]
    }

    /// The frames of the stack ending at `id`, leaf first.
    pub fn stack_frames(&self, id: StackId) -> StackFrames<'_> {
        StackFrames {
            profile: self,
            next: Some(id),
        }
    }

    /// The frames of the stack ending at `id`, root first, written into `out` (cleared first).
    pub fn stack_frames_root_first(&self, id: StackId, out: &mut Vec<FrameId>) {
        out.clear();
        out.extend(self.stack_frames(id));
        out.reverse();
    }

    // ----- threads and processes -----

    /// Interns the thread `(pid, tid)`; a later call may set or change its name.
    pub fn intern_thread(&mut self, pid: u32, tid: u32) -> ThreadId {
        if let Some(&id) = self.thread_index.get(&(pid, tid)) {
            return id;
        }
        let id = ThreadId(next_id(self.threads.len(), "thread"));
        self.threads.push(Thread {
            pid,
            tid,
            name: None,
        });
        self.thread_index.insert((pid, tid), id);
        id
    }

    /// Sets a thread's name.
    pub fn set_thread_name(&mut self, id: ThreadId, name: &str) {
        let name = self.intern_string(name);
        self.threads[id.index()].name = Some(name);
    }

    /// The thread with id `id`.
    pub fn thread(&self, id: ThreadId) -> &Thread {
        &self.threads[id.index()]
    }

    /// All threads in id order.
    pub fn threads(&self) -> &[Thread] {
        &self.threads
    }

    /// The thread's name, if it has one.
    pub fn thread_name(&self, id: ThreadId) -> Option<&str> {
        self.thread(id).name.map(|n| self.string(n))
    }

    /// Records process `pid` (once) and returns a mutable reference to it.
    pub fn intern_process(&mut self, pid: u32) -> &mut Process {
        let index = *self.process_index.entry(pid).or_insert_with(|| {
            self.processes.push(Process {
                pid,
                name: None,
                command_line: None,
            });
            self.processes.len() - 1
        });
        &mut self.processes[index]
    }

    /// Sets a process's short name (`comm`).
    pub fn set_process_name(&mut self, pid: u32, name: &str) {
        let name = self.intern_string(name);
        self.intern_process(pid).name = Some(name);
    }

    /// The process with id `pid`, if recorded.
    pub fn process(&self, pid: u32) -> Option<&Process> {
        self.process_index.get(&pid).map(|&i| &self.processes[i])
    }

    /// All processes in the order they were first recorded.
    pub fn processes(&self) -> &[Process] {
        &self.processes
    }

    /// The process name of a thread's process, if known.
    pub fn process_name(&self, pid: u32) -> Option<&str> {
        self.process(pid)
            .and_then(|p| p.name)
            .map(|n| self.string(n))
    }

    // ----- samples -----

    /// The sample value types, in column order.
    pub fn sample_types(&self) -> &[SampleType] {
        &self.sample_types
    }

    /// The columnar samples.
    pub fn samples(&self) -> &Samples {
        &self.samples
    }

    /// Appends a sample. `values` must hold one value per sample type.
    pub fn push_sample(
        &mut self,
        time_ns: u64,
        thread: ThreadId,
        stack: StackId,
        values: &[i64],
    ) -> Result<(), ProfileError> {
        if values.len() != self.sample_types.len() {
            return Err(ProfileError::ValueCount {
                expected: self.sample_types.len(),
                got: values.len(),
            });
        }
        check_id("thread", thread.0, self.threads.len())?;
        check_id("stack", stack.0, self.stacks.len())?;
        self.samples.times.push(time_ns);
        self.samples.threads.push(thread);
        self.samples.stacks.push(stack);
        for (column, &value) in self.samples.values.iter_mut().zip(values) {
            column.push(value);
        }
        Ok(())
    }

    /// Removes and returns all samples, leaving the tables untouched (bounded-memory recording).
    ///
    /// A recorder that streams to a `.rlp` file writes a chunk, then takes the samples it just wrote
    /// so memory stays proportional to the distinct stacks, not to the samples. The count of samples
    /// taken so far is kept (see [`Profile::samples_taken`]) so a writer can tell written samples
    /// from new ones.
    pub fn take_samples(&mut self) -> Samples {
        let empty = Samples {
            values: vec![Vec::new(); self.sample_types.len()],
            ..Samples::default()
        };
        let taken = std::mem::replace(&mut self.samples, empty);
        self.samples_taken += taken.len() as u64;
        taken
    }

    /// Number of samples removed by [`Profile::take_samples`] over the life of the profile: the
    /// absolute index of `samples()`'s first sample among all samples ever pushed.
    pub fn samples_taken(&self) -> u64 {
        self.samples_taken
    }

    /// Replaces the stack of sample `index` (used by repair; the sample keeps its time and values).
    pub fn set_sample_stack(&mut self, index: usize, stack: StackId) -> Result<(), ProfileError> {
        check_id("stack", stack.0, self.stacks.len())?;
        check_id(
            "sample",
            u32::try_from(index).unwrap_or(u32::MAX),
            self.samples.len(),
        )?;
        self.samples.stacks[index] = stack;
        Ok(())
    }

    /// Keeps only value column `column` (its sample type and values), dropping the others: a
    /// profile of one measure (e.g. off-CPU time) for writers that show one value.
    pub fn keep_value_column(&mut self, column: usize) -> Result<(), ProfileError> {
        let len = self.sample_types.len();
        check_id(
            "sample type",
            u32::try_from(column).unwrap_or(u32::MAX),
            len,
        )?;
        let kept = std::mem::take(&mut self.samples.values[column]);
        self.samples.values = vec![kept];
        let sample_type = self.sample_types.swap_remove(column);
        self.sample_types = vec![sample_type];
        Ok(())
    }

    /// Sum of each value column over all samples.
    pub fn totals(&self) -> Vec<i64> {
        self.samples
            .values
            .iter()
            .map(|column| column.iter().copied().fold(0i64, i64::saturating_add))
            .collect()
    }
}

fn check_id(table: &'static str, id: u32, len: usize) -> Result<(), ProfileError> {
    if (id as usize) < len {
        Ok(())
    } else {
        Err(ProfileError::BadId { table, id, len })
    }
}

fn intern<T, I>(
    rows: &mut Vec<T>,
    index: &mut Index<T, I>,
    row: T,
    make_id: fn(u32) -> I,
    table: &'static str,
) -> I
where
    T: Copy + Eq + std::hash::Hash,
    I: Copy,
{
    if let Some(&id) = index.get(&row) {
        return id;
    }
    let id = make_id(next_id(rows.len(), table));
    rows.push(row);
    index.insert(row, id);
    id
}

/// Iterator over the frames of a stack, leaf first. See [`Profile::stack_frames`].
pub struct StackFrames<'a> {
    profile: &'a Profile,
    next: Option<StackId>,
}

impl Iterator for StackFrames<'_> {
    type Item = FrameId;

    fn next(&mut self) -> Option<FrameId> {
        let node = self.profile.stack(self.next?);
        self.next = node.parent;
        Some(node.frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_trie_shares_prefixes_and_keys_on_full_pair() {
        let mut p = Profile::new(vec![SampleType::samples()]);
        let main = p.intern_named_frame("main", FrameKind::Native);
        let a = p.intern_named_frame("a", FrameKind::Native);
        let leaf = p.intern_named_frame("leaf", FrameKind::Native);
        let s1 = p.intern_stack_root_first([main, a, leaf]).unwrap();
        let s2 = p.intern_stack_root_first([main, a, leaf]).unwrap();
        let s3 = p.intern_stack_root_first([main, leaf]).unwrap();
        assert_eq!(s1, s2);
        assert_ne!(s1, s3);
        // main, main;a, main;a;leaf, main;leaf
        assert_eq!(p.stacks().len(), 4);
        assert_eq!(p.stack_depth(s1), 3);
        let names: Vec<&str> = p.stack_frames(s1).map(|f| p.frame_name(f)).collect();
        assert_eq!(names, ["leaf", "a", "main"]);
    }

    #[test]
    fn same_name_different_kind_is_a_different_frame() {
        let mut p = Profile::new(vec![]);
        let a = p.intern_named_frame("x", FrameKind::Native);
        let b = p.intern_named_frame("x", FrameKind::Jit);
        assert_ne!(a, b);
        assert_eq!(p.functions().len(), 1);
    }

    #[test]
    fn push_sample_checks_value_count_and_ids() {
        let mut p = Profile::new(vec![SampleType::samples(), SampleType::cpu_nanoseconds()]);
        let t = p.intern_thread(1, 1);
        let f = p.intern_named_frame("f", FrameKind::Native);
        let s = p.intern_stack(None, f);
        assert!(p.push_sample(0, t, s, &[1]).is_err());
        assert!(p.push_sample(0, t, StackId(9), &[1, 2]).is_err());
        p.push_sample(5, t, s, &[1, 1000]).unwrap();
        p.push_sample(6, t, s, &[1, 1000]).unwrap();
        assert_eq!(p.totals(), vec![2, 2000]);
        assert_eq!(p.samples().len(), 2);
    }
}
