//! The agent counts the stacks its source cut short, and says when the module budget cut them.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::CollectingExporter;
use rootline_agent::{
    Agent, AgentConfig, FrameDesc, PollStats, RawSample, SampleSource, SourceError, StackTable,
};
use rootline_capture::unwind::TruncateReason;
use rootline_profile::FrameKind;

/// A source that sends its stacks once, as samples of this process.
struct Cut {
    stacks: Vec<Vec<FrameDesc>>,
    table: StackTable,
    sent: bool,
}

fn frame(name: &str, kind: FrameKind) -> FrameDesc {
    FrameDesc {
        name: Arc::from(name),
        module: None,
        address: 0,
        inline_depth: 0,
        kind,
        code: None,
    }
}

impl SampleSource for Cut {
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

#[test]
fn stacks_cut_short_and_cut_by_the_module_budget_are_counted() {
    let leaf = frame("work", FrameKind::Native);
    let whole = vec![frame("_start", FrameKind::Native), leaf.clone()];
    let cut = |reason: TruncateReason| {
        vec![
            frame(&reason.frame_name(), FrameKind::Truncated),
            leaf.clone(),
        ]
    };
    let mut stacks = vec![whole; 5];
    stacks.extend(std::iter::repeat_n(
        cut(TruncateReason::ModuleMemoryLimit),
        3,
    ));
    stacks.extend(std::iter::repeat_n(cut(TruncateReason::LiveUnproven), 2));
    let config = AgentConfig {
        export_interval: Duration::from_millis(100),
        ..AgentConfig::default()
    };
    let (exporter, _collected, _) = CollectingExporter::new();
    let source = Cut {
        stacks,
        table: StackTable::new(),
        sent: false,
    };
    let agent = Agent::start(&config, Box::new(source), vec![Box::new(exporter)]).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    let stats = agent.stop().unwrap();
    assert_eq!(stats.captured, 10);
    assert_eq!(stats.truncated, 5);
    assert_eq!(stats.module_limited, 3);
    assert!(
        stats.status_line().contains("truncated=5"),
        "{}",
        stats.status_line()
    );
}
