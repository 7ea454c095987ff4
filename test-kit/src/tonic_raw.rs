//! tonic as a raw-bytes gRPC client over a unix socket, with its own
//! connection (not criguard's `Upstream`), reporting headers and trailers
//! apart the way the helper processes do.

use std::path::Path;
use std::time::Duration;

use bytes::{Buf, BufMut};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};

use super::clients::{Answer, Call, Event};

/// Message bytes as they are, both ways.
#[derive(Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Self::Error> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// One tonic channel (one HTTP/2 connection) to a unix socket.
pub struct RawTonic {
    channel: Channel,
}

/// A lazily dialled channel to `socket`, `:authority` "localhost".
pub fn channel(socket: &Path) -> Channel {
    let path = socket.to_owned();
    Endpoint::from_static("http://localhost").connect_with_connector_lazy(tower::service_fn(
        move |_| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        },
    ))
}

fn pairs(md: &tonic::metadata::MetadataMap) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = md
        .clone()
        .into_headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

impl RawTonic {
    /// A client with its own connection to `socket`.
    pub fn new(socket: &Path) -> Self {
        Self {
            channel: channel(socket),
        }
    }

    /// Starts `call` on a task; events come on the receiver.
    pub fn start(&self, call: Call) -> mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = mpsc::unbounded_channel();
        let channel = self.channel.clone();
        tokio::spawn(async move {
            let answer = run(channel, call, &tx).await;
            let _ = tx.send(Event::Done(answer));
        });
        rx
    }
}

fn failed(status: tonic::Status, msgs: Vec<Vec<u8>>, header: Vec<(String, String)>) -> Answer {
    Answer {
        code: status.code() as i32,
        message: status.message().to_owned(),
        msgs,
        // A trailers-only answer's metadata is its header block.
        trailer: if header.is_empty() {
            vec![]
        } else {
            pairs(status.metadata())
        },
        header: if header.is_empty() {
            pairs(status.metadata())
        } else {
            header
        },
    }
}

async fn run(channel: Channel, call: Call, tx: &mpsc::UnboundedSender<Event>) -> Answer {
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(16 << 20)
        .max_encoding_message_size(16 << 20);
    let mut req = tonic::Request::new(call.req);
    for (k, v) in &call.md {
        let key: tonic::metadata::MetadataKey<tonic::metadata::Ascii> = k.parse().unwrap();
        req.metadata_mut().append(key, v.parse().unwrap());
    }
    req.set_timeout(call.timeout.unwrap_or(Duration::from_secs(30)));
    if let Err(e) = grpc.ready().await {
        return failed(tonic::Status::unavailable(e.to_string()), vec![], vec![]);
    }
    let path = call.method.parse().unwrap();
    // Unary calls go through the streaming path too: it keeps the header
    // block and the trailers apart (tonic's unary merges them).
    let resp = match grpc.server_streaming(req, path, RawCodec).await {
        Ok(r) => r,
        Err(s) => return failed(s, vec![], vec![]),
    };
    let header = pairs(resp.metadata());
    let mut body = resp.into_inner();
    let mut msgs = Vec::new();
    loop {
        match body.message().await {
            Ok(Some(m)) => {
                if call.stream {
                    let _ = tx.send(Event::Msg(m.clone()));
                }
                msgs.push(m);
            }
            Ok(None) => break,
            Err(s) => return failed(s, msgs, header),
        }
    }
    let trailer = match body.trailers().await {
        Ok(t) => t.map(|t| pairs(&t)).unwrap_or_default(),
        Err(s) => return failed(s, msgs, header),
    };
    Answer {
        code: 0,
        message: String::new(),
        msgs,
        header,
        trailer,
    }
}
