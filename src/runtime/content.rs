//! containerd's content service (`containerd.services.content.v1.Content`):
//! the image blobs of one namespace as containerd's metadata store lists them.
//!
//! criguard's node usage counts the content store on disk by walking
//! `<containerd root>/io.containerd.content.v1.content/blobs`
//! (`signals::usage`), and keeps doing so: the walk answers what imagefs
//! pressure needs — allocated bytes and inodes of every namespace's blobs —
//! while `List` answers logical sizes of one namespace's blobs and no
//! inodes, and `benches/content.rs` measures the walk faster. `List` is the
//! fallback when containerd's root cannot be read from where criguard runs:
//! the image store is then counted as containerd sees it rather than not at
//! all (one inode per blob).

use containerd_client::services::v1::ListContentRequest;
use containerd_client::services::v1::content_client::ContentClient;
use tonic::transport::Channel;

use super::{MAX_MESSAGE, namespaced};

/// The blobs of a namespace, as the content service lists them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContentUsage {
    /// Sum of the blobs' sizes (logical bytes, not allocated blocks).
    pub bytes: u64,
    /// Number of blobs.
    pub blobs: u64,
}

/// Why the content store could not be listed.
#[derive(Debug, thiserror::Error)]
#[error("content List in namespace {namespace}: {status}")]
pub struct ContentError {
    /// The namespace asked.
    pub namespace: String,
    /// containerd's answer.
    pub status: tonic::Status,
}

/// A client of containerd's content service for one namespace.
#[derive(Clone, Debug)]
pub struct Content {
    channel: Channel,
    namespace: String,
}

impl Content {
    /// A client over `channel` (containerd's socket) for `namespace`.
    pub fn new(channel: Channel, namespace: &str) -> Self {
        Self {
            channel,
            namespace: namespace.to_owned(),
        }
    }

    /// Sizes and count of every blob in the namespace (`List`, streamed in chunks).
    pub async fn usage(&self) -> Result<ContentUsage, ContentError> {
        let err = |status| ContentError {
            namespace: self.namespace.clone(),
            status,
        };
        let req = namespaced(ListContentRequest { filters: vec![] }, &self.namespace);
        let mut client =
            ContentClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE);
        let mut stream = super::bounded("Content.List", super::CALL_DEADLINE, client.list(req))
            .await
            .map_err(err)?
            .into_inner();
        let mut total = ContentUsage::default();
        while let Some(chunk) = stream.message().await.map_err(err)? {
            for info in chunk.info {
                total.bytes += info.size.max(0) as u64;
                total.blobs += 1;
            }
        }
        Ok(total)
    }
}
