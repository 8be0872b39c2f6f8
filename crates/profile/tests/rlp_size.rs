//! Compactness: rootline promises "a few bytes per sample". A typical recording — 100k samples at
//! 1 ms spacing over ~1k distinct stacks on 4 threads — must cost at most 16 bytes per sample on
//! disk, tables included, whether written in one go or as one chunk per second of recording.

mod common;

use common::Recording;
use rootline_profile::{RlpWriter, read_rlp, write_rlp};

const SAMPLES: usize = 100_000;
const STACKS: usize = 1_000;

fn recording(uniform: bool) -> Recording {
    let mut rec = Recording::new(99);
    rec.uniform = uniform;
    for tid in 1..4 {
        rec.add_thread(100, 100 + tid, Some("worker"));
    }
    rec.add_stacks(STACKS, 300);
    rec
}

/// Bytes per sample when written as one chunk per 1,000 samples (a chunk per second at 1 kHz),
/// taking samples after each chunk as a bounded-memory recorder does.
fn streamed(uniform: bool) -> (usize, f64) {
    let mut rec = recording(uniform);
    let mut writer = RlpWriter::new(Vec::new()).unwrap();
    for _ in 0..SAMPLES / 1_000 {
        rec.add_samples(1_000);
        writer.write_chunk(&rec.profile).unwrap();
        rec.profile.take_samples();
    }
    let bytes = writer.finish().unwrap();
    let read = read_rlp(&bytes[..]).unwrap();
    assert_eq!(read.tail, None);
    assert_eq!(read.profile.samples().len(), SAMPLES);
    (bytes.len(), bytes.len() as f64 / SAMPLES as f64)
}

fn one_shot(uniform: bool) -> (usize, f64, usize) {
    let mut rec = recording(uniform);
    let tables_only = write_rlp(Vec::new(), &rec.profile).unwrap().len();
    rec.add_samples(SAMPLES);
    assert!(rec.leaves.len() >= STACKS);
    let bytes = write_rlp(Vec::new(), &rec.profile).unwrap();
    (
        bytes.len(),
        bytes.len() as f64 / SAMPLES as f64,
        tables_only,
    )
}

#[test]
fn a_typical_recording_costs_at_most_16_bytes_per_sample() {
    for uniform in [false, true] {
        let label = if uniform {
            "uniform stacks"
        } else {
            "hot/cold stacks"
        };
        let (total, per_sample, tables) = one_shot(uniform);
        println!(
            "{label}: one chunk: {total} bytes, {per_sample:.2} bytes/sample \
             (tables alone {tables} bytes)"
        );
        assert!(per_sample <= 16.0, "{label}: {per_sample:.2} bytes/sample");
        let (total, per_sample) = streamed(uniform);
        println!("{label}: 100 chunks of 1k samples: {total} bytes, {per_sample:.2} bytes/sample");
        assert!(per_sample <= 16.0, "{label}: {per_sample:.2} bytes/sample");
    }
}
