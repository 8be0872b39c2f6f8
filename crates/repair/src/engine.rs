//! The repair passes over each thread's samples. All policy — what is truncated, what is re-attached,
//! what is marked — is decided here and in [`crate::align`], nowhere else.
//!
//! Per thread, in time order:
//! 1. **Forward pass.** Each truncated sample is aligned against the nearest earlier sample that is
//!    complete or already repaired, and the nearest later complete sample. When it aligns, its new
//!    stack is `leading pseudo frames ++ donor base ++ the sample's own frames`, and it becomes the
//!    earlier donor of the next truncated sample, so a long run of deep samples is repaired link by
//!    link from one complete sample.
//! 2. **Backward pass.** Samples the forward pass could not align try again with the nearest later
//!    sample that is now complete or repaired (a run that only a later sample can anchor).
//! 3. Whatever is left is kept with a `[truncated: depth cap N]` frame as its base.
//!
//! In both passes, when the nearest donors offer no alignment (typically a shallow complete sample
//! sits between deep ones, like a call to print between two deep recursions), the nearest
//! *repaired* samples on each side are tried instead. Frames are compared by function name, so the same
//! method at another address (another call site, re-jitted code) still aligns; the re-attached
//! base is the donor's own frames.
//!
//! A guessed (ambiguous) join puts the repair gap frame (`[repair: frames unknown]`) between the
//! re-attached base and the sample's own frames, so every output shows where frames may be missing;
//! a sample whose base, lent by a guessed donor, carries that gap is ambiguous too. A repaired stack
//! has at most one gap, and it is ambiguous exactly when it has one (see [`Engine::join`]). A run of identical
//! truncated stacks costs O(1) per sample after the first (each is its predecessor's repair); any
//! other truncated sample costs O(cap + donor depths) for the alignment, plus hashing only for the
//! frames in which its repaired stack differs from the previous repair. Memory beyond the profile:
//! one byte per sample of outcome and the per-thread sample index lists (4 bytes per sample).

use std::collections::HashMap;

use rootline_profile::pseudo::intern_repair_gap;
use rootline_profile::{FrameId, Profile, ProfileError, StackId, TruncateReason};

use crate::align::{Aligner, Side};
use crate::detect::StackTables;
use crate::report::SampleOutcome;

/// A sample whose frames can be lent: complete, or repaired (then `ambiguous` says if it was a guess).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Donor {
    stack: StackId,
    ambiguous: bool,
}

/// The last alignment: a truncated stack, its next donor, and the result.
type Memo = (StackId, Option<Donor>, Option<(StackId, bool)>);

pub(crate) struct Engine<'a> {
    pub profile: &'a mut Profile,
    pub tables: StackTables,
    pub cap: u32,
    pub min_overlap: usize,
    aligner: Aligner,
    memo: Option<Memo>,
    marked: HashMap<StackId, StackId>,
    truncated_frame: Option<FrameId>,
    gap_frame: Option<FrameId>,
    scratch_t: Vec<u32>,
    scratch_prev: Vec<u32>,
    scratch_next: Vec<u32>,
    /// Alignment keys (function ids) of the truncated stack and the donors.
    keys: [Vec<u32>; 3],
    scratch_full: Vec<FrameId>,
    /// Frames (root first) of the last stack built by [`Engine::rebuild`], and its trie node at each
    /// depth: the next build re-interns only the frames past the prefix it shares with the last one.
    last_frames: Vec<FrameId>,
    last_nodes: Vec<StackId>,
    build: Vec<FrameId>,
}

impl<'a> Engine<'a> {
    pub fn new(
        profile: &'a mut Profile,
        tables: StackTables,
        cap: u32,
        min_overlap: usize,
    ) -> Self {
        Engine {
            profile,
            tables,
            cap,
            min_overlap,
            aligner: Aligner::default(),
            memo: None,
            marked: HashMap::new(),
            truncated_frame: None,
            gap_frame: None,
            scratch_t: Vec::new(),
            scratch_prev: Vec::new(),
            scratch_next: Vec::new(),
            keys: Default::default(),
            scratch_full: Vec::new(),
            last_frames: Vec::new(),
            last_nodes: Vec::new(),
            build: Vec::new(),
        }
    }

