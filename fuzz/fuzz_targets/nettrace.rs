//! Fuzz target: any bytes through the `.nettrace` reader and the Profile conversion must give a
//! result or a positioned error, never a panic, a hang or unbounded memory.
//!
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run nettrace` from the workspace root (seed the corpus with
//! traces written by `rootline dotnet collect -o x.nettrace`, or any other `.nettrace` files).

#![no_main]

use libfuzzer_sys::fuzz_target;
use rootline_dotnet::{NetTraceReader, read_profile};

fuzz_target!(|data: &[u8]| {
    if let Ok(mut reader) = NetTraceReader::new(data) {
        loop {
            match reader.next_event() {
                Ok(Some(event)) => {
                    assert!(event.offset <= data.len() as u64);
                    let _ = event.stack.ips().count();
                }
                Ok(None) => break,
                Err(e) => {
                    assert!(e.offset <= data.len() as u64, "{e}");
                    break;
                }
            }
        }
    }
    let _ = read_profile(data);
});
