//! `rootline` with .NET: `.nettrace` input for convert/report, and `dotnet ps|perfmap|collect`
//! against a live .NET process on every installed runtime (CoreCLR 3.1 and .NET 8), including
//! Ctrl-C and SIGKILL of rootline mid-collection.

#[path = "../../../tests/support/fixtures.rs"]
mod fixtures;
#[path = "../../dotnet/tests/common/live.rs"]
mod live;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use live::{Runtime, for_each_runtime};

fn rootline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(args)
        .output()
        .expect("run rootline")
}

/// Unzips a perfview fixture into `dir`; `None` (skipping `test`) when the fixtures are absent.
fn perfview_trace(test: &str, name: &str, dir: &Path) -> Option<PathBuf> {
    let zip_path = fixtures::third_party(test, &format!("perfview/{name}.nettrace.zip"))?;
    let mut zip = zip::ZipArchive::new(std::fs::File::open(&zip_path).unwrap()).unwrap();
    let mut data = Vec::new();
    zip.by_name(&format!("{name}.nettrace"))
        .unwrap()
        .read_to_end(&mut data)
        .unwrap();
    let path = dir.join(format!("{name}.nettrace"));
    std::fs::write(&path, data).unwrap();
    Some(path)
}

/// `rootline dotnet collect -o DIR/live.nettrace` of a live `Rec.exe 150 30` on `runtime` for 2
/// seconds.
fn collected_trace(runtime: &Runtime, dir: &Path) -> PathBuf {
    let exe = runtime.build_target(dir);
    let target = runtime.start(&exe, 150, 30);
    let trace = dir.join("live.nettrace");
    let out = rootline(&[
        "dotnet",
        "collect",
        "-p",
        &target.pid().to_string(),
        "--duration",
        "2",
        "-o",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    trace
}

/// Converts `trace` to folded text and checks its total; reports its top functions; and reads it
/// again under a name that says nothing. Returns the folded text and the report.
fn convert_and_report(trace: &Path, total: u64) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let folded = dir.path().join("out.folded");
    let out = rootline(&[
        "convert",
        trace.to_str().unwrap(),
        "-o",
        folded.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&folded).unwrap();
    let sum: u64 = text
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert_eq!(sum, total, "every thread sample");

    let out = rootline(&["report", trace.to_str().unwrap(), "--top", "5"]);
    assert!(out.status.success(), "{out:?}");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();

    // Known by its content too, whatever the name.
    let renamed = dir.path().join("trace.bin");
    std::fs::copy(trace, &renamed).unwrap();
    let out = rootline(&["report", renamed.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    (text, report)
}

/// Cuts `trace` to a third and checks `rootline report` rejects it in one line with the offset.
fn assert_cut_is_a_positioned_one_line_error(trace: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let data = std::fs::read(trace).unwrap();
    let cut = dir.path().join("cut.nettrace");
    std::fs::write(&cut, &data[..data.len() / 3]).unwrap();
    let out = rootline(&["report", cut.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cut.nettrace") && stderr.contains("at byte"),
        "{stderr}"
    );
}

#[test]
fn convert_and_report_read_nettrace() {
    let dir = tempfile::tempdir().unwrap();
    let test = "convert_and_report_read_nettrace";
    let Some(trace) = perfview_trace(test, "only_managed_samples", dir.path()) else {
        return;
    };
    let (text, report) = convert_and_report(&trace, 7423);
    assert!(text.contains("NoNativeStacks!NoNativeStacks.Program.Main(class System.String[]);"));
    assert!(
        report.contains("NoNativeStacks.Program.FindByte"),
        "{report}"
    );
}

#[test]
fn a_truncated_nettrace_is_a_positioned_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let test = "a_truncated_nettrace_is_a_positioned_one_line_error";
    if let Some(trace) = perfview_trace(test, "mixed_managed_external_samples", dir.path()) {
        assert_cut_is_a_positioned_one_line_error(&trace);
    }
}

/// A trace `rootline dotnet collect` wrote now: converted with every sample, reported with the
/// spinning leaf on top, and rejected in one line when cut.
#[test]
fn a_collected_nettrace_converts_reports_and_is_rejected_when_cut() {
    let test = "a_collected_nettrace_converts_reports_and_is_rejected_when_cut";
    for_each_runtime(test, |runtime| {
        let dir = tempfile::tempdir().unwrap();
        let trace = collected_trace(runtime, dir.path());
        let profile = rootline_dotnet::read_profile(std::fs::File::open(&trace).unwrap()).unwrap();
        // The first column counts thread samples (allocation ticks, if any, weigh 0 in it).
        let samples = profile.totals()[0] as u64;
        assert!(samples > 100, "{samples} samples");
        let (text, report) = convert_and_report(&trace, samples);
        assert!(
            text.contains("Rec!Rec.Shallow(class System.Object);Rec!Rec.Down(int32,int32);"),
            "{text}"
        );
        assert!(report.contains("Rec.Spin(int32)"), "{report}");
        assert_cut_is_a_positioned_one_line_error(&trace);
    });
}

#[test]
fn collect_from_a_missing_process_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("x.folded");
    let out = rootline(&[
        "dotnet",
        "collect",
        "-p",
        "4000000",
        "-o",
        out_path.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let out = rootline(&[
        "dotnet",
        "collect",
        "-p",
        &std::process::id().to_string(),
        "-o",
        out_path.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("diagnostics socket"));
    assert!(!out_path.exists());
}

/// Sends `signal` to `pid` with kill(1).
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits until rootline's collection has started (its partial trace file has the stream header).
fn wait_for_partial(path: &Path) {
    let t0 = Instant::now();
    while std::fs::metadata(path).map_or(true, |m| m.len() < 8) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "collection never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `rootline dotnet collect -p PID -o OUT EXTRA…` in the background and waits until the
/// collection has started (its partial trace file exists).
fn start_collect(pid: &str, out: &Path, extra: &[&str]) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(["dotnet", "collect", "-p", pid, "-o", out.to_str().unwrap()])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut partial = out.as_os_str().to_owned();
    partial.push(".nettrace.partial");
    wait_for_partial(Path::new(&partial));
    child
}

#[test]
fn dotnet_ps_collect_ctrl_c_and_sigkill_leave_the_target_running() {
    for_each_runtime(
        "dotnet_ps_collect_ctrl_c_and_sigkill",
        ps_collect_ctrl_c_and_sigkill,
    );
}

fn ps_collect_ctrl_c_and_sigkill(runtime: &Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let exe = runtime.build_target(dir.path());
    let mut target = runtime.start(&exe, 150, 30);
    let pid = target.pid();
    let pid_s = pid.to_string();

    let out = rootline(&["dotnet", "ps"]);
    assert!(out.status.success());
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing
            .lines()
            .any(|l| l.split_whitespace().next() == Some(pid_s.as_str())),
        "{listing}"
    );

    let out = rootline(&["dotnet", "perfmap", "-p", &pid_s]);
    if runtime.major() < 8 {
        // perfmap: a 3.1 runtime cannot switch perf maps on while running; the user is told how.
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("DOTNET_PerfMapEnabled=1"));
    } else {
        // .NET 8 switches them on over the diagnostics IPC; the map names the target's methods.
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("perf maps enabled"));
        let map = std::fs::read_to_string(format!("/tmp/perf-{pid}.map")).unwrap_or_default();
        assert!(map.lines().any(|l| l.contains("[Rec] Rec::")), "{map}");
        let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    }

    // A timed collection into a folded file, unrepaired: Spin under Down, cut at 100 frames.
    let folded = dir.path().join("timed.folded");
    let out = rootline(&[
        "dotnet",
        "collect",
        "-p",
        &pid_s,
        "--duration",
        "2",
        "--no-repair",
        "-o",
        folded.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("100.0% of managed frames named"),
        "{stderr}"
    );
    let text = std::fs::read_to_string(&folded).unwrap();
    let cut = text
        .lines()
        .filter(|l| l.contains("Rec!Rec.Spin(int32) "))
        .filter(|l| l.split(';').filter(|f| f.contains("Rec!Rec.Down")).count() == 99)
        .count();
    assert!(cut > 0, "{text}");
    assert!(!dir.path().join("timed.folded.nettrace.partial").exists());
    target.assert_still_answers();

    // Ctrl-C: the session is stopped, the rundown arrives, the output is whole.
    let raw = dir.path().join("ctrlc.nettrace");
    let child = start_collect(&pid_s, &raw, &[]);
    std::thread::sleep(Duration::from_millis(1000));
    signal(child.id(), "-INT");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let (profile, stats) =
        rootline_dotnet::read_profile_with_stats(std::fs::File::open(&raw).unwrap()).unwrap();
    assert!(!profile.samples().is_empty());
    assert_eq!(
        stats.resolved_sample_frames, stats.sample_frames,
        "rundown present"
    );
    target.assert_still_answers();
    // `rootline repair` reads the raw trace and finds EventPipe's cap in its metadata.
    let repaired = dir.path().join("repaired.folded");
    let out = rootline(&[
        "repair",
        raw.to_str().unwrap(),
        "-o",
        repaired.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("depth cap 100 (metadata)"));

    // SIGKILL of rootline mid-way: the runtime abandons the session, the target runs on, and the
    // next collection works.
    let killed = dir.path().join("killed.folded");
    let mut child = start_collect(&pid_s, &killed, &["--duration", "60"]);
    std::thread::sleep(Duration::from_millis(500));
    child.kill().unwrap();
    child.wait().unwrap();
    target.assert_still_answers();
    let again = dir.path().join("again.folded");
    let out = rootline(&[
        "dotnet",
        "collect",
        "-p",
        &pid_s,
        "--duration",
        "1",
        "-o",
        again.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        std::fs::read_to_string(&again)
            .unwrap()
            .contains("Rec!Rec.Spin(int32)")
    );
    // Repair runs by default.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("; repair: "),
        "{out:?}"
    );
    target.assert_still_answers();
}

/// `rootline record -- dotnet Rec.exe` names the launched runtime's JIT-compiled frames with no
/// variable set by the user: the recorder starts the command with the runtime's perf map on.
#[test]
fn record_of_a_launched_dotnet_program_names_its_methods() {
    for_each_runtime(
        "record_of_a_launched_dotnet_program_names_its_methods",
        |runtime| {
            let dir = tempfile::tempdir().unwrap();
            let exe = runtime.build_target(dir.path());
            let folded = dir.path().join("launched.folded");
            // The recording ends after 4 s and leaves the command running, as it does any
            // launched command: `timeout` ends it.
            let status = Command::new(env!("CARGO_BIN_EXE_rootline"))
                .args(["record", "--duration", "4", "-o"])
                .arg(&folded)
                .args(["--", "timeout", "-s", "KILL", "8"])
                .arg(&runtime.dotnet)
                .arg(&exe)
                .args(["40", "10"])
                .env_remove("DOTNET_PerfMapEnabled")
                .env_remove("COMPlus_PerfMapEnabled")
                .env("DOTNET_CLI_TELEMETRY_OPTOUT", "1")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("run rootline record");
            assert!(status.success(), "{status:?}");
            let text = std::fs::read_to_string(&folded).unwrap();
            let (mut program, mut named, mut cut) = (0u64, 0u64, 0u64);
            for line in text.lines() {
                let (stack, n) = line.rsplit_once(' ').unwrap();
                let n: u64 = n.parse().unwrap();
                // The program's threads: Main and the worker, under their entry methods.
                if !(stack.contains("Rec::Main(") || stack.contains("Rec::Shallow(")) {
                    continue;
                }
                program += n;
                if stack.contains("Rec::Down(int32,int32)") {
                    named += n;
                }
                if stack.contains("[truncated") {
                    cut += n;
                }
            }
            println!("{runtime}: {program} program samples, {named} in Rec::Down, {cut} cut");
            assert!(
                program >= 1000,
                "{program} samples in the program's methods"
            );
            assert!(
                named * 100 >= program * 95,
                "{named} of {program} through Rec::Down"
            );
            // (A few samples taken while the runtime compiles at start-up end explicitly in its
            // deep native frames: the in-kernel stack walk is the cure for those.)
            assert!(
                cut * 100 <= program,
                "{cut} of {program} program stacks truncated"
            );
        },
    );
}
