//! The CRI proxy: what the kubelet talks to.
//!
//! An HTTP/2 frame relay, not a terminating server: each kubelet connection
//! is relayed frame by frame to its own runtime connection, so criguard
//! accepts whatever the runtime accepts (any `:authority`, any header,
//! header blocks of any size the runtime takes) and changes nothing but
//! the observed requests it patches or refuses. See `conn` for the frame
//! handling, `held` for observed calls and flow control, `pump` for the
//! I/O loop, `unavailable` answering calls while the runtime is down (or a connection is refused) and `budget` for what
//! the relay may hold.

pub mod budget;
pub mod conn;
mod flow;
pub mod frame;
#[doc(hidden)]
pub mod fuzz;
pub mod headers;
mod held;
pub mod hpack;
pub mod methods;
pub mod metrics;
pub mod observe;
pub mod out;
pub mod proxy;
pub mod pump;
pub mod server;
pub mod unavailable;

pub use proxy::Proxy;
pub use server::serve;

#[cfg(test)]
mod tests;
