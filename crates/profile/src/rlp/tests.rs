//! Chunks that pass the crc but say impossible things: each must be rejected as
//! [`TailReason::Inconsistent`] and leave the profile exactly as it was before the chunk.

use prost::Message;

use super::schema;
use super::{RlpTailError, TailReason, read_rlp, write_rlp};
use crate::{FrameKind, Profile, SampleType};

/// A valid one-chunk file: strings "", main, worker, f0..f2; 3 frames; stacks f0, f0;f1, f0;f1;f2;
/// thread 0 (1, 1) "main"; process 1 "app"; 2 samples.
fn base_file() -> (Vec<u8>, Profile) {
    let mut p = Profile::new(vec![SampleType::samples()]);
    let t = p.intern_thread(1, 1);
    p.set_thread_name(t, "main");
    p.set_process_name(1, "app");
    let frames: Vec<_> = (0..3)
        .map(|i| p.intern_named_frame(&format!("f{i}"), FrameKind::Native))
        .collect();
    let leaf = p.intern_stack_root_first(frames).unwrap();
    p.push_sample(10, t, leaf, &[1]).unwrap();
    p.push_sample(20, t, leaf, &[1]).unwrap();
    (write_rlp(Vec::new(), &p).unwrap(), p)
}

/// A chunk that continues `p` correctly and adds nothing.
fn next_chunk(p: &Profile) -> schema::Chunk {
    schema::Chunk {
        first_string: p.strings().len() as u32,
        first_mapping: p.mappings().len() as u32,
        first_function: p.functions().len() as u32,
        first_frame: p.frames().len() as u32,
        first_stack: p.stacks().len() as u32,
        ..schema::Chunk::default()
    }
}

