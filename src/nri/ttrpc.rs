//! ttRPC, the RPC protocol NRI speaks (`containerd/ttrpc`, `PROTOCOL.md`):
//! frames of a 10-byte header and up to 4 MiB of data over a byte stream,
//! a protobuf `Request` or `Response` in each, calls told apart by stream
//! id (odd, rising, chosen by the caller). NRI uses unary calls only, so
//! the streaming frames (`Data`) are recognised and refused.
//!
//! Pure codecs: bytes in, frames out, and back; the I/O is in [`super::conn`].

/// The header: data length, stream id (both big-endian u32), type, flags.
pub const HEADER_LEN: usize = 10;
/// The largest data a frame may carry; a longer frame is refused and its
/// bytes skipped, as the Go implementation does.
pub const MAX_DATA: usize = 4 << 20;

/// A frame's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A call.
    Request,
    /// Its answer, on the same stream id.
    Response,
    /// Streaming data (not used by NRI).
    Data,
    /// A type this codec does not know.
    Other(u8),
}

impl Kind {
    fn from_byte(b: u8) -> Self {
        match b {
            1 => Kind::Request,
            2 => Kind::Response,
            3 => Kind::Data,
            b => Kind::Other(b),
        }
    }

    fn byte(self) -> u8 {
        match self {
            Kind::Request => 1,
            Kind::Response => 2,
            Kind::Data => 3,
            Kind::Other(b) => b,
        }
    }
}

/// One frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The call it belongs to.
    pub stream: u32,
    /// Its type.
    pub kind: Kind,
    /// Its flags (0 for unary calls).
    pub flags: u8,
    /// The encoded `Request` or `Response`.
    pub data: Vec<u8>,
}

/// A frame that cannot be sent or was refused on receipt.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// Data over [`MAX_DATA`].
    #[error("ttRPC frame on stream {stream} carries {len} bytes, over the {MAX_DATA} allowed")]
    TooLarge {
        /// The stream it was on.
        stream: u32,
        /// Its data length.
        len: usize,
    },
}

impl Frame {
    /// The frame as it goes on the wire.
    pub fn encode(&self) -> Result<Vec<u8>, FrameError> {
        if self.data.len() > MAX_DATA {
            return Err(FrameError::TooLarge {
                stream: self.stream,
                len: self.data.len(),
            });
        }
        let mut out = Vec::with_capacity(HEADER_LEN + self.data.len());
        out.extend_from_slice(&(self.data.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.stream.to_be_bytes());
        out.push(self.kind.byte());
        out.push(self.flags);
        out.extend_from_slice(&self.data);
        Ok(out)
    }
}

/// Cuts a byte stream into frames, whatever pieces it arrives in.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Bytes of a refused frame still to be dropped.
    skip: usize,
}

impl Decoder {
    /// Adds bytes read from the stream.
    pub fn push(&mut self, mut bytes: &[u8]) {
        let dropped = self.skip.min(bytes.len());
        self.skip -= dropped;
        bytes = &bytes[dropped..];
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, if one has arrived. A frame over [`MAX_DATA`]
    /// is an error once, and its data is skipped as it arrives; the stream
    /// goes on after it.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let h = &self.buf[..HEADER_LEN];
        let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let stream = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let (kind, flags) = (Kind::from_byte(h[8]), h[9]);
        if len > MAX_DATA {
            let have = self.buf.len() - HEADER_LEN;
            self.skip = len - have.min(len);
            let rest = self.buf.split_off(HEADER_LEN + have.min(len));
            self.buf = rest;
            return Err(FrameError::TooLarge { stream, len });
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let rest = self.buf.split_off(HEADER_LEN + len);
        let mut data = std::mem::replace(&mut self.buf, rest);
        data.drain(..HEADER_LEN);
        Ok(Some(Frame {
            stream,
            kind,
            flags,
            data,
        }))
    }
}

/// A call (ttRPC's `Request`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Request {
    /// The fully qualified service, `nri.pkg.api.v1alpha1.Plugin`.
    #[prost(string, tag = "1")]
    pub service: String,
    /// The method, `Configure`.
    #[prost(string, tag = "2")]
    pub method: String,
    /// The encoded request message.
    #[prost(bytes = "vec", tag = "3")]
    pub payload: Vec<u8>,
    /// The caller's deadline, nanoseconds from now (0: none).
    #[prost(int64, tag = "4")]
    pub timeout_nano: i64,
    /// Metadata (tracing); unused here.
    #[prost(message, repeated, tag = "5")]
    pub metadata: Vec<KeyValue>,
}

