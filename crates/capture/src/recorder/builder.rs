//! Off the hot path: symbolizes the distinct raw frames of each [`Batch`], translates raw trie
//! nodes into the profile's stack trie and appends the batch's samples to the [`Profile`].

use std::collections::HashMap;

use rootline_profile::{
    FrameId, FrameKind, Function, Mapping, MappingId, Profile, SampleType, StackId, ThreadId,
};

use super::raw::{Batch, NO_NODE, RawFrame, RawKind, RawMapping};
use crate::jit::JitName;
use crate::symbolize::{SymbolFrame, Symbolizer, SymbolizerBudgets};

/// Builds the profile from batches.
pub(crate) struct Builder {
    pub profile: Profile,
    symbolizer: Symbolizer,
    /// DWARF and module budgets of the symbolizer.
    budgets: SymbolizerBudgets,
    /// Where the symbolizer keeps names between recordings, if anywhere.
    names_dir: Option<std::path::PathBuf>,
    mappings: Vec<(RawMapping, Option<MappingId>)>,
    frame_map: Vec<Vec<FrameId>>,
    node_map: Vec<StackId>,
    threads: HashMap<(u32, u32), ThreadId>,
    /// Where each kind of value goes among the profile's columns.
    columns: Columns,
    /// A sample's values, reused.
    values: Vec<i64>,
}

/// The positions of the value columns a recorded sample can fill; a column the profile lacks is
/// None. Columns of other sources (e.g. injected .NET allocation ticks) stay 0 in the recorder's
/// samples, whatever their position.
#[derive(Clone, Copy)]
struct Columns {
    samples: Option<usize>,
    cpu: Option<usize>,
    off_cpu: Option<usize>,
    wall: Option<usize>,
    alloc_bytes: Option<usize>,
    alloc_count: Option<usize>,
}

impl Columns {
    fn of(profile: &Profile) -> Columns {
        let types = profile.sample_types();
        let column = |t: SampleType| types.iter().position(|x| *x == t);
        Columns {
            samples: column(SampleType::samples()),
            cpu: column(SampleType::cpu_nanoseconds()),
            off_cpu: column(SampleType::off_cpu_nanoseconds()),
            wall: column(SampleType::wall_nanoseconds()),
            alloc_bytes: column(SampleType::alloc_bytes()),
            alloc_count: column(SampleType::alloc_count()),
        }
    }
}

impl Builder {
    /// A builder adding to `profile`, with the symbolizer's budgets (see
    /// [`Symbolizer::with_budgets`]) and the directory where it keeps names between recordings
    /// (see [`Symbolizer::keeping_names`]); samples fill the columns of their kind, found by
    /// type.
    pub fn new(
        profile: Profile,
        budgets: SymbolizerBudgets,
        names_dir: Option<std::path::PathBuf>,
    ) -> Builder {
        Builder {
            columns: Columns::of(&profile),
            values: vec![0; profile.sample_types().len()],
            profile,
            symbolizer: symbolizer(&budgets, &names_dir),
            budgets,
            names_dir,
            mappings: Vec::new(),
            frame_map: Vec::new(),
            node_map: Vec::new(),
            threads: HashMap::new(),
        }
    }

    /// Continues with an empty profile (same sample types and metadata) and forgets every raw id:
    /// the pipeline has started its tables over too. The symbolizer starts afresh as well: the
    /// binaries it read are reached through `/proc/self/fd/N` paths of the mappings dropped here,
    /// and a closed descriptor's number is reused by the next file opened.
    pub fn start_over(&mut self) {
        let mut fresh = Profile::new(self.profile.sample_types().to_vec());
        fresh.metadata = self.profile.metadata.clone();
        self.profile = fresh;
        self.symbolizer.write_kept_names();
        self.symbolizer = symbolizer(&self.budgets, &self.names_dir);
        self.mappings.clear();
        self.frame_map.clear();
        self.node_map.clear();
        self.threads.clear();
    }

    /// Writes the names the symbolizer keeps between recordings: the recording has ended.
    pub fn finish(&mut self) {
        self.symbolizer.write_kept_names();
    }

