//! The agent with the real sampler and `dotnet.allocation_ticks` on, on every installed runtime
//! (CoreCLR 3.1 and .NET 8), against the ground truth of the .NET allocation tests
//! (tests/data/Alloc.cs: three quarters of the bytes `byte[4096]` in `Big`, a quarter `int[1024]`
//! in `Small`). Sessions are replaced every 2 s while the agent exports every second: the exported
//! allocation samples give each method and type its share of the bytes within 10 points, on stacks
//! from `Main`, beside perf's CPU samples of the same process; every captured sample is exported
//! or counted as dropped; the OTLP request has one profile per sample type, `alloc_space` holding
//! the bytes.

#[path = "../../dotnet/tests/common/live.rs"]
mod live;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use live::{Runtime, for_each_runtime};
use rootline_agent::config::DotnetConfig;
use rootline_agent::{
    Agent, AgentConfig, ExportBatch, ExportError, Exporter, ProcessProfile, TargetConfig,
};
use rootline_profile::{SampleType, pseudo};

const SOURCE: &str = include_str!("../../dotnet/tests/data/Alloc.cs");
const BIG: &str = "Alloc!Alloc.Big(int32)";
const SMALL: &str = "Alloc!Alloc.Small(int32)";
const MAIN: &str = "Alloc!Alloc.Main(class System.String[])";

#[derive(Debug, Default)]
struct Seen {
    /// Bytes per (caller of the allocation frame, type).
    sites: BTreeMap<(String, String), i64>,
    bytes: i64,
    ticks: i64,
    cpu_samples: i64,
    whole_big: u64,
    /// Totals of the OTLP profiles by sample type.
    otlp: BTreeMap<String, i64>,
    samples: u64,
}

struct Collect(Arc<Mutex<Seen>>);

impl Exporter for Collect {
    fn name(&self) -> &str {
        "collect"
    }

    fn export_process(
        &mut self,
        _batch: &ExportBatch,
        process: &ProcessProfile,
    ) -> Result<(), ExportError> {
        let p = &process.profile;
        let mut seen = self.0.lock().unwrap();
        seen.samples += process.samples;
        let types = p.sample_types();
        let column = |t: SampleType| types.iter().position(|s| *s == t).unwrap();
        let (count, cpu, bytes, ticks) = (
            column(SampleType::samples()),
            column(SampleType::cpu_nanoseconds()),
            column(SampleType::alloc_bytes()),
            column(SampleType::alloc_count()),
        );
        let samples = p.samples();
        for i in 0..samples.len() {
            let stack = samples.stacks[i];
            let leaf = p.frame_name(p.stack(stack).frame);
            let Some(ty) = pseudo::alloc_type_of(leaf) else {
                assert_eq!(samples.values[bytes][i], 0);
                assert_eq!(samples.values[ticks][i], 0);
                seen.cpu_samples += samples.values[count][i];
                continue;
            };
            assert_eq!(samples.values[count][i], 0);
            assert_eq!(samples.values[cpu][i], 0);
            assert_eq!(samples.values[ticks][i], 1);
            let b = samples.values[bytes][i];
            let names: Vec<&str> = p.stack_frames(stack).map(|f| p.frame_name(f)).collect();
            let caller = names.get(1).copied().unwrap_or("(none)");
            if caller == BIG && names.last() == Some(&MAIN) {
                seen.whole_big += 1;
            }
            *seen
                .sites
                .entry((caller.to_string(), ty.to_string()))
                .or_default() += b;
            seen.bytes += b;
            seen.ticks += 1;
        }
        // OTLP: one profile per sample type.
        let request = rootline_formats::otlp::to_request(p);
        let d = request.dictionary.as_ref().unwrap();
        for profile in &request.resource_profiles[0].scope_profiles[0].profiles {
            let t = profile.sample_type.as_ref().unwrap();
            let name = d.string_table[t.type_strindex as usize].clone();
            let total: i64 = profile.samples.iter().flat_map(|s| &s.values).sum();
            *seen.otlp.entry(name).or_default() += total;
        }
        Ok(())
    }
}

#[test]
fn agent_exports_dotnet_allocation_ticks() {
    for_each_runtime("agent_exports_dotnet_allocation_ticks", run);
}

fn run(runtime: &Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let exe = runtime.build_program(SOURCE, "Alloc", dir.path());
    let mut target = runtime.start(&exe, 0, 0);
    let config = AgentConfig {
        export_interval: Duration::from_secs(1),
        targets: TargetConfig {
            pids: vec![target.pid()],
            ..TargetConfig::default()
        },
        dotnet: DotnetConfig {
            allocation_ticks: true,
            session_length: Duration::from_secs(2),
        },
        ..AgentConfig::default()
    };
    config.validate().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let source = rootline_agent::default_source(&config).expect("the sampler starts");
    let exporters: Vec<Box<dyn Exporter>> = vec![Box::new(Collect(Arc::clone(&seen)))];
    let agent = Agent::start(&config, source, exporters).unwrap();
    std::thread::sleep(Duration::from_secs(7));
    let stats = agent.stop().expect("the agent ran");
    target.assert_still_answers();
    drop(target);

    let seen = seen.lock().unwrap();
    for ((caller, ty), bytes) in &seen.sites {
        eprintln!(
            "{runtime}: {:6.2}% {bytes:>12} {caller} [{ty}]",
            100.0 * *bytes as f64 / seen.bytes as f64
        );
    }
    eprintln!(
        "{runtime}: {} ticks, {} bytes, {} CPU samples, OTLP {:?}; {stats:?}",
        seen.ticks, seen.bytes, seen.cpu_samples, seen.otlp
    );
    let e = &stats.exporters[0];
    assert_eq!(stats.captured, stats.dropped + e.exported + e.failed);
    assert_eq!(e.exported, seen.samples);
    assert!(seen.ticks > 300, "{} ticks", seen.ticks);
    assert!(seen.cpu_samples > 50, "{} CPU samples", seen.cpu_samples);
    let share = |caller: &str, ty: &str| {
        seen.sites
            .get(&(caller.to_string(), ty.to_string()))
            .copied()
            .unwrap_or(0) as f64
            / seen.bytes as f64
    };
    let big = share(BIG, "System.Byte[]");
    let small = share(SMALL, "System.Int32[]");
    assert!((big - 0.75).abs() <= 0.10, "Big has {big:.4}");
    assert!((small - 0.25).abs() <= 0.10, "Small has {small:.4}");
    assert!(
        seen.whole_big > 100,
        "{} Big stacks from Main",
        seen.whole_big
    );
    // Ticks carry about 100 KB each: a tick counted twice at a session handover would not change
    // that, but one lost or doubled session would show in the shares and counts above.
    let per_tick = seen.bytes as f64 / seen.ticks as f64;
    assert!((90_000.0..200_000.0).contains(&per_tick), "{per_tick}");
    assert_eq!(seen.otlp["alloc_space"], seen.bytes);
    assert_eq!(seen.otlp["alloc_objects"], seen.ticks);
    assert_eq!(seen.otlp["samples"], seen.cpu_samples);
}
