//! Observed calls: their request bodies held, read, patched or refused.
//!
//! The body of an observed request (RunPodSandbox, CreateContainer, …) is
//! held until its END_STREAM, then decoded as a copy and released: as it
//! was, with criguard's merge patch appended, or not at all (admission:
//! criguard answers, and cancels the runtime's copy of the stream, whose
//! HEADERS it had to forward to keep HPACK in step).
//!
//! Flow control stays exact. While a body is held the client's windows
//! shrink but the runtime sees nothing to credit, so criguard credits the
//! held bytes itself (stream and connection WINDOW_UPDATEs) for frames that
//! do not end the body, lest the client stall. On release the runtime
//! receives `F` bytes where the client spent `N` and was already credited
//! `a`: when `F > N − a` the runtime's later credit exceeds what the client
//! is owed, and the excess is kept back from the WINDOW_UPDATEs passed to
//! the client (`debt`); when `F < N − a` criguard credits the difference at
//! once. A body the runtime never sees is credited in full.
//!
//! Bodies larger than the runtime accepts (over 16 MiB by their gRPC length
//! prefix), beyond the connection's hold budget or beyond the relay's
//! shared one ([`super::budget`]) pass unobserved, so the runtime gives
//! its own answer and criguard's memory stays bounded: criguard never
//! fails or stalls a call the runtime alone would take because of its
//! own memory.

use bytes::{Bytes, BytesMut};

use super::budget::{self, UNHELD_BODIES};
use super::conn::{Conn, Io};
use super::frame::{self, Head, error, flag};
use super::observe::{self, Method};
use super::proxy::{Proxy, guarded};
use crate::lograte::LogRate;
use crate::runtime::MAX_MESSAGE;

/// Request bytes one connection may hold across its observed calls.
const HOLD_BUDGET: usize = 2 * MAX_MESSAGE;
/// Complaints about bodies relayed unheld.
static UNHELD_LOG: LogRate = budget::complaint();

/// Where an observed call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Collecting the request body.
    Holding,
    /// Body complete; waiting for the node model to be rebuilt.
    Parked,
    /// Forwarded; the answer is copied for the observer.
    Sent,
    /// Forwarded unobserved.
    Passed,
}

/// What criguard keeps of an observed call.
#[derive(Debug)]
pub(super) struct Observed {
    method: Method,
    /// The request announced no content-length, so its body may grow.
    may_patch: bool,
    state: State,
    /// The request body held (DATA payloads without padding).
    body: BytesMut,
    /// DATA bytes the client sent on the stream, padding included.
    client_bytes: u64,
    /// Of those, the bytes criguard credited back itself.
    advanced: u64,
    /// The request message as forwarded (patched), for the observer.
    request: Option<Bytes>,
    /// A copy of the answer body, while it fits in a message.
    response: Option<BytesMut>,
}

impl Observed {
    /// A call of `method` whose body is about to arrive.
    pub(super) fn new(method: Method, may_patch: bool) -> Self {
        Self {
            method,
            may_patch,
            state: State::Holding,
            body: BytesMut::new(),
            client_bytes: 0,
            advanced: 0,
            request: None,
            response: None,
        }
    }

    /// Whether the request body is held (not yet forwarded).
    pub(super) fn is_holding(&self) -> bool {
        matches!(self.state, State::Holding | State::Parked)
    }

    /// Whether the body waits for the node model.
    pub(super) fn is_parked(&self) -> bool {
        self.state == State::Parked
    }

    /// Credit the client spent on this body that nobody has returned yet.
    fn owed(&self) -> u64 {
        self.client_bytes - self.advanced
    }

    /// Copies a DATA frame of the answer, while it fits in a message.
    pub(super) fn copy_response(&mut self, head: &Head, payload: &[u8]) {
        let Some(resp) = self.response.as_mut() else {
            return;
        };
        match frame::unpadded(head, payload) {
            Some((a, b)) if resp.len() + (b - a) <= MAX_MESSAGE + frame::GRPC_PREFIX => {
                resp.extend_from_slice(&payload[a..b]);
            }
            _ => self.response = None,
        }
    }

