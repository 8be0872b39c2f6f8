//! The agent's configuration: a TOML file (every key optional), then the OpenTelemetry environment
//! variables for the OTLP exporter.
//!
//! ```toml
//! frequency_hz = 99
//! stack_bytes = "16KiB"  # user stack copied per sample, at most 65528
//! export_interval = "10s"
//! export_timeout = "5s"
//! memory_limit = "288MiB"
//! shutdown_timeout = "20s"
//! kernel_walk = "auto"  # walk user stacks in the kernel at sample time: auto, on or off
//!
//! [targets]            # nothing set: the whole host
//! regex = ["^java$"]
//!
//! [cache]
//! buckets = 4096
//! bucket_limit = 4
//! byte_budget = "8MiB"
//!
//! [buffers]
//! bytes = "1MiB"       # each of the two
//!
//! [modules]            # unwind tables and symbols of the binaries being profiled
//! byte_budget = "64MiB"
//! dwarf_budget = "24MiB" # parsed DWARF (inlined frames, lines) held at once
//! kernel_rows = "64MiB"  # the in-kernel walk's rules for those binaries
//!
//! [off_cpu]            # where threads wait, besides where they run; off by default
//! enabled = true
//! min_us = 100         # shorter waits: time counted, stacks not taken
//! max_rate = 1000      # switch-out stacks taken per second on the host, at most
//!
//! [exporters.otlp]     # endpoint from OTEL_EXPORTER_OTLP_* when not given here
//! [exporters.pprof]
//! directory = "/var/lib/rootline/pprof"
//! max_bytes = "256MiB"
//! [exporters.rlp]
//! directory = "/var/lib/rootline/rlp"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use crate::cache::CacheLimits;
use crate::targets::TargetConfig;

/// A configuration error, with the file and what to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TOML is malformed or has an unknown key or a bad value (the message names the line).
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// Values that parse but do not fit together.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Everything the agent needs to run.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Sampling frequency per CPU (or per thread), Hz. Default 99.
    pub frequency_hz: u32,
    /// User stack bytes the kernel copies with each sample. Default 16 KiB, at most 65528 (the
    /// kernel's limit). Frames past the copy are read from the live process only where a watch
    /// proves them unchanged, else the stack ends `[truncated: live-unproven]`: raise it (e.g.
    /// 65528) for deep, varying stacks such as compilers'. Each CPU's ring buffer grows with it
    /// (counted in `memory_limit`).
    #[serde(deserialize_with = "de_bytes")]
    pub stack_bytes: usize,
    /// How often the exporter thread exports. Default 10 s.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub export_interval: Duration,
    /// Time limit of one export attempt. Default 5 s.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub export_timeout: Duration,
    /// Hard cap on the agent's memory: the stack cache, the sample buffers, the exporter's working
    /// set, the loaded binaries' tables and DWARF (`modules`) and the sampler's working set
    /// ([`CAPTURE_ALLOWANCE`]), and the in-kernel walk's tables and ring
    /// ([`AgentConfig::kernel_walk_memory`], 124 MiB by default). Checked against
    /// [`AgentConfig::memory_estimate`] at start. Default 288 MiB (158 MiB fits the defaults
    /// with `kernel_walk = "off"`).
    #[serde(deserialize_with = "de_bytes")]
    pub memory_limit: usize,
    /// Longest the final export may take after a stop request (SIGTERM): exports still trying a
    /// slow or dead receiver give up at it. Default 20 s, inside Kubernetes' default 30 s grace
    /// period.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub shutdown_timeout: Duration,
    /// How often target rules are re-evaluated for sources that sample per process. Default 1 s.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub target_refresh: Duration,
    /// Whether each sampled user stack is also walked in the kernel at sample time (a BPF
    /// program; deep stacks rebuilt between samples, such as a compiler's, then stay whole):
    /// `auto` (default) walks when the program loads and otherwise logs one line with the fix
    /// and unwinds the usual way; `on` fails to start without it; `off` never walks. Its ring
    /// buffer and working set are counted in `memory_limit`
    /// ([`AgentConfig::kernel_walk_memory`]: `modules.kernel_rows`, [`KERNEL_WALK_RING_BYTES`],
    /// [`KERNEL_WALK_ALLOWANCE`]).
    pub kernel_walk: KernelWalkSetting,
    /// What to profile.
    pub targets: TargetConfig,
    /// Stack cache shape.
    pub cache: CacheConfig,
    /// Sample buffer size.
    pub buffers: BufferConfig,
    /// Memory for the binaries being profiled.
    pub modules: ModulesConfig,
    /// Off-CPU profiling: where threads wait.
    pub off_cpu: OffCpuConfig,
    /// Where profiles go; several at once are fine.
    pub exporters: ExportersConfig,
    /// .NET processes.
    pub dotnet: DotnetConfig,
}

