//! criguard's admin endpoint: what it knows, for `criguard pods` and scripts.
//!
//! HTTP/1.1 with JSON bodies on a unix socket of its own (mode 0660, like the
//! CRI socket), so that reading criguard's state never competes with the
//! kubelet's calls and needs no gRPC tooling:
//!
//! | path | answer |
//! | --- | --- |
//! | `GET /v1/pods` | the node model, synced with the runtime first |
//! | `GET /v1/evictions` | every eviction since start, oldest first |
//! | `GET /v1/oom-kills` | every kernel OOM kill in a pod since start, oldest first |
//! | `GET /v1/conditions` | node conditions, the last signal observations and when they were read |
//! | `GET /v1/usage` | per-pod disk and process usage, read now (model synced first) |
//! | `GET /v1/rank` | the eviction order for each configured signal, read now (model synced first) |

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};

use crate::config::Signal;
use crate::model::{NodeModel, Pod, sync};
use crate::reclaim::evict::{Eviction, NodeStatus};
use crate::reclaim::oom_kills::{OomKill, OomKills};
use crate::reclaim::rank::{RankEntry, Ranker};
use crate::runtime::Upstream;
use crate::signals::unix_ms;
use crate::signals::usage::{NodeUsage, UsageReader};

/// What the admin endpoint serves from.
#[derive(Clone, Debug)]
pub struct AdminState {
    /// The live model.
    pub model: Arc<RwLock<NodeModel>>,
    /// The runtime, to sync before answering.
    pub upstream: Upstream,
    /// Conditions and evictions.
    pub status: Arc<RwLock<NodeStatus>>,
    /// Per-pod usage, read on request.
    pub usage: UsageReader,
    /// Eviction orders, read on request.
    pub ranker: Ranker,
    /// The signals with a threshold, which `/v1/rank` ranks for.
    pub rank_signals: Vec<Signal>,
    /// Kernel OOM kills recorded from containerd's events.
    pub oom_kills: OomKills,
}

fn json<T: serde::Serialize>(status: http::StatusCode, value: &T) -> http::Response<Full<Bytes>> {
    let body = serde_json::to_vec_pretty(value)
        .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}").into_bytes());
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts")
}

async fn handle(
    state: AdminState,
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    Ok(match (req.method(), req.uri().path()) {
        (&http::Method::GET, "/v1/pods") => {
            // Fresh: states change without passing criguard (a container exits).
            if let Err(err) = sync::sync(&state.model, &state.upstream).await {
                tracing::warn!(%err, "sync before /v1/pods failed; answering from the model as it is");
            }
            let pods = state.model.read().unwrap_or_else(|e| e.into_inner()).pods();
            json(http::StatusCode::OK, &pods)
        }
        (&http::Method::GET, "/v1/usage") => {
            if let Err(err) = sync::sync(&state.model, &state.upstream).await {
                tracing::warn!(%err, "sync before /v1/usage failed; answering from the model as it is");
            }
            let pods = state.model.read().unwrap_or_else(|e| e.into_inner()).pods();
            json(http::StatusCode::OK, &state.usage.read(pods).await)
        }
        (&http::Method::GET, "/v1/rank") => {
            if let Err(err) = sync::sync(&state.model, &state.upstream).await {
                tracing::warn!(%err, "sync before /v1/rank failed; answering from the model as it is");
            }
            json(
                http::StatusCode::OK,
                &state.ranker.report(&state.rank_signals).await,
            )
        }
        (&http::Method::GET, "/v1/evictions") => {
            let st = state.status.read().unwrap_or_else(|e| e.into_inner());
            json(http::StatusCode::OK, &st.evictions)
        }
        (&http::Method::GET, "/v1/oom-kills") => {
            json(http::StatusCode::OK, &state.oom_kills.list())
        }
        (&http::Method::GET, "/v1/conditions") => {
            let st = state.status.read().unwrap_or_else(|e| e.into_inner());
            let observations: std::collections::BTreeMap<String, (i64, u64)> = st
                .observations
                .iter()
                .flat_map(|o| &o.signals)
                .map(|(s, o)| (s.to_string(), (o.available, o.capacity)))
                .collect();
            let observed_at = st.observations.as_ref().map(|o| unix_ms(o.at));
            json(
                http::StatusCode::OK,
                &serde_json::json!({
                    "conditions": st.conditions.iter().map(|c| format!("{c:?}")).collect::<Vec<_>>(),
                    "observations": observations,
                    "observed_at_unix_ms": observed_at,
                }),
            )
        }
        (_, path) => json(
            http::StatusCode::NOT_FOUND,
            &serde_json::json!({ "error": format!("no such path {path}") }),
        ),
    })
}