/// A metadata entry.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    /// The key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// An answer (ttRPC's `Response`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Response {
    /// The outcome; absent or code 0 is success.
    #[prost(message, optional, tag = "1")]
    pub status: Option<Status>,
    /// The encoded response message.
    #[prost(bytes = "vec", tag = "2")]
    pub payload: Vec<u8>,
}

/// `google.rpc.Status`, without its details.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    /// A gRPC status code.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// What went wrong.
    #[prost(string, tag = "2")]
    pub message: String,
}

impl Response {
    /// A success carrying `msg`.
    pub fn ok(msg: &impl prost::Message) -> Self {
        Self {
            status: None,
            payload: msg.encode_to_vec(),
        }
    }

    /// A failure with `code` and `message`.
    pub fn error(code: tonic::Code, message: impl Into<String>) -> Self {
        Self {
            status: Some(Status {
                code: code as i32,
                message: message.into(),
            }),
            payload: Vec::new(),
        }
    }

    /// The payload, or the status when the call failed.
    pub fn into_result(self) -> Result<Vec<u8>, Status> {
        match self.status {
            Some(s) if s.code != 0 => Err(s),
            _ => Ok(self.payload),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn frame(stream: u32, data: &[u8]) -> Frame {
        Frame {
            stream,
            kind: Kind::Request,
            flags: 0,
            data: data.to_vec(),
        }
    }

    #[test]
    fn a_header_is_length_stream_type_flags_big_endian() {
        let bytes = frame(0x0102_0304, b"abc").encode().unwrap();
        assert_eq!(bytes, [0, 0, 0, 3, 1, 2, 3, 4, 1, 0, b'a', b'b', b'c']);
    }

    #[test]
    fn frames_come_out_whole_from_any_split_of_the_stream() {
        let frames = [frame(1, b"first"), frame(3, b""), frame(5, &[7; 300])];
        let wire: Vec<u8> = frames.iter().flat_map(|f| f.encode().unwrap()).collect();
        for piece in [1, 2, 9, 10, 11, 64, wire.len()] {
            let mut d = Decoder::default();
            let mut got = Vec::new();
            for chunk in wire.chunks(piece) {
                d.push(chunk);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got, frames, "pieces of {piece} bytes");
        }
    }

    #[test]
    fn an_oversized_frame_is_refused_once_and_skipped() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&((MAX_DATA + 5) as u32).to_be_bytes());
        wire.extend_from_slice(&[0, 0, 0, 7, 1, 0]);
        wire.extend(std::iter::repeat_n(0u8, MAX_DATA + 5));
        wire.extend(frame(9, b"next").encode().unwrap());
        let mut d = Decoder::default();
        let mut errors = Vec::new();
        let mut got = Vec::new();
        for chunk in wire.chunks(1 << 20) {
            d.push(chunk);
            loop {
                match d.next_frame() {
                    Ok(Some(f)) => got.push(f),
                    Ok(None) => break,
                    Err(e) => errors.push(e),
                }
            }
        }
        assert_eq!(
            errors,
            [FrameError::TooLarge {
                stream: 7,
                len: MAX_DATA + 5
            }]
        );
        assert_eq!(got, [frame(9, b"next")]);
        let big = frame(1, &vec![0; MAX_DATA + 1]);
        assert!(big.encode().is_err(), "never sent");
    }

    #[test]
    fn a_failed_call_carries_its_status_and_no_payload() {
        let r = Response::error(tonic::Code::Unimplemented, "method Nope");
        let back = Response::decode(r.encode_to_vec().as_slice()).unwrap();
        let s = back.into_result().unwrap_err();
        assert_eq!((s.code, s.message.as_str()), (12, "method Nope"));
        let ok = Response::ok(&KeyValue {
            key: "k".into(),
            value: "v".into(),
        });
        assert!(ok.status.is_none());
        let payload = ok.into_result().unwrap();
        assert_eq!(KeyValue::decode(payload.as_slice()).unwrap().key, "k");
    }
}
