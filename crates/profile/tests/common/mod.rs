//! Shared helpers for the `.rlp` tests: a deterministic generator of realistic profiles and a
//! field-by-field profile comparison.

#![allow(dead_code)]

pub mod harness;

use rootline_profile::{
    Frame, FrameKind, Function, Mapping, Profile, SampleType, StackId, ThreadId,
};

/// splitmix64: small, deterministic, good enough to vary test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A recording in progress: a profile plus the pools a fake sampler draws from.
pub struct Recording {
    pub profile: Profile,
    pub rng: Rng,
    pub leaves: Vec<StackId>,
    pub threads: Vec<ThreadId>,
    pub time: u64,
    /// Pick sample stacks uniformly instead of skewed towards a few hot ones.
    pub uniform: bool,
    next_function: u32,
}

impl Recording {
    /// A profile with cpu and sample-count columns, some mappings, and metadata.
    pub fn new(seed: u64) -> Recording {
        let mut profile = Profile::new(vec![SampleType::cpu_nanoseconds(), SampleType::samples()]);
        profile.metadata.producer = "rootline record".into();
        profile.metadata.start_time_ns = 1_700_000_000_000_000_000;
        profile.metadata.host = Some("testhost".into());
        profile.metadata.command_line = Some("./app --flag".into());
        profile.metadata.sample_rate_hz = Some(999);
        profile.metadata.depth_cap = None;
        profile
            .metadata
            .extra
            .insert("perf_event".into(), "cpu-clock".into());
        let mut rec = Recording {
            profile,
            rng: Rng(seed),
            leaves: Vec::new(),
            threads: Vec::new(),
            time: 1_700_000_000_000_000_000,
            uniform: false,
            next_function: 0,
        };
        for (i, path) in ["/usr/bin/app", "/usr/lib/libc.so.6", "[anon:jit]"]
            .into_iter()
            .enumerate()
        {
            let path = rec.profile.intern_string(path);
            let build_id = (i < 2).then(|| rec.profile.intern_string(&format!("{i:040x}")));
            rec.profile.intern_mapping(Mapping {
                start: 0x5555_0000_0000 + (i as u64) * 0x100_0000,
                end: 0x5555_0000_0000 + (i as u64 + 1) * 0x100_0000,
                file_offset: 0x1000 * i as u64,
                path,
                build_id,
            });
        }
        rec.add_thread(100, 100, Some("app"));
        rec.profile.set_process_name(100, "app");
        let cmd = rec.profile.intern_string("./app --flag");
        rec.profile.intern_process(100).command_line = Some(cmd);
        rec
    }

    pub fn add_thread(&mut self, pid: u32, tid: u32, name: Option<&str>) -> ThreadId {
        let id = self.profile.intern_thread(pid, tid);
        if let Some(name) = name {
            self.profile.set_thread_name(id, name);
        }
        self.threads.push(id);
        id
    }

    /// A new frame of a rotating kind, in one of the mappings (or none).
    pub fn new_frame(&mut self) -> rootline_profile::FrameId {
        let n = self.next_function;
        self.next_function += 1;
        let name = self.profile.intern_string(&format!("module::function_{n}"));
        let file = n.is_multiple_of(3).then(|| {
            self.profile
                .intern_string(&format!("src/file_{}.rs", n % 17))
        });
        // Every fifth function has a runtime name and a code tier, as .NET methods do.
        let (system_name, tier) = if n % 5 == 4 {
            let raw = format!("void [module] module::function_{n}()[OptimizedTier1]");
            (
                Some(self.profile.intern_string(&raw)),
                Some(self.profile.intern_string("OptimizedTier1")),
            )
        } else {
            (None, None)
        };
        let function = self.profile.intern_function(Function {
            system_name,
            tier,
            ..Function::new(name, file)
        });
        let kind = FrameKind::ALL[(n % 6) as usize];
        let mapping = match n % 4 {
            3 => None,
            m => Some(rootline_profile::MappingId(m)),
        };
        self.profile.intern_frame(Frame {
            function,
            mapping,
            address: 0x5555_0000_0000 + u64::from(n) * 0x40 + self.rng.below(0x40),
            line: n.is_multiple_of(2).then_some(n * 7),
            inline_depth: (n % 5) as u8,
            kind,
            from_live_memory: false,
        })
    }