    /// Repairs the truncated samples among `indices` (one thread's samples in time order), writing
    /// their outcomes. `tick` is called once per sample handled by the forward pass.
    pub fn repair_thread(
        &mut self,
        indices: &[u32],
        truncated: &[bool],
        outcomes: &mut [SampleOutcome],
        tick: &mut dyn FnMut(),
    ) -> Result<(), ProfileError> {
        let usable = |engine: &Self, i: usize| {
            !truncated[i] && engine.tables.depth(engine.profile.samples().stacks[i]) > 0
        };
        // Forward pass.
        let mut pending: Vec<(usize, Option<Donor>, Option<Donor>)> = Vec::new();
        let mut prev: Option<Donor> = None;
        let mut anchor: Option<Donor> = None; // the last repaired sample
        let mut next_pos = 0usize; // position of the next complete sample at or after `pos`
        for (pos, &i) in indices.iter().enumerate() {
            tick();
            let i = i as usize;
            let stack = self.profile.samples().stacks[i];
            if !truncated[i] {
                if usable(self, i) {
                    prev = Some(Donor {
                        stack,
                        ambiguous: false,
                    });
                }
                continue;
            }
            if next_pos <= pos {
                next_pos = pos + 1;
                while next_pos < indices.len() && !usable(self, indices[next_pos] as usize) {
                    next_pos += 1;
                }
            }
            let next = indices.get(next_pos).map(|&j| Donor {
                stack: self.profile.samples().stacks[j as usize],
                ambiguous: false,
            });
            match self.attempt_with_fallback(stack, (prev, next), (anchor, next)) {
                Some((repaired, ambiguous)) => {
                    self.profile.set_sample_stack(i, repaired)?;
                    outcomes[i] = outcome(ambiguous);
                    prev = Some(Donor {
                        stack: repaired,
                        ambiguous,
                    });
                    anchor = prev;
                }
                None => pending.push((pos, prev, anchor)),
            }
        }
        // Backward pass over what is left.
        let mut next: Option<Donor> = None;
        let mut next_anchor: Option<Donor> = None; // the last repaired sample seen walking back
        let mut waiting = pending.iter().rev().peekable();
        for pos in (0..indices.len()).rev() {
            let i = indices[pos] as usize;
            let stack = self.profile.samples().stacks[i];
            if let Some(&(_, prev, anchor)) = waiting.next_if(|(p, _, _)| *p == pos) {
                let fallback = (anchor.or(prev), next_anchor.or(next));
                match self.attempt_with_fallback(stack, (prev, next), fallback) {
                    Some((repaired, ambiguous)) => {
                        self.profile.set_sample_stack(i, repaired)?;
                        outcomes[i] = outcome(ambiguous);
                        next = Some(Donor {
                            stack: repaired,
                            ambiguous,
                        });
                        next_anchor = next;
                    }
                    None => {
                        let marked = self.mark(stack);
                        self.profile.set_sample_stack(i, marked)?;
                        outcomes[i] = SampleOutcome::Unrepairable;
                    }
                }
            } else if usable(self, i) {
                next = Some(Donor {
                    stack,
                    ambiguous: false,
                });
            } else if matches!(outcomes[i], SampleOutcome::Exact | SampleOutcome::Ambiguous) {
                next = Some(Donor {
                    stack,
                    ambiguous: outcomes[i] == SampleOutcome::Ambiguous,
                });
                next_anchor = next;
            }
        }
        Ok(())
    }

    /// [`Engine::attempt`] with the nearest donors, then, if that finds no alignment and they
    /// differ, with the fallback donors (the nearest *repaired* samples: a shallow complete sample
    /// between deep ones, such as a call to print between two deep recursions, offers no overlap).
    fn attempt_with_fallback(
        &mut self,
        stack: StackId,
        nearest: (Option<Donor>, Option<Donor>),
        fallback: (Option<Donor>, Option<Donor>),
    ) -> Option<(StackId, bool)> {
        self.attempt(stack, nearest.0, nearest.1).or_else(|| {
            let fallback = (fallback.0.or(nearest.0), fallback.1.or(nearest.1));
            (fallback != nearest)
                .then(|| self.attempt(stack, fallback.0, fallback.1))
                .flatten()
        })
    }

    /// Aligns the truncated `stack` against the donors; the repaired stack and whether it is a guess.
    fn attempt(
        &mut self,
        stack: StackId,
        prev: Option<Donor>,
        next: Option<Donor>,
    ) -> Option<(StackId, bool)> {
        // A sample identical to the one just repaired, with the same next donor, and whose earlier
        // donor is that repair: aligning it against its own repaired stack gives that stack back.
        if let Some((last, last_next, Some(result))) = self.memo
            && last == stack
            && last_next == next
            && prev
                == Some(Donor {
                    stack: result.0,
                    ambiguous: result.1,
                })
        {
            return Some(result);
        }
        let result = self.align(stack, prev, next);
        self.memo = Some((stack, next, result));
        result
    }

    fn align(
        &mut self,
        stack: StackId,
        prev: Option<Donor>,
        next: Option<Donor>,
    ) -> Option<(StackId, bool)> {
        let mut t = std::mem::take(&mut self.scratch_t);
        let mut p = std::mem::take(&mut self.scratch_prev);
        let mut n = std::mem::take(&mut self.scratch_next);
        let [mut tk, mut pk, mut nk] = std::mem::take(&mut self.keys);
        self.code_frames(Some(stack), &mut t, &mut tk);
        self.code_frames(prev.map(|d| d.stack), &mut p, &mut pk);
        self.code_frames(next.map(|d| d.stack), &mut n, &mut nk);
        let alignment = self.aligner.align(
            &tk,
            prev.map(|_| pk.as_slice()),
            next.map(|_| nk.as_slice()),
            self.min_overlap,
        );
        let result = alignment.map(|a| {
            let frames = match a.side {
                Side::Prev => &p,
                Side::Next => &n,
            };
            let mut base: Vec<FrameId> = frames[..a.offset].iter().map(|&f| FrameId(f)).collect();
            let ambiguous = self.join(&mut base, a.is_exact());
            (self.rebuild(stack, &base), ambiguous)
        });
        self.scratch_t = t;
        self.scratch_prev = p;
        self.scratch_next = n;
        self.keys = [tk, pk, nk];
        result
    }