    /// Adds a batch to the profile.
    pub fn apply(&mut self, batch: Batch) {
        self.mappings
            .extend(batch.mappings.into_iter().map(|m| (m, None)));
        self.symbolize(&batch.frames, batch.jit_names);
        self.symbolizer.end_batch();
        for (parent, frame) in batch.nodes {
            let mut stack = (parent != NO_NODE).then(|| self.node_map[parent as usize]);
            for &f in &self.frame_map[frame as usize] {
                stack = Some(self.profile.intern_stack(stack, f));
            }
            // Every raw frame yields at least one profile frame, so `stack` is set.
            self.node_map.push(stack.unwrap_or(StackId(0)));
        }
        for (pid, tid, name) in batch.names {
            let t = self.thread(pid, tid);
            self.profile.set_thread_name(t, &name);
            if pid == tid {
                self.profile.set_process_name(pid, &name);
            }
        }
        // Columns: samples, cpu; with off-CPU recording off_cpu and wall (their sum); with
        // allocation recording alloc-bytes and alloc-count.
        let c = self.columns;
        for p in batch.samples {
            let thread = self.thread(p.pid, p.tid);
            let stack = self.node_map[p.node as usize];
            let values = &mut self.values;
            values.iter_mut().for_each(|v| *v = 0);
            let mut set = |column: Option<usize>, v: i64| {
                if let Some(i) = column {
                    values[i] = v;
                }
            };
            match (p.off_cpu.is_some(), p.alloc) {
                (true, _) => {
                    set(c.off_cpu, p.nanos);
                    set(c.wall, p.nanos);
                }
                (false, Some(a)) => {
                    set(c.alloc_bytes, a.bytes);
                    set(c.alloc_count, a.count);
                }
                (false, None) => {
                    set(c.samples, 1);
                    set(c.cpu, p.nanos);
                    set(c.wall, p.nanos);
                }
            }
            // Ids come from this profile and the value count matches its sample types.
            let _ = self
                .profile
                .push_sample(p.time, thread, stack, &self.values);
        }
    }

    fn thread(&mut self, pid: u32, tid: u32) -> ThreadId {
        *self
            .threads
            .entry((pid, tid))
            .or_insert_with(|| self.profile.intern_thread(pid, tid))
    }

    fn symbolize(&mut self, frames: &[RawFrame], mut jit_names: Vec<Option<JitName>>) {
        let mut by_mapping: HashMap<u32, Vec<usize>> = HashMap::new();
        for (i, f) in frames.iter().enumerate() {
            if let RawKind::User(m, _) = f.kind {
                by_mapping.entry(m).or_default().push(i);
            }
        }
        let mut symbols: HashMap<usize, Vec<SymbolFrame>> = HashMap::new();
        for (m, idxs) in by_mapping {
            let mapping = &self.mappings[m as usize].0;
            let (Some(path), Some(module)) =
                (mapping.binary.reopen_path(), mapping.binary.module.clone())
            else {
                continue;
            };
            let svmas: Vec<u64> = idxs
                .iter()
                .map(|&i| {
                    let offset = file_offset(mapping, frames[i]);
                    module.svma_of_file_offset(offset).unwrap_or(u64::MAX)
                })
                .collect();
            let found = self.symbolizer.symbolize_file(
                &path,
                module.build_id(),
                module.has_debug_info(),
                &svmas,
                |a| module.symbol_start(a),
                |a| module.symbol_name(a),
            );
            symbols.extend(idxs.into_iter().zip(found));
        }
        for (i, &frame) in frames.iter().enumerate() {
            let ids = match frame.kind {
                RawKind::User(m, _) if self.mappings[m as usize].0.binary.module.is_none() => {
                    let name = jit_names.get_mut(i).and_then(Option::take);
                    self.jit_frame(m, frame, name)
                }
                RawKind::User(m, _) => {
                    let mapping = self.profile_mapping(m);
                    match symbols.remove(&i) {
                        Some(syms) if !syms.is_empty() => syms
                            .iter()
                            .enumerate()
                            .map(|(depth, s)| {
                                self.frame(NewFrame {
                                    name: &s.name,
                                    file: s.file.as_deref(),
                                    system_name: None,
                                    tier: None,
                                    mapping: Some(mapping),
                                    address: frame.address,
                                    line: s.line,
                                    inline_depth: depth.min(255) as u8,
                                    kind: FrameKind::Native,
                                })
                            })
                            .collect(),
                        _ => {
                            let raw = &self.mappings[m as usize].0;
                            let name = format!(
                                "{}+0x{:x}",
                                basename(&raw.binary.path),
                                frame.address - raw.start + raw.file_offset
                            );
                            let kind = FrameKind::Native;
                            vec![self.frame(NewFrame::named(
                                &name,
                                Some(mapping),
                                frame.address,
                                kind,
                            ))]
                        }
                    }
                }
                RawKind::Unknown => {
                    let name = format!("[unknown]+0x{:x}", frame.address);
                    vec![self.frame(NewFrame::named(
                        &name,
                        None,
                        frame.address,
                        FrameKind::Native,
                    ))]
                }
                RawKind::Kernel => {
                    let name = self
                        .symbolizer
                        .kernel(frame.address)
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("[kernel]+0x{:x}", frame.address));
                    vec![self.frame(NewFrame::named(
                        &name,
                        None,
                        frame.address,
                        FrameKind::Kernel,
                    ))]
                }
                RawKind::KernelOnly => {
                    vec![
                        self.profile
                            .intern_named_frame("[kernel]", FrameKind::Kernel),
                    ]
                }
                RawKind::Exec => {
                    vec![
                        self.profile
                            .intern_named_frame("[kernel: exec]", FrameKind::Kernel),
                    ]
                }
                RawKind::Alloc(kind) => vec![
                    self.profile
                        .intern_named_frame(&kind.frame_name(), FrameKind::Pseudo),
                ],
                RawKind::OffCpu(reason) => vec![
                    self.profile
                        .intern_named_frame(reason.frame_name(), FrameKind::Pseudo),
                ],
                RawKind::Truncated(reason) => vec![
                    self.profile
                        .intern_named_frame(&reason.frame_name(), FrameKind::Truncated),
                ],
            };
            let ids = if frame.live {
                ids.into_iter()
                    .map(|id| {
                        let mut f = *self.profile.frame(id);
                        f.from_live_memory = true;
                        self.profile.intern_frame(f)
                    })
                    .collect()
            } else {
                ids
            };
            self.frame_map.push(ids);
        }
    }

    /// The frame of an address in code without ELF symbols: named through the process's JIT
    /// maps or precompiled images when they had an entry, else `path+0xOFFSET` like any
    /// unnamed address.
    fn jit_frame(&mut self, m: u32, frame: RawFrame, name: Option<JitName>) -> Vec<FrameId> {
        let Some(name) = name else {
            let mapping = self.profile_mapping(m);
            let raw = &self.mappings[m as usize].0;
            let base = match basename(&raw.binary.path) {
                "" => "[anon]",
                b => b,
            };
            let label = format!("{base}+0x{:x}", frame.address - raw.start + raw.file_offset);
            let kind = FrameKind::Native;
            return vec![self.frame(NewFrame::named(&label, Some(mapping), frame.address, kind))];
        };
        let (start, end) = {
            let raw = &self.mappings[m as usize].0;
            (raw.start, raw.end)
        };
        // Precompiled code in a mapped image (.NET ReadyToRun) keeps the image as its mapping.
        let mapping = if name.precompiled {
            self.profile_mapping(m)
        } else {
            let module = name.module.as_deref().unwrap_or("[jit]");
            let path = self.profile.intern_string(module);
            self.profile.intern_mapping(Mapping {
                start,
                end,
                file_offset: 0,
                path,
                build_id: None,
            })
        };
        vec![self.frame(NewFrame {
            file: name.file.as_deref(),
            system_name: name.system_name.as_deref(),
            tier: name.tier.as_deref(),
            ..NewFrame::named(&name.name, Some(mapping), frame.address, name.kind)
        })]
    }

    fn profile_mapping(&mut self, m: u32) -> MappingId {
        if let Some(id) = self.mappings[m as usize].1 {
            return id;
        }
        let raw = self.mappings[m as usize].0.clone();
        let path = self.profile.intern_string(&raw.binary.path);
        let build_id = raw
            .binary
            .module
            .as_ref()
            .and_then(|m| m.build_id())
            .map(|b| self.profile.intern_string(b));
        let id = self.profile.intern_mapping(Mapping {
            start: raw.start,
            end: raw.end,
            file_offset: raw.file_offset,
            path,
            build_id,
        });
        self.mappings[m as usize].1 = Some(id);
        id
    }

    fn frame(&mut self, f: NewFrame<'_>) -> FrameId {
        let name = self.profile.intern_string(f.name);
        let file = f.file.map(|file| self.profile.intern_string(file));
        let function = Function {
            system_name: f.system_name.map(|s| self.profile.intern_string(s)),
            tier: f.tier.map(|t| self.profile.intern_string(t)),
            ..Function::new(name, file)
        };
        let function = self.profile.intern_function(function);
        self.profile.intern_frame(rootline_profile::Frame {
            function,
            mapping: f.mapping,
            address: f.address,
            line: f.line,
            inline_depth: f.inline_depth,
            kind: f.kind,
            from_live_memory: false,
        })
    }
}

