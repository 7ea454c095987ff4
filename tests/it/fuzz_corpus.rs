//! Replays the fuzz corpus (`fuzz/corpus/`, grown by `hack/fuzz.sh`) and a
//! set of hand-built exchanges through the same entry points the fuzz
//! targets use: the relay must not panic nor queue beyond its bounds on any
//! input found so far.
//!
//! `CRIGUARD_WRITE_SEEDS=DIR` also writes the hand-built exchanges to
//! `DIR/relay/` and `DIR/header_block/`, the fuzzer's starting corpus.

use std::path::{Path, PathBuf};

use criguard::cri::{frame, fuzz};
use criguard::intercept::fuzz_observer;
use k8s_cri::v1 as cri;
use prost::Message;

fn step(script: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    script.push(tag);
    script.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    script.extend_from_slice(bytes);
}

fn grpc(msg: &[u8]) -> Vec<u8> {
    let mut v = vec![0];
    v.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    v.extend_from_slice(msg);
    v
}

fn pod() -> criguard_test_kit::kubelet::PodSpec {
    let mut pod = criguard_test_kit::kubelet::PodSpec::new("p", "uid-1").container(
        criguard_test_kit::kubelet::ContainerSpec {
            name: "app".into(),
            image: "busybox".into(),
            ..Default::default()
        },
    );
    pod.cgroup_root = "/kubepods".into();
    pod
}

/// Client and runtime sides of a few calls: an unobserved one, a patched
/// CreateContainer split over frames, a refused RunPodSandbox, with the
/// runtime's SETTINGS, credit and answers.
fn seeds() -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut client = loona_hpack::Encoder::new();
    let mut server = loona_hpack::Encoder::new();
    let mut req = |path: &str| {
        client.encode([
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", path.as_bytes()),
            (b":authority", b"/run/criguard/criguard.sock"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ])
    };
    let blocks_req = [
        req("/runtime.v1.RuntimeService/Version"),
        req("/runtime.v1.RuntimeService/CreateContainer"),
        req("/runtime.v1.RuntimeService/RunPodSandbox"),
    ];
    let resp = server.encode([
        (&b":status"[..], &b"200"[..]),
        (b"content-type", b"application/grpc"),
    ]);
    let trailers = server.encode([(&b"grpc-status"[..], &b"0"[..])]);
    let pod = pod();
    let create = grpc(
        &cri::CreateContainerRequest {
            pod_sandbox_id: "sb1".into(),
            config: Some(pod.container_config(0)),
            sandbox_config: Some(pod.sandbox_config()),
        }
        .encode_to_vec(),
    );
    let run = grpc(
        &cri::RunPodSandboxRequest {
            config: Some(pod.sandbox_config()),
            runtime_handler: String::new(),
        }
        .encode_to_vec(),
    );
    use frame::{flag, kind};
    let h = |stream, block: &[u8], end: bool| {
        let flags = flag::END_HEADERS | if end { flag::END_STREAM } else { 0 };
        frame::build(kind::HEADERS, flags, stream, block).to_vec()
    };
    let d = |stream, payload: &[u8], end: bool| {
        frame::build(
            kind::DATA,
            if end { flag::END_STREAM } else { 0 },
            stream,
            payload,
        )
        .to_vec()
    };
    let mut s = Vec::new();
    step(&mut s, 0, &frame::build(kind::SETTINGS, 0, 0, &[]));
    step(
        &mut s,
        1,
        &frame::build(kind::SETTINGS, 0, 0, &[0, 4, 0, 0, 0x10, 0]),
    );
    step(
        &mut s,
        0,
        &[h(1, &blocks_req[0], false), d(1, &grpc(b"v"), true)].concat(),
    );
    step(
        &mut s,
        1,
        &[
            h(1, &resp, false),
            d(1, &grpc(b"ok"), false),
            h(1, &trailers, true),
        ]
        .concat(),
    );
    let (a, b) = create.split_at(create.len() / 2);
    step(
        &mut s,
        0,
        &[h(3, &blocks_req[1], false), d(3, a, false)].concat(),
    );
    step(&mut s, 2, &[]);
    step(&mut s, 0, &d(3, b, true));
    step(&mut s, 1, &frame::window_update(0, 40_000));
    step(
        &mut s,
        1,
        &[
            h(3, &resp, false),
            d(3, &grpc(b"\x0a\x02c1"), false),
            h(3, &trailers, true),
        ]
        .concat(),
    );
    step(
        &mut s,
        0,
        &[h(5, &blocks_req[2], false), d(5, &run, true)].concat(),
    );
    step(&mut s, 4, &[]);
    step(&mut s, 3, &[]);
    step(&mut s, 0, &frame::rst_stream(7, 8));
    (
        vec![s],
        blocks_req
            .iter()
            .chain([&resp, &trailers])
            .cloned()
            .collect(),
    )
}

fn files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}

#[test]
fn the_relay_survives_every_input_found_so_far() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let (relay_seeds, block_seeds) = seeds();
    if let Ok(dir) = std::env::var("CRIGUARD_WRITE_SEEDS") {
        for (sub, seeds) in [("relay", &relay_seeds), ("header_block", &block_seeds)] {
            let d = Path::new(&dir).join(sub);
            std::fs::create_dir_all(&d).unwrap();
            for (i, s) in seeds.iter().enumerate() {
                std::fs::write(d.join(format!("seed-{i}")), s).unwrap();
            }
        }
    }
    let relay_files = files(&corpus.join("relay"));
    let block_files = files(&corpus.join("header_block"));
    assert!(
        !relay_files.is_empty() && !block_files.is_empty(),
        "the committed corpus is missing under {}",
        corpus.display()
    );
    for s in &relay_seeds {
        fuzz::relay(fuzz_observer(), s);
    }
    for s in &block_seeds {
        fuzz::header_block(s);
    }
    for f in relay_files {
        fuzz::relay(fuzz_observer(), &std::fs::read(&f).unwrap());
    }
    for f in block_files {
        fuzz::header_block(&std::fs::read(&f).unwrap());
    }
}

/// Every header block of the corpus, read by criguard's HPACK decoder and
/// by loona-hpack on one context each: whatever loona-hpack accepts, ours
/// reads the same fields (the fuzz target `header_block` checks the same).
#[test]
fn the_hpack_decoder_reads_the_corpus_like_loona_hpack() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/header_block");
    let (_, seeds) = seeds();
    let blocks: Vec<Vec<u8>> = files(&corpus)
        .iter()
        .map(|f| std::fs::read(f).unwrap())
        .chain(seeds)
        .collect();
    let mut compared = 0;
    for block in &blocks {
        let (first, second) = block.split_at(block.len() / 2);
        let mut ours = criguard::cri::hpack::Decoder::new();
        let mut theirs = loona_hpack::Decoder::new();
        for part in [first, second] {
            let Ok(want) = theirs.decode(part) else { break };
            let mut got = Vec::new();
            ours.decode(part, |n, v| got.push((n.to_vec(), v.to_vec())))
                .unwrap_or_else(|e| panic!("{e:?} on a block loona-hpack reads: {part:02x?}"));
            assert_eq!(got, want, "{part:02x?}");
            compared += 1;
        }
    }
    assert!(compared > 50, "only {compared} blocks compared");
}