    /// Makes `base` the frames to put below a cut stack, marking a guessed join; returns whether
    /// the repaired stack is ambiguous, which is exactly when it carries the repair gap frame.
    ///
    /// - An exact join to a base without a gap: the base as it is (exact).
    /// - An exact join to a base that has a gap (a donor that was itself a guess): the base as it
    ///   is; the stack inherits the donor's one gap (ambiguous).
    /// - A guessed join to a base without a gap: the base, then the gap (ambiguous).
    /// - A guessed join to a base that has a gap: the base up to and including its gap, so the
    ///   frames the donor had between its gap and this join, themselves unsure, are dropped, and the
    ///   stack still has one gap, with only the sample's own frames after it (ambiguous).
    fn join(&mut self, base: &mut Vec<FrameId>, exact: bool) -> bool {
        let gap_at = base.iter().position(|f| self.tables.gap[f.index()]);
        match (exact, gap_at) {
            (true, None) => false,
            (true, Some(_)) => true,
            (false, Some(g)) => {
                base.truncate(g + 1);
                true
            }
            (false, None) => {
                let gap = match self.gap_frame {
                    Some(f) => f,
                    None => {
                        let f = intern_repair_gap(self.profile);
                        self.gap_frame = Some(f);
                        self.tables.extend(self.profile);
                        f
                    }
                };
                base.push(gap);
                true
            }
        }
    }

    /// Code frames (pseudo frames left out, except the repair gap) of `stack`, root first, and their
    /// alignment keys: the names of the frames' functions. Frames are matched by function name, not
    /// address or function row, so the same method at another call site or in re-jitted code
    /// (another code tier, which is another function row) still aligns; the re-attached base keeps
    /// the donor's own frames.
    fn code_frames(&self, stack: Option<StackId>, frames: &mut Vec<u32>, keys: &mut Vec<u32>) {
        frames.clear();
        keys.clear();
        let Some(stack) = stack else {
            return;
        };
        for f in self.profile.stack_frames(stack) {
            // The gap is kept: a donor lends it with its base, and since no cut stack has it, an
            // overlap never runs across it (frames on its two sides were never seen together).
            if !self.tables.pseudo[f.index()] || self.tables.gap[f.index()] {
                frames.push(f.0);
                let function = self.profile.frame(f).function;
                keys.push(self.profile.function(function).name.0);
            }
        }
        frames.reverse();
        keys.reverse();
    }

    /// `stack` with `base` inserted after its leading pseudo frames, interned.
    fn rebuild(&mut self, stack: StackId, base: &[FrameId]) -> StackId {
        let mut full = std::mem::take(&mut self.scratch_full);
        self.profile.stack_frames_root_first(stack, &mut full);
        let lead = full
            .iter()
            .take_while(|f| self.tables.pseudo[f.index()] && !self.tables.gap[f.index()])
            .count();
        let mut build = std::mem::take(&mut self.build);
        build.clear();
        build.extend_from_slice(&full[..lead]);
        build.extend_from_slice(base);
        build.extend_from_slice(&full[lead..]);
        self.scratch_full = full;
        // Consecutive repairs share most of their frames: reuse the trie path of the last build.
        let shared = build
            .iter()
            .zip(&self.last_frames)
            .take_while(|(a, b)| a == b)
            .count();
        self.last_frames.truncate(shared);
        self.last_nodes.truncate(shared);
        let mut node = self.last_nodes.last().copied();
        for &frame in &build[shared..] {
            let id = self.profile.intern_stack(node, frame);
            self.last_frames.push(frame);
            self.last_nodes.push(id);
            node = Some(id);
        }
        self.build = build;
        self.tables.extend(self.profile);
        // A truncated stack has frames, so `node` is set.
        node.unwrap_or(stack)
    }

    /// `stack` with a `[truncated: depth cap N]` frame as its base.
    fn mark(&mut self, stack: StackId) -> StackId {
        if let Some(&marked) = self.marked.get(&stack) {
            return marked;
        }
        let frame = match self.truncated_frame {
            Some(f) => f,
            None => {
                let f = self
                    .profile
                    .intern_truncated(TruncateReason::DepthCap(self.cap));
                self.truncated_frame = Some(f);
                f
            }
        };
        let marked = self.rebuild(stack, &[frame]);
        self.marked.insert(stack, marked);
        marked
    }
}

fn outcome(ambiguous: bool) -> SampleOutcome {
    if ambiguous {
        SampleOutcome::Ambiguous
    } else {
        SampleOutcome::Exact
    }
}
