fn main() {
    let pid: u32 = std::env::args().nth(1).unwrap().parse().unwrap();
    println!(
        "hotspot: {}",
        rootline_capture::jit::hotspot::is_hotspot(pid)
    );
    let t = std::time::Instant::now();
    println!(
        "{:?} in {:?}",
        rootline_capture::jit::hotspot::ask_perf_map(pid),
        t.elapsed()
    );
    let t = std::time::Instant::now();
    println!(
        "{:?} in {:?}",
        rootline_capture::jit::hotspot::ask_perf_map(pid),
        t.elapsed()
    );
}