/// Serves the admin endpoint on `listener` until `shutdown` resolves.
pub async fn serve(listener: UnixListener, state: AdminState, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let state = state.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| handle(state.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            () = &mut shutdown => return,
        }
    }
}

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
    /// The HTTP exchange failed.
    #[error("admin socket: {0}")]
    Http(#[from] hyper::Error),
    /// The answer was not the JSON expected.
    #[error("admin socket: unexpected answer: {0}")]
    Decode(#[from] serde_json::Error),
}

/// `GET /v1/pods` from a running criguard.
pub async fn get_pods(socket: &Path) -> Result<Vec<Pod>, ClientError> {
    get(socket, "/v1/pods").await
}

/// `GET /v1/evictions` from a running criguard.
pub async fn get_evictions(socket: &Path) -> Result<Vec<Eviction>, ClientError> {
    get(socket, "/v1/evictions").await
}

/// `GET /v1/oom-kills` from a running criguard.
pub async fn get_oom_kills(socket: &Path) -> Result<Vec<OomKill>, ClientError> {
    get(socket, "/v1/oom-kills").await
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

/// Both lists from a running criguard.
pub async fn get_evictions_report(socket: &Path) -> Result<EvictionsReport, ClientError> {
    Ok(EvictionsReport {
        evictions: get_evictions(socket).await?,
        kernel_oom_kills: get_oom_kills(socket).await?,
    })
}

/// The report as lines for people: evictions, then kernel OOM kills.
pub fn evictions_text(r: &EvictionsReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for e in &r.evictions {
        let dry = if e.dry_run { " (dry run)" } else { "" };
        let _ = writeln!(
            out,
            "{} {} [{}]{dry}: {}",
            e.at_unix_ms, e.pod, e.threshold, e.message
        );
    }
    for k in &r.kernel_oom_kills {
        let first = k.first_ranked.as_deref().unwrap_or("none");
        let matched = if k.matched_rank {
            "criguard's first-ranked pod"
        } else {
            "not criguard's first-ranked pod"
        };
        let _ = writeln!(
            out,
            "{} {} [kernel OOM kill] container {} ({:?}), {} process(es): {matched} (first ranked: {first})",
            k.at_unix_ms, k.pod, k.container, k.qos, k.kills
        );
    }
    out
}

/// `GET /v1/usage` from a running criguard.
pub async fn get_usage(socket: &Path) -> Result<NodeUsage, ClientError> {
    get(socket, "/v1/usage").await
}

/// `GET /v1/rank` from a running criguard.
pub async fn get_rank(socket: &Path) -> Result<Vec<RankEntry>, ClientError> {
    get(socket, "/v1/rank").await
}

/// The ranking as a table: one line per pod and signal, first victim first.
pub fn rank_table(entries: &[RankEntry]) -> String {
    let mut out = format!(
        "{:<28} {:>4}  {:<40} {:<10} {:>9} {:>12} {:>12}\n",
        "SIGNAL", "RANK", "POD", "QOS", "PRIORITY", "USAGE", "REQUEST"
    );
    for e in entries {
        let bytes = Signal::parse(&e.signal).is_some_and(|s| s.is_bytes());
        let show = |v: i64| {
            if bytes {
                crate::quantity::format_bytes(v.max(0) as u64)
            } else {
                v.to_string()
            }
        };
        out.push_str(&format!(
            "{:<28} {:>4}  {:<40} {:<10} {:>9} {:>12} {:>12}\n",
            e.signal,
            e.rank,
            e.pod,
            e.qos,
            e.priority,
            e.usage.map_or("?".to_owned(), show),
            show(e.request)
        ));
    }
    out
}

/// `GET /v1/conditions` from a running criguard, as JSON.
pub async fn get_conditions(socket: &Path) -> Result<serde_json::Value, ClientError> {
    get(socket, "/v1/conditions").await
}

async fn get<T: serde::de::DeserializeOwned>(socket: &Path, path: &str) -> Result<T, ClientError> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|source| ClientError::Connect {
            path: socket.display().to_string(),
            source,
        })?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", "criguard")
        .body(Full::new(Bytes::new()))
        .expect("static request parts");
    let body = send
        .send_request(req)
        .await?
        .into_body()
        .collect()
        .await?
        .to_bytes();
    Ok(serde_json::from_slice(&body)?)
}

