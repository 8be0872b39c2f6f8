//! Truncated and corrupted input: the reader must answer with a positioned error, never panic.
//! A bounded mutation run over real traces (the `cargo fuzz` target `nettrace` runs the same
//! check without a bound): one collected now from a live .NET process, and perfview's when the
//! third-party fixtures are present.

mod common;

use common::live::recorded_trace;
use common::{FIXTURES, fixture, perfview_dir};
use rootline_dotnet::{NetTraceReader, read_profile};

/// Reads the whole stream; returns the error, if any.
fn read_all(data: &[u8]) -> Option<rootline_dotnet::NetTraceError> {
    let mut reader = match NetTraceReader::new(data) {
        Ok(r) => r,
        Err(e) => return Some(e),
    };
    loop {
        match reader.next_event() {
            Ok(Some(_)) => {}
            Ok(None) => return None,
            Err(e) => return Some(e),
        }
    }
}

/// Every cut in `cuts` is a truncation error at or before the cut, and the whole trace reads.
fn assert_cuts_are_positioned_eof_errors(data: &[u8], cuts: impl Iterator<Item = usize>) {
    assert!(read_all(data).is_none(), "the whole file reads");
    for len in cuts {
        let e = read_all(&data[..len]).unwrap_or_else(|| panic!("cut at {len} read cleanly"));
        assert!(e.is_truncated(), "cut at {len}: {e}");
        assert!(
            e.offset <= len as u64,
            "cut at {len}: error offset {}",
            e.offset
        );
        assert!(e.to_string().contains(&format!("at byte {}", e.offset)));
        assert!(read_profile(&data[..len]).is_err());
    }
}

#[test]
fn every_truncation_is_a_positioned_eof_error() {
    let Some(dir) = perfview_dir("every_truncation_is_a_positioned_eof_error") else {
        return;
    };
    let data = fixture(&dir, FIXTURES[2]);
    assert_cuts_are_positioned_eof_errors(&data, 0..data.len());
}

#[test]
fn truncating_a_large_trace_reports_where() {
    let Some(dir) = perfview_dir("truncating_a_large_trace_reports_where") else {
        return;
    };
    let data = fixture(&dir, FIXTURES[4]);
    let cuts = [9, 100, 1000, 4096, 100_000, data.len() / 2, data.len() - 1];
    assert_cuts_are_positioned_eof_errors(&data, cuts.into_iter());
}

/// A trace collected now: every cut in its first 2 KiB (header, metadata, the first stacks), then
/// 200 cuts spread over the rest, down to the rundown at its end.
#[test]
fn truncating_a_collected_trace_is_a_positioned_eof_error() {
    let Some(data) = recorded_trace("truncating_a_collected_trace_is_a_positioned_eof_error")
    else {
        return;
    };
    let head = data.len().min(2 << 10);
    let step = (data.len() / 200).max(1);
    let cuts = (0..head).chain((head..data.len()).step_by(step));
    assert_cuts_are_positioned_eof_errors(data, cuts.chain([data.len() - 1]));
}

#[test]
fn not_a_nettrace_is_rejected_at_byte_zero() {
    let e = read_all(b"Netperf!\x14\0\0\0!FastSerialization.1").unwrap();
    assert_eq!(e.offset, 0);
    let e = read_all(b"Nettrace\x14\0\0\0!FastSerialization.2").unwrap();
    assert_eq!(e.offset, 12);
}

/// xorshift64*: a fixed-seed generator, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// 600 rounds of random damage to `small` and `head`, alternately: every error is positioned
/// within the input, nothing panics, and the damage reaches the error paths.
fn assert_mutations_never_panic(small: &[u8], head: &[u8]) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut outcomes = [0usize; 2];
    for round in 0..600 {
        let mut data = if round % 2 == 0 {
            small.to_vec()
        } else {
            head.to_vec()
        };
        for _ in 0..1 + rng.below(8) {
            let i = rng.below(data.len());
            match rng.below(4) {
                0 => data[i] = rng.next() as u8,
                1 => data[i] ^= 1 << rng.below(8),
                2 => data[i] = [0, 0xff, 0x7f, 0x80][rng.below(4)],
                _ => {
                    let n = rng.below(16).min(data.len() - i);
                    data.drain(i..i + n);
                }
            }
        }
        let error = read_all(&data);
        if let Some(e) = &error {
            assert!(e.offset <= data.len() as u64, "round {round}: {e}");
        }
        outcomes[usize::from(error.is_some())] += 1;
        let _ = read_profile(&data[..]);
    }
    // The mutations must actually exercise the error paths.
    assert!(outcomes[1] > 300, "{outcomes:?}");
}

#[test]
fn random_mutations_never_panic() {
    let Some(dir) = perfview_dir("random_mutations_never_panic") else {
        return;
    };
    let small = fixture(&dir, FIXTURES[2]);
    // The head of a sampled trace: metadata, stacks, compressed event headers.
    let big = fixture(&dir, FIXTURES[3]);
    assert_mutations_never_panic(&small, &big[..48 * 1024]);
}

/// The same damage to a trace collected now: the whole trace (down to the rundown's method events
/// and the end of the stream) and its head (metadata, stacks, the first samples).
#[test]
fn random_mutations_of_a_collected_trace_never_panic() {
    let Some(data) = recorded_trace("random_mutations_of_a_collected_trace_never_panic") else {
        return;
    };
    eprintln!("collected trace: {} bytes", data.len());
    assert_mutations_never_panic(data, &data[..data.len().min(48 * 1024)]);
}
