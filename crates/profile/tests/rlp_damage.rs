//! A damaged `.rlp` still opens: a file cut at any byte gives every chunk before the cut and names
//! the offset of the torn chunk; a flipped byte anywhere in a chunk is caught and that chunk (and
//! only it and what follows) is dropped; a damaged chunk never leaves half of itself merged.

mod common;

use common::{Recording, assert_same};
use rootline_profile::{Profile, RLP_HEADER_LEN, RlpError, RlpWriter, TailReason, read_rlp};

/// A small multi-chunk recording: the file, the offset where each chunk starts (plus the end of
/// the file), and a snapshot of the profile after each chunk.
fn recording() -> (Vec<u8>, Vec<u64>, Vec<Profile>) {
    let mut rec = Recording::new(11);
    let mut writer = RlpWriter::new(Vec::new()).unwrap();
    let mut starts = vec![writer.bytes_written()];
    let mut snapshots = Vec::new();
    for round in 0..5u32 {
        rec.add_stacks(6, 4);
        if round == 2 {
            rec.add_thread(100, 102, Some("io"));
            rec.profile.set_thread_name(rec.threads[0], "main-renamed");
        }
        rec.add_samples(40);
        rec.profile.metadata.lost_samples = u64::from(round);
        writer.write_chunk(&rec.profile).unwrap();
        starts.push(writer.bytes_written());
        snapshots.push(rec.profile.clone());
    }
    (writer.finish().unwrap(), starts, snapshots)
}

/// Number of whole chunks in the first `len` bytes.
fn chunks_before(starts: &[u64], len: u64) -> usize {
    starts[1..].iter().take_while(|&&end| end <= len).count()
}

#[test]
fn a_file_cut_at_every_offset_still_opens() {
    let (bytes, starts, snapshots) = recording();
    assert_eq!(starts.len(), 6);
    for cut in 0..=bytes.len() {
        let read =
            read_rlp(&bytes[..cut]).unwrap_or_else(|e| panic!("cut at {cut}: hard error {e}"));
        if cut < RLP_HEADER_LEN {
            assert_eq!(read.chunks, 0, "cut at {cut}");
            let tail = read.tail.expect("tail error for a cut header");
            assert_eq!(tail.offset, 0);
            assert_eq!(tail.reason, TailReason::TruncatedFileHeader { have: cut });
            assert_eq!(read.profile.strings().len(), 1, "empty profile with \"\"");
            continue;
        }
        let whole = chunks_before(&starts, cut as u64);
        assert_eq!(read.chunks, whole, "cut at {cut}");
        assert_eq!(read.valid_len, starts[whole], "cut at {cut}");
        if cut as u64 == starts[whole] {
            assert_eq!(read.tail, None, "cut at a chunk boundary {cut}");
        } else {
            let tail = read
                .tail
                .unwrap_or_else(|| panic!("cut at {cut}: no tail error"));
            assert_eq!(
                tail.offset, starts[whole],
                "cut at {cut}: offset of torn chunk"
            );
            let into = cut as u64 - starts[whole];
            match tail.reason {
                TailReason::TruncatedHeader { have } => {
                    assert!(into < 8);
                    assert_eq!(have as u64, into);
                }
                TailReason::TruncatedPayload { expected, have } => {
                    assert!(into >= 8);
                    assert_eq!(u64::from(have), into - 8);
                    assert_eq!(starts[whole] + 8 + u64::from(expected), starts[whole + 1]);
                }
                other => panic!("cut at {cut}: unexpected reason {other:?}"),
            }
        }
        if whole > 0 {
            assert_same(&read.profile, &snapshots[whole - 1]);
        } else {
            assert_eq!(read.profile.strings().len(), 1);
            assert!(read.profile.samples().is_empty());
        }
    }
}

#[test]
fn a_flipped_byte_in_any_chunk_is_caught() {
    let (bytes, starts, snapshots) = recording();
    let mut damaged = bytes.clone();
    for pos in RLP_HEADER_LEN..bytes.len() {
        let chunk = chunks_before(&starts, pos as u64);
        for mask in [0x01u8, 0x80, 0xff] {
            damaged[pos] ^= mask;
            let read = read_rlp(&damaged[..])
                .unwrap_or_else(|e| panic!("flip {mask:#x} at {pos}: hard error {e}"));
            damaged[pos] = bytes[pos];
            assert_eq!(read.chunks, chunk, "flip {mask:#x} at {pos}");
            let tail = read
                .tail
                .unwrap_or_else(|| panic!("flip {mask:#x} at {pos}: not detected"));
            assert_eq!(tail.offset, starts[chunk], "flip {mask:#x} at {pos}");
            let in_crc_or_payload = pos as u64 >= starts[chunk] + 4;
            if in_crc_or_payload {
                assert!(
                    matches!(tail.reason, TailReason::CrcMismatch { .. }),
                    "flip {mask:#x} at {pos}: {:?}",
                    tail.reason
                );
            }
            if chunk > 0 {
                assert_same(&read.profile, &snapshots[chunk - 1]);
            }
        }
    }
}

#[test]
fn a_damaged_header_is_a_hard_error_with_its_offset() {
    let (bytes, _, _) = recording();
    for pos in 0..RLP_HEADER_LEN {
        let mut damaged = bytes.clone();
        damaged[pos] ^= 0x20;
        match read_rlp(&damaged[..]) {
            Err(RlpError::BadMagic { offset }) => {
                assert!(pos < 8);
                assert_eq!(offset, pos as u64);
            }
            Err(RlpError::UnsupportedVersion { offset, .. }) => {
                assert!(pos >= 8);
                assert_eq!(offset, 8);
            }
            other => panic!("flip at {pos}: {other:?}"),
        }
    }
    // Text that happens to be another format is rejected at byte 0.
    assert!(matches!(
        read_rlp(&b"main;foo;bar 12\n"[..]),
        Err(RlpError::BadMagic { offset: 0 })
    ));
}

#[test]
fn a_huge_length_field_is_reported_without_allocating_it() {
    let (bytes, starts, _) = recording();
    let mut damaged = bytes[..starts[2] as usize].to_vec();
    damaged.extend_from_slice(&u32::MAX.to_le_bytes());
    damaged.extend_from_slice(&[0; 4]);
    let read = read_rlp(&damaged[..]).unwrap();
    assert_eq!(read.chunks, 2);
    let tail = read.tail.unwrap();
    assert_eq!(tail.offset, starts[2]);
    assert_eq!(tail.reason, TailReason::ChunkTooLarge { len: u32::MAX });

    // Just under the limit, but the file ends: truncated, not an allocation of 64 MiB.
    let mut damaged = bytes[..starts[2] as usize].to_vec();
    damaged.extend_from_slice(&(rootline_profile::MAX_CHUNK_LEN).to_le_bytes());
    damaged.extend_from_slice(&[0; 4]);
    damaged.extend_from_slice(&[7; 100]);
    let read = read_rlp(&damaged[..]).unwrap();
    assert!(matches!(
        read.tail.unwrap().reason,
        TailReason::TruncatedPayload { have: 100, .. }
    ));
}
