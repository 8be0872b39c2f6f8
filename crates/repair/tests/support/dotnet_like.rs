//! A generator of realistic deep .NET-like stacks, written as dotnet-trace shows them: pseudo frames
//! `Process64 …` / `Threads` / `Thread (N)` at the root, managed frames, and a `CPU_TIME` or
//! `UNMANAGED_CODE_TIME` leaf; one sample per thread per millisecond.
//!
//! Each worker thread starts at the thread-pool roots, dispatches requests through an async
//! middleware chain of 80–200 frames (three frames per middleware: `Invoke`, `AsyncMethodBuilderCore
//! .Start`, `<Invoke>d__N.MoveNext`; routes share their first middlewares and then diverge), descends
//! it step by step, works at the bottom with varying leaves and runs of recursion (`Tree.Walk` self
//! recursion, `Expr.Eval`/`Expr.EvalBinary` mutual recursion), climbs back and idles. The main thread
//! runs `Main` → batch work with recursion up to 250 deep. The same samples are produced twice: whole,
//! and cut to the `cap` leaf-most managed frames as EventPipe does.

#![allow(dead_code)]

use rootline_profile::{FrameId, FrameKind, Profile, SampleType, StackId, ThreadId};

/// What to generate.
#[derive(Debug, Clone)]
pub struct Config {
    /// Worker threads (the main thread comes on top).
    pub workers: usize,
    /// Milliseconds of samples (one sample per thread per millisecond).
    pub ticks: usize,
    /// Random seed.
    pub seed: u64,
    /// Managed frames kept by the producer.
    pub cap: usize,
    /// Also build the whole profile (tests); benchmarks only need the cut one.
    pub whole: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            workers: 4,
            ticks: 2000,
            seed: 7,
            cap: 100,
            whole: true,
        }
    }
}

/// The same samples, whole and cut.
pub struct Generated {
    /// Every stack whole (`None` when `Config::whole` is false).
    pub whole: Option<Profile>,
    /// Stacks deeper than the cap cut to their `cap` leaf-most managed frames.
    pub cut: Profile,
}

/// Frame names by index, and per-profile frame ids.
struct Names {
    names: Vec<String>,
}

impl Names {
    fn add(&mut self, name: String) -> u32 {
        self.names.push(name);
        (self.names.len() - 1) as u32
    }
}

const MIDDLEWARES_PER_ROUTE: usize = 70;
const SHARED_MIDDLEWARES: usize = 40;
const ROUTES: usize = 3;

struct Catalog {
    names: Names,
    main_roots: Vec<u32>,
    worker_roots: Vec<u32>,
    request_entry: Vec<u32>,
    idle: Vec<u32>,
    /// Per route: the chain's frames, root first, three per middleware.
    routes: Vec<Vec<u32>>,
    leaves: Vec<Vec<u32>>,
    /// Leaves that run outside managed code (leaf pseudo frame `UNMANAGED_CODE_TIME`).
    unmanaged_leaves: Vec<bool>,
    walk: u32,
    visit: u32,
    eval: u32,
    eval_binary: u32,
    batch: Vec<u32>,
    cpu_time: u32,
    unmanaged_time: u32,
    threads_frame: u32,
    process_frame: u32,
}