/// The `kernel_walk` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelWalkSetting {
    /// Walk when the BPF program loads; otherwise one log line and the usual unwind.
    #[default]
    Auto,
    /// Walk, or fail to start.
    On,
    /// Never walk.
    Off,
}

impl KernelWalkSetting {
    /// The recorder's mode for this setting.
    pub fn mode(self) -> rootline_capture::recorder::KernelWalkMode {
        use rootline_capture::recorder::KernelWalkMode;
        match self {
            KernelWalkSetting::Auto => KernelWalkMode::Auto,
            KernelWalkSetting::On => KernelWalkMode::On,
            KernelWalkSetting::Off => KernelWalkMode::Off,
        }
    }
}

/// What the agent collects from the .NET processes among its targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DotnetConfig {
    /// Collect GC allocation ticks (about one per 100 KB a thread allocates, with its managed
    /// stack and type) from every .NET process among the targets, over an EventPipe session on
    /// its diagnostics socket; exported as the columns `alloc-bytes` and `alloc-count` beside the
    /// CPU samples. Default off.
    pub allocation_ticks: bool,
    /// How long each EventPipe session runs before the next one takes over; each ends with the
    /// runtime's rundown of its methods, which names them, so ticks reach the buffers once per
    /// session. Default 10 s.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub session_length: Duration,
}

impl Default for DotnetConfig {
    fn default() -> DotnetConfig {
        DotnetConfig {
            allocation_ticks: false,
            session_length: Duration::from_secs(10),
        }
    }
}

/// Off-CPU settings: every time a thread of the host leaves the CPU its stack is taken and
/// weighed by how long it stayed off (the `off_cpu` sample type, nanoseconds, beside `cpu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OffCpuConfig {
    /// Record off-CPU time. Default false.
    pub enabled: bool,
    /// Waits shorter than this many microseconds are counted (their time summed per thread
    /// under `[off-cpu: short, not unwound]`) without taking their stacks. Default 100.
    pub min_us: u64,
    /// Most switch-out stacks taken per second on the whole host (the kernel's stack copy is
    /// the cost of a switch); the time of the others is summed per thread under
    /// `[off-cpu: over the rate cap, not unwound]`. 0: every switch. Default 1000.
    pub max_rate: u32,
}

impl Default for OffCpuConfig {
    fn default() -> OffCpuConfig {
        OffCpuConfig {
            enabled: false,
            min_us: 100,
            max_rate: rootline_capture::recorder::DEFAULT_OFF_CPU_MAX_RATE,
        }
    }
}

/// Stack cache settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Hash buckets. Default 4096.
    pub buckets: usize,
    /// Most stacks per bucket (MRU order). Default 4.
    pub bucket_limit: usize,
    /// Byte budget of all cached stacks. Default 8 MiB.
    #[serde(deserialize_with = "de_bytes")]
    pub byte_budget: usize,
}

/// Sample buffer settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BufferConfig {
    /// Byte budget of each of the two buffers. Default 1 MiB.
    #[serde(deserialize_with = "de_bytes")]
    pub bytes: usize,
}

