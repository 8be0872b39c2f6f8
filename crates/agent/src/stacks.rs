//! Interned stacks shared by a sample source, the capture thread and the exporter thread.
//!
//! A [`StackTable`] is a stack trie like the profile's: frames are interned once, and a
//! [`StackId`] names a node `(caller's node, frame)`, so a sample refers to its whole stack by
//! one id and no stack is copied per sample. The production source mirrors rootline-capture's
//! profile tables into one (same ids, appended at each flush); a table is replaced by a new one,
//! with a new [`StackTable::id`], when the capture side starts its tables over. Handles are
//! cheap to clone; the table is read under a lock held only for a lookup or an export.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use rootline_profile::{FrameKind, StackId, TruncateReason};

/// One frame of a captured stack, already symbolized.
///
/// Names and module paths are `Arc<str>` so a source can intern them once and hand out cheap
/// clones; equality still compares the text, so identity never rests on a pointer or a hash.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FrameDesc {
    /// Display name of the function (or `[truncated: reason]`, or `0x…` when unnamed).
    pub name: Arc<str>,
    /// Path of the module (binary, library, `[kernel.kallsyms]`, JIT region) holding the address.
    pub module: Option<Arc<str>>,
    /// Instruction address, 0 when the source only has a name.
    pub address: u64,
    /// 0 for a physical frame, n > 0 for the n-th inlined frame at the same address.
    pub inline_depth: u8,
    /// Where the code comes from.
    pub kind: FrameKind,
    /// What the JIT said about the code beyond its display name, when it said anything.
    pub code: Option<Arc<CodeDetail>>,
}

/// What a runtime's JIT says about a piece of code besides its display name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CodeDetail {
    /// The name exactly as the runtime wrote it (a CoreCLR perf map's whole line).
    pub system_name: Option<Arc<str>>,
    /// The code tier (`QuickJitted`, `OptimizedTier1OSR`, `ReadyToRun`, …).
    pub tier: Option<Arc<str>>,
}

impl FrameDesc {
    /// Bytes one frame of a stack is charged in the stack cache and the sample buffers.
    pub const COST: usize = std::mem::size_of::<FrameDesc>();

    /// A native frame with a name and an address, without a module.
    pub fn native(name: &str, address: u64) -> FrameDesc {
        FrameDesc {
            name: Arc::from(name),
            module: None,
            address,
            inline_depth: 0,
            kind: FrameKind::Native,
            code: None,
        }
    }
}

/// No caller: the node of a root frame.
const NO_PARENT: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    parent: u32,
    frame: u32,
    /// Frames from the root to this node, both included.
    depth: u32,
    /// The root frame of the stack.
    root: u32,
}

#[derive(Debug, Default)]
struct Tables {
    frames: Vec<FrameDesc>,
    nodes: Vec<Node>,
    /// Filled by [`StackTable::intern`] only (a mirror keeps its source's ids).
    frame_index: HashMap<FrameDesc, u32>,
    node_index: HashMap<(u32, u32), u32>,
}

/// A shared, append-only stack trie. See the module documentation.
#[derive(Debug, Clone)]
pub struct StackTable {
    id: u64,
    tables: Arc<RwLock<Tables>>,
}

impl Default for StackTable {
    fn default() -> StackTable {
        StackTable::new()
    }
}

/// A stack in a [`StackTable`]: the handle of the table and the node of the leaf frame.
#[derive(Debug, Clone)]
pub struct StackRef {
    /// The table.
    pub table: StackTable,
    /// The leaf's node.
    pub id: StackId,
    /// Frames of the stack.
    pub depth: u32,
}

impl StackTable {
    /// An empty table with an id no other table of this process has.
    pub fn new() -> StackTable {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        StackTable {
            id: NEXT.fetch_add(1, Relaxed),
            tables: Arc::default(),
        }
    }

