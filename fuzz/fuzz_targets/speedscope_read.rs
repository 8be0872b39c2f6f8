//! Fuzzes the speedscope reader: any input gives a profile or a positioned error, and a profile
//! it reads can be written and read again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rootline_formats::{FormatError, speedscope};

fuzz_target!(|data: &[u8]| {
    match speedscope::read(data) {
        Ok(profile) => {
            let mut out = Vec::new();
            speedscope::write(&profile, &mut out).expect("writing to memory");
            speedscope::read(&out[..]).expect("our own output reads back");
        }
        Err(FormatError::Invalid { .. }) => {}
        Err(other) => panic!("an error without a position: {other}"),
    }
});
