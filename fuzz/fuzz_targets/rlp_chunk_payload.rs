//! Bytes used as the protobuf payload of a correctly framed chunk (valid zstd and crc) after 0–2
//! intact chunks, so the fuzzer spends its time in the reader's id validation and rollback rather
//! than on the crc. The first input byte picks how many chunks precede it.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/profile/tests/common/mod.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    if let Some((&intact, payload)) = data.split_first() {
        common::harness::check_payload(usize::from(intact), payload);
    }
});
