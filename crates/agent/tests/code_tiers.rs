//! The agent's exported profiles keep what the JIT said about a frame's code: its code tier and
//! the runtime's own name, so one .NET method at two tiers is two functions with one display name.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rootline_agent::{
    Agent, AgentConfig, CodeDetail, ExportBatch, ExportError, Exporter, FrameDesc, PollStats,
    ProcessProfile, RawSample, SampleSource, SourceError, StackTable,
};
use rootline_profile::FrameKind;

/// A source that sends its stacks once, as samples of this process.
struct Once {
    stacks: Vec<Vec<FrameDesc>>,
    table: StackTable,
    sent: bool,
}

impl SampleSource for Once {
    fn poll(
        &mut self,
        timeout: Duration,
        sink: &mut dyn FnMut(&RawSample<'_>),
    ) -> Result<PollStats, SourceError> {
        if self.sent {
            std::thread::sleep(timeout);
        } else {
            for (i, frames) in self.stacks.iter().enumerate() {
                sink(&RawSample {
                    off_cpu: false,
                    pid: std::process::id(),
                    tid: std::process::id(),
                    time_ns: 1_700_000_000_000_000_000 + i as u64,
                    weight_ns: 10_000_000,
                    alloc_bytes: 0,
                    stack: self.table.intern(frames),
                    stacks: &self.table,
                    process_name: None,
                });
            }
            self.sent = true;
        }
        Ok(PollStats::default())
    }
}

/// (display name, tier, system name) of every function exported.
type Functions = Arc<Mutex<Vec<(String, Option<String>, Option<String>)>>>;

struct FunctionsExporter(Functions);

impl Exporter for FunctionsExporter {
    fn name(&self) -> &str {
        "functions"
    }

    fn export_process(
        &mut self,
        _batch: &ExportBatch,
        process: &ProcessProfile,
    ) -> Result<(), ExportError> {
        let p = &process.profile;
        let text = |s: Option<rootline_profile::StringId>| s.map(|s| p.string(s).to_string());
        self.0.lock().unwrap().extend(p.functions().iter().map(|f| {
            (
                p.string(f.name).to_string(),
                text(f.tier),
                text(f.system_name),
            )
        }));
        Ok(())
    }
}

fn spin(tier: &str) -> FrameDesc {
    FrameDesc {
        name: Arc::from("Calls::Spin(int32)"),
        module: Some(Arc::from("Calls")),
        address: 0x7f00_0000_1000,
        inline_depth: 0,
        kind: FrameKind::Managed,
        code: Some(Arc::new(CodeDetail {
            system_name: Some(Arc::from(
                format!("int32 [Calls] Calls::Spin(int32)[{tier}]").as_str(),
            )),
            tier: Some(Arc::from(tier)),
        })),
    }
}

#[test]
fn exported_functions_keep_their_tier_and_system_name() {
    let main = FrameDesc::native("main", 0x1000);
    let stacks = vec![
        vec![main.clone(), spin("QuickJitted")],
        vec![main.clone(), spin("OptimizedTier1")],
    ];
    let functions: Functions = Arc::default();
    let config = AgentConfig {
        export_interval: Duration::from_millis(100),
        ..AgentConfig::default()
    };
    let source = Once {
        stacks,
        table: StackTable::new(),
        sent: false,
    };
    let exporter = FunctionsExporter(Arc::clone(&functions));
    let agent = Agent::start(&config, Box::new(source), vec![Box::new(exporter)]).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    agent.stop().unwrap();
    let mut seen = functions.lock().unwrap().clone();
    seen.sort();
    seen.dedup();
    let some = |s: &str| Some(s.to_string());
    assert_eq!(
        seen,
        [
            (
                "Calls::Spin(int32)".to_string(),
                some("OptimizedTier1"),
                some("int32 [Calls] Calls::Spin(int32)[OptimizedTier1]")
            ),
            (
                "Calls::Spin(int32)".to_string(),
                some("QuickJitted"),
                some("int32 [Calls] Calls::Spin(int32)[QuickJitted]")
            ),
            ("main".to_string(), None, None),
        ]
    );
}
