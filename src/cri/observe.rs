//! The calls criguard looks at while forwarding them, as the relay sees
//! them: which methods are observed ([`Method`]), what an observer may ask
//! of a request ([`RequestPlan`]: bytes to append, or a refusal), and the
//! [`Observe`] interface the relay calls. What the calls mean for pods (the
//! node model, admission, the `oom_score_adj` patch) lives on the domain
//! side, in [`crate::intercept`]; the relay knows frames, streams and
//! methods, no pods. Decoding never changes what is forwarded: the only
//! change to any request is an appended patch.

use bytes::{Bytes, BytesMut};

use super::frame::GRPC_PREFIX;

/// The lifecycle methods criguard observes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// RunPodSandbox.
    RunPodSandbox,
    /// CreateContainer (also patched).
    CreateContainer,
    /// StartContainer.
    StartContainer,
    /// StopContainer.
    StopContainer,
    /// RemoveContainer.
    RemoveContainer,
    /// StopPodSandbox.
    StopPodSandbox,
    /// RemovePodSandbox.
    RemovePodSandbox,
    /// UpdateContainerResources (an in-place resize).
    UpdateContainerResources,
}

impl Method {
    /// The observed method at a gRPC path, if it is one (CRI v1 only).
    pub fn from_path(path: &str) -> Option<Self> {
        Some(match path.strip_prefix("/runtime.v1.RuntimeService/")? {
            "RunPodSandbox" => Self::RunPodSandbox,
            "CreateContainer" => Self::CreateContainer,
            "StartContainer" => Self::StartContainer,
            "StopContainer" => Self::StopContainer,
            "RemoveContainer" => Self::RemoveContainer,
            "StopPodSandbox" => Self::StopPodSandbox,
            "RemovePodSandbox" => Self::RemovePodSandbox,
            "UpdateContainerResources" => Self::UpdateContainerResources,
            _ => return None,
        })
    }
}

/// What the observer decided about a request.
#[derive(Debug, Default)]
pub struct RequestPlan {
    /// Bytes to append to the request message, if any.
    pub patch: Option<Vec<u8>>,
    /// Refuse the call with this reason instead of forwarding it (admission).
    pub refuse: Option<String>,
}

/// What the relay asks of the code that watches the calls it forwards.
/// Both calls run on the relay's thread: they must not block (no I/O, no
/// lock held by anyone across I/O). A panic in either is caught and the
/// call forwarded as is.
pub trait Observe: std::fmt::Debug + Send + Sync + 'static {
    /// Looks at a request message before it is forwarded.
    fn on_request(&self, method: Method, msg: &[u8]) -> RequestPlan;
    /// Looks at a successful answer (gRPC status OK) to `req`.
    fn on_response(&self, method: Method, req: &[u8], resp: &[u8]);
}

/// Splits a gRPC body holding exactly one uncompressed message into that
/// message; `None` for anything else (compressed, several, truncated).
pub fn single_message(body: &[u8]) -> Option<&[u8]> {
    let (&flag, rest) = body.split_first()?;
    if flag != 0 || rest.len() < 4 {
        return None;
    }
    let len = u32::from_be_bytes(rest[..4].try_into().ok()?) as usize;
    (rest.len() - 4 == len).then(|| &rest[4..])
}

/// Frames a message (and an optional appended patch) as one gRPC message.
pub fn frame(msg: &[u8], patch: Option<&[u8]>) -> Bytes {
    let len = msg.len() + patch.map_or(0, <[u8]>::len);
    let mut out = BytesMut::with_capacity(len + GRPC_PREFIX);
    out.extend_from_slice(&[0]);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(msg);
    if let Some(p) = patch {
        out.extend_from_slice(p);
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_message_refuses_compressed_and_truncated_bodies() {
        let framed = frame(b"abc", Some(b"de"));
        assert_eq!(single_message(&framed), Some(&b"abcde"[..]));
        let mut compressed = framed.to_vec();
        compressed[0] = 1;
        assert_eq!(single_message(&compressed), None);
        assert_eq!(single_message(&framed[..6]), None);
        assert_eq!(single_message(b""), None);
    }

    #[test]
    fn observed_methods_are_v1_lifecycle_calls_only() {
        assert_eq!(
            Method::from_path("/runtime.v1.RuntimeService/CreateContainer"),
            Some(Method::CreateContainer)
        );
        assert_eq!(
            Method::from_path("/runtime.v1alpha2.RuntimeService/CreateContainer"),
            None
        );
        assert_eq!(
            Method::from_path("/runtime.v1.RuntimeService/ListContainers"),
            None
        );
    }
}
