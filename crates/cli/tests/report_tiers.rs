//! `rootline report` on a profile whose .NET method ran at two JIT code tiers: one line per
//! method by default (with a note that tiers are recorded), self time per tier with `--tiers`.

use std::process::Command;

use rootline_profile::{Frame, FrameKind, Function, Profile, SampleType, write_rlp};

fn rootline() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rootline"))
}

/// `Main → Spin`: Spin 1 sample at QuickJitted, 3 at OptimizedTier1OSR; Main 1 sample on its own.
fn profile() -> Profile {
    let mut p = Profile::new(vec![SampleType::samples()]);
    let t = p.intern_thread(5, 5);
    let main = p.intern_named_frame("Calls::Main(string[])", FrameKind::Managed);
    let root = p.intern_stack(None, main);
    p.push_sample(0, t, root, &[1]).unwrap();
    let name = p.intern_string("Calls::Spin(int32)");
    for (i, (tier, count)) in [("QuickJitted", 1), ("OptimizedTier1OSR", 3)]
        .into_iter()
        .enumerate()
    {
        let tier = p.intern_string(tier);
        let function = p.intern_function(Function {
            tier: Some(tier),
            ..Function::new(name, None)
        });
        let frame = p.intern_frame(Frame {
            function,
            mapping: None,
            address: 0x1000 + i as u64,
            line: None,
            inline_depth: 0,
            kind: FrameKind::Managed,
            from_live_memory: false,
        });
        let leaf = p.intern_stack(Some(root), frame);
        for _ in 0..count {
            p.push_sample(1, t, leaf, &[1]).unwrap();
        }
    }
    p
}

fn report(extra: &[&str]) -> String {
    // A folder of its own per call: the tests of this file run at once.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiers.rlp");
    std::fs::write(&path, write_rlp(Vec::new(), &profile()).unwrap()).unwrap();
    let out = rootline()
        .arg("report")
        .arg(&path)
        .args(extra)
        .output()
        .expect("rootline runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_default_report_shows_one_line_per_method_and_notes_the_tiers() {
    let text = report(&[]);
    let spin: Vec<&str> = text
        .lines()
        .filter(|l| l.ends_with("%  Calls::Spin(int32)"))
        .collect();
    // Once among the top functions by self, once by total.
    assert_eq!(spin.len(), 2, "{text}");
    assert!(spin[0].contains("80.00%"), "{text}");
    assert!(!text.contains("OptimizedTier1OSR"), "{text}");
    assert!(text.contains("--tiers shows self time per tier"), "{text}");
}

#[test]
fn tiers_split_self_time_by_tier() {
    let text = report(&["--tiers"]);
    let section = text
        .split_once("Self time by code tier")
        .unwrap_or_else(|| panic!("no tier section in {text}"))
        .1;
    let rows: Vec<&str> = section
        .lines()
        .skip(2)
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(
        rows,
        [
            "60.00%  Calls::Spin(int32) [OptimizedTier1OSR]",
            "20.00%  Calls::Spin(int32) [QuickJitted]",
        ],
        "{text}"
    );
    assert!(!text.contains("--tiers shows"), "{text}");
}
