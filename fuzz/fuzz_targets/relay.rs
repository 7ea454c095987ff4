//! Scripts of client and runtime bytes through one relayed connection
//! (format: `criguard::cri::fuzz`).
#![no_main]

libfuzzer_sys::fuzz_target!(|script: &[u8]| {
    criguard::cri::fuzz::relay(criguard::intercept::fuzz_observer(), script)
});
