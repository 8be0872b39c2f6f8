//! speedscope output opened by the speedscope web app itself (npm `speedscope`) in headless
//! Chromium, driven by `tests/js-speedscope/speedscope-check.mjs` (installed by `scripts/test.sh`).

use std::path::Path;
use std::process::Command;

use rootline_formats::speedscope;
use rootline_profile::{Frame, FrameKind, Function, Profile, SampleType};

#[path = "../../../tests/support/speedscope_check.rs"]
mod speedscope_check;

fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn profile() -> Profile {
    let mut p = Profile::new(vec![SampleType::wall_nanoseconds()]);
    p.set_process_name(9, "checkout-service");
    let names = [
        "Checkout!Program.Main(string[])",
        "Checkout!OrderService.PlaceOrder()",
        "Checkout!PriceCalculator.Total(Order)",
        "Checkout!TaxTable.Lookup(string)",
    ];
    for t in 0..2u32 {
        let thread = p.intern_thread(9, 90 + t);
        p.set_thread_name(thread, &format!("request worker {t}"));
        for s in 0..40u32 {
            let depth = 2 + (s % 3) as usize;
            let mut frames: Vec<_> = names[..depth]
                .iter()
                .map(|n| p.intern_named_frame(n, FrameKind::Managed))
                .collect();
            // The leaf at a JIT code tier, which the file shows in the frame's `file` field.
            if depth == names.len() {
                let name = p.intern_string(names[depth - 1]);
                let tier = p.intern_string(if s % 2 == 0 {
                    "QuickJitted"
                } else {
                    "OptimizedTier1"
                });
                let function = p.intern_function(Function {
                    tier: Some(tier),
                    ..Function::new(name, None)
                });
                let leaf = *p.frame(frames[depth - 1]);
                frames[depth - 1] = p.intern_frame(Frame { function, ..leaf });
            }
            let stack = p.intern_stack_root_first(frames).unwrap();
            p.push_sample(u64::from(s) * 1_000_000, thread, stack, &[1_000_000])
                .unwrap();
        }
    }
    p
}

#[test]
fn speedscope_web_app_renders_our_output() {
    if !speedscope_check::present(workspace(), "the speedscope web app check") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("rootline-speedscope-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("checkout.speedscope.json");
    let mut out = Vec::new();
    speedscope::write(&profile(), &mut out).unwrap();
    assert!(String::from_utf8_lossy(&out).contains("\"file\":\"[OptimizedTier1]\""));
    std::fs::write(&file, &out).unwrap();
    let output = Command::new("node")
        .arg(workspace().join("tests/js-speedscope/speedscope-check.mjs"))
        .arg(&file)
        .arg("request worker 0 (pid 9, tid 90)")
        .args(["OrderService.PlaceOrder()", "TaxTable.Lookup(string)"])
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        output.status.success(),
        "speedscope check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("\"ok\":true"), "{stdout}");
}
