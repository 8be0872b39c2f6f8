//! JIT state shares the module memory budget with the ELF binaries: a runtime's symbol tables
//! (perf map, jitdump) or a .NET ReadyToRun image's method table that does not fit is not kept,
//! and stacks reaching that code end there with an explicit `[truncated: module-memory-limit]` —
//! never a frame-pointer guess through code whose function bounds are unknown. (One at a time:
//! every cache and recording here counts its modules in the one budget [`modules`] gives.)

mod jit;

use std::collections::BTreeSet;
use std::fs::File;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use jit::{Running, Setup, dotnet, node};
use rootline_capture::jit::{ImageCache, ImageError, JitMaps, PerfMap};

use rootline_capture::process::read_maps;
use rootline_capture::recorder::{RecordOptions, Recording, Target, record};
use rootline_image::{CodeModule, ModuleBudget, PAGE_CACHE_BYTES};

/// The module budget every cache and recording of these tests counts in.
fn modules() -> &'static ModuleBudget {
    static MODULES: std::sync::OnceLock<ModuleBudget> = std::sync::OnceLock::new();
    MODULES.get_or_init(ModuleBudget::new)
}

/// Memory held by the modules counted in [`modules`].
fn live_module_bytes() -> usize {
    modules().live_bytes()
}

/// The memory the ELF binaries `pid` maps executable take as modules.
fn elf_module_bytes(pid: u32) -> usize {
    let paths: BTreeSet<String> = read_maps(pid)
        .unwrap()
        .into_iter()
        .filter(|m| m.exec && m.path.starts_with('/'))
        .map(|m| m.path)
        .collect();
    paths
        .iter()
        .filter_map(|p| CodeModule::open(p, File::open(p).ok()?, &ModuleBudget::new(), None).ok())
        .map(|m| m.heap_bytes())
        .sum()
}

/// Records `pid` for 3 s at 5 kHz, copying `stack_bytes` per sample, with `budget` for modules.
fn record_with_budget(pid: u32, stack_bytes: u32, budget: usize) -> Recording {
    let mut opts = RecordOptions::new(Target::Pids(vec![pid]));
    opts.frequency_hz = 5_000;
    opts.stack_bytes = stack_bytes;
    opts.duration = Some(Duration::from_secs(3));
    opts.module_budget = Some(budget);
    opts.modules = modules().clone();
    record(&opts, &AtomicBool::new(false), None).expect("records")
}

/// One test at a time: each measures the memory of all modules of this process.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A .NET target that runs for a minute (with its perfinfo file), started once it is ready.
fn start(dotnet: &std::path::Path, exe: &std::path::Path) -> Running {
    let mut cmd = Command::new(dotnet);
    cmd.arg(exe)
        .arg("60")
        .env("COMPlus_PerfMapEnabled", "1")
        .env("COMPlus_TieredCompilation", "0")
        .env("DOTNET_CLI_TELEMETRY_OPTOUT", "1");
    Running::start(cmd)
}

/// Where `pid` maps CoreLib's image.
fn corelib_base(pid: u32) -> u64 {
    read_maps(pid)
        .unwrap()
        .into_iter()
        .find(|m| m.offset == 0 && m.path.ends_with("/System.Private.CoreLib.dll"))
        .expect("CoreLib is mapped")
        .start
}

/// Calls `f` until it says yes (the runtime writes its perfinfo file as it loads images).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("never: {what}");
}

/// A process whose CoreLib was refused uses it once another process has loaded it, even when the
/// budget has no room for a second copy (the processes share one).
fn an_image_another_process_loaded_is_shared(
    dotnet: &std::path::Path,
    exe: &std::path::Path,
    needed: usize,
) {
    let (first, second) = (start(dotnet, exe), start(dotnet, exe));
    let mut jit = JitMaps::new(modules().clone());
    // Room for CoreLib and the other, small images both targets load, but not for two CoreLibs.
    let others = needed / 2;
    jit.set_module_budget(PAGE_CACHE_BYTES + needed + others);
    let at = corelib_base(first.pid()) + 0x1000;
    let blocker = modules().charge(others + 1);
    eventually("CoreLib refused in the first target", || {
        let p = jit.process(first.pid());
        p.refresh();
        p.image_refused(at)
    });
    drop(blocker);
    eventually("CoreLib loaded for the second target", || {
        jit.process(second.pid()).refresh();
        jit.image_bytes() >= needed
    });
    assert!(
        jit.image_bytes() <= needed + others,
        "the other images take {} bytes",
        jit.image_bytes() - needed
    );
    assert!(
        !jit.process(first.pid()).image_refused(at),
        "the first target still refuses the CoreLib the second one loaded"
    );
    assert!(jit.image_bytes() < 2 * needed, "one CoreLib for both");
}