fn append(file: &[u8], chunk: &schema::Chunk) -> Vec<u8> {
    let payload = zstd::bulk::compress(&chunk.encode_to_vec(), 3).unwrap();
    let mut out = file.to_vec();
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

fn same(a: &Profile, b: &Profile) {
    assert_eq!(a.strings(), b.strings());
    assert_eq!(a.mappings(), b.mappings());
    assert_eq!(a.functions(), b.functions());
    assert_eq!(a.frames(), b.frames());
    assert_eq!(a.stacks(), b.stacks());
    assert_eq!(a.threads(), b.threads());
    assert_eq!(a.processes(), b.processes());
    assert_eq!(a.samples(), b.samples());
    assert_eq!(a.metadata, b.metadata);
}

/// Appends `edit(next_chunk)` and expects it to be rejected with a message containing `needle`.
fn rejects(needle: &str, edit: impl FnOnce(&mut schema::Chunk)) {
    let (file, p) = base_file();
    let mut chunk = next_chunk(&p);
    edit(&mut chunk);
    let read = read_rlp(&append(&file, &chunk)[..]).unwrap();
    assert_eq!(read.chunks, 1, "{needle}");
    match read.tail {
        Some(RlpTailError {
            offset,
            reason: TailReason::Inconsistent(message),
        }) => {
            assert_eq!(offset, file.len() as u64);
            assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        }
        other => panic!("{needle}: expected an inconsistency, got {other:?}"),
    }
    same(&read.profile, &p);
}

fn sample_batch(threads: Vec<u32>, stacks: Vec<u32>, columns: usize) -> schema::Samples {
    let n = threads.len();
    schema::Samples {
        time_deltas: vec![5; n],
        threads,
        stacks,
        values: vec![schema::ValueColumn { deltas: vec![1; n] }; columns],
    }
}

#[test]
fn crafted_valid_chunk_is_merged() {
    // Proves the helpers build chunks the reader accepts, so the rejections below are real.
    let (file, p) = base_file();
    let mut chunk = next_chunk(&p);
    chunk.strings.push("new".into());
    chunk.stack_parents.push(3); // node 3's parent is node 0
    chunk.stack_frames.push(2);
    chunk.threads.push(schema::Thread {
        id: 1,
        pid: 1,
        tid: 2,
        name: Some(6),
    });
    chunk.samples = Some(sample_batch(vec![1], vec![3], 1));
    let read = read_rlp(&append(&file, &chunk)[..]).unwrap();
    assert_eq!((read.chunks, read.tail), (2, None));
    assert_eq!(read.profile.thread_name(crate::ThreadId(1)), Some("new"));
    assert_eq!(
        read.profile.stack(crate::StackId(3)).parent,
        Some(crate::StackId(0))
    );
    assert_eq!(read.profile.samples().times, [10, 20, 5]);
}

#[test]
fn repeated_or_misplaced_rows_are_rejected() {
    rejects("repeats", |c| c.strings.push("f1".into()));
    rejects("repeats", |c| {
        c.strings.push("x".into());
        c.strings.push("x".into());
    });
    rejects("first string", |c| c.first_string += 1);
    rejects("first stack", |c| c.first_stack -= 1);
    rejects("repeats", |c| {
        c.stack_parents.push(0);
        c.stack_frames.push(0);
    });
    rejects("repeats", |c| {
        c.functions.push(schema::Function {
            name: 3,
            ..Default::default()
        })
    });
    rejects("repeats", |c| {
        c.threads.push(schema::Thread {
            id: 1,
            pid: 1,
            tid: 1,
            name: None,
        })
    });
}

#[test]
fn ids_out_of_range_are_rejected() {
    rejects("string id 99", |c| {
        c.mappings.push(schema::Mapping {
            path: 99,
            ..Default::default()
        })
    });
    rejects("string id 99", |c| {
        c.functions.push(schema::Function {
            name: 1,
            file: Some(99),
            ..Default::default()
        })
    });
    rejects("string id 98", |c| {
        c.functions.push(schema::Function {
            name: 1,
            system_name: Some(98),
            ..Default::default()
        })
    });
    rejects("string id 97", |c| {
        c.functions.push(schema::Function {
            name: 1,
            tier: Some(97),
            ..Default::default()
        })
    });
    rejects("function id 9", |c| {
        c.frames.push(schema::Frame {
            function: 9,
            ..Default::default()
        })
    });
    rejects("mapping id 0", |c| {
        c.frames.push(schema::Frame {
            mapping: Some(0),
            ..Default::default()
        })
    });
    rejects("inline depth", |c| {
        c.frames.push(schema::Frame {
            inline_depth: 256,
            ..Default::default()
        })
    });
    rejects("frame kind", |c| {
        c.frames.push(schema::Frame {
            kind: 6,
            ..Default::default()
        })
    });
    rejects("parent 4 nodes before", |c| {
        c.stack_parents.push(4);
        c.stack_frames.push(0);
    });
    rejects("frame id 3", |c| {
        c.stack_parents.push(0);
        c.stack_frames.push(3);
    });
    rejects("stack parents but", |c| c.stack_parents.push(1));
    rejects("thread id 5", |c| {
        c.threads.push(schema::Thread {
            id: 5,
            pid: 1,
            tid: 9,
            name: None,
        })
    });
    rejects("thread 0 is (1, 1)", |c| {
        c.threads.push(schema::Thread {
            id: 0,
            pid: 1,
            tid: 9,
            name: None,
        })
    });
    rejects("string id 50", |c| {
        c.threads.push(schema::Thread {
            id: 0,
            pid: 1,
            tid: 1,
            name: Some(50),
        })
    });
    rejects("string id 50", |c| {
        c.processes.push(schema::Process {
            pid: 3,
            name: None,
            command_line: Some(50),
        })
    });
}

#[test]
fn malformed_samples_are_rejected() {
    rejects("stack id 3", |c| {
        c.samples = Some(sample_batch(vec![0], vec![3], 1))
    });
    rejects("thread id 1", |c| {
        c.samples = Some(sample_batch(vec![1], vec![0], 1))
    });
    rejects("value columns", |c| {
        c.samples = Some(sample_batch(vec![0], vec![0], 2))
    });
    rejects("value columns", |c| {
        c.samples = Some(sample_batch(vec![0], vec![0], 0))
    });
    rejects("differ in length", |c| {
        let mut s = sample_batch(vec![0, 0], vec![0, 0], 1);
        s.stacks.pop();
        c.samples = Some(s);
    });
    rejects("a value column has", |c| {
        let mut s = sample_batch(vec![0, 0], vec![0, 0], 1);
        s.values[0].deltas.pop();
        c.samples = Some(s);
    });
    rejects("sample types differ", |c| {
        c.sample_types.push(schema::SampleType {
            name: "cpu".into(),
            unit: "nanoseconds".into(),
        })
    });
}

#[test]
fn a_rejected_chunk_leaves_no_trace() {
    // Everything valid — new rows in every table, a rename, a new process, metadata, samples —
    // until the last sample, which names a missing stack.
    rejects("sample 2", |c| {
        c.strings.push("late".into());
        c.mappings.push(schema::Mapping {
            start: 1,
            end: 2,
            path: 6,
            ..Default::default()
        });
        c.functions.push(schema::Function {
            name: 6,
            ..Default::default()
        });
        c.frames.push(schema::Frame {
            function: 3,
            mapping: Some(0),
            ..Default::default()
        });
        c.stack_parents.extend([0, 1]);
        c.stack_frames.extend([3, 3]);
        c.threads.push(schema::Thread {
            id: 0,
            pid: 1,
            tid: 1,
            name: Some(6),
        });
        c.threads.push(schema::Thread {
            id: 1,
            pid: 2,
            tid: 2,
            name: None,
        });
        c.processes.push(schema::Process {
            pid: 1,
            name: None,
            command_line: None,
        });
        c.processes.push(schema::Process {
            pid: 2,
            name: Some(6),
            command_line: None,
        });
        c.metadata = Some(schema::Metadata {
            producer: "evil".into(),
            ..Default::default()
        });
        c.samples = Some(sample_batch(vec![0, 1, 1], vec![3, 4, 9], 1));
    });
}

#[test]
fn a_rejected_first_chunk_gives_an_empty_profile() {
    let mut chunk = schema::Chunk::default();
    chunk.strings.push("".into());
    chunk.stack_parents.push(0);
    chunk.stack_frames.push(0);
    let mut file = super::RLP_MAGIC.to_vec();
    file.extend_from_slice(&super::RLP_VERSION.to_le_bytes());
    let read = read_rlp(&append(&file, &chunk)[..]).unwrap();
    assert_eq!(read.chunks, 0);
    assert!(matches!(
        read.tail,
        Some(RlpTailError {
            offset: 12,
            reason: TailReason::Inconsistent(_)
        })
    ));
    assert_eq!(read.profile.strings().len(), 1);
    assert!(read.profile.stacks().is_empty());
}

#[test]
fn zstd_bombs_and_bad_payloads_are_tail_errors() {
    let (file, _) = base_file();
    let frame = |payload: &[u8]| {
        let mut out = file.clone();
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        out.extend_from_slice(payload);
        out
    };
    // 65 MiB of zeros compresses to a few KiB.
    let bomb =
        zstd::bulk::compress(&vec![0u8; super::MAX_DECOMPRESSED_LEN + (1 << 20)], 3).unwrap();
    assert!(bomb.len() < 1 << 20);
    let read = read_rlp(&frame(&bomb)[..]).unwrap();
    assert_eq!(read.chunks, 1);
    assert_eq!(read.tail.unwrap().reason, TailReason::DecompressedTooLarge);

    let read = read_rlp(&frame(b"not zstd at all")[..]).unwrap();
    assert!(matches!(read.tail.unwrap().reason, TailReason::Zstd(_)));
    let read = read_rlp(&frame(b"")[..]).unwrap();
    assert!(matches!(read.tail.unwrap().reason, TailReason::Zstd(_)));

    let valid = zstd::bulk::compress(b"\x0a\x02hi", 3).unwrap();
    let read = read_rlp(&frame(&valid[..valid.len() - 1])[..]).unwrap();
    assert!(
        matches!(read.tail.unwrap().reason, TailReason::Zstd(_)),
        "truncated frame"
    );

    // Valid zstd, not a protobuf Chunk (field 4 must be a UTF-8 string).
    let junk = zstd::bulk::compress(b"\x22\x02\xff\xfe", 3).unwrap();
    let read = read_rlp(&frame(&junk)[..]).unwrap();
    assert!(matches!(read.tail.unwrap().reason, TailReason::Decode(_)));
}

/// A frame row as files written before the live-memory flag encoded it (tags 1..=6 only).
#[derive(Clone, PartialEq, prost::Message)]
struct OldFrame {
    #[prost(uint32, tag = "1")]
    function: u32,
    #[prost(uint32, optional, tag = "2")]
    mapping: Option<u32>,
    #[prost(uint64, tag = "3")]
    address: u64,
    #[prost(uint32, optional, tag = "4")]
    line: Option<u32>,
    #[prost(uint32, tag = "5")]
    inline_depth: u32,
    #[prost(uint32, tag = "6")]
    kind: u32,
}

#[test]
fn live_memory_flag_round_trips_and_is_part_of_frame_identity() {
    let mut p = Profile::new(vec![SampleType::samples()]);
    let t = p.intern_thread(1, 1);
    let copied = p.intern_named_frame("f", FrameKind::Native);
    let mut live_frame = *p.frame(copied);
    live_frame.from_live_memory = true;
    let live = p.intern_frame(live_frame);
    assert_ne!(copied, live, "the flag is part of the frame's key");
    let stack = p.intern_stack_root_first([live, copied]).unwrap();
    p.push_sample(1, t, stack, &[1]).unwrap();
    let read = read_rlp(&write_rlp(Vec::new(), &p).unwrap()[..]).unwrap();
    same(&read.profile, &p);
    assert!(read.profile.frame(live).from_live_memory);
    assert!(!read.profile.frame(copied).from_live_memory);
}

#[test]
fn frames_from_files_without_the_flag_read_as_copied() {
    let (file, p) = base_file();
    let mut chunk = next_chunk(&p);
    chunk.strings.push("old".into());
    chunk.functions.push(schema::Function {
        name: p.strings().len() as u32,
        ..Default::default()
    });
    // An old writer's row and a new writer's unflagged row are the same bytes, so this chunk is
    // what an old file holds.
    let old = OldFrame {
        function: p.functions().len() as u32,
        address: 0x1234,
        kind: FrameKind::Native as u32,
        ..Default::default()
    };
    let new = schema::Frame {
        function: old.function,
        address: old.address,
        kind: old.kind,
        ..Default::default()
    };
    assert_eq!(
        old.encode_to_vec(),
        new.encode_to_vec(),
        "same bytes as an old file"
    );
    chunk.frames.push(new);
    let read = read_rlp(&append(&file, &chunk)[..]).unwrap();
    assert_eq!(read.tail, None);
    let f = read.profile.frame(crate::FrameId(p.frames().len() as u32));
    assert_eq!(f.address, 0x1234);
    assert!(!f.from_live_memory);
    // And a row that sets the flag decodes in an old reader's message without error.
    let flagged = schema::Frame {
        from_live_memory: true,
        ..schema::Frame::default()
    };
    assert!(OldFrame::decode(&flagged.encode_to_vec()[..]).is_ok());
}
