//! One NRI plugin connection: the trunk ([`super::mux`]) over a unix
//! socket, the plugin's ttRPC server on [`PLUGIN_CONN`] (the runtime's
//! calls, each answered by a [`Handler`]) and its client on
//! [`RUNTIME_CONN`] ([`Client::call`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

use super::mux::{self, Demux, PLUGIN_CONN, RUNTIME_CONN};
use super::ttrpc::{Decoder, Frame, FrameError, Kind, Request, Response, Status};

/// What answers the runtime's calls.
pub trait Handler: Send + Sync + 'static {
    /// The answer to `service`/`method` with the encoded request `payload`.
    fn call(
        &self,
        service: &str,
        method: &str,
        payload: &[u8],
    ) -> impl Future<Output = Response> + Send;
}

/// Why a call to the runtime failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The runtime answered with an error.
    #[error("{method}: the runtime answered code {} ({})", .status.code, .status.message)]
    Status {
        /// The method called.
        method: String,
        /// Its answer.
        status: Status,
    },
    /// No answer within the time allowed.
    #[error("{method}: no answer within {timeout:?}")]
    Timeout {
        /// The method called.
        method: String,
        /// The time allowed.
        timeout: Duration,
    },
    /// The connection closed first.
    #[error("{method}: the NRI connection closed")]
    Closed {
        /// The method called.
        method: String,
    },
    /// The request could not be framed.
    #[error("{method}: {source}")]
    Frame {
        /// The method called.
        method: String,
        /// Why.
        source: FrameError,
    },
}

type Pending = Arc<Mutex<HashMap<u32, oneshot::Sender<Response>>>>;

/// The plugin's side of calls to the runtime.
#[derive(Clone, Debug)]
pub struct Client {
    out: mpsc::UnboundedSender<Vec<u8>>,
    pending: Pending,
    next: Arc<AtomicU32>,
}

