//! Profile → .rlp → Profile keeps every table, sample and metadata field, for one-shot writes,
//! incremental recordings (renames, metadata updates), bounded-memory recordings and large profiles
//! that the writer splits into several chunks.

mod common;

use common::{Recording, assert_same};
use rootline_profile::{
    FrameKind, Profile, RlpError, RlpReader, RlpWriter, SampleType, read_rlp, write_rlp,
};

#[test]
fn one_shot_round_trip_preserves_everything() {
    let mut rec = Recording::new(1);
    rec.add_thread(100, 101, Some("worker"));
    rec.add_thread(200, 201, None);
    rec.add_stacks(300, 120);
    rec.add_samples(5_000);
    rec.profile.metadata.lost_samples = 3;
    rec.profile.metadata.dropped_samples = 2;
    rec.profile.metadata.truncated_samples = 1;
    rec.profile.metadata.depth_cap = Some(127);

    let bytes = write_rlp(Vec::new(), &rec.profile).unwrap();
    let read = read_rlp(&bytes[..]).unwrap();
    assert_eq!(read.tail, None);
    assert_eq!(read.chunks, 1);
    assert_eq!(read.valid_len, bytes.len() as u64);
    assert_same(&read.profile, &rec.profile);
}

#[test]
fn incremental_recording_with_renames_and_metadata_updates() {
    let mut rec = Recording::new(2);
    let mut writer = RlpWriter::new(Vec::new()).unwrap();
    let mut chunk_ends = Vec::new();
    for round in 0..8u32 {
        rec.add_stacks(40, 20);
        if round % 3 == 1 {
            let tid = 1000 + round;
            rec.add_thread(100, tid, None);
        }
        if round == 4 {
            // A thread named after it was first written, and a renamed one.
            let t = rec.threads[1];
            rec.profile.set_thread_name(t, "late-name");
            rec.profile.set_thread_name(rec.threads[0], "renamed-main");
            rec.profile.set_process_name(100, "app-renamed");
            rec.profile.set_process_name(300, "second process");
        }
        rec.add_samples(700);
        rec.profile.metadata.lost_samples += u64::from(round);
        writer.write_chunk(&rec.profile).unwrap();
        chunk_ends.push(writer.bytes_written());
    }
    // A last write with only new metadata (the final counts) still makes a chunk…
    rec.profile.metadata.truncated_samples = 42;
    writer.write_chunk(&rec.profile).unwrap();
    // …and a write with nothing new makes none.
    let before = writer.bytes_written();
    writer.write_chunk(&rec.profile).unwrap();
    assert_eq!(writer.bytes_written(), before);
    assert_eq!(writer.chunks_written(), 9);
    let bytes = writer.finish().unwrap();

    let read = read_rlp(&bytes[..]).unwrap();
    assert_eq!((read.chunks, read.tail.clone()), (9, None));
    assert_same(&read.profile, &rec.profile);
    assert_eq!(
        read.profile.thread_name(rec.threads[0]),
        Some("renamed-main")
    );
    assert_eq!(read.profile.process_name(100), Some("app-renamed"));

    // The streaming reader reports each chunk at the offset the writer put it.
    let mut reader = RlpReader::new(&bytes[..]).unwrap();
    let mut offsets = Vec::new();
    while let Some(info) = reader.next_chunk().unwrap() {
        offsets.push(info.offset);
        assert_eq!(
            info.offset + 8 + u64::from(info.len),
            reader.valid_len(),
            "chunk extent"
        );
    }
    assert_eq!(reader.tail(), None);
    assert_eq!(offsets[0], 12);
    assert_eq!(&offsets[1..], &chunk_ends[..8]);
}

#[test]
fn bounded_memory_recording_takes_samples_after_each_chunk() {
    let mut rec = Recording::new(3);
    let mut full = Vec::new(); // every sample as pushed, to compare against
    let mut writer = RlpWriter::new(Vec::new()).unwrap();
    for _ in 0..6 {
        rec.add_stacks(30, 15);
        rec.add_samples(1_000);
        writer.write_chunk(&rec.profile).unwrap();
        let taken = rec.profile.take_samples();
        assert_eq!(taken.len(), 1_000);
        assert!(rec.profile.samples().is_empty());
        assert_eq!(rec.profile.samples().values.len(), 2, "columns kept");
        full.push(taken);
    }
    assert_eq!(rec.profile.samples_taken(), 6_000);
    assert_eq!(writer.samples_written(), 6_000);
    let bytes = writer.finish().unwrap();

    let mut reader = RlpReader::new(&bytes[..]).unwrap();
    let mut chunk = 0;
    while let Some(info) = reader.next_chunk().unwrap() {
        assert_eq!(info.samples, 1_000);
        // The reader can stream in bounded memory too.
        assert_eq!(reader.take_samples(), full[chunk]);
        chunk += 1;
    }
    assert_eq!((chunk, reader.tail()), (6, None));
    let read = reader.finish();
    assert!(read.profile.samples().is_empty());
    assert_eq!(read.profile.stacks(), rec.profile.stacks());
    assert_eq!(read.profile.metadata, rec.profile.metadata);
}

