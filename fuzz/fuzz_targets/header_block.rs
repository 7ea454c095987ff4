//! Header blocks through criguard's shadow HPACK decoder and its answers.
#![no_main]

libfuzzer_sys::fuzz_target!(|block: &[u8]| criguard::cri::fuzz::header_block(block));
