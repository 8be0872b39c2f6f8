//! A JIT process in its own mount and PID namespace (as in a container): it is pid 1 there and
//! writes `/tmp/perf-1.map` into a private `/tmp` that the host cannot see at that path. Its JIT
//! frames must still be named, through `/proc/PID/root` and the in-namespace pid (`NSpid`); so
//! must a .NET process's precompiled frames, through its `perfinfo-1.map` and the images it
//! lists.

mod jit;

use jit::{
    Rate, Setup, dotnet, node, record_and_check, require, sources, start_in_namespace,
    visible_beside_private_tmp, which,
};
use rootline_capture::jit::perfinfo::PerfInfo;

const DEEP: usize = 10;

#[test]
fn jit_frames_are_named_inside_a_pid_and_mount_namespace() {
    let test = "jit_frames_are_named_inside_a_pid_and_mount_namespace";
    let Some(node) = node::node(test) else {
        return;
    };
    let Some(unshare) = require(test, "unshare (util-linux)", which("unshare")) else {
        return;
    };
    // The script the target runs lies in the repository.
    if !visible_beside_private_tmp(test, &sources()) {
        return;
    }
    let setup = Setup::new();
    let args = node::args(&["--perf-basic-prof"], DEEP, 60);
    let started = std::time::SystemTime::now();
    let (_target, pid) = start_in_namespace(&unshare, setup.path(), &node, &args, &[]);
    // The map exists only inside the target's mount namespace.
    assert!(
        std::fs::metadata(format!("/proc/{pid}/root/tmp/perf-1.map")).is_ok(),
        "the target writes its perf map into its own /tmp"
    );
    // None in the host's /tmp (one older than the target is a dead process's under the same pid).
    let host_map = std::fs::metadata(format!("/tmp/perf-{pid}.map")).and_then(|m| m.modified());
    assert!(!host_map.is_ok_and(|made| made >= started));

    let rate = Rate {
        hz: 10_000,
        seconds: 5.0,
        stack_kib: 16,
    };
    let (_, v) = record_and_check("node in a namespace", pid, rate, &node::graph(DEEP), 1000);
    v.assert_whole_and_true();
}

/// CoreCLR in a namespace: its perfinfo file (`perfinfo-1.map`) is in its own `/tmp`, and the
/// images it lists are found through its root; CoreLib's precompiled frames are still named.
#[test]
fn precompiled_frames_are_named_inside_a_pid_and_mount_namespace() {
    let test = "precompiled_frames_are_named_inside_a_pid_and_mount_namespace";
    let Some(dotnet) = dotnet::host(test) else {
        return;
    };
    let Some(mcs) = dotnet::mcs(test) else {
        return;
    };
    let Some(unshare) = require(test, "unshare (util-linux)", which("unshare")) else {
        return;
    };
    let _setup = Setup::new();
    // Outside /tmp, which the target's private /tmp hides.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    if !visible_beside_private_tmp(test, dir.path()) {
        return;
    }
    let exe = dotnet::build(&mcs, dir.path(), Some(&dotnet), "Precompiled");
    let args = [exe.into_os_string(), "60".into()];
    let started = std::time::SystemTime::now();
    let (_target, pid) = start_in_namespace(
        &unshare,
        dir.path(),
        &dotnet,
        &args,
        &[
            ("COMPlus_PerfMapEnabled", "1"),
            ("COMPlus_TieredCompilation", "0"),
            ("DOTNET_CLI_TELEMETRY_OPTOUT", "1"),
        ],
    );
    let inside = format!("/proc/{pid}/root/tmp/perfinfo-1.map");
    // Nothing written to the host's /tmp under the outer pid (a file there from before the
    // target started is a dead process's under the same, reused pid).
    let outer = std::fs::metadata(format!("/tmp/perfinfo-{pid}.map"));
    assert!(
        outer.is_err() || outer.unwrap().modified().unwrap() < started,
        "the target wrote /tmp/perfinfo-{pid}.map outside its namespace"
    );
    let mut info =
        PerfInfo::new(std::fs::File::open(&inside).expect("perfinfo in the target's /tmp"));
    info.read_more().unwrap();
    let corelib = info
        .images
        .iter()
        .find(|i| i.path.ends_with("/System.Private.CoreLib.dll"))
        .expect("CoreLib's image load")
        .path
        .clone();

    let rate = Rate {
        hz: 5_000,
        seconds: 4.0,
        stack_kib: 32,
    };
    let graph = dotnet::precompiled_graph();
    let (recording, v) = record_and_check("coreclr in a namespace", pid, rate, &graph, 2000);
    v.assert_whole_and_true();
    let frames = dotnet::CoreLibFrames::collect(&recording.profile, &corelib);
    frames.print();
    frames.assert_named_and_true(500);
}

/// .NET 8 in a pid and mount namespace, started without any perf map variable: its diagnostics
/// socket is found in its private `/tmp` through `/proc/PID/root`, `EnablePerfMap` switches its
/// perf map and perfinfo file on there, and its JIT and precompiled frames are named.
#[test]
fn net8_frames_are_named_inside_a_pid_and_mount_namespace_with_perf_maps_over_ipc() {
    let test = "net8_frames_are_named_inside_a_pid_and_mount_namespace_with_perf_maps_over_ipc";
    let Some(dotnet) = dotnet::host8(test) else {
        return;
    };
    let Some(mcs) = dotnet::mcs(test) else {
        return;
    };
    let Some(unshare) = require(test, "unshare (util-linux)", which("unshare")) else {
        return;
    };
    let _setup = Setup::new();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    if !visible_beside_private_tmp(test, dir.path()) {
        return;
    }
    let exe = dotnet::build(&mcs, dir.path(), Some(&dotnet), "Precompiled");
    let args = [exe.into_os_string(), "60".into()];
    let (_target, pid) = start_in_namespace(
        &unshare,
        dir.path(),
        &dotnet,
        &args,
        &[
            ("DOTNET_TieredCompilation", "0"),
            ("DOTNET_CLI_TELEMETRY_OPTOUT", "1"),
        ],
    );
    let _guard = match rootline_dotnet::perfmap::PerfMapGuard::enable(pid) {
        rootline_dotnet::perfmap::Outcome::Enabled(g) => g,
        other => panic!("EnablePerfMap in the namespace: {other:?}"),
    };
    let inside = format!("/proc/{pid}/root/tmp/perfinfo-1.map");
    let mut info =
        PerfInfo::new(std::fs::File::open(&inside).expect("perfinfo in the target's /tmp"));
    info.read_more().unwrap();
    let corelib = info
        .images
        .iter()
        .find(|i| i.path.ends_with("/System.Private.CoreLib.dll"))
        .expect("CoreLib's image load")
        .path
        .clone();
    let rate = Rate {
        hz: 5_000,
        seconds: 4.0,
        stack_kib: 32,
    };
    let graph = dotnet::precompiled_graph();
    let (recording, v) = record_and_check(".NET 8 in a namespace", pid, rate, &graph, 2000);
    v.assert_whole_and_true();
    let frames = dotnet::CoreLibFrames::collect(&recording.profile, &corelib);
    frames.print();
    frames.assert_named_and_true(500);
}