/// Memory for the binaries being profiled: their unwind tables (`.eh_frame`, `.debug_frame`),
/// FDE indexes and symbol tables. Binaries are never read whole; code bytes and names are read
/// from the file when needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModulesConfig {
    /// Most memory all loaded binaries may hold (ELF files' unwind and symbol tables, .NET
    /// ReadyToRun images' method tables, JIT runtimes' perf map and jitdump symbols). A binary
    /// that does not fit is not loaded; its frames end their stacks as
    /// `[truncated: module-memory-limit]` until there is room (binaries of exited processes are
    /// freed, and a binary a running process needs may take their room at once, going over the
    /// budget until they are). Default 64 MiB (rustc's 150 MB driver library needs 16 and libLLVM 24, .NET
    /// 3.1's CoreLib 4).
    #[serde(deserialize_with = "de_bytes")]
    pub byte_budget: usize,
    /// Most memory the symbolizer's parsed DWARF (inlined frames, source lines) may take at once,
    /// estimated from each binary's debug sections. A binary whose DWARF does not fit is named
    /// from its symbol tables (and a `-dbg` package's) without inlined frames. Default 24 MiB (a
    /// 67 MB Rust binary with debug info needs about 16; Debian's `libc6-dbg` about 34).
    #[serde(deserialize_with = "de_bytes")]
    pub dwarf_budget: usize,
    /// The in-kernel stack walk's rules table (`kernel_walk`): 16 bytes per CFI row of the
    /// binaries being profiled, allocated whole when the agent starts (resident from the start,
    /// not counted when the walk is off). A binary whose rows do not fit is walked no further
    /// than its frames; its stacks continue the usual way (counted as
    /// `kernel_walk.binaries_refused`), as is a binary with more rows than half the table.
    /// Default 64 MiB (rustc's driver library has 1.4 million rows, 23 MiB; a shared build host
    /// running several toolchains, node and cargo used 54 MiB).
    #[serde(deserialize_with = "de_bytes")]
    pub kernel_rows: usize,
}

impl Default for ModulesConfig {
    fn default() -> ModulesConfig {
        ModulesConfig {
            byte_budget: 64 << 20,
            dwarf_budget: 24 << 20,
            kernel_rows: 64 << 20,
        }
    }
}

/// The exporters to run; each is on when its table is present.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExportersConfig {
    /// OTLP/HTTP protobuf.
    pub otlp: Option<OtlpConfig>,
    /// pprof files in a directory.
    pub pprof: Option<DirConfig>,
    /// `.rlp` streams in a directory.
    pub rlp: Option<DirConfig>,
}

/// OTLP/HTTP exporter settings. Unset values come from the `OTEL_*` environment variables.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// Full URL of the profiles endpoint, or a base URL to which `/v1development/profiles` is added.
    pub endpoint: Option<String>,
    /// Extra HTTP headers (e.g. an API key).
    pub headers: BTreeMap<String, String>,
    /// Gzip the request body (else `OTEL_EXPORTER_OTLP_[PROFILES_]COMPRESSION`: `gzip` or
    /// `none`). Default true.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gzip: Option<bool>,
    /// Time limit of one attempt (else `OTEL_EXPORTER_OTLP_[PROFILES_]TIMEOUT`, in milliseconds,
    /// else `export_timeout`).
    #[serde(
        deserialize_with = "de_opt_duration",
        serialize_with = "ser_opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout: Option<Duration>,
    /// Retries after a failed attempt. Default 2.
    pub retries: u32,
    /// Wait before the first retry; doubles on each retry. Default 500 ms.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub backoff: Duration,
    /// Extra resource attributes (`OTEL_RESOURCE_ATTRIBUTES` adds to these).
    pub resource_attributes: BTreeMap<String, String>,
    /// `service.name` (`OTEL_SERVICE_NAME` overrides it). Default: the process's name.
    pub service_name: Option<String>,
    /// PEM file of the CA certificates to trust for HTTPS instead of the WebPKI roots
    /// (else `OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE`, `OTEL_EXPORTER_OTLP_CERTIFICATE`).
    pub certificate: Option<PathBuf>,
    /// PEM file of the client certificate chain for mutual TLS
    /// (else `OTEL_EXPORTER_OTLP_[PROFILES_]CLIENT_CERTIFICATE`).
    pub client_certificate: Option<PathBuf>,
    /// PEM file of the client certificate's private key
    /// (else `OTEL_EXPORTER_OTLP_[PROFILES_]CLIENT_KEY`).
    pub client_key: Option<PathBuf>,
}