    /// This table's id (tables are never confused, even after one is dropped).
    pub fn id(&self) -> u64 {
        self.id
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Tables> {
        // A writer that panicked left whole rows behind (rows are pushed whole), so go on.
        self.tables.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the table (for resolving many stacks under one lock).
    pub fn read(&self) -> StackView<'_> {
        StackView(self.tables.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Interns a stack given root first, by the full value of every frame; an empty stack
    /// becomes one `[truncated: empty stack]` frame.
    pub fn intern(&self, frames: &[FrameDesc]) -> StackId {
        let mut t = self.write();
        let t = &mut *t;
        let empty;
        let frames = if frames.is_empty() {
            empty = [FrameDesc {
                name: Arc::from(TruncateReason::NoStackInInput.frame_name()),
                module: None,
                address: 0,
                inline_depth: 0,
                kind: FrameKind::Truncated,
                code: None,
            }];
            &empty[..]
        } else {
            frames
        };
        let mut parent = NO_PARENT;
        for frame in frames {
            let f = match t.frame_index.get(frame) {
                Some(&f) => f,
                None => {
                    let f = t.frames.len() as u32;
                    t.frames.push(frame.clone());
                    t.frame_index.insert(frame.clone(), f);
                    f
                }
            };
            parent = match t.node_index.get(&(parent, f)) {
                Some(&n) => n,
                None => {
                    let n = push_node(&mut t.nodes, parent, f);
                    t.node_index.insert((parent, f), n);
                    n
                }
            };
        }
        StackId(parent)
    }

    /// Appends frames and trie nodes `(caller's node, frame)` that a source interned elsewhere
    /// under the next ids of this table (a mirror of its tables). A node naming a caller or
    /// frame not in the table is cut to a root of an unnamed frame, so ids stay in step.
    pub fn append(
        &self,
        frames: impl IntoIterator<Item = FrameDesc>,
        nodes: impl IntoIterator<Item = (Option<StackId>, u32)>,
    ) {
        let mut t = self.write();
        let t = &mut *t;
        t.frames.extend(frames);
        for (parent, frame) in nodes {
            let parent = parent
                .map(|p| p.0)
                .filter(|&p| (p as usize) < t.nodes.len())
                .unwrap_or(NO_PARENT);
            let frame = if (frame as usize) < t.frames.len() {
                frame
            } else {
                t.frames.push(FrameDesc::native("[unknown]", 0));
                (t.frames.len() - 1) as u32
            };
            push_node(&mut t.nodes, parent, frame);
        }
    }

    /// Frames and nodes held.
    pub fn len(&self) -> (usize, usize) {
        let t = self.read();
        (t.0.frames.len(), t.0.nodes.len())
    }

    /// Whether the table holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == (0, 0)
    }

    /// The depth of stack `id` and what `root` makes of its root frame (None: no such stack).
    pub fn summary<R>(&self, id: StackId, root: impl FnOnce(&FrameDesc) -> R) -> Option<(u32, R)> {
        let view = self.read();
        let node = view.0.nodes.get(id.index())?;
        Some((node.depth, root(&view.0.frames[node.root as usize])))
    }
}

fn push_node(nodes: &mut Vec<Node>, parent: u32, frame: u32) -> u32 {
    let (depth, root) = match nodes.get(parent as usize) {
        Some(p) => (p.depth + 1, p.root),
        None => (1, frame),
    };
    nodes.push(Node {
        parent,
        frame,
        depth,
        root,
    });
    (nodes.len() - 1) as u32
}

/// A [`StackTable`] under its read lock.
pub struct StackView<'t>(RwLockReadGuard<'t, Tables>);

impl StackView<'_> {
    /// The caller's node and the frame index of node `id` (None: no such node).
    pub fn node(&self, id: StackId) -> Option<(Option<StackId>, u32)> {
        let n = self.0.nodes.get(id.index())?;
        Some((
            (n.parent != NO_PARENT).then_some(StackId(n.parent)),
            n.frame,
        ))
    }

    /// Frame `index` of the table.
    pub fn frame(&self, index: u32) -> Option<&FrameDesc> {
        self.0.frames.get(index as usize)
    }

    /// The frames of stack `id`, root first, into `out` (cleared first).
    pub fn frames_root_first(&self, id: StackId, out: &mut Vec<FrameDesc>) {
        out.clear();
        let mut next = Some(id);
        while let Some((parent, frame)) = next.and_then(|id| self.node(id)) {
            out.extend(self.frame(frame).cloned());
            next = parent;
        }
        out.reverse();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(names: &[&str]) -> Vec<FrameDesc> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| FrameDesc::native(n, 0x1000 + i as u64))
            .collect()
    }

    #[test]
    fn interning_shares_prefixes_and_gives_back_the_whole_stack() {
        let table = StackTable::new();
        let a = table.intern(&stack(&["main", "run", "leaf"]));
        let b = table.intern(&stack(&["main", "run", "other"]));
        assert_ne!(a, b);
        assert_eq!(table.intern(&stack(&["main", "run", "leaf"])), a);
        assert_eq!(table.len().1, 4, "main and run are shared");
        let mut out = Vec::new();
        table.read().frames_root_first(b, &mut out);
        assert_eq!(out, stack(&["main", "run", "other"]));
        assert_eq!(
            table.summary(a, |root| root.name.clone()),
            Some((3, Arc::from("main")))
        );
    }

    #[test]
    fn a_mirror_keeps_its_sources_ids_and_survives_bad_rows() {
        let table = StackTable::new();
        table.append(
            stack(&["main", "leaf"]),
            [(None, 0), (Some(StackId(0)), 1), (Some(StackId(9)), 7)],
        );
        let mut out = Vec::new();
        table.read().frames_root_first(StackId(1), &mut out);
        assert_eq!(out, stack(&["main", "leaf"]));
        table.read().frames_root_first(StackId(2), &mut out);
        assert_eq!(
            out.len(),
            1,
            "a row naming unknown ids becomes a root of its own"
        );
        assert_ne!(StackTable::new().id(), table.id());
    }

    #[test]
    fn an_empty_stack_is_an_explicit_truncation() {
        let table = StackTable::new();
        let id = table.intern(&[]);
        let kind = table.summary(id, |root| root.kind);
        assert_eq!(kind, Some((1, FrameKind::Truncated)));
    }
}