#[test]
fn images_past_the_budget_end_stacks_explicitly() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some((dotnet, exe, _setup)) = dotnet::coreclr_program(
        "images_past_the_budget_end_stacks_explicitly",
        "Precompiled",
    ) else {
        return;
    };
    let corelib_file = dotnet
        .parent()
        .unwrap()
        .join("shared/Microsoft.NETCore.App");
    let corelib_file = std::fs::read_dir(&corelib_file)
        .unwrap()
        .flatten()
        .map(|e| e.path().join("System.Private.CoreLib.dll"))
        .find(|p| p.exists())
        .expect("CoreLib in the runtime");
    let corelib_file = corelib_file.to_str().unwrap();

    // The cache on its own: an image is counted while cached, refused past the budget, and let
    // go when another image needs the room and no process holds it.
    let xml_file = corelib_file.replace("System.Private.CoreLib.dll", "System.Private.Xml.dll");
    let cache = ImageCache::new(modules().clone());
    let image = cache
        .get(corelib_file)
        .expect("CoreLib is a ReadyToRun image");
    let needed = image.heap_bytes();
    assert_eq!(live_module_bytes(), needed, "the cached image is counted");
    assert!(needed > 1 << 20, "CoreLib's methods take {needed} bytes");
    drop(image);
    let tight = ImageCache::new(modules().clone());
    tight.set_module_budget(PAGE_CACHE_BYTES + needed);
    match tight.get(corelib_file) {
        Err(ImageError::OverBudget { needed: n, .. }) => assert_eq!(n, needed),
        other => panic!("refused while the other cache holds it: {other:?}"),
    }
    // A refused image is not read again until it fits (each .NET process that starts would
    // parse CoreLib again to refuse it): a copy refused, then overwritten with zeros at the same
    // size and time, is still refused rather than found broken.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("System.Private.CoreLib.dll");
    std::fs::copy(corelib_file, &copy).unwrap();
    let copy = copy.to_str().unwrap();
    assert!(matches!(
        tight.get(copy),
        Err(ImageError::OverBudget { .. })
    ));
    let file = std::fs::OpenOptions::new().write(true).open(copy).unwrap();
    let time = file.metadata().unwrap().modified().unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[0; 4096], 0).unwrap();
    file.set_modified(time).unwrap();
    match tight.get(copy) {
        Err(ImageError::OverBudget { needed: n, .. }) => assert_eq!(n, needed),
        other => panic!("read again while it still does not fit: {other:?}"),
    }
    drop(cache);
    assert_eq!(
        live_module_bytes(),
        0,
        "dropping the cache returns its memory"
    );
    let held = tight
        .get(corelib_file)
        .expect("fits once the other cache let go");
    assert_eq!(live_module_bytes(), needed);
    match tight.get(&xml_file) {
        Err(ImageError::OverBudget { .. }) => {}
        other => panic!("no room next to CoreLib, which a process holds: {other:?}"),
    }
    drop(held);
    tight.sweep(false);
    assert_eq!(
        live_module_bytes(),
        needed,
        "kept for the next process without pressure"
    );
    let xml = tight.get(&xml_file).expect("room once CoreLib is let go");
    assert_eq!(live_module_bytes(), xml.heap_bytes(), "CoreLib let go");
    drop(xml);
    // Something refused for the budget (a binary, another image): unheld images make room.
    tight.sweep(true);
    assert_eq!(live_module_bytes(), 0, "let go for a refusal");
    drop(tight);
    an_image_another_process_loaded_is_shared(&dotnet, &exe, needed);
    assert_eq!(live_module_bytes(), 0);

    // A recording with room for every ELF binary of the target but not for CoreLib's image.
    let target = start(&dotnet, &exe);
    let pid = target.pid();
    let elf = elf_module_bytes(pid);
    let slack = 1 << 20;
    assert!(needed > 2 * slack);
    let budget = PAGE_CACHE_BYTES + elf + slack;
    let recording = record_with_budget(pid, 32 * 1024, budget);

    let p = &recording.profile;
    let samples = p.samples();
    let (mut in_corelib, mut whole_in_work) = (0, 0);
    let mut frames = Vec::new();
    for i in 0..samples.len() {
        p.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().rev().map(|&f| p.frame_name(f)).collect();
        let is_corelib = |&f: &rootline_profile::FrameId| {
            p.frame(f).mapping.is_some_and(|m| {
                p.string(p.mapping(m).path)
                    .ends_with("/System.Private.CoreLib.dll")
            })
        };
        // Leaf first: the first frame in CoreLib's code is the last one, followed by the
        // explicit end (JIT frames above it, e.g. a callback, are allowed).
        if let Some(j) = frames.iter().rev().position(is_corelib) {
            in_corelib += 1;
            assert!(names[j].contains("+0x"), "not named: {names:?}");
            assert_eq!(names.len(), j + 2, "{names:?}");
            assert_eq!(
                names[j + 1],
                "[truncated: module-memory-limit]",
                "{names:?}"
            );
            continue;
        }
        if names.first() == Some(&"Precompiled::Work(int32)") {
            assert!(names.contains(&"Precompiled::Main(string[])"), "{names:?}");
            assert!(
                !names.iter().any(|n| n.starts_with("[truncated")),
                "{names:?}"
            );
            whole_in_work += 1;
        }
    }
    println!(
        "budget {budget} bytes (ELF {elf}, CoreLib's methods {needed}): {} samples, {in_corelib} \
         ending at CoreLib, {whole_in_work} whole in Work",
        samples.len()
    );
    assert!(in_corelib > 1000, "{in_corelib} samples in CoreLib");
    assert!(whole_in_work > 100, "{whole_in_work} samples whole in Work");
    drop(recording);
    assert_eq!(
        live_module_bytes(),
        0,
        "the recording's modules and images are freed with it"
    );
}

