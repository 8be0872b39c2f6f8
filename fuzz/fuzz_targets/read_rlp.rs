//! Any bytes given to the `.rlp` reader: no panic, and whatever opens is consistent and survives a
//! write/read round trip. Same property as `crates/profile/tests/rlp_fuzz.rs`.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/profile/tests/common/mod.rs"]
mod common;

fuzz_target!(|data: &[u8]| common::harness::check_bytes(data));
