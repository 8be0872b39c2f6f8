//! Format V6 (plain blocks, thread table, V6 metadata), on a trace written here byte by byte from
//! the specification, since no runtime available here writes V6.

use rootline_dotnet::{NetTraceReader, read_profile_with_stats};

fn varuint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    varuint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn utf16z(out: &mut Vec<u8>, s: &str) {
    for u in s.encode_utf16().chain([0]) {
        out.extend_from_slice(&u.to_le_bytes());
    }
}

fn block(out: &mut Vec<u8>, kind: u32, data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32 | kind << 24).to_le_bytes());
    out.extend_from_slice(data);
}

fn metadata_row(out: &mut Vec<u8>, id: u64, provider: &str, event_id: u64, name: &str) {
    let mut row = Vec::new();
    varuint(&mut row, id);
    string(&mut row, provider);
    varuint(&mut row, event_id);
    string(&mut row, name);
    row.extend_from_slice(&0u16.to_le_bytes()); // no fields
    // Optional metadata: opcode 0, level 4.
    row.extend_from_slice(&4u16.to_le_bytes());
    row.extend_from_slice(&[1, 0, 8, 4]);
    out.extend_from_slice(&(row.len() as u16).to_le_bytes());
    out.extend_from_slice(&row);
}

fn method(start: u64, size: u32, name: &str) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&7u64.to_le_bytes()); // method id
    p.extend_from_slice(&5u64.to_le_bytes()); // module id
    p.extend_from_slice(&start.to_le_bytes());
    p.extend_from_slice(&size.to_le_bytes());
    p.extend_from_slice(&[0; 8]); // token, flags
    utf16z(&mut p, "Ns");
    utf16z(&mut p, name);
    utf16z(&mut p, "void  (int32)");
    p.extend_from_slice(&1u16.to_le_bytes());
    p
}

