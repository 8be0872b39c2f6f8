//! Per-thread slice nesting: turns `B`/`E`/`X` events into samples of the open-slice stack.
//!
//! A thread's events go through a bounded reorder window (sorted by time, stable), so traces whose
//! events are slightly out of order still nest right while a huge trace keeps only
//! [`WINDOW`] pending events per thread. Each event that changes the stack is a *transition*; the
//! stack current after it lasts until the next event time on that thread and becomes one sample
//! whose weight is that duration. Several transitions at one instant yield one sample.

use rustc_hash::FxHashMap;

/// Pending events kept per thread before the earliest are nested.
pub const WINDOW: usize = 1 << 16;

/// Marks "no parent" in [`KeyTrie`].
pub const NO_PARENT: u32 = u32::MAX;

/// A stack trie over frame keys; resolved to profile frames once the whole file is read.
#[derive(Debug, Default)]
pub struct KeyTrie {
    /// `(parent, key)` per node; parents always precede their children.
    pub nodes: Vec<(u32, u32)>,
    index: FxHashMap<(u32, u32), u32>,
}

impl KeyTrie {
    /// The node for `key` called from `parent` ([`NO_PARENT`] for a root).
    pub fn intern(&mut self, parent: u32, key: u32) -> u32 {
        let len = self.nodes.len() as u32;
        let id = *self.index.entry((parent, key)).or_insert(len);
        if id == len {
            self.nodes.push((parent, key));
        }
        id
    }

    /// Frees the lookup index once no more nodes will be added.
    pub fn release_index(&mut self) {
        self.index = FxHashMap::default();
    }
}

/// Where a sample's stack comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackRef {
    /// A node of the [`KeyTrie`] (slice nesting).
    Node(u32),
    /// A `stackFrames` entry (the `samples` dialect): the stack is its parent chain.
    Sf(u32),
}

/// Samples gathered while reading, before the profile is built.
#[derive(Debug, Default)]
pub struct Sink {
    /// Sample start times, nanoseconds.
    pub times: Vec<i64>,
    /// Thread index (into the reader's thread list) per sample.
    pub threads: Vec<u32>,
    /// Stack per sample.
    pub stacks: Vec<StackRef>,
    /// Wall-clock nanoseconds per sample (0 for `samples` entries).
    pub wall: Vec<i64>,
    /// Sample count per sample (0 for slice-derived samples).
    pub count: Vec<i64>,
}

impl Sink {
    /// Appends one sample.
    pub fn push(&mut self, time: i64, thread: u32, stack: StackRef, wall: i64, count: i64) {
        self.times.push(time);
        self.threads.push(thread);
        self.stacks.push(stack);
        self.wall.push(wall);
        self.count.push(count);
    }
}

/// Counts of what nesting found, reported in the profile's metadata.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    /// Events that changed a thread's open-slice stack.
    pub transitions: u64,
    /// Events earlier than an instant already nested (treated as happening at that instant).
    pub out_of_order: u64,
    /// `E` events with no open slice to close.
    pub unmatched_end: u64,
    /// `E` events that closed a slice other than the innermost one (matched by name).
    pub mismatched_end: u64,
    /// `X` events of zero duration (they hold no time and are skipped).
    pub zero_duration: u64,
}

/// What an event does to a thread's open-slice stack.
#[derive(Debug, Clone, Copy)]
pub enum Action {
    /// `B`: open a slice.
    Begin(u32),
    /// `E`: close the innermost slice (or the innermost one with this key).
    End(Option<u32>),
    /// `X` start: open a slice that closes itself at `end`.
    XBegin {
        /// The frame key.
        key: u32,
        /// The end time, ns.
        end: i64,
        /// Identifies the slice for its end.
        seq: u64,
    },
    /// `X` end.
    XEnd(u64),
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    ts: i64,
    class: u8,
    sub: i64,
    order: u64,
    action: Action,
}

/// The nesting state of one thread.
#[derive(Debug)]
pub struct Timeline {
    thread: u32,
    window: Vec<Pending>,
    open_keys: Vec<u32>,
    open_seq: Vec<u64>,
    open_nodes: Vec<u32>,
    current: Option<i64>,
}

/// Shared state the timelines write into.
pub struct Context<'a> {
    /// The key trie.
    pub trie: &'a mut KeyTrie,
    /// The samples.
    pub sink: &'a mut Sink,
    /// The counters.
    pub counters: &'a mut Counters,
}

