//! Turning what the reader gathered into a [`Profile`]: frames named, stacks resolved, threads
//! named, and the nesting counters and unclosed slices reported in the metadata.

use std::collections::HashMap;

use rootline_profile::{FrameId, FrameKind, Profile, SampleType, StackId, TruncateReason};

use super::super::DOTNET_DEPTH_CAP;
use super::super::scan::shorten;
use super::super::timeline::{Context, NO_PARENT, StackRef};
use super::{SfDef, TraceReader};
use crate::WARNING_PREFIX;
use crate::error::{FormatError, Position};
use rootline_profile::pseudo::is_pseudo_name as is_pseudo_frame;

impl TraceReader {
    /// The display name of key `key`.
    fn key_name(&self, key: u32) -> String {
        let (sf, name) = self.keys[key as usize];
        match self.sf_defs.get(sf as usize).and_then(Option::as_ref) {
            Some(def) => self.sf_display_name(def),
            None => self.names[name as usize].to_string(),
        }
    }

    /// The (name, category) a key is named by; keys with equal pairs get equal frames.
    fn key_pair(&self, key: u32) -> (u32, u32) {
        let (sf, name) = self.keys[key as usize];
        match self.sf_defs.get(sf as usize).and_then(Option::as_ref) {
            Some(def) => (def.name, def.category),
            None => (name, u32::MAX),
        }
    }

    fn sf_display_name(&self, def: &SfDef) -> String {
        let name = &self.names[def.name as usize];
        let category = &self.names[def.category as usize];
        if self.sample_event_dialect && !category.is_empty() {
            // dotnet-trace splits `Module!Method` into category and name; put it back together.
            format!("{category}!{name}")
        } else {
            name.to_string()
        }
    }

    fn frame_kind(&self, name: &str) -> FrameKind {
        if is_pseudo_frame(name) {
            FrameKind::Pseudo
        } else if self.dotnet {
            FrameKind::Managed
        } else {
            FrameKind::Native
        }
    }