/// A directory exporter's settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DirConfig {
    /// Where the files go (created if missing).
    pub directory: PathBuf,
    /// Byte cap of the directory's files from this exporter; the oldest are deleted past it.
    /// Default 256 MiB.
    #[serde(default = "default_dir_cap", deserialize_with = "de_bytes")]
    pub max_bytes: usize,
}

fn default_dir_cap() -> usize {
    256 << 20
}

impl Default for AgentConfig {
    fn default() -> AgentConfig {
        AgentConfig {
            frequency_hz: 99,
            stack_bytes: DEFAULT_STACK_BYTES,
            export_interval: Duration::from_secs(10),
            export_timeout: Duration::from_secs(5),
            memory_limit: 288 << 20,
            shutdown_timeout: Duration::from_secs(20),
            target_refresh: Duration::from_secs(1),
            kernel_walk: KernelWalkSetting::Auto,
            targets: TargetConfig::default(),
            cache: CacheConfig::default(),
            buffers: BufferConfig::default(),
            modules: ModulesConfig::default(),
            off_cpu: OffCpuConfig::default(),
            exporters: ExportersConfig::default(),
            dotnet: DotnetConfig::default(),
        }
    }
}

impl Default for CacheConfig {
    fn default() -> CacheConfig {
        CacheConfig {
            buckets: 4096,
            bucket_limit: 4,
            byte_budget: 8 << 20,
        }
    }
}

impl Default for BufferConfig {
    fn default() -> BufferConfig {
        BufferConfig { bytes: 1 << 20 }
    }
}

impl Default for OtlpConfig {
    fn default() -> OtlpConfig {
        OtlpConfig {
            endpoint: None,
            headers: BTreeMap::new(),
            gzip: None,
            timeout: None,
            retries: 2,
            backoff: Duration::from_millis(500),
            resource_attributes: BTreeMap::new(),
            service_name: None,
            certificate: None,
            client_certificate: None,
            client_key: None,
        }
    }
}

impl CacheConfig {
    /// The cache limits.
    pub fn limits(&self) -> CacheLimits {
        CacheLimits {
            buckets: self.buckets,
            bucket_limit: self.bucket_limit,
            byte_budget: self.byte_budget,
        }
    }
}

/// Fixed allowance, besides cache and buffers, for the exporter's working set and bookkeeping.
pub const WORKING_ALLOWANCE: usize = 4 << 20;

/// Fixed allowance for the sampler besides the binaries' tables: its tables of distinct frames
/// and stack nodes (bounded by the capture source's table limit), the per-CPU ring buffers at
/// the default stack copy, the symbolizer's working set and the batches in flight.
pub const CAPTURE_ALLOWANCE: usize = 40 << 20;

/// The in-kernel walk's ring buffer in the agent: it is drained every few milliseconds (a
/// 1,000-frame walk sends about 50 KiB), so a few MiB ride out a pause of the sampler thread;
/// walks that find it full end early, counted (`kernel_walk.lost_chunks`). A new process's
/// first samples, before its binaries' rows are placed, send their stack whole (up to 1 MiB,
/// page by page while the ring is at most a quarter full): 8 MiB leaves room for a few of them
/// in every round.
pub const KERNEL_WALK_RING_BYTES: usize = 8 << 20;

/// Most bytes of those stack dumps held by samples set aside (until their binaries are read).
pub const KERNEL_WALK_KEPT_DUMPS: usize = 8 << 20;

/// The in-kernel walk's working set besides its ring, its rows table and the binary's rows
/// waiting to be placed (see [`AgentConfig::kernel_walk_memory`]): walks being assembled and
/// kept for their samples, with at most [`KERNEL_WALK_KEPT_DUMPS`] of stack dumps.
pub const KERNEL_WALK_ALLOWANCE: usize = (4 << 20) + KERNEL_WALK_KEPT_DUMPS;

