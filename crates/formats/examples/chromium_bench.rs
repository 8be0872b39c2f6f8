//! Benchmark helper for `scripts/bench-formats.sh` (not part of the CLI).
//!
//! `chromium_bench generate OUT MB [POOL]` writes a dotnet-trace style Chromium trace of about MB
//! megabytes: several threads, 1 ms samples, ~100-deep managed stacks under dotnet-trace's pseudo
//! frames, changing a few frames per sample. With POOL, each thread cycles through its first POOL
//! stacks, so the number of distinct stacks stays fixed however large the file grows.
//! `chromium_bench read IN` reads a trace and reports MB/s, samples and distinct stacks.
//! `chromium_bench write IN OUT` reads a trace, then writes it again and reports the write MB/s.

use std::fs::File;
use std::io::{BufReader, Write};
use std::time::Instant;

use rootline_formats::chromium;
use rootline_profile::{FrameKind, Profile, SampleType};

const THREADS: u32 = 4;
const DEPTH: usize = 100;

fn generate(samples_per_thread: u32, pool: Option<u32>) -> Profile {
    let mut p = Profile::new(vec![SampleType::wall_nanoseconds()]);
    let pid = 4242;
    p.set_process_name(pid, "Demo.App");
    let process = p.intern_named_frame(
        "Process64 Process(4242) (4242) Args: Demo.App --serve",
        FrameKind::Pseudo,
    );
    let threads = p.intern_named_frame("Threads", FrameKind::Pseudo);
    let cpu = p.intern_named_frame("CPU_TIME", FrameKind::Pseudo);
    let mut rng = 0x853c_49e6_748f_ea9bu64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for t in 0..THREADS {
        let tid = 5000 + t;
        let thread = p.intern_thread(pid, tid);
        p.set_thread_name(thread, &format!(".NET ThreadPool Worker {t}"));
        let thread_frame = p.intern_named_frame(&format!("Thread ({tid})"), FrameKind::Pseudo);
        // A managed call path that random-walks: each sample keeps most of the previous stack.
        let mut path: Vec<u32> = (0..DEPTH as u32 - 4).map(|d| d % 40).collect();
        let mut stacks = Vec::new();
        for s in 0..samples_per_thread {
            if let Some(pool) = pool.filter(|&p| s >= p) {
                let stack = stacks[(s % pool) as usize];
                let time = 1_000_000 * u64::from(s) + u64::from(t) * 1000;
                p.push_sample(time, thread, stack, &[1_000_000]).unwrap();
                continue;
            }
            let keep = path.len() - (next() % 8) as usize;
            path.truncate(keep);
            while path.len() < DEPTH - 4 {
                path.push((next() % 200) as u32);
            }
            let mut frames = vec![process, threads, thread_frame];
            for (depth, &m) in path.iter().enumerate() {
                let name = format!(
                    "Demo.Module{}!Demo.Namespace{}.Service{}.Handle{}(class System.String,int32)",
                    m % 7,
                    m % 13,
                    m,
                    depth % 5
                );
                frames.push(p.intern_named_frame(&name, FrameKind::Managed));
            }
            frames.push(cpu);
            let stack = p.intern_stack_root_first(frames).unwrap();
            stacks.push(stack);
            let time = 1_000_000 * u64::from(s) + u64::from(t) * 1000;
            p.push_sample(time, thread, stack, &[1_000_000]).unwrap();
        }
    }
    p
}

fn size_of(profile: &Profile) -> u64 {
    struct Count(u64);
    impl Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    chromium::write(profile, &mut c).unwrap();
    c.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("generate") if args.len() == 4 || args.len() == 5 => {
            let target: u64 = args[3].parse::<u64>().expect("MB") << 20;
            let pool = args.get(4).map(|p| p.parse::<u32>().expect("POOL"));
            let pilot = 2000;
            let per_sample = size_of(&generate(pilot, pool)) as f64 / f64::from(pilot);
            let n = (target as f64 / per_sample).ceil() as u32;
            let profile = generate(n, pool);
            let start = Instant::now();
            let file = File::create(&args[2]).expect("create output");
            chromium::write(&profile, file).expect("write");
            let secs = start.elapsed().as_secs_f64();
            let bytes = std::fs::metadata(&args[2]).unwrap().len();
            println!(
                "generated {} bytes, {} samples ({n} per thread), {} stacks; write {:.0} MB/s",
                bytes,
                profile.samples().len(),
                profile.stacks().len(),
                bytes as f64 / 1e6 / secs
            );
        }
        Some("read") if args.len() == 3 => {
            let bytes = std::fs::metadata(&args[2]).unwrap().len();
            let start = Instant::now();
            let file = BufReader::new(File::open(&args[2]).expect("open input"));
            let profile = chromium::read(file).expect("read");
            let secs = start.elapsed().as_secs_f64();
            println!(
                "read {bytes} bytes in {secs:.2} s: {:.0} MB/s; {} samples, {} stacks, {} frames, {} transitions",
                bytes as f64 / 1e6 / secs,
                profile.samples().len(),
                profile.stacks().len(),
                profile.frames().len(),
                profile.metadata.extra["chromium.stack_transitions"],
            );
        }
        Some("write") if args.len() == 4 => {
            let file = BufReader::new(File::open(&args[2]).expect("open input"));
            let profile = chromium::read(file).expect("read");
            let start = Instant::now();
            let out = File::create(&args[3]).expect("create output");
            chromium::write(&profile, out).expect("write");
            let secs = start.elapsed().as_secs_f64();
            let bytes = std::fs::metadata(&args[3]).unwrap().len();
            println!(
                "wrote {bytes} bytes in {secs:.2} s: {:.0} MB/s",
                bytes as f64 / 1e6 / secs
            );
        }
        _ => {
            eprintln!("usage: chromium_bench generate OUT MB [POOL] | read IN | write IN OUT");
            std::process::exit(1);
        }
    }
}
