//! Header blocks through criguard's shadow HPACK decoder and its answers,
//! and the decoder against loona-hpack: what that accepts, ours reads the
//! same.
#![no_main]

libfuzzer_sys::fuzz_target!(|block: &[u8]| {
    criguard::cri::fuzz::header_block(block);
    let (first, second) = block.split_at(block.len() / 2);
    let mut ours = criguard::cri::hpack::Decoder::new();
    let mut theirs = loona_hpack::Decoder::new();
    for part in [first, second] {
        let Ok(want) = theirs.decode(part) else { break };
        let mut got = Vec::new();
        ours.decode(part, |n, v| got.push((n.to_vec(), v.to_vec())))
            .expect("loona-hpack read this block");
        assert_eq!(got, want);
    }
});