/// The default `stack_bytes`.
pub const DEFAULT_STACK_BYTES: usize = 16 << 10;

/// The kernel's largest user stack copy per sample.
pub const MAX_STACK_BYTES: usize = 65528;

impl AgentConfig {
    /// Parses TOML text; `path` is only used in messages.
    pub fn from_toml(text: &str, path: &Path) -> Result<AgentConfig, ConfigError> {
        let config: AgentConfig = toml::from_str(text).map_err(|e| {
            let place = e.span().map_or(String::new(), |span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!("line {line}, column {column}: ")
            });
            ConfigError::Parse {
                path: path.to_path_buf(),
                message: format!("{place}{}", e.message().replace('\n', " ")),
            }
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Reads and parses a TOML file.
    pub fn load(path: &Path) -> Result<AgentConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        AgentConfig::from_toml(&text, path)
    }

    /// Memory the pipeline (cache, buffers, exporter) may use at most, by its parts: the cache
    /// budget; each buffer's budget twice (record slots, plus the frames of the stacks it
    /// defines); the exporter's mirror of the cache (at most the cache plus stacks evicted while
    /// both buffers still refer to them); the exporter's per-export profiles (bounded by a
    /// buffer's content, a few times over); and a fixed allowance.
    pub fn pipeline_memory_estimate(&self) -> usize {
        let buffer = self.buffers.bytes;
        self.cache.byte_budget * 2 + buffer * 2 * 2 + buffer * 2 + buffer * 4 + WORKING_ALLOWANCE
    }

    /// Memory the whole agent may use at most: the pipeline's
    /// ([`AgentConfig::pipeline_memory_estimate`]), the binaries' budgets (tables and DWARF) and
    /// the sampler's allowance ([`CAPTURE_ALLOWANCE`]) and the in-kernel walk's
    /// ([`AgentConfig::kernel_walk_memory`]).
    pub fn memory_estimate(&self) -> usize {
        self.pipeline_memory_estimate()
            + self.modules.byte_budget
            + self.modules.dwarf_budget
            + CAPTURE_ALLOWANCE
            + self.ring_growth()
            + self.kernel_walk_memory()
    }

    /// What the in-kernel walk adds to the agent's memory: its rows table
    /// (`modules.kernel_rows`, resident whole); one large binary's rows read or compiled and
    /// waiting to be placed (one at a time in the agent, and a binary with more rows than half
    /// the table is refused: at most half the table); its ring buffer (whose data pages the
    /// kernel maps twice, both counted in RSS); and its working set
    /// ([`KERNEL_WALK_ALLOWANCE`]). 0 when it is off.
    pub fn kernel_walk_memory(&self) -> usize {
        match self.kernel_walk {
            KernelWalkSetting::Off => 0,
            KernelWalkSetting::Auto | KernelWalkSetting::On => {
                self.modules.kernel_rows
                    + self.modules.kernel_rows / 2
                    + 2 * KERNEL_WALK_RING_BYTES
                    + KERNEL_WALK_ALLOWANCE
            }
        }
    }

    /// The rows of the in-kernel walk's table (`modules.kernel_rows` in rows of 16 bytes).
    pub fn kernel_rows(&self) -> u32 {
        u32::try_from(self.modules.kernel_rows / 16).unwrap_or(u32::MAX)
    }

    /// What the per-CPU ring buffers take beyond the allowance's (made for the default stack
    /// copy, without off-CPU), on this host's CPUs.
    fn ring_growth(&self) -> usize {
        let ring =
            |stack: usize| rootline_capture::recorder::ring_bytes(self.frequency_hz, stack as u32);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let stack = self.stack_bytes.min(MAX_STACK_BYTES);
        // Off-CPU adds a ring per CPU for the switch-outs, as large as the sampling one.
        let off_cpu = if self.off_cpu.enabled { ring(stack) } else { 0 };
        cpus * (ring(stack).saturating_sub(ring(DEFAULT_STACK_BYTES)) + off_cpu)
    }

    /// Checks that the values fit together, in particular that [`Self::memory_estimate`] is within
    /// `memory_limit`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.frequency_hz == 0 || self.frequency_hz > 10_000 {
            return Err(ConfigError::Invalid(format!(
                "frequency_hz = {} is out of range; use 1..=10000 (99 is the usual choice)",
                self.frequency_hz
            )));
        }
        if self.export_interval < Duration::from_millis(10) {
            return Err(ConfigError::Invalid(
                "export_interval must be at least 10ms".into(),
            ));
        }
        if self.dotnet.session_length < Duration::from_secs(1) {
            return Err(ConfigError::Invalid(
                "dotnet.session_length must be at least 1s (each session ends with the runtime's \
                 rundown of its methods)"
                    .into(),
            ));
        }
        if self.export_timeout.is_zero() {
            return Err(ConfigError::Invalid("export_timeout must not be 0".into()));
        }
        if self.shutdown_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "shutdown_timeout must not be 0 (the final export needs some time)".into(),
            ));
        }
        if self.stack_bytes < 8
            || self.stack_bytes > MAX_STACK_BYTES
            || !self.stack_bytes.is_multiple_of(8)
        {
            return Err(ConfigError::Invalid(format!(
                "stack_bytes = {} is out of range; use a multiple of 8 up to {MAX_STACK_BYTES} (the \
                 kernel's limit; 16KiB is the default)",
                self.stack_bytes
            )));
        }
        let page_cache = rootline_image::PAGE_CACHE_BYTES;
        if self.modules.byte_budget < 2 * page_cache {
            return Err(ConfigError::Invalid(format!(
                "modules.byte_budget = {} bytes is too small: {page_cache} bytes of it are the code \
                 page cache; use at least {} (\"8MiB\"), 64MiB is the default",
                self.modules.byte_budget,
                2 * page_cache
            )));
        }
        let estimate = self.memory_estimate();
        if estimate > self.memory_limit {
            return Err(ConfigError::Invalid(format!(
                "cache.byte_budget, buffers.bytes and the modules budgets need up to {} bytes with \
                 the sampler's working set (and the in-kernel walk's, unless kernel_walk = \"off\"), \
                 more than memory_limit = {} bytes; raise memory_limit or lower them",
                estimate, self.memory_limit
            )));
        }
        Ok(())
    }
}