#[test]
fn jit_tables_past_the_budget_end_stacks_explicitly() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(node) = node::node("jit_tables_past_the_budget_end_stacks_explicitly") else {
        return;
    };
    let setup = Setup::new();
    let mut cmd = Command::new(node);
    cmd.current_dir(setup.path())
        .args(node::args(&["--perf-basic-prof"], 20, 60));
    let target = Running::start(cmd);
    let pid = target.pid();
    // What the JIT symbols need now (the map only grows).
    let mut map = PerfMap::new(File::open(format!("/tmp/perf-{pid}.map")).expect("perf map"));
    map.read_more().unwrap();
    let needed = map.symbols.heap_bytes();
    let elf = elf_module_bytes(pid);
    let slack = 16 << 10;
    assert!(needed > 4 * slack, "the JIT symbols need {needed} bytes");
    let budget = PAGE_CACHE_BYTES + elf + slack;
    assert_eq!(live_module_bytes(), 0);

    let recording = record_with_budget(pid, 16 * 1024, budget);
    let p = &recording.profile;
    let samples = p.samples();
    let (mut ended_in_jit, mut whole) = (0, 0);
    let mut frames = Vec::new();
    for i in 0..samples.len() {
        p.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().rev().map(|&f| p.frame_name(f)).collect();
        assert!(
            !names
                .iter()
                .any(|n| ["main", "down", "spin", "step"].contains(n)),
            "a JIT frame was named without the JIT tables: {names:?}"
        );
        match names.last() {
            Some(&"[truncated: module-memory-limit]") => {
                // Leaf first: the last real frame is the first one in JIT code (unnamed), whose
                // tables were let go.
                assert!(names[names.len() - 2].starts_with("[anon]"), "{names:?}");
                ended_in_jit += 1;
            }
            Some(n) if n.starts_with("[truncated") => panic!("{names:?}"),
            _ => whole += 1,
        }
        if i < 5 {
            println!("{names:?}");
        }
    }
    println!(
        "budget {budget} bytes (ELF {elf}, JIT symbols {needed}): {} samples, {ended_in_jit} \
         ending in JIT code, {whole} whole",
        samples.len()
    );
    assert!(
        ended_in_jit > 1000,
        "{ended_in_jit} samples ending in JIT code"
    );
    drop(recording);
    assert_eq!(
        live_module_bytes(),
        0,
        "the recording's modules are freed with it"
    );
}