/// One compressed event: metadata id, thread index 1, a stack id, a timestamp delta, a payload.
fn event(out: &mut Vec<u8>, first: bool, meta: u64, stack: u64, delta: u64, payload: &[u8]) {
    let flags: u8 = 1 | 4 | 8 | 128 | if first { 2 } else { 0 };
    out.push(flags);
    varuint(out, meta);
    if first {
        varuint(out, 0); // sequence delta
        varuint(out, 1); // capture thread index
        varuint(out, 0); // processor
    }
    varuint(out, 1); // thread index
    varuint(out, stack);
    varuint(out, delta);
    varuint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

fn v6_trace() -> Vec<u8> {
    let mut f = b"Nettrace".to_vec();
    for v in [0u32, 6, 0] {
        f.extend_from_slice(&v.to_le_bytes());
    }
    let mut trace = Vec::new();
    for v in [2024u16, 1, 1, 1, 0, 0, 0, 0] {
        trace.extend_from_slice(&v.to_le_bytes());
    }
    trace.extend_from_slice(&1000u64.to_le_bytes());
    trace.extend_from_slice(&1_000_000u64.to_le_bytes());
    trace.extend_from_slice(&8u32.to_le_bytes());
    trace.extend_from_slice(&2u32.to_le_bytes());
    string(&mut trace, "ProcessId");
    string(&mut trace, "4242");
    string(&mut trace, "ExpectedCPUSamplingRate");
    string(&mut trace, "1000000");
    block(&mut f, 1, &trace);

    let mut meta = 0u16.to_le_bytes().to_vec();
    metadata_row(
        &mut meta,
        1,
        "Microsoft-DotNETCore-SampleProfiler",
        0,
        "ThreadSample",
    );
    metadata_row(
        &mut meta,
        2,
        "Microsoft-Windows-DotNETRuntimeRundown",
        144,
        "",
    );
    metadata_row(
        &mut meta,
        3,
        "Microsoft-Windows-DotNETRuntimeRundown",
        154,
        "",
    );
    block(&mut f, 3, &meta);

    let mut row = Vec::new();
    varuint(&mut row, 1);
    row.push(3);
    varuint(&mut row, 777);
    row.push(2);
    varuint(&mut row, 4242);
    row.push(1);
    string(&mut row, "worker");
    let mut threads = (row.len() as u16).to_le_bytes().to_vec();
    threads.extend_from_slice(&row);
    block(&mut f, 6, &threads);

    let mut stacks = Vec::new();
    stacks.extend_from_slice(&1u32.to_le_bytes());
    stacks.extend_from_slice(&1u32.to_le_bytes());
    stacks.extend_from_slice(&24u32.to_le_bytes());
    for ip in [0x1010u64, 0x2020, 0x3030] {
        stacks.extend_from_slice(&ip.to_le_bytes());
    }
    block(&mut f, 5, &stacks);

    let mut events = Vec::new();
    events.extend_from_slice(&20u16.to_le_bytes());
    events.extend_from_slice(&1u16.to_le_bytes());
    events.extend_from_slice(&[0; 16]);
    event(&mut events, true, 1, 1, 3000, &2u32.to_le_bytes());
    event(&mut events, false, 2, 0, 10, &method(0x1000, 0x100, "Leaf"));
    event(&mut events, false, 2, 0, 10, &method(0x2000, 0x100, "Mid"));
    let mut module = Vec::new();
    module.extend_from_slice(&5u64.to_le_bytes());
    module.extend_from_slice(&9u64.to_le_bytes());
    module.extend_from_slice(&[0; 8]);
    utf16z(&mut module, "/app/App.dll");
    utf16z(&mut module, "");
    event(&mut events, false, 3, 0, 10, &module);
    block(&mut f, 2, &events);

    let mut sp = 5000u64.to_le_bytes().to_vec();
    sp.extend_from_slice(&0u32.to_le_bytes());
    sp.extend_from_slice(&1u32.to_le_bytes());
    varuint(&mut sp, 1);
    varuint(&mut sp, 4);
    block(&mut f, 4, &sp);
    block(&mut f, 9, b"a block kind this reader does not know"); // skipped
    block(&mut f, 0, &[]);
    f
}

#[test]
fn reads_a_v6_trace() {
    let data = v6_trace();
    let mut reader = NetTraceReader::new(&data[..]).unwrap();
    assert_eq!(reader.info().format_version, 6);
    assert_eq!(reader.info().process_id, 4242);
    let e = reader.next_event().unwrap().unwrap();
    assert_eq!(e.metadata.name, "ThreadSample");
    assert_eq!(e.metadata.level, 4);
    assert_eq!((e.thread_id, e.process_id), (777, Some(4242)));
    assert_eq!(e.sequence_number, 1);
    assert_eq!(e.stack.ips().collect::<Vec<_>>(), [0x1010, 0x2020, 0x3030]);
    let mut n = 1;
    while reader.next_event().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 4);
    assert_eq!(reader.stats().dropped_events, 0);

    let (profile, stats) = read_profile_with_stats(&data[..]).unwrap();
    assert_eq!(stats.managed_samples, 1);
    let stack = profile.samples().stacks[0];
    let names: Vec<&str> = profile
        .stack_frames(stack)
        .map(|f| profile.frame_name(f))
        .collect();
    assert_eq!(
        names,
        ["App!Ns.Leaf(int32)", "App!Ns.Mid(int32)", "?!0x3030"]
    );
    assert_eq!(profile.thread(profile.samples().threads[0]).tid, 777);
    // 2024-01-01T00:00:00Z plus (3000 - 1000) ticks of a 1 MHz clock.
    assert_eq!(
        profile.samples().times[0],
        1_704_067_200_000_000_000 + 2_000_000
    );
}

#[test]
fn every_truncation_of_the_v6_trace_is_a_positioned_error() {
    let data = v6_trace();
    for len in 0..data.len() {
        let err = read_profile_with_stats(&data[..len]).unwrap_err();
        assert!(err.is_truncated(), "cut at {len}: {err}");
        assert!(err.offset <= len as u64);
    }
}
