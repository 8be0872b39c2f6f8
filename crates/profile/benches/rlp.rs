//! Throughput and size of the `.rlp` writer and reader: `cargo bench -p rootline-profile --bench rlp`.
//!
//! Builds a recording of 1M samples at ~1 ms spacing over ~1k distinct stacks on 4 threads, writes it
//! as one chunk per 1,000 samples (what a recorder does once a second at 1 kHz) and in one go, and
//! reads both back. Prints bytes per sample and samples per second.

use std::time::Instant;

use rootline_profile::{
    FrameKind, Profile, RlpWriter, SampleType, StackId, ThreadId, read_rlp, write_rlp,
};

const SAMPLES: usize = 1_000_000;

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

fn tables(rng: &mut Rng) -> (Profile, Vec<ThreadId>, Vec<StackId>) {
    let mut p = Profile::new(vec![SampleType::cpu_nanoseconds(), SampleType::samples()]);
    let threads: Vec<_> = (0..4).map(|t| p.intern_thread(100, 100 + t)).collect();
    let frames: Vec<_> = (0..300)
        .map(|i| p.intern_named_frame(&format!("crate::module::function_{i}"), FrameKind::Native))
        .collect();
    let mut leaves = Vec::new();
    while leaves.len() < 1_000 {
        let depth = 5 + rng.below(30);
        let stack = (0..depth).map(|_| frames[rng.below(frames.len() as u64) as usize]);
        leaves.push(p.intern_stack_root_first(stack).expect("non-empty"));
    }
    (p, threads, leaves)
}

fn main() {
    let mut rng = Rng(1);
    let (mut p, threads, leaves) = tables(&mut rng);
    let mut time = 1_700_000_000_000_000_000u64;
    let mut batches = Vec::new();
    for _ in 0..SAMPLES / 1_000 {
        for _ in 0..1_000 {
            time += 1_000_000 + rng.below(100_000) - 50_000;
            let thread = threads[rng.below(4) as usize];
            let stack = leaves[rng.below(leaves.len() as u64) as usize];
            let cpu = 1_000_000 + rng.below(2_000) as i64;
            p.push_sample(time, thread, stack, &[cpu, 1])
                .expect("valid");
        }
        batches.push(p.take_samples());
    }

    // Streamed: replay the batches through a fresh profile so the writer sees them arrive.
    let (mut live, _, _) = tables(&mut Rng(1));
    let start = Instant::now();
    let mut writer = RlpWriter::new(Vec::new()).expect("header");
    for batch in &batches {
        for i in 0..batch.len() {
            live.push_sample(
                batch.times[i],
                batch.threads[i],
                batch.stacks[i],
                &[batch.values[0][i], batch.values[1][i]],
            )
            .expect("valid");
        }
        writer.write_chunk(&live).expect("write");
        live.take_samples();
    }
    let streamed = writer.finish().expect("finish");
    let write_secs = start.elapsed().as_secs_f64();
    report("1k-sample chunks", &streamed, write_secs);

    // One shot.
    let (mut whole, _, _) = tables(&mut Rng(1));
    for batch in &batches {
        for i in 0..batch.len() {
            whole
                .push_sample(
                    batch.times[i],
                    batch.threads[i],
                    batch.stacks[i],
                    &[batch.values[0][i], batch.values[1][i]],
                )
                .expect("valid");
        }
    }
    let start = Instant::now();
    let one = write_rlp(Vec::new(), &whole).expect("write");
    report("one call", &one, start.elapsed().as_secs_f64());
}

fn report(label: &str, bytes: &[u8], write_secs: f64) {
    let start = Instant::now();
    let read = read_rlp(bytes).expect("read");
    let read_secs = start.elapsed().as_secs_f64();
    assert_eq!(read.tail, None);
    assert_eq!(read.profile.samples().len(), SAMPLES);
    println!(
        "{label}: {} chunks, {} bytes, {:.2} bytes/sample; write {:.1} M samples/s, read {:.1} M samples/s",
        read.chunks,
        bytes.len(),
        bytes.len() as f64 / SAMPLES as f64,
        SAMPLES as f64 / write_secs / 1e6,
        SAMPLES as f64 / read_secs / 1e6,
    );
}