/// A cache byte budget that holds `stacks` stacks of `depth` frames each.
pub fn stack_budget_for(stacks: usize, depth: usize) -> usize {
    stacks * crate::cache::stack_cost(depth)
}

/// Parses `500ms`, `10s`, `2m`, `1h` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let scale = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(value * scale).ok()
}

/// Parses `1048576`, `512KiB`, `8MiB`, `1GiB` (also `K`, `M`, `G`, `KB`, `MB`, `GB` as binary).
pub fn parse_bytes(text: &str) -> Option<usize> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: usize = number.parse().ok()?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return None,
    };
    value.checked_mul(1usize << shift)
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrText {
    Int(u64),
    Float(f64),
    Text(String),
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    match NumOrText::deserialize(d)? {
        NumOrText::Int(secs) => Ok(Duration::from_secs(secs)),
        NumOrText::Float(secs) => Duration::try_from_secs_f64(secs)
            .map_err(|_| serde::de::Error::custom("duration out of range")),
        NumOrText::Text(text) => parse_duration(&text).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "bad duration {text:?}; write e.g. \"500ms\", \"10s\", \"2m\""
            ))
        }),
    }
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{}ms", d.as_millis()))
}

fn de_opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    de_duration(d).map(Some)
}

fn ser_opt_duration<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => ser_duration(d, s),
        None => s.serialize_none(),
    }
}

fn de_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    match NumOrText::deserialize(d)? {
        NumOrText::Int(n) => usize::try_from(n).map_err(serde::de::Error::custom),
        NumOrText::Float(_) => Err(serde::de::Error::custom(
            "byte sizes are whole numbers or e.g. \"8MiB\"",
        )),
        NumOrText::Text(text) => parse_bytes(&text).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "bad byte size {text:?}; write e.g. 1048576, \"512KiB\", \"8MiB\""
            ))
        }),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod deploy_tests;