/// The model as a table for people.
pub fn pods_table(pods: &[Pod]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<30} {:<11} {:>9} {:<8} {:<9} {:<13} {:<16} {:<9} {:>9} {:>9} {:>5}",
        "NAMESPACE/POD",
        "QOS",
        "PRIORITY",
        "CRITICAL",
        "STATE",
        "SANDBOX",
        "CONTAINER",
        "C-STATE",
        "MEM-REQ",
        "MEM-LIM",
        "OOM"
    );
    for p in pods {
        let pod = format!("{}/{}", p.namespace, p.name);
        let crit = if p.critical { "yes" } else { "no" };
        let head = format!(
            "{pod:<30} {:<11} {:>9} {crit:<8} {:<9} {:<13}",
            format!("{:?}", p.qos),
            p.priority,
            format!("{:?}", p.state),
            p.sandbox_id.get(..12).unwrap_or(&p.sandbox_id),
        );
        if p.containers.is_empty() {
            let _ = writeln!(out, "{head}");
        }
        for c in p.containers.values() {
            let _ = writeln!(
                out,
                "{head} {:<16} {:<9} {:>9} {:>9} {:>5}",
                c.name,
                format!("{:?}", c.state),
                mib(c.memory_request),
                mib(c.memory_limit),
                c.oom_score_adj
            );
        }
    }
    out
}

fn mib(bytes: i64) -> String {
    if bytes <= 0 {
        "-".into()
    } else {
        format!("{}Mi", bytes >> 20)
    }
}

/// Per-pod usage as a table for people: one line per pod, then the node's
/// filesystems and image store.
pub fn usage_table(u: &NodeUsage) -> String {
    use crate::quantity::format_bytes;
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<36} {:>10} {:>8} {:>10} {:>8} {:>10} {:>8} {:>6}",
        "NAMESPACE/POD", "ROOTFS", "INODES", "LOGS", "INODES", "VOLUMES", "INODES", "PROCS"
    );
    for p in &u.pods {
        let procs = p.processes.map_or("-".into(), |n| n.to_string());
        let _ = writeln!(
            out,
            "{:<36} {:>10} {:>8} {:>10} {:>8} {:>10} {:>8} {:>6}",
            format!("{}/{}", p.namespace, p.name),
            format_bytes(p.rootfs.bytes),
            p.rootfs.inodes,
            format_bytes(p.logs.bytes),
            p.logs.inodes,
            format_bytes(p.volumes.bytes),
            p.volumes.inodes,
            procs
        );
        for e in &p.errors {
            let _ = writeln!(out, "  not read: {e}");
        }
    }
    for (name, fs) in [("nodefs", u.nodefs), ("imagefs", u.imagefs)] {
        if let Some(fs) = fs {
            let _ = writeln!(
                out,
                "{name}: {} of {} available, {} of {} inodes free",
                format_bytes(fs.available),
                format_bytes(fs.capacity),
                fs.inodes_free,
                fs.inodes
            );
        }
    }
    let _ = writeln!(
        out,
        "dedicated imagefs: {}; image content store: {}; read in {} µs",
        if u.dedicated_imagefs { "yes" } else { "no" },
        u.images.map_or("-".into(), |i| format!(
            "{} in {} inodes",
            format_bytes(i.bytes),
            i.inodes
        )),
        u.read_us
    );
    out
}