impl Timeline {
    /// An empty timeline for thread index `thread`.
    pub fn new(thread: u32) -> Timeline {
        Timeline {
            thread,
            window: Vec::new(),
            open_keys: Vec::new(),
            open_seq: Vec::new(),
            open_nodes: Vec::new(),
            current: None,
        }
    }

    /// Queues an event at `ts` (ns); `order` is its position in the file.
    pub fn push(&mut self, ts: i64, action: Action, order: u64, cx: &mut Context<'_>) {
        let (class, sub) = match action {
            Action::XEnd(seq) => (0, -(seq as i64)),
            Action::Begin(_) | Action::End(_) => (1, 0),
            Action::XBegin { end, .. } => (2, -end),
        };
        self.window.push(Pending {
            ts,
            class,
            sub,
            order,
            action,
        });
        if self.window.len() >= WINDOW {
            self.drain(false, cx);
        }
    }

    /// Nests queued events: all of them when `all`, else those before the latest queued instant.
    fn drain(&mut self, all: bool, cx: &mut Context<'_>) {
        self.window
            .sort_unstable_by_key(|p| (p.ts, p.class, p.sub, p.order));
        let last = self.window.last().map_or(i64::MIN, |p| p.ts);
        let first = self.window.first().map_or(i64::MIN, |p| p.ts);
        let cut = if all || first == last {
            self.window.len()
        } else {
            self.window.partition_point(|p| p.ts < last)
        };
        let mut window = std::mem::take(&mut self.window);
        for p in window.drain(..cut) {
            self.apply(p, cx);
        }
        self.window = window;
    }

    fn apply(&mut self, p: Pending, cx: &mut Context<'_>) {
        let ts = p.ts;
        match self.current {
            Some(cur) if ts < cur => {
                // Nested as if it happened at the instant already reached.
                cx.counters.out_of_order += 1;
            }
            Some(cur) if ts > cur => {
                self.emit(cur, ts, cx);
                self.current = Some(ts);
            }
            Some(_) => {}
            None => self.current = Some(ts),
        }
        let changed = match p.action {
            Action::Begin(key) => {
                self.open(key, 0);
                true
            }
            Action::XBegin { key, seq, .. } => {
                self.open(key, seq);
                true
            }
            Action::XEnd(seq) => match self.open_seq.iter().rposition(|&s| s == seq) {
                Some(i) => {
                    self.remove(i);
                    true
                }
                None => false,
            },
            Action::End(key) => self.end(key, cx.counters),
        };
        if changed {
            cx.counters.transitions += 1;
        }
    }

    fn open(&mut self, key: u32, seq: u64) {
        self.open_keys.push(key);
        self.open_seq.push(seq);
    }

    fn remove(&mut self, i: usize) {
        self.open_keys.remove(i);
        self.open_seq.remove(i);
        self.open_nodes.truncate(i);
    }

    fn end(&mut self, key: Option<u32>, counters: &mut Counters) -> bool {
        let Some(top) = self.open_keys.len().checked_sub(1) else {
            counters.unmatched_end += 1;
            return false;
        };
        let index = match key {
            Some(key) if self.open_keys[top] != key => {
                match self.open_keys.iter().rposition(|&k| k == key) {
                    Some(i) => {
                        counters.mismatched_end += 1;
                        i
                    }
                    // An `E` naming no open slice closes the innermost one, as Chrome does.
                    None => {
                        counters.mismatched_end += 1;
                        top
                    }
                }
            }
            _ => top,
        };
        self.remove(index);
        true
    }

    /// Records the open stack as a sample lasting from `from` to `to`.
    fn emit(&mut self, from: i64, to: i64, cx: &mut Context<'_>) {
        if self.open_keys.is_empty() || to <= from {
            return;
        }
        while self.open_nodes.len() < self.open_keys.len() {
            let parent = self.open_nodes.last().copied().unwrap_or(NO_PARENT);
            let key = self.open_keys[self.open_nodes.len()];
            self.open_nodes.push(cx.trie.intern(parent, key));
        }
        let node = *self.open_nodes.last().unwrap_or(&NO_PARENT);
        cx.sink.push(
            from,
            self.thread,
            StackRef::Node(node),
            to.saturating_sub(from),
            0,
        );
    }

    /// Nests everything left and closes the thread at `end` (ns). Returns the keys of slices still
    /// open at the end, outermost first.
    pub fn finish(&mut self, end: i64, cx: &mut Context<'_>) -> Vec<u32> {
        self.drain(true, cx);
        if let Some(cur) = self.current {
            self.emit(cur, end, cx);
        }
        std::mem::take(&mut self.open_keys)
    }
}