/// A frame to intern: a function `name` (in source `file`; named `system_name` by its runtime,
/// compiled at code `tier`) at `address`, `line`, inlined `inline_depth` levels deep at that
/// address.
struct NewFrame<'a> {
    name: &'a str,
    file: Option<&'a str>,
    system_name: Option<&'a str>,
    tier: Option<&'a str>,
    mapping: Option<MappingId>,
    address: u64,
    line: Option<u32>,
    inline_depth: u8,
    kind: FrameKind,
}

impl NewFrame<'_> {
    /// A frame known only by its name and address.
    fn named(
        name: &str,
        mapping: Option<MappingId>,
        address: u64,
        kind: FrameKind,
    ) -> NewFrame<'_> {
        NewFrame {
            name,
            file: None,
            system_name: None,
            tier: None,
            mapping,
            address,
            line: None,
            inline_depth: 0,
            kind,
        }
    }
}

/// The file offset a frame is symbolized at (a return address at the call, one byte before).
fn file_offset(mapping: &RawMapping, frame: RawFrame) -> u64 {
    let lookup = match frame.kind {
        RawKind::User(_, true) => frame.address - 1,
        _ => frame.address,
    };
    lookup - mapping.start + mapping.file_offset
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A symbolizer held to `budgets`, keeping names in `names_dir` if given.
fn symbolizer(budgets: &SymbolizerBudgets, names_dir: &Option<std::path::PathBuf>) -> Symbolizer {
    let s = Symbolizer::with_budgets(budgets.clone());
    match names_dir {
        Some(dir) => s.keeping_names(dir.clone()),
        None => s,
    }
}