    /// Ends every thread and builds the profile.
    pub(in crate::chromium) fn finish(mut self) -> Result<Profile, FormatError> {
        let end = self.end;
        let mut unclosed: Vec<(u32, Vec<u32>)> = Vec::new();
        let mut cx = Context {
            trie: &mut self.trie,
            sink: &mut self.sink,
            counters: &mut self.counters,
        };
        for (i, timeline) in self.timelines.iter_mut().enumerate() {
            let open = timeline.finish(end, &mut cx);
            if !open.is_empty() {
                unclosed.push((i as u32, open));
            }
        }

        // Reading is over: the lookup indexes are no longer needed, only the tables.
        self.trie.release_index();
        self.key_index = Default::default();
        self.name_index = Default::default();

        // Point samples (`samples` entries) last until the next one on their thread, as speedscope
        // shows them; the last one on a thread has no known length and weighs 0 ns.
        if self.point_samples {
            let mut per_thread: Vec<Vec<usize>> = vec![Vec::new(); self.threads.len()];
            for (i, stack) in self.sink.stacks.iter().enumerate() {
                if matches!(stack, StackRef::Sf(_)) {
                    per_thread[self.sink.threads[i] as usize].push(i);
                }
            }
            for mut list in per_thread {
                list.sort_by_key(|&i| self.sink.times[i]);
                for pair in list.windows(2) {
                    self.sink.wall[pair[0]] = self.sink.times[pair[1]] - self.sink.times[pair[0]];
                }
            }
        }
        let mut types = vec![SampleType::wall_nanoseconds()];
        if self.point_samples {
            types.push(SampleType::samples());
        }
        let mut profile = Profile::new(types);

        let mut key_frames = vec![None; self.keys.len()];
        let mut pair_frames: HashMap<(u32, u32), FrameId> = HashMap::new();
        let mut node_stacks: Vec<StackId> = Vec::with_capacity(self.trie.nodes.len());
        for &(parent, key) in &self.trie.nodes {
            let frame = match key_frames[key as usize] {
                Some(f) => f,
                None => {
                    // Many keys (one per `stackFrames` entry) share a name: build each name once.
                    let pair = self.key_pair(key);
                    let f = match pair_frames.get(&pair) {
                        Some(&f) => f,
                        None => {
                            let name = self.key_name(key);
                            let f = profile.intern_named_frame(&name, self.frame_kind(&name));
                            pair_frames.insert(pair, f);
                            f
                        }
                    };
                    key_frames[key as usize] = Some(f);
                    f
                }
            };
            let parent = (parent != NO_PARENT).then(|| node_stacks[parent as usize]);
            node_stacks.push(profile.intern_stack(parent, frame));
        }
        let mut sf_stacks: HashMap<u32, StackId> = HashMap::new();
        for stack in &self.sink.stacks {
            if let StackRef::Sf(sf) = *stack
                && !sf_stacks.contains_key(&sf)
            {
                let id = self.sf_chain(sf, &mut profile)?;
                sf_stacks.insert(sf, id);
            }
        }

        for &(pid, tid) in &self.threads {
            let t = profile.intern_thread(pid, tid);
            if let Some(name) = self.thread_names.get(&(pid, tid)) {
                profile.set_thread_name(t, name);
            }
            if let Some(name) = self.process_names.get(&pid) {
                profile.set_process_name(pid, name);
            } else {
                profile.intern_process(pid);
            }
        }

        let mut values = Vec::with_capacity(2);
        for i in 0..self.sink.times.len() {
            let stack = match self.sink.stacks[i] {
                StackRef::Node(n) => node_stacks[n as usize],
                StackRef::Sf(sf) => sf_stacks[&sf],
            };
            values.clear();
            values.push(self.sink.wall[i]);
            if self.point_samples {
                values.push(self.sink.count[i]);
            }
            let thread = rootline_profile::ThreadId(self.sink.threads[i]);
            profile
                .push_sample(self.sink.times[i] as u64, thread, stack, &values)
                .map_err(|e| FormatError::invalid(Position::Input, e.to_string()))?;
        }

        let m = &mut profile.metadata;
        m.producer = match (&self.declared_producer, self.dotnet) {
            (Some(p), _) => format!("{p} (chromium)"),
            (None, true) => "dotnet-trace (chromium)".into(),
            (None, false) => "chromium trace events".into(),
        };
        if self.dotnet {
            m.depth_cap = Some(DOTNET_DEPTH_CAP);
        }
        if self.declared_depth_cap.is_some() {
            m.depth_cap = self.declared_depth_cap;
        }
        m.start_time_ns = self.start.unwrap_or(0) as u64;
        m.end_time_ns = self.end.max(self.start.unwrap_or(0)) as u64;
        let c = self.counters;
        let extra = &mut m.extra;
        let unit = match self.scale {
            Some(0) => "ns",
            Some(6) => "ms",
            _ => "us",
        };
        extra.insert("chromium.ts_unit".into(), unit.into());
        extra.insert(
            "chromium.stack_transitions".into(),
            c.transitions.to_string(),
        );
        let open_total: usize = unclosed.iter().map(|(_, o)| o.len()).sum();
        extra.insert("chromium.unclosed_slices".into(), open_total.to_string());
        for (name, value) in [
            ("chromium.out_of_order_events", c.out_of_order),
            ("chromium.unmatched_end_events", c.unmatched_end),
            ("chromium.mismatched_end_events", c.mismatched_end),
            ("chromium.zero_duration_slices", c.zero_duration),
        ] {
            if value > 0 {
                extra.insert(name.into(), value.to_string());
            }
        }
        let mut places = Vec::new();
        for (thread, open) in &unclosed {
            let (pid, tid) = self.threads[*thread as usize];
            let names: Vec<String> = open.iter().map(|&k| shorten(&self.key_name(k))).collect();
            places.push(format!("pid {pid} tid {tid}"));
            profile
                .metadata
                .extra
                .insert(format!("chromium.unclosed.{pid}.{tid}"), names.join(";"));
        }
        if open_total > 0 {
            profile.metadata.extra.insert(
                format!("{WARNING_PREFIX}chromium.unclosed_slices"),
                format!(
                    "{open_total} slice(s) had no end event ({}); they were closed at the trace's \
                     last timestamp",
                    places.join(", ")
                ),
            );
        }
        if c.out_of_order > 0 {
            profile.metadata.extra.insert(
                format!("{WARNING_PREFIX}chromium.out_of_order_events"),
                format!(
                    "{} event(s) came too late to be sorted into place and were nested at the \
                     latest instant already read on their thread",
                    c.out_of_order
                ),
            );
        }
        Ok(profile)
    }

    /// The profile stack of `stackFrames` entry `sf`: its parent chain, root first.
    fn sf_chain(&self, sf: u32, profile: &mut Profile) -> Result<StackId, FormatError> {
        let mut chain = Vec::new();
        let mut next = Some(sf);
        while let Some(id) = next {
            if chain.len() > self.sf_defs.len() {
                return Err(FormatError::invalid(
                    Position::Input,
                    format!(
                        "`stackFrames` entry {:?} is its own ancestor (a parent cycle)",
                        shorten(&self.sf_id(sf))
                    ),
                ));
            }
            chain.push(id);
            next = self.sf_defs[id as usize].as_ref().and_then(|d| d.parent);
        }
        let mut parent = None;
        for &id in chain.iter().rev() {
            let frame = match &self.sf_defs[id as usize] {
                Some(def) => {
                    let name = self.sf_display_name(def);
                    profile.intern_named_frame(&name, self.frame_kind(&name))
                }
                None => profile.intern_truncated(TruncateReason::StackDefinitionMissing),
            };
            parent = Some(profile.intern_stack(parent, frame));
        }
        parent.ok_or_else(|| FormatError::invalid(Position::Input, "an empty stack"))
    }
}