    /// Hands a successful call (request and answer) to the observer.
    pub(super) fn observe_answer(&self, proxy: &Proxy) {
        let (Some(observer), Some(req), Some(resp)) =
            (&proxy.observer, &self.request, &self.response)
        else {
            return;
        };
        if let Some(msg) = observe::single_message(resp) {
            guarded(self.method, || observer.on_response(self.method, req, msg));
        }
    }
}

/// The message length a gRPC body announces in its prefix.
fn declared_len(body: &[u8]) -> Option<usize> {
    let b: [u8; 4] = body.get(1..frame::GRPC_PREFIX)?.try_into().ok()?;
    Some(u32::from_be_bytes(b) as usize)
}

impl Conn {
    fn observed(&mut self, stream: u32) -> Option<&mut Observed> {
        self.streams
            .get_mut(&stream)
            .and_then(|s| s.observed.as_deref_mut())
    }

    /// `n` held bytes are let go.
    fn unhold(&mut self, n: usize) {
        self.held -= n;
        self.proxy.budget.give(n);
    }

    /// Holds a DATA frame of an observed request.
    pub(super) fn hold(&mut self, head: Head, f: BytesMut, io: &mut Io) {
        let stream = head.stream;
        let Some((a, b)) = frame::unpadded(&head, &f[frame::HEADER_LEN..]) else {
            // Malformed padding: the runtime will refuse the frame itself.
            self.pass_held(stream, io);
            self.to_server
                .forward(&mut io.to_server, f.freeze(), head.len);
            return;
        };
        let payload = &f[frame::HEADER_LEN + a..frame::HEADER_LEN + b];
        let Some(obs) = self.observed(stream) else {
            return;
        };
        obs.body.extend_from_slice(payload);
        obs.client_bytes += u64::from(head.len);
        let too_big = declared_len(&obs.body).is_some_and(|n| n > MAX_MESSAGE);
        let n = payload.len();
        let fits = self.proxy.budget.try_take(n);
        if !fits {
            // Given back with the rest of the body just below.
            self.proxy.budget.take_anyway(n);
            UNHELD_BODIES.inc();
            let budget = self.proxy.budget.limit();
            if let Some(skipped) = UNHELD_LOG.allow(std::time::Instant::now()) {
                tracing::warn!(
                    budget,
                    not_logged = skipped,
                    "hold budget spent: an observed call is relayed without inspection"
                );
            }
        }
        self.held += n;
        if !fits || too_big || self.held > HOLD_BUDGET {
            tracing::debug!(
                stream,
                held = self.held,
                "request body too large to observe; forwarded as is"
            );
            self.pass_held(stream, io);
        } else if head.has(flag::END_STREAM) {
            self.release(stream, io, true);
        } else {
            self.advance(stream, u64::from(head.len), io);
        }
    }

    /// Credits `n` held bytes of `stream` to the client.
    fn advance(&mut self, stream: u32, n: u64, io: &mut Io) {
        let Some(st) = self.streams.get_mut(&stream) else {
            return;
        };
        let open = !st.client_done;
        let Some(obs) = st.observed.as_deref_mut() else {
            return;
        };
        if n == 0 {
            return;
        }
        obs.advanced += n;
        if open {
            self.inject_client(io, frame::window_update(stream, n as u32));
        }
        self.inject_client(io, frame::window_update(0, n as u32));
    }

