//! The admin API's client: what `criguard pods|evictions|rank|usage` and
//! the tests call. Each function dials the socket, makes one call and
//! hands back criguard's own types ([`super::convert`]).

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::lock::Locked;
use futures::{Stream, StreamExt};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

use super::convert::{ConditionsReport, ConvertError};
use super::pb;
use super::pb::admin_client::AdminClient;
use crate::eviction::Eviction;
use crate::eviction::rank::{NotRanked, RankEntry};
use crate::model::Pod;
use crate::oom::kills::OomKill;
use crate::runtime::MAX_MESSAGE;
use crate::signals::usage::NodeUsage;

/// Errors from asking a running criguard.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached.
    #[error("admin socket {path}: {source} (is `criguard serve` running?)")]
    Connect {
        /// The socket path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The HTTP/2 connection could not be set up.
    #[error("admin socket: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The call failed.
    #[error("admin socket: {0}")]
    Call(#[from] tonic::Status),
    /// The answer holds what this version cannot read.
    #[error("admin socket: unexpected answer: {0}")]
    Decode(#[from] ConvertError),
}

/// The process serving the admin API on `socket` (0: a criguard too old to
/// say).
pub async fn serving_pid(socket: &Path) -> Result<u32, ClientError> {
    let mut c = connect(socket).await?;
    let r = c.status(pb::StatusRequest {}).await?.into_inner();
    Ok(r.pid)
}

/// A client of the admin API on `socket`, connected.
pub async fn connect(socket: &Path) -> Result<AdminClient<Channel>, ClientError> {
    // Dialled here first, so that a missing socket is named in the error.
    let first = UnixStream::connect(socket)
        .await
        .map_err(|source| ClientError::Connect {
            path: socket.display().to_string(),
            source,
        })?;
    let first = Arc::new(Mutex::new(Some(first)));
    let path = socket.to_owned();
    // The URI is a placeholder: the connector dials the socket.
    let channel = Endpoint::from_static("http://criguard.admin")
        .connect_with_connector(tower::service_fn(move |_| {
            let (first, path) = (first.clone(), path.clone());
            async move {
                let taken = first.locked().take();
                let stream = match taken {
                    Some(s) => s,
                    None => UnixStream::connect(path).await?,
                };
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await?;
    Ok(AdminClient::new(channel).max_decoding_message_size(MAX_MESSAGE))
}

/// `Pods`: the node model of a running criguard.
pub async fn get_pods(socket: &Path) -> Result<Vec<Pod>, ClientError> {
    let r = connect(socket).await?.pods(pb::PodsRequest {}).await?;
    let pods = r.into_inner().pods.into_iter().map(Pod::try_from);
    Ok(pods.collect::<Result<_, _>>()?)
}

/// `Evictions`: every eviction a running criguard made, oldest first.
pub async fn get_evictions(socket: &Path) -> Result<Vec<Eviction>, ClientError> {
    let r = connect(socket)
        .await?
        .evictions(pb::EvictionsRequest {})
        .await?;
    Ok(r.into_inner()
        .evictions
        .into_iter()
        .map(Into::into)
        .collect())
}

/// `KernelOomKills`: every kernel OOM kill in a pod a running criguard
/// recorded, oldest first.
pub async fn get_oom_kills(socket: &Path) -> Result<Vec<OomKill>, ClientError> {
    let r = connect(socket)
        .await?
        .kernel_oom_kills(pb::KernelOomKillsRequest {})
        .await?;
    let kills = r.into_inner().kills.into_iter().map(OomKill::try_from);
    Ok(kills.collect::<Result<_, _>>()?)
}

/// What `criguard evictions` shows: criguard's evictions and the kernel's
/// OOM kills in pods (`--json` prints this object).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvictionsReport {
    /// criguard's evictions, oldest first.
    pub evictions: Vec<Eviction>,
    /// The kernel's OOM kills in pods, oldest first.
    pub kernel_oom_kills: Vec<OomKill>,
}

/// `Evictions` and `KernelOomKills` of a running criguard.
pub async fn get_evictions_report(socket: &Path) -> Result<EvictionsReport, ClientError> {
    Ok(EvictionsReport {
        evictions: get_evictions(socket).await?,
        kernel_oom_kills: get_oom_kills(socket).await?,
    })
}

/// `Usage`: per-pod usage, read now.
pub async fn get_usage(socket: &Path) -> Result<NodeUsage, ClientError> {
    let r = connect(socket).await?.usage(pb::UsageRequest {}).await?;
    Ok(r.into_inner().into())
}

/// `Rank`: the eviction order for each ranked signal, now.
pub async fn get_rank(socket: &Path) -> Result<Vec<RankEntry>, ClientError> {
    Ok(get_rank_report(socket).await?.0)
}

/// `Rank`: the eviction order for each ranked signal, now, and the disk
/// signals left unranked because they are far from their thresholds.
pub async fn get_rank_report(
    socket: &Path,
) -> Result<(Vec<RankEntry>, Vec<NotRanked>), ClientError> {
    let r = connect(socket).await?.rank(pb::RankRequest {}).await?;
    let r = r.into_inner();
    Ok((
        r.entries.into_iter().map(Into::into).collect(),
        r.not_ranked.into_iter().map(Into::into).collect(),
    ))
}

/// `Conditions`: node conditions and the last observations.
pub async fn get_conditions(socket: &Path) -> Result<ConditionsReport, ClientError> {
    let r = connect(socket)
        .await?
        .conditions(pb::ConditionsRequest {})
        .await?;
    Ok(r.into_inner().try_into()?)
}

/// `WatchEvictions`: each eviction as criguard makes it (with `replay`,
/// the earlier ones first); ends when criguard stops.
pub async fn watch_evictions(
    socket: &Path,
    replay: bool,
) -> Result<impl Stream<Item = Result<Eviction, ClientError>> + use<>, ClientError> {
    let r = connect(socket)
        .await?
        .watch_evictions(pb::WatchEvictionsRequest { replay })
        .await?;
    Ok(r.into_inner()
        .map(|e| e.map(Eviction::from).map_err(ClientError::from)))
}