fn catalog() -> Catalog {
    let mut n = Names { names: Vec::new() };
    let add_all = |n: &mut Names, list: &[&str]| -> Vec<u32> {
        list.iter().map(|s| n.add((*s).to_string())).collect()
    };
    let main_roots = add_all(&mut n, &["App!App.Program.Main(class System.String[])"]);
    let worker_roots = add_all(
        &mut n,
        &[
            "System.Private.CoreLib!System.Threading.Thread.StartCallback()",
            "System.Private.CoreLib!System.Threading.PortableThreadPool+WorkerThread.WorkerThreadStart()",
            "System.Private.CoreLib!System.Threading.ThreadPoolWorkQueue.Dispatch()",
        ],
    );
    let request_entry = add_all(
        &mut n,
        &[
            "System.Private.CoreLib!System.Threading.ExecutionContext.RunInternal(class System.Threading.ExecutionContext,class System.Threading.ContextCallback,class System.Object)",
            "Microsoft.AspNetCore.Server.Kestrel.Core!Microsoft.AspNetCore.Server.Kestrel.Core.Internal.Http.HttpProtocol+<ProcessRequests>d__223`1.MoveNext()",
            "Microsoft.AspNetCore.Hosting!Microsoft.AspNetCore.Hosting.HostingApplication.ProcessRequestAsync(class Context)",
        ],
    );
    let idle = add_all(
        &mut n,
        &[
            "System.Private.CoreLib!System.Threading.LowLevelLifoSemaphore.Wait(int32,bool)",
            "System.Private.CoreLib!System.Threading.LowLevelLifoSemaphore.WaitForSignal(int32)",
        ],
    );
    let start = n.add(
        "System.Private.CoreLib!System.Runtime.CompilerServices.AsyncMethodBuilderCore.Start(!!0&)"
            .to_string(),
    );
    let middleware = |n: &mut Names, name: &str| -> [u32; 3] {
        [
            n.add(format!(
                "App!App.Middleware.{name}.Invoke(class Microsoft.AspNetCore.Http.HttpContext)"
            )),
            start,
            n.add(format!("App!App.Middleware.{name}+<Invoke>d__3.MoveNext()")),
        ]
    };
    let shared: Vec<[u32; 3]> = (0..SHARED_MIDDLEWARES)
        .map(|i| middleware(&mut n, &format!("Shared{i:02}")))
        .collect();
    let routes = (0..ROUTES)
        .map(|r| {
            let mut chain: Vec<u32> = shared.iter().flatten().copied().collect();
            for i in SHARED_MIDDLEWARES..MIDDLEWARES_PER_ROUTE {
                chain.extend(middleware(&mut n, &format!("Route{r}Step{i:02}")));
            }
            chain
        })
        .collect();
    let leaf_lists: [(&[&str], bool); 6] = [
        (
            &[
                "System.Text.Json!System.Text.Json.JsonSerializer.Serialize(class System.Text.Json.Utf8JsonWriter,!!0)",
                "System.Text.Json!System.Text.Json.Serialization.JsonConverter`1.WriteCore(class Utf8JsonWriter,!0&)",
                "System.Text.Json!System.Text.Json.Utf8JsonWriter.WriteStringValue(value class System.ReadOnlySpan`1<wchar>)",
                "System.Text.Encodings.Web!System.Text.Encodings.Web.OptimizedInboxTextEncoder.GetIndexOfFirstCharToEncode(value class System.ReadOnlySpan`1<wchar>)",
            ],
            false,
        ),
        (
            &[
                "Npgsql!Npgsql.NpgsqlCommand.ExecuteReader(value class System.Data.CommandBehavior,bool)",
                "Npgsql!Npgsql.Internal.NpgsqlConnector.ReadMessage(bool)",
                "Npgsql!Npgsql.Internal.NpgsqlReadBuffer.Ensure(int32,bool)",
                "System.Net.Sockets!System.Net.Sockets.Socket.Receive(value class System.Span`1<unsigned int8>,value class System.Net.Sockets.SocketFlags)",
            ],
            true,
        ),
        (
            &[
                "App!App.Services.PricingService.Compute(class App.Order)",
                "App!App.Services.PricingService.ApplyRules(class App.Order,class System.Collections.Generic.List`1<class App.Rule>)",
                "System.Private.CoreLib!System.Collections.Generic.Dictionary`2[System.__Canon,System.__Canon].TryGetValue(!0,!1&)",
                "System.Private.CoreLib!System.Collections.Generic.Dictionary`2[System.__Canon,System.__Canon].FindValue(!0)",
            ],
            false,
        ),
        (
            &[
                "System.Linq!System.Linq.Enumerable.ToList(class System.Collections.Generic.IEnumerable`1<!!0>)",
                "System.Private.CoreLib!System.Collections.Generic.List`1[System.__Canon].AddRange(class System.Collections.Generic.IEnumerable`1<!0>)",
            ],
            false,
        ),
        (
            &[
                "System.Private.CoreLib!System.String.Concat(class System.String,class System.String)",
                "System.Private.CoreLib!System.Buffer.Memmove(unsigned int8&,unsigned int8&,native unsigned int)",
            ],
            false,
        ),
        (&["System.Private.CoreLib!System.GC.Alloc(int32)"], true),
    ];
    let mut leaves = Vec::new();
    let mut unmanaged_leaves = Vec::new();
    for (list, unmanaged) in leaf_lists {
        leaves.push(add_all(&mut n, list));
        unmanaged_leaves.push(unmanaged);
    }
    let walk = n.add("App!App.Services.Tree.Walk(class App.Services.Node,int32)".to_string());
    let visit = n.add("App!App.Services.Tree.Visit(class App.Services.Node)".to_string());
    let eval = n.add("App!App.Rules.Expr.Eval(class App.Rules.Scope)".to_string());
    let eval_binary = n.add(
        "App!App.Rules.Expr.EvalBinary(class App.Rules.Scope,class App.Rules.Expr)".to_string(),
    );
    let batch = add_all(
        &mut n,
        &[
            "App!App.Program.RunBatch(int32)",
            "App!App.Batch.Process(class App.Services.Node)",
        ],
    );
    let cpu_time = n.add("CPU_TIME".to_string());
    let unmanaged_time = n.add("UNMANAGED_CODE_TIME".to_string());
    let threads_frame = n.add("Threads".to_string());
    let process_frame = n.add("Process64 Process(4242) (4242) Args:  App.dll".to_string());
    Catalog {
        names: n,
        main_roots,
        worker_roots,
        request_entry,
        idle,
        routes,
        leaves,
        unmanaged_leaves,
        walk,
        visit,
        eval,
        eval_binary,
        batch,
        cpu_time,
        unmanaged_time,
        threads_frame,
        process_frame,
    }
}