    /// The body of `stream` is complete: observe it and forward, patch or
    /// refuse it. With `may_park`, a body that needs the node model waits
    /// for it to be rebuilt ([`Conn::on_ready`]).
    pub(super) fn release(&mut self, stream: u32, io: &mut Io, may_park: bool) {
        if may_park && !self.proxy.is_ready() {
            let Some(obs) = self.observed(stream) else {
                return;
            };
            obs.state = State::Parked;
            let owed = obs.owed();
            self.parked += 1;
            // The client's connection window is not tied up meanwhile.
            self.advance(stream, owed, io);
            return;
        }
        let Some(observer) = self.proxy.observer.clone() else {
            return self.pass_held(stream, io);
        };
        let Some(obs) = self.observed(stream) else {
            return;
        };
        let was_parked = obs.is_parked();
        let body = obs.body.split().freeze();
        let method = obs.method;
        let may_patch = obs.may_patch;
        if was_parked {
            self.parked -= 1;
        }
        // Charged to the budget until it has left for the runtime.
        let charged = body.len();
        self.held -= charged;
        let msg = observe::single_message(&body).map(|m| body.slice_ref(m));
        let plan = match &msg {
            Some(m) => guarded(method, || observer.on_request(method, m)).unwrap_or_default(),
            None => observe::RequestPlan::default(),
        };
        if let Some(why) = plan.refuse {
            self.proxy.budget.give(charged);
            return self.refuse(stream, &why, io);
        }
        if plan.patch.is_some() && !may_patch {
            tracing::debug!(
                ?method,
                "request carries content-length; forwarded unpatched"
            );
        }
        let (payload, request) = match (msg, plan.patch.filter(|_| may_patch)) {
            (Some(m), Some(patch)) => {
                let framed = observe::frame(&m, Some(&patch));
                let request = framed.slice(frame::GRPC_PREFIX..);
                (framed, Some(request))
            }
            (msg, _) => (body, msg),
        };
        let Some(obs) = self.observed(stream) else {
            return;
        };
        obs.state = State::Sent;
        obs.response = request.is_some().then(BytesMut::new);
        obs.request = request;
        self.send_body(stream, payload, charged, io);
    }

    /// Forwards what is held of `stream` unobserved; later frames pass as they come.
    pub(super) fn pass_held(&mut self, stream: u32, io: &mut Io) {
        let Some(obs) = self.observed(stream) else {
            return;
        };
        if obs.state == State::Parked {
            self.parked -= 1;
        }
        let Some(obs) = self.observed(stream) else {
            return;
        };
        obs.state = State::Passed;
        let body = obs.body.split().freeze();
        let charged = body.len();
        self.held -= charged;
        self.send_body(stream, body, charged, io);
    }

    /// Sends `payload` as the body of `stream` and settles the credit.
    fn send_body(&mut self, stream: u32, payload: Bytes, charged: usize, io: &mut Io) {
        let Some(st) = self.streams.get_mut(&stream) else {
            return;
        };
        let Some(obs) = st.observed.as_deref_mut() else {
            return;
        };
        let owed = obs.owed();
        obs.advanced = obs.client_bytes;
        let sent = payload.len() as u64;
        let open = !st.client_done;
        if sent >= owed {
            self.conn_debt += sent - owed;
            st.debt += sent - owed;
        } else {
            let short = (owed - sent) as u32;
            if open {
                self.inject_client(io, frame::window_update(stream, short));
            }
            self.inject_client(io, frame::window_update(0, short));
        }
        self.to_server
            .body(&mut io.to_server, stream, payload, !open, charged);
    }

    /// Answers `stream` with RESOURCE_EXHAUSTED and cancels the runtime's copy.
    fn refuse(&mut self, stream: u32, why: &str, io: &mut Io) {
        let Some(st) = self.streams.remove(&stream) else {
            return;
        };
        let rst = frame::rst_stream(stream, error::CANCEL);
        self.to_server.inject(&mut io.to_server, rst);
        if let Some(obs) = &st.observed
            && obs.owed() > 0
        {
            self.inject_client(io, frame::window_update(0, obs.owed() as u32));
        }
        self.answer(
            io,
            stream,
            &st,
            tonic::Code::ResourceExhausted as i32,
            &format!("criguard: {why}"),
        );
    }

    /// A held body that will never be forwarded (the call was reset):
    /// the client gets its connection credit back.
    pub(super) fn drop_held(&mut self, st: &super::conn::Stream, io: &mut Io) {
        let Some(obs) = st.observed.as_deref().filter(|o| o.is_holding()) else {
            return;
        };
        self.unhold(obs.body.len());
        if obs.is_parked() {
            self.parked -= 1;
        }
        if obs.owed() > 0 {
            self.inject_client(io, frame::window_update(0, obs.owed() as u32));
        }
    }

    /// Whether a body waits for the node model.
    pub fn wants_ready(&self) -> bool {
        self.parked > 0
    }

    /// The node model is rebuilt: parked bodies go, in stream order.
    pub fn on_ready(&mut self, io: &mut Io) {
        let mut parked: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| s.observed.as_ref().is_some_and(|o| o.is_parked()))
            .map(|(id, _)| *id)
            .collect();
        parked.sort_unstable();
        for id in parked {
            self.release(id, io, false);
        }
    }
}
