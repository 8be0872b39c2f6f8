//! Any bytes given to the pprof reader yield a profile or an error, never a panic, and a profile
//! that is read can be written again.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A small cap keeps gzip inputs from spending the run on decompression.
    if let Ok(profile) = rootline_formats::pprof::read_with_limit(data, 1 << 20) {
        let mut out = Vec::new();
        rootline_formats::pprof::write(&profile, &mut out).expect("writing to a Vec succeeds");
    }
});