    /// Adds `count` distinct leaf stacks built as branches off earlier stacks (depth up to ~60).
    pub fn add_stacks(&mut self, count: usize, frame_pool: usize) {
        let mut frames = Vec::with_capacity(frame_pool);
        for _ in 0..frame_pool {
            frames.push(self.new_frame());
        }
        let before = self.leaves.len();
        while self.leaves.len() < before + count {
            let mut parent = if self.leaves.is_empty() || self.rng.below(8) == 0 {
                None
            } else {
                let leaf = self.leaves[self.rng.below(self.leaves.len() as u64) as usize];
                // Branch off somewhere along the chosen stack.
                let mut node = Some(leaf);
                for _ in 0..self.rng.below(4) {
                    node = node.and_then(|n| self.profile.stack(n).parent);
                }
                node
            };
            for _ in 0..1 + self.rng.below(6) {
                let frame = frames[self.rng.below(frames.len() as u64) as usize];
                parent = Some(self.profile.intern_stack(parent, frame));
            }
            let leaf = parent.expect("at least one frame");
            if !self.leaves.contains(&leaf) {
                self.leaves.push(leaf);
            }
        }
    }

    /// Pushes `count` samples about 1 ms apart (with µs jitter), skewed towards hot stacks.
    pub fn add_samples(&mut self, count: usize) {
        for _ in 0..count {
            self.time += 1_000_000 + self.rng.below(100_000) - 50_000;
            let thread = self.threads[self.rng.below(self.threads.len() as u64) as usize];
            // Hot/cold skew: most samples land in the first few dozen stacks.
            let pick = if self.uniform || self.rng.below(4) == 0 {
                self.rng.below(self.leaves.len() as u64)
            } else {
                self.rng.below(self.leaves.len().min(40) as u64)
            };
            let stack = self.leaves[pick as usize];
            let cpu = 1_000_000 + self.rng.below(2_000) as i64;
            self.profile
                .push_sample(self.time, thread, stack, &[cpu, 1])
                .expect("valid sample");
        }
        self.profile.metadata.end_time_ns = self.time;
    }
}

/// Asserts that two profiles hold the same tables, samples and metadata (samples of `expected`
/// are compared against `actual`'s whole sample columns).
pub fn assert_same(actual: &Profile, expected: &Profile) {
    assert_eq!(actual.strings(), expected.strings(), "strings");
    assert_eq!(actual.mappings(), expected.mappings(), "mappings");
    assert_eq!(actual.functions(), expected.functions(), "functions");
    assert_eq!(actual.frames(), expected.frames(), "frames");
    assert_eq!(actual.stacks(), expected.stacks(), "stacks");
    for i in 0..actual.stacks().len() {
        let id = StackId(i as u32);
        assert_eq!(
            actual.stack_depth(id),
            expected.stack_depth(id),
            "stack depth {i}"
        );
    }
    assert_eq!(actual.threads(), expected.threads(), "threads");
    assert_eq!(actual.processes(), expected.processes(), "processes");
    assert_eq!(
        actual.sample_types(),
        expected.sample_types(),
        "sample types"
    );
    assert_eq!(actual.samples(), expected.samples(), "samples");
    assert_eq!(actual.metadata, expected.metadata, "metadata");
    // The interning indexes must agree with the tables: re-interning finds the same ids.
    let mut probe = actual.clone();
    for (i, s) in expected.strings().iter().enumerate() {
        assert_eq!(probe.intern_string(s).0 as usize, i, "string index {i}");
    }
    for (i, node) in expected.stacks().iter().enumerate() {
        assert_eq!(
            probe.intern_stack(node.parent, node.frame).0 as usize,
            i,
            "stack index {i}"
        );
    }
    for (i, t) in expected.threads().iter().enumerate() {
        assert_eq!(
            probe.intern_thread(t.pid, t.tid).0 as usize,
            i,
            "thread index {i}"
        );
    }
    assert_eq!(probe.strings().len(), expected.strings().len());
}
