//! The reader's robustness properties, shared by the proptest suite (`tests/rlp_fuzz.rs`) and the
//! cargo-fuzz targets (`fuzz/fuzz_targets/`):
//!
//! * any input either is rejected as a hard error or opens, never panics;
//! * whatever opens is internally consistent (every id resolves) and survives a write/read round
//!   trip unchanged;
//! * a damaged chunk after intact ones never disturbs what the intact ones gave.

use std::sync::OnceLock;

use super::{Recording, assert_same};
use rootline_profile::{RlpRead, RlpWriter, read_rlp, write_rlp};

/// A small valid multi-chunk file, its chunk start offsets (plus the end), and each chunk's
/// decompressed protobuf payload.
pub struct Base {
    pub file: Vec<u8>,
    pub starts: Vec<u64>,
    pub payloads: Vec<Vec<u8>>,
}

pub fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let mut rec = Recording::new(7);
        let mut writer = RlpWriter::new(Vec::new()).unwrap();
        let mut starts = vec![writer.bytes_written()];
        for round in 0..3 {
            rec.add_stacks(4, 3);
            if round == 1 {
                rec.add_thread(100, 7, Some("t7"));
                rec.profile.set_process_name(200, "other");
            }
            rec.add_samples(12);
            rec.profile.metadata.dropped_samples += 1;
            writer.write_chunk(&rec.profile).unwrap();
            starts.push(writer.bytes_written());
        }
        let file = writer.finish().unwrap();
        let payloads = starts
            .windows(2)
            .map(|w| {
                let payload = &file[w[0] as usize + 8..w[1] as usize];
                zstd::decode_all(payload).unwrap()
            })
            .collect();
        Base {
            file,
            starts,
            payloads,
        }
    })
}

/// Frames `payload` (already protobuf bytes) as a chunk: zstd, length, crc.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let compressed = zstd::bulk::compress(payload, 1).unwrap();
    let mut out = Vec::with_capacity(compressed.len() + 8);
    out.extend_from_slice(&(compressed.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&compressed).to_le_bytes());
    out.extend_from_slice(&compressed);
    out
}

/// Any bytes: no panic; anything that opens is consistent and round-trips.
pub fn check_bytes(data: &[u8]) {
    if let Ok(read) = read_rlp(data) {
        assert!(read.valid_len <= data.len() as u64);
        check_consistent(&read);
    }
}

/// `payload` as the protobuf of the chunk after the first `intact` chunks of the base file (with
/// valid framing, so the reader's id validation is what is exercised).
pub fn check_payload(intact: usize, payload: &[u8]) {
    let base = base();
    let intact = intact % base.payloads.len();
    let cut = base.starts[intact] as usize;
    let mut file = base.file[..cut].to_vec();
    file.extend_from_slice(&frame(payload));
    let read = read_rlp(&file[..]).expect("valid header");
    check_consistent(&read);
    match read.chunks {
        n if n == intact => {
            let tail = read.tail.as_ref().expect("a rejected chunk is reported");
            assert_eq!(tail.offset, cut as u64);
            let before = read_rlp(&base.file[..cut]).unwrap();
            assert_same(&read.profile, &before.profile);
        }
        n if n == intact + 1 => assert_eq!(read.tail, None),
        n => panic!("{n} chunks from {intact} intact plus one"),
    }
}

/// Applies byte edits (`(position, operation, value)`) to a copy of `bytes`.
pub fn mutate(bytes: &[u8], edits: &[(u16, u8, u8)]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for &(pos, op, value) in edits {
        if out.is_empty() {
            out.push(value);
            continue;
        }
        let pos = pos as usize % out.len();
        match op % 4 {
            0 => out[pos] ^= value.max(1),
            1 => out[pos] = value,
            2 => out.insert(pos, value),
            _ => {
                out.remove(pos);
            }
        }
    }
    out
}

/// Every id in the profile resolves (walking them would panic otherwise), and writing the profile
/// and reading it back gives it unchanged.
pub fn check_consistent(read: &RlpRead) {
    let p = &read.profile;
    let samples = p.samples();
    assert_eq!(samples.values.len(), p.sample_types().len());
    for column in &samples.values {
        assert_eq!(column.len(), samples.len());
    }
    for (&thread, &stack) in samples.threads.iter().zip(&samples.stacks) {
        let _ = p.thread_name(thread);
        let mut depth = 0u32;
        for frame in p.stack_frames(stack) {
            let _ = p.frame_name(frame);
            depth += 1;
        }
        assert_eq!(depth, p.stack_depth(stack));
    }
    for frame in p.frames() {
        let _ = p.function(frame.function);
        if let Some(m) = frame.mapping {
            let _ = p.string(p.mapping(m).path);
        }
    }
    let again = read_rlp(&write_rlp(Vec::new(), p).unwrap()[..]).unwrap();
    assert_eq!(again.tail, None);
    assert_same(&again.profile, p);
}