enum Phase {
    Idle(usize),
    Descend,
    Bottom(usize),
    Ascend,
}

/// One thread's program: a state machine producing one managed stack per millisecond.
struct ThreadModel {
    main: bool,
    phase: Phase,
    route: usize,
    chain_len: usize,
    depth_in_chain: usize,
    leaf: usize,
    leaf_len: usize,
    recursion: usize,
    mutual: bool,
    in_recursion: bool,
    descending: bool,
}

impl ThreadModel {
    fn new(main: bool) -> Self {
        ThreadModel {
            main,
            phase: Phase::Idle(1),
            route: 0,
            chain_len: 0,
            depth_in_chain: 0,
            leaf: 0,
            leaf_len: 1,
            recursion: if main { 90 } else { 10 },
            mutual: false,
            in_recursion: false,
            descending: true,
        }
    }

    /// Writes the next sample's managed frames (root first) into `out`; true when the leaf runs
    /// outside managed code.
    fn step(&mut self, c: &Catalog, rng: &mut fastrand::Rng, out: &mut Vec<u32>) -> bool {
        out.clear();
        if self.main {
            return self.step_main(c, rng, out);
        }
        out.extend(&c.worker_roots);
        match self.phase {
            Phase::Idle(left) => {
                out.extend(&c.idle);
                self.phase = if left <= 1 {
                    self.route = rng.usize(..ROUTES);
                    self.chain_len = 3 * rng.usize(27..=66); // 81..=198 frames
                    self.depth_in_chain = 0;
                    Phase::Descend
                } else {
                    Phase::Idle(left - 1)
                };
                return true;
            }
            Phase::Descend => {
                self.depth_in_chain = (self.depth_in_chain + rng.usize(3..=12)).min(self.chain_len);
                if self.depth_in_chain == self.chain_len {
                    self.phase = Phase::Bottom(rng.usize(20..=150));
                }
            }
            Phase::Bottom(left) => {
                self.phase = if left <= 1 {
                    Phase::Ascend
                } else {
                    Phase::Bottom(left - 1)
                };
            }
            Phase::Ascend => {
                self.depth_in_chain = self.depth_in_chain.saturating_sub(rng.usize(20..=60));
                if self.depth_in_chain == 0 {
                    self.phase = Phase::Idle(rng.usize(1..=5));
                }
            }
        }
        out.extend(&c.request_entry);
        out.extend(&c.routes[self.route][..self.depth_in_chain]);
        if matches!(self.phase, Phase::Bottom(_)) {
            self.work(c, rng, out)
        } else {
            self.small_leaf(c, rng, out)
        }
    }