#[test]
fn taking_unwritten_samples_is_reported_not_silent() {
    let mut rec = Recording::new(4);
    rec.add_stacks(10, 5);
    let mut writer = RlpWriter::new(Vec::new()).unwrap();
    rec.add_samples(10);
    writer.write_chunk(&rec.profile).unwrap();
    rec.add_samples(5);
    rec.profile.take_samples(); // 5 samples never written
    rec.add_samples(3);
    match writer.write_chunk(&rec.profile) {
        Err(RlpError::SamplesLost { count: 5 }) => {}
        other => panic!("expected SamplesLost {{ count: 5 }}, got {other:?}"),
    }
    // The writer carries on with what the profile holds now.
    writer.write_chunk(&rec.profile).unwrap();
    assert_eq!(writer.samples_written(), 18);
    let read = read_rlp(&writer.finish().unwrap()[..]).unwrap();
    assert_eq!(read.profile.samples().len(), 13);
    assert_eq!(read.tail, None);
}

#[test]
fn writing_a_different_profile_is_an_error() {
    let mut rec = Recording::new(5);
    rec.add_stacks(10, 5);
    let mut writer = RlpWriter::new(Vec::new()).unwrap();
    writer.write_chunk(&rec.profile).unwrap();
    let other = Profile::new(vec![SampleType::cpu_nanoseconds(), SampleType::samples()]);
    assert!(matches!(
        writer.write_chunk(&other),
        Err(RlpError::ProfileMismatch { .. })
    ));
}

#[test]
fn large_profile_is_split_into_bounded_chunks() {
    let mut rec = Recording::new(6);
    rec.add_stacks(2_000, 400);
    rec.add_samples(200_000);
    let bytes = write_rlp(Vec::new(), &rec.profile).unwrap();
    let mut reader = RlpReader::new(&bytes[..]).unwrap();
    let mut sizes = Vec::new();
    while let Some(info) = reader.next_chunk().unwrap() {
        sizes.push(info.len);
    }
    assert_eq!(reader.tail(), None);
    assert!(sizes.len() >= 3, "expected several chunks, got {sizes:?}");
    let read = reader.finish();
    assert_same(&read.profile, &rec.profile);
}

#[test]
fn empty_profiles_round_trip() {
    for profile in [
        Profile::new(vec![]),
        Profile::new(vec![SampleType::wall_nanoseconds()]),
        Profile::default(),
    ] {
        let bytes = write_rlp(Vec::new(), &profile).unwrap();
        let read = read_rlp(&bytes[..]).unwrap();
        assert_eq!((read.chunks, read.tail.clone()), (1, None));
        assert_same(&read.profile, &profile);
    }
    // A header with no chunk at all reads as an empty profile whose string 0 is "".
    let bytes = RlpWriter::new(Vec::new()).unwrap().finish().unwrap();
    assert_eq!(bytes.len(), 12);
    let read = read_rlp(&bytes[..]).unwrap();
    assert_eq!((read.chunks, read.tail), (0, None));
    assert_eq!(read.profile.strings().len(), 1);
}

#[test]
fn extreme_values_round_trip() {
    let mut p = Profile::new(vec![SampleType::alloc_bytes(), SampleType::alloc_count()]);
    let t = p.intern_thread(u32::MAX, 0);
    p.set_thread_name(t, "ünïcødé ✓");
    let f = p.intern_named_frame("[truncated: stack copy ended]", FrameKind::Truncated);
    let s = p.intern_stack(None, f);
    for (time, a, b) in [
        (u64::MAX, i64::MIN, i64::MAX),
        (0, i64::MAX, i64::MIN),
        (u64::MAX / 2, -1, 0),
        (7, 0, -7),
    ] {
        p.push_sample(time, t, s, &[a, b]).unwrap();
    }
    p.metadata.start_time_ns = u64::MAX;
    p.metadata.extra.insert(String::new(), "\u{0}".into());
    let read = read_rlp(&write_rlp(Vec::new(), &p).unwrap()[..]).unwrap();
    assert_same(&read.profile, &p);
}

/// A sink that accepts `limit` bytes and then fails, like a full disk.
struct FullDisk {
    written: Vec<u8>,
    limit: usize,
}

impl std::io::Write for FullDisk {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = self.limit - self.written.len();
        if room == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::StorageFull));
        }
        let n = room.min(buf.len());
        self.written.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_failed_write_leaves_the_earlier_chunks_readable() {
    let mut rec = Recording::new(8);
    rec.add_stacks(20, 10);
    rec.add_samples(100);
    let first = write_rlp(Vec::new(), &rec.profile).unwrap().len();
    let snapshot = rec.profile.clone();
    let mut writer = RlpWriter::new(FullDisk {
        written: Vec::new(),
        limit: first + 50,
    })
    .unwrap();
    writer.write_chunk(&rec.profile).unwrap();
    rec.add_stacks(20, 10);
    rec.add_samples(100);
    assert!(matches!(
        writer.write_chunk(&rec.profile),
        Err(RlpError::Io { .. })
    ));
    // The stream ends in a partial chunk now; the writer refuses to append after it.
    assert!(writer.write_chunk(&rec.profile).is_err());
    let file = writer.get_ref().written.clone();
    assert_eq!(file.len(), first + 50);
    let read = read_rlp(&file[..]).unwrap();
    assert_eq!(read.chunks, 1);
    assert_eq!(read.valid_len, first as u64);
    assert_eq!(read.tail.unwrap().offset, first as u64);
    assert_same(&read.profile, &snapshot);
}