impl Client {
    /// Calls `service`/`method` with `msg`; the encoded answer.
    pub async fn call(
        &self,
        service: &str,
        method: &str,
        msg: &impl Message,
        timeout: Duration,
    ) -> Result<Vec<u8>, CallError> {
        let name = || method.to_owned();
        // Odd and rising, as a ttRPC caller's stream ids must be.
        let stream = self.next.fetch_add(2, Ordering::Relaxed);
        let req = Request {
            service: service.to_owned(),
            method: method.to_owned(),
            payload: msg.encode_to_vec(),
            timeout_nano: timeout.as_nanos().min(i64::MAX as u128) as i64,
            metadata: Vec::new(),
        };
        let frame = Frame {
            stream,
            kind: Kind::Request,
            flags: 0,
            data: req.encode_to_vec(),
        };
        let wire = frame.encode().map_err(|source| CallError::Frame {
            method: name(),
            source,
        })?;
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(stream, tx);
        let closed = || CallError::Closed { method: name() };
        if self.out.send(mux::encode(RUNTIME_CONN, &wire)).is_err() {
            lock(&self.pending).remove(&stream);
            return Err(closed());
        }
        let answer = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => return Err(closed()),
            Err(_) => {
                lock(&self.pending).remove(&stream);
                return Err(CallError::Timeout {
                    method: name(),
                    timeout,
                });
            }
        };
        answer.into_result().map_err(|status| CallError::Status {
            method: name(),
            status,
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Serves `handler` on `stream` until the runtime closes it (`Ok`) or it
/// fails; `ready` gets the client for calls to the runtime once the
/// connection is served (so that a call made before the runtime's first
/// call cannot miss it).
pub async fn serve(
    stream: UnixStream,
    handler: Arc<impl Handler>,
    ready: oneshot::Sender<Client>,
) -> std::io::Result<()> {
    let (mut rd, mut wr) = stream.into_split();
    let (out, mut outq) = mpsc::unbounded_channel::<Vec<u8>>();
    let pending: Pending = Arc::default();
    let client = Client {
        out: out.clone(),
        pending: pending.clone(),
        next: Arc::new(AtomicU32::new(1)),
    };
    let writer = async move {
        while let Some(bytes) = outq.recv().await {
            wr.write_all(&bytes).await?;
        }
        std::io::Result::Ok(())
    };
    let _ = ready.send(client);
    let waiting = pending.clone();
    let reader = async move {
        let mut demux = Demux::default();
        let (mut calls, mut answers) = (Decoder::default(), Decoder::default());
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = rd.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            demux.push(&buf[..n]);
            while let Some((conn, payload)) = demux.next_frame().map_err(invalid)? {
                match conn {
                    PLUGIN_CONN => {
                        calls.push(&payload);
                        answer_calls(&mut calls, &handler, &out);
                    }
                    RUNTIME_CONN => {
                        answers.push(&payload);
                        take_answers(&mut answers, &pending);
                    }
                    other => {
                        tracing::debug!(conn = other, "NRI frame on an unknown connection dropped")
                    }
                }
            }
        }
    };
    let result = tokio::select! {
        r = reader => r,
        r = writer => r,
    };
    // Calls still waiting learn that the connection closed.
    lock(&waiting).clear();
    result
}

fn invalid(e: impl std::error::Error + Send + Sync + 'static) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e)
}

/// Starts an answer to each whole call in `calls`; an oversized or
/// undecodable one is answered with an error, never dropped silently.
fn answer_calls(
    calls: &mut Decoder,
    handler: &Arc<impl Handler>,
    out: &mpsc::UnboundedSender<Vec<u8>>,
) {
    loop {
        let (stream, request) = match calls.next_frame() {
            Ok(None) => return,
            Ok(Some(f)) if f.kind == Kind::Request => {
                (f.stream, Request::decode(f.data.as_slice()))
            }
            Ok(Some(f)) => {
                tracing::debug!(stream = f.stream, kind = ?f.kind, "NRI frame other than a call dropped");
                continue;
            }
            Err(e @ FrameError::TooLarge { stream, .. }) => {
                let r = Response::error(tonic::Code::ResourceExhausted, e.to_string());
                respond(out, stream, &r);
                continue;
            }
        };
        let out = out.clone();
        let handler = handler.clone();
        tokio::spawn(async move {
            let answer = match request {
                Ok(req) => handler.call(&req.service, &req.method, &req.payload).await,
                Err(e) => Response::error(
                    tonic::Code::InvalidArgument,
                    format!("undecodable ttRPC request: {e}"),
                ),
            };
            respond(&out, stream, &answer);
        });
    }
}

/// Queues `answer` to the call on `stream`.
fn respond(out: &mpsc::UnboundedSender<Vec<u8>>, stream: u32, answer: &Response) {
    let frame = Frame {
        stream,
        kind: Kind::Response,
        flags: 0,
        data: answer.encode_to_vec(),
    };
    match frame.encode() {
        Ok(wire) => {
            let _ = out.send(mux::encode(PLUGIN_CONN, &wire));
        }
        Err(e) => {
            let r = Response::error(tonic::Code::ResourceExhausted, e.to_string());
            respond(out, stream, &r);
        }
    }
}

/// Hands each whole answer in `answers` to the call waiting on its stream.
fn take_answers(answers: &mut Decoder, pending: &Pending) {
    loop {
        let (stream, answer) = match answers.next_frame() {
            Ok(None) => return,
            Ok(Some(f)) if f.kind == Kind::Response => {
                let answer = Response::decode(f.data.as_slice()).unwrap_or_else(|e| {
                    Response::error(
                        tonic::Code::Internal,
                        format!("undecodable ttRPC answer: {e}"),
                    )
                });
                (f.stream, answer)
            }
            Ok(Some(f)) => {
                tracing::debug!(stream = f.stream, kind = ?f.kind, "NRI frame other than an answer dropped");
                continue;
            }
            Err(e @ FrameError::TooLarge { stream, .. }) => (
                stream,
                Response::error(tonic::Code::ResourceExhausted, e.to_string()),
            ),
        };
        match lock(pending).remove(&stream) {
            Some(tx) => {
                let _ = tx.send(answer);
            }
            None => tracing::debug!(stream, "NRI answer to no waiting call dropped"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nri::api;

    /// Answers Configure with every event; anything else is unknown.
    struct Echo;

    impl Handler for Echo {
        async fn call(&self, service: &str, method: &str, payload: &[u8]) -> Response {
            match (service, method) {
                ("nri.pkg.api.v1alpha1.Plugin", "Configure") => {
                    let req = api::ConfigureRequest::decode(payload).unwrap();
                    assert_eq!(req.runtime_name, "containerd");
                    Response::ok(&api::ConfigureResponse { events: 0x7ff })
                }
                _ => Response::error(tonic::Code::Unimplemented, format!("method {method}")),
            }
        }
    }

    /// The runtime's end: whole ttRPC frames per connection.
    struct Runtime {
        sock: UnixStream,
        demux: Demux,
        streams: [Decoder; 2],
    }

    impl Runtime {
        async fn send(&mut self, conn: u32, kind: Kind, stream: u32, data: Vec<u8>) {
            let f = Frame {
                stream,
                kind,
                flags: 0,
                data,
            };
            let wire = mux::encode(conn, &f.encode().unwrap());
            self.sock.write_all(&wire).await.unwrap();
        }

        async fn recv(&mut self) -> (u32, Frame) {
            let mut buf = [0u8; 1024];
            loop {
                for conn in [PLUGIN_CONN, RUNTIME_CONN] {
                    if let Some(f) = self.streams[conn as usize - 1].next_frame().unwrap() {
                        return (conn, f);
                    }
                }
                if let Some((conn, payload)) = self.demux.next_frame().unwrap() {
                    self.streams[conn as usize - 1].push(&payload);
                    continue;
                }
                let n = self.sock.read(&mut buf).await.unwrap();
                assert!(n > 0, "the plugin closed the connection");
                self.demux.push(&buf[..n]);
            }
        }
    }

    #[tokio::test]
    async fn the_plugin_answers_the_runtimes_calls_and_makes_its_own() {
        let (plugin_end, runtime_end) = UnixStream::pair().unwrap();
        let (tx, rx) = oneshot::channel();
        let served = tokio::spawn(serve(plugin_end, Arc::new(Echo), tx));
        let client = rx.await.unwrap();
        let mut rt = Runtime {
            sock: runtime_end,
            demux: Demux::default(),
            streams: Default::default(),
        };

        // The plugin registers; the runtime calls Configure before it
        // answers, as containerd may.
        let register = api::RegisterPluginRequest {
            plugin_name: "criguard".into(),
            plugin_idx: "10".into(),
            nri_version: String::new(),
        };
        let call = tokio::spawn({
            let client = client.clone();
            async move {
                let service = "nri.pkg.api.v1alpha1.Runtime";
                let t = Duration::from_secs(5);
                client.call(service, "RegisterPlugin", &register, t).await
            }
        });
        let (conn, f) = rt.recv().await;
        assert_eq!((conn, f.kind, f.stream), (RUNTIME_CONN, Kind::Request, 1));
        let req = Request::decode(f.data.as_slice()).unwrap();
        assert_eq!(req.method, "RegisterPlugin");
        let reg = api::RegisterPluginRequest::decode(req.payload.as_slice()).unwrap();
        assert_eq!(
            (reg.plugin_name.as_str(), reg.plugin_idx.as_str()),
            ("criguard", "10")
        );

        let configure = Request {
            service: "nri.pkg.api.v1alpha1.Plugin".into(),
            method: "Configure".into(),
            payload: api::ConfigureRequest {
                runtime_name: "containerd".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            ..Default::default()
        };
        rt.send(PLUGIN_CONN, Kind::Request, 1, configure.encode_to_vec())
            .await;
        let (conn, f) = rt.recv().await;
        assert_eq!((conn, f.kind, f.stream), (PLUGIN_CONN, Kind::Response, 1));
        let answer = Response::decode(f.data.as_slice())
            .unwrap()
            .into_result()
            .unwrap();
        assert_eq!(
            api::ConfigureResponse::decode(answer.as_slice())
                .unwrap()
                .events,
            0x7ff
        );

        // An unknown method gets Unimplemented, which NRI v0.12 relies on.
        let unknown = Request {
            service: "nri.pkg.api.v1alpha1.Plugin".into(),
            method: "Nope".into(),
            ..Default::default()
        };
        rt.send(PLUGIN_CONN, Kind::Request, 3, unknown.encode_to_vec())
            .await;
        let (_, f) = rt.recv().await;
        let status = Response::decode(f.data.as_slice())
            .unwrap()
            .into_result()
            .unwrap_err();
        assert_eq!(status.code, tonic::Code::Unimplemented as i32);

        // The registration's answer reaches the waiting call; a 5000-byte
        // one crosses the trunk in two frames.
        let empty = Response::ok(&api::Empty {});
        rt.send(RUNTIME_CONN, Kind::Response, 1, empty.encode_to_vec())
            .await;
        assert!(call.await.unwrap().is_ok());
        let big = Response::error(tonic::Code::Unknown, "x".repeat(5000));
        let call = tokio::spawn(async move {
            let t = Duration::from_secs(5);
            client
                .call(
                    "nri.pkg.api.v1alpha1.Runtime",
                    "UpdateContainers",
                    &api::Empty {},
                    t,
                )
                .await
        });
        let (_, f) = rt.recv().await;
        assert_eq!(f.stream, 3, "odd and rising");
        rt.send(RUNTIME_CONN, Kind::Response, 3, big.encode_to_vec())
            .await;
        match call.await.unwrap() {
            Err(CallError::Status { status, .. }) => assert_eq!(status.message.len(), 5000),
            other => panic!("{other:?}"),
        }

        // The runtime goes away: serving ends cleanly.
        drop(rt);
        served.await.unwrap().unwrap();
    }
}
