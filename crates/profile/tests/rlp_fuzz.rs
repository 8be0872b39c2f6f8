//! Random input never panics the reader, and whatever it accepts is consistent. These are the
//! properties of the cargo-fuzz targets in `fuzz/`, run here as bounded proptest searches so the
//! normal test suite (stable toolchain) exercises them too.

mod common;

use common::harness::{base, check_bytes, check_payload, mutate};
use proptest::prelude::*;
use rootline_profile::{RLP_MAGIC, RLP_VERSION};

fn header() -> Vec<u8> {
    let mut out = RLP_MAGIC.to_vec();
    out.extend_from_slice(&RLP_VERSION.to_le_bytes());
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_bytes(&data);
    }

    #[test]
    fn random_chunks_after_a_valid_header_never_panic(
        data in proptest::collection::vec(any::<u8>(), 0..512),
        len in 0u32..600,
    ) {
        // A plausible length field, so the payload path is reached, then random bytes.
        let mut file = header();
        file.extend_from_slice(&len.to_le_bytes());
        file.extend_from_slice(&data);
        check_bytes(&file);
    }

    #[test]
    fn mutated_valid_files_never_panic(
        edits in proptest::collection::vec((any::<u16>(), any::<u8>(), any::<u8>()), 1..8),
    ) {
        let mut file = mutate(&base().file[12..], &edits);
        file.splice(0..0, header());
        check_bytes(&file);
    }

    #[test]
    fn random_payloads_with_valid_framing_never_panic(
        intact in 0usize..3,
        data in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        check_payload(intact, &data);
    }

    #[test]
    fn mutated_payloads_with_valid_framing_are_rejected_whole_or_merged(
        intact in 0usize..3,
        edits in proptest::collection::vec((any::<u16>(), any::<u8>(), any::<u8>()), 1..6),
    ) {
        // A real chunk's protobuf with a few bytes changed: mostly still decodes, so this reaches
        // the id checks (and the rollback of a chunk that fails halfway).
        let payload = mutate(&base().payloads[intact], &edits);
        check_payload(intact, &payload);
    }
}

#[test]
fn the_unmutated_payloads_merge() {
    // The harness itself: re-framing each real payload gives the same file back.
    let base = base();
    let mut rebuilt = header();
    for (i, payload) in base.payloads.iter().enumerate() {
        check_payload(i, payload);
        rebuilt.extend_from_slice(&common::harness::frame(payload));
    }
    let read = rootline_profile::read_rlp(&rebuilt[..]).unwrap();
    assert_eq!((read.chunks, read.tail), (3, None));
}