    fn step_main(&mut self, c: &Catalog, rng: &mut fastrand::Rng, out: &mut Vec<u32>) -> bool {
        out.extend(&c.main_roots);
        out.extend(&c.batch);
        self.in_recursion = true;
        // A deep tree walk: the recursion drifts between 30 and 220 deep, with noise.
        if self.recursion <= 30 {
            self.mutual = false;
            self.descending = true;
        } else if self.recursion >= 220 {
            self.descending = false;
        }
        let drift = if self.descending { 1 } else { 0 };
        self.recursion = (self.recursion + drift + rng.usize(0..=2))
            .saturating_sub(1 + (1 - drift) * 2)
            .clamp(20, 250);
        self.work(c, rng, out)
    }

    /// Bottom-of-request work: a varying leaf, sometimes below a run of recursion.
    fn work(&mut self, c: &Catalog, rng: &mut fastrand::Rng, out: &mut Vec<u32>) -> bool {
        if !self.main && rng.usize(..40) == 0 {
            self.in_recursion = !self.in_recursion;
            self.mutual = rng.bool();
            self.recursion = rng.usize(3..=60);
        }
        if self.in_recursion {
            if !self.main {
                self.recursion = walk(self.recursion, rng, 1, 120);
            }
            if self.mutual {
                out.push(c.eval);
                for i in 1..self.recursion {
                    out.push(if i % 2 == 1 { c.eval_binary } else { c.eval });
                }
            } else {
                out.extend(std::iter::repeat_n(c.walk, self.recursion));
                out.push(c.visit);
            }
        }
        if rng.usize(..4) == 0 {
            self.leaf = rng.usize(..c.leaves.len());
        }
        self.leaf_len = rng.usize(1..=c.leaves[self.leaf].len());
        out.extend(&c.leaves[self.leaf][..self.leaf_len]);
        c.unmanaged_leaves[self.leaf] && self.leaf_len == c.leaves[self.leaf].len()
    }

    fn small_leaf(&mut self, c: &Catalog, rng: &mut fastrand::Rng, out: &mut Vec<u32>) -> bool {
        let leaf = rng.usize(..c.leaves.len());
        out.push(c.leaves[leaf][0]);
        false
    }
}

/// A random walk step of -2..=2, kept in `lo..=hi`.
fn walk(n: usize, rng: &mut fastrand::Rng, lo: usize, hi: usize) -> usize {
    (n + rng.usize(0..=4)).saturating_sub(2).clamp(lo, hi)
}

/// Builds a profile sample by sample from catalog name indexes.
struct Builder {
    profile: Profile,
    frames: Vec<Option<FrameId>>,
    threads: Vec<ThreadId>,
    thread_frames: Vec<FrameId>,
    stack: Vec<FrameId>,
    /// Trie node at each depth of the last stack pushed, to intern only what changed.
    last: Vec<(FrameId, StackId)>,
}

