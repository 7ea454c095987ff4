//! The CRI proxy: what the kubelet talks to.
//!
//! Every gRPC path is forwarded to the runtime as raw HTTP/2: headers
//! (metadata, `grpc-timeout`), the body frames and the trailers pass through
//! untouched, so fields newer than criguard's proto copy survive in both
//! directions and streaming methods stream. The only header that changes is
//! `:authority`, which names the upstream socket's placeholder host.

pub mod observe;
pub mod proxy;
pub mod server;

pub use proxy::Proxy;
pub use server::serve;
