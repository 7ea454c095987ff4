//! CRI answers decoded for comparison: containerd encodes map fields in a
//! random order, so two equal answers can differ byte for byte; decoded,
//! they compare equal whatever the order. Times that legitimately differ
//! between two runs are zeroed.

use k8s_cri::v1 as cri;
use prost::Message;

use crate::common::clients::Answer;

/// Header or trailer metadata as a client shows it.
pub type Meta = Vec<(String, String)>;

/// An answer decoded, with the times that differ between runs zeroed.
#[derive(Debug, PartialEq)]
#[allow(clippy::large_enum_variant)] // a few dozen per test, compared once
pub enum Decoded {
    /// A failed call: code and message.
    Error(i32, String),
    /// Version.
    Version(cri::VersionResponse),
    /// Status.
    Status(cri::StatusResponse),
    /// ListImages, sorted by image id.
    Images(Vec<cri::Image>),
    /// ImageStatus.
    ImageStatus(cri::ImageStatusResponse),
    /// RunPodSandbox.
    RunPodSandbox(cri::RunPodSandboxResponse),
    /// CreateContainer.
    CreateContainer(cri::CreateContainerResponse),
    /// PodSandboxStatus, creation time zeroed.
    PodSandboxStatus(cri::PodSandboxStatusResponse),
    /// ListPodSandbox, creation times zeroed.
    ListPodSandbox(cri::ListPodSandboxResponse),
    /// ContainerStatus, times zeroed.
    ContainerStatus(cri::ContainerStatusResponse),
    /// ListContainers, creation times zeroed.
    ListContainers(cri::ListContainersResponse),
    /// ExecSync.
    ExecSync(cri::ExecSyncResponse),
    /// Empty answers (Start/Stop/Remove), streams: the message bytes.
    Raw(Vec<Vec<u8>>),
}

/// `a` decoded as `method`'s answer, with its metadata.
pub fn decode(method: &str, a: &Answer) -> (Decoded, Meta, Meta) {
    let meta = (a.header.clone(), a.trailer.clone());
    if a.code != 0 {
        return (Decoded::Error(a.code, a.message.clone()), meta.0, meta.1);
    }
    let m = a.msgs.first().map(Vec::as_slice).unwrap_or_default();
    let name = method.rsplit('/').next().unwrap();
    let d = match name {
        "Version" => Decoded::Version(Message::decode(m).unwrap()),
        "Status" => Decoded::Status(Message::decode(m).unwrap()),
        "ListImages" => {
            let mut l = cri::ListImagesResponse::decode(m).unwrap().images;
            l.sort_by(|a, b| a.id.cmp(&b.id));
            Decoded::Images(l)
        }
        "ImageStatus" => Decoded::ImageStatus(Message::decode(m).unwrap()),
        "RunPodSandbox" => Decoded::RunPodSandbox(Message::decode(m).unwrap()),
        "CreateContainer" => Decoded::CreateContainer(Message::decode(m).unwrap()),
        "PodSandboxStatus" => {
            let mut r = cri::PodSandboxStatusResponse::decode(m).unwrap();
            if let Some(s) = r.status.as_mut() {
                s.created_at = 0;
            }
            Decoded::PodSandboxStatus(r)
        }
        "ListPodSandbox" => {
            let mut r = cri::ListPodSandboxResponse::decode(m).unwrap();
            r.items.iter_mut().for_each(|s| s.created_at = 0);
            Decoded::ListPodSandbox(r)
        }
        "ContainerStatus" => {
            let mut r = cri::ContainerStatusResponse::decode(m).unwrap();
            if let Some(s) = r.status.as_mut() {
                (s.created_at, s.started_at, s.finished_at) = (0, 0, 0);
            }
            Decoded::ContainerStatus(r)
        }
        "ListContainers" => {
            let mut r = cri::ListContainersResponse::decode(m).unwrap();
            r.containers.iter_mut().for_each(|c| c.created_at = 0);
            Decoded::ListContainers(r)
        }
        "ExecSync" => Decoded::ExecSync(Message::decode(m).unwrap()),
        _ => Decoded::Raw(a.msgs.clone()),
    };
    (d, meta.0, meta.1)
}

/// Replaces every occurrence of `from` in `bytes` by `to` (same length, so
/// protobuf lengths stay right).
pub fn replace(bytes: &mut [u8], from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let mut i = 0;
    while i + from.len() <= bytes.len() {
        if &bytes[i..i + from.len()] == from {
            bytes[i..i + from.len()].copy_from_slice(to);
            i += from.len();
        } else {
            i += 1;
        }
    }
}