impl Builder {
    fn new(c: &Catalog, tids: &[u32], producer: &str) -> Builder {
        let mut profile = Profile::new(vec![SampleType::samples()]);
        profile.metadata.producer = producer.to_string();
        profile.metadata.sample_rate_hz = Some(1000);
        profile.set_process_name(4242, "App");
        let threads = tids
            .iter()
            .map(|&t| profile.intern_thread(4242, t))
            .collect();
        // Readers of name-only formats give pseudo frames an ordinary kind; repair must know them
        // by name.
        let thread_frames = tids
            .iter()
            .map(|t| profile.intern_named_frame(&format!("Thread ({t})"), FrameKind::Managed))
            .collect();
        Builder {
            profile,
            frames: vec![None; c.names.names.len()],
            threads,
            thread_frames,
            stack: Vec::new(),
            last: Vec::new(),
        }
    }

    fn frame(&mut self, c: &Catalog, name: u32) -> FrameId {
        *self.frames[name as usize].get_or_insert_with(|| {
            self.profile
                .intern_named_frame(&c.names.names[name as usize], FrameKind::Managed)
        })
    }

    fn push(
        &mut self,
        c: &Catalog,
        thread: usize,
        time: u64,
        managed: &[u32],
        leaf: u32,
    ) -> StackId {
        self.stack.clear();
        let process = self.frame(c, c.process_frame);
        let threads = self.frame(c, c.threads_frame);
        self.stack
            .extend([process, threads, self.thread_frames[thread]]);
        for &m in managed {
            let f = self.frame(c, m);
            self.stack.push(f);
        }
        let leaf = self.frame(c, leaf);
        self.stack.push(leaf);
        let shared = self
            .stack
            .iter()
            .zip(&self.last)
            .take_while(|(f, (g, _))| *f == g)
            .count();
        self.last.truncate(shared);
        let mut node = self.last.last().map(|&(_, s)| s);
        for &frame in &self.stack[shared..] {
            let id = self.profile.intern_stack(node, frame);
            self.last.push((frame, id));
            node = Some(id);
        }
        let stack = node.expect("non-empty stack");
        self.profile
            .push_sample(time, self.threads[thread], stack, &[1])
            .expect("valid sample");
        stack
    }
}

/// Generates the samples of `config`.
pub fn generate(config: &Config) -> Generated {
    let c = catalog();
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let tids: Vec<u32> = (0..=config.workers as u32).map(|i| 4242 + i * 3).collect();
    let mut models: Vec<ThreadModel> = (0..tids.len()).map(|i| ThreadModel::new(i == 0)).collect();
    for m in models.iter_mut().skip(1) {
        m.phase = Phase::Idle(rng.usize(1..=20));
    }
    let mut whole = config
        .whole
        .then(|| Builder::new(&c, &tids, "dotnet-trace"));
    let mut cut = Builder::new(&c, &tids, "dotnet-trace");
    cut.profile.metadata.depth_cap = None; // known from the producer tag
    let mut managed = Vec::new();
    for tick in 0..config.ticks {
        for (thread, model) in models.iter_mut().enumerate() {
            let unmanaged = model.step(&c, &mut rng, &mut managed);
            let leaf = if unmanaged {
                c.unmanaged_time
            } else {
                c.cpu_time
            };
            let time = 1_000_000_000 + tick as u64 * 1_000_000 + thread as u64 * 1_000;
            if let Some(w) = whole.as_mut() {
                w.push(&c, thread, time, &managed, leaf);
            }
            let keep = managed.len().saturating_sub(config.cap);
            cut.push(&c, thread, time, &managed[keep..], leaf);
        }
    }
    Generated {
        whole: whole.map(|b| b.profile),
        cut: cut.profile,
    }
}

/// Frame names of a stack, root first.
pub fn names(profile: &Profile, stack: StackId) -> Vec<String> {
    let mut frames: Vec<String> = profile
        .stack_frames(stack)
        .map(|f| profile.frame_name(f).to_string())
        .collect();
    frames.reverse();
    frames
}
