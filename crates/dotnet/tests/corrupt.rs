//! Truncated and corrupted input: the reader must answer with a positioned error, never panic.
//! A bounded mutation run over real traces (the `cargo fuzz` target `nettrace` runs the same
//! check without a bound).

mod common;

use common::{FIXTURES, fixture};
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

#[test]
fn every_truncation_is_a_positioned_eof_error() {
    let data = fixture(FIXTURES[2]);
    assert!(read_all(&data).is_none(), "the whole file reads");
    for len in 0..data.len() {
        let e = read_all(&data[..len]).unwrap_or_else(|| panic!("cut at {len} read cleanly"));
        assert!(e.is_truncated(), "cut at {len}: {e}");
        assert!(
            e.offset <= len as u64,
            "cut at {len}: error offset {}",
            e.offset
        );
        assert!(read_profile(&data[..len]).is_err());
    }
}

#[test]
fn truncating_a_large_trace_reports_where() {
    let data = fixture(FIXTURES[4]);
    for len in [9, 100, 1000, 4096, 100_000, data.len() / 2, data.len() - 1] {
        let e = read_all(&data[..len]).expect("error");
        assert!(e.is_truncated(), "cut at {len}: {e}");
        assert!(e.offset <= len as u64);
        assert!(e.to_string().contains(&format!("at byte {}", e.offset)));
    }
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

#[test]
fn random_mutations_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let small = fixture(FIXTURES[2]);
    // The head of a sampled trace: metadata, stacks, compressed event headers.
    let big = fixture(FIXTURES[3]);
    let head = &big[..48 * 1024];
    let mut outcomes = [0usize; 2];
    for round in 0..600 {
        let mut data = if round % 2 == 0 {
            small.clone()
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
