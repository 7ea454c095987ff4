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
//! This file owns the bookkeeping ([`Observed`] per call, [`Held`] per
//! connection) and the decisions (what a frame does to a held body, what
//! the observer's plan makes of it, how the credit settles); the
//! connection ([`super::conn`]) carries them out on its streams and queues.
//!
//! Bodies larger than the runtime accepts (over 16 MiB by their gRPC length
//! prefix), beyond the connection's hold budget or beyond the relay's
//! shared one ([`super::budget`]) pass unobserved, so the runtime gives
//! its own answer and criguard's memory stays bounded: criguard never
//! fails or stalls a call the runtime alone would take because of its
//! own memory.

use bytes::{Bytes, BytesMut};

use super::budget::{self, Budget, Charge, UNHELD_BODIES};
use super::frame::{self, Head, flag};
use super::observe::{self, Method, Observe};
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

/// Bytes of memory per body byte the observer may use while it reads a
/// complete body: the decoded message (prost copies its strings) and the
/// patched copy that is forwarded.
pub(super) const WORK_PER_BYTE: usize = 2;

/// Counts, and logs at a bounded rate, an observed call relayed
/// uninspected because `budget` is spent.
fn spent(budget: &Budget) {
    UNHELD_BODIES.inc();
    if let Some(skipped) = UNHELD_LOG.allow(std::time::Instant::now()) {
        tracing::warn!(
            budget = budget.limit(),
            not_logged = skipped,
            "hold budget spent: an observed call is relayed without inspection"
        );
    }
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
    /// The request message as forwarded (patched), for the observer, with
    /// the hold budget's charge for its bytes until the call ends.
    request: Option<(Bytes, Charge)>,
    /// A copy of the answer body, while it fits in a message.
    response: Option<BytesMut>,
}

/// What a DATA frame of a held body leads to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// The body goes on unobserved (too large, or over a budget).
    Pass,
    /// The body is complete: observe it.
    Release,
    /// Keep holding, and credit the client this many bytes.
    Advance(u64),
}

/// What the observer's plan makes of a complete body.
#[derive(Debug)]
pub(super) enum Verdict {
    /// criguard answers the call itself, for this reason.
    Refuse(String),
    /// The runtime gets `payload`; `request` is the message the observer
    /// sees with the answer (`None`: the answer is not observed).
    Send {
        payload: Bytes,
        request: Option<Bytes>,
    },
}

/// How the client's credit settles once a body is sent.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Settle {
    /// The runtime will grant this much more than the client is owed: kept
    /// back from its WINDOW_UPDATEs.
    Debt(u64),
    /// The client is owed this much that the runtime will never grant:
    /// criguard credits it now.
    Short(u32),
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
    pub(super) fn owed(&self) -> u64 {
        self.client_bytes - self.advanced
    }

    /// criguard credited `n` held bytes to the client.
    pub(super) fn advance(&mut self, n: u64) {
        self.advanced += n;
    }

    /// The body leaves as `sent` bytes: nothing is owed any more, and the
    /// difference to what was owed settles one way or the other.
    pub(super) fn settle(&mut self, sent: u64) -> Settle {
        let owed = self.owed();
        self.advanced = self.client_bytes;
        if sent >= owed {
            Settle::Debt(sent - owed)
        } else {
            Settle::Short((owed - sent) as u32)
        }
    }

    /// What `observer` makes of the complete `body`.
    pub(super) fn verdict(&self, observer: &dyn Observe, body: Bytes) -> Verdict {
        let method = self.method;
        let msg = observe::single_message(&body).map(|m| body.slice_ref(m));
        let plan = match &msg {
            Some(m) => guarded(method, || observer.on_request(method, m)).unwrap_or_default(),
            None => observe::RequestPlan::default(),
        };
        if let Some(why) = plan.refuse {
            return Verdict::Refuse(why);
        }
        if plan.patch.is_some() && !self.may_patch {
            tracing::debug!(
                ?method,
                "request carries content-length; forwarded unpatched"
            );
        }
        match (msg, plan.patch.filter(|_| self.may_patch)) {
            (Some(m), Some(patch)) => {
                let payload = observe::frame(&m, Some(&patch));
                let request = payload.slice(frame::GRPC_PREFIX..);
                Verdict::Send {
                    payload,
                    request: Some(request),
                }
            }
            (request, _) => Verdict::Send {
                payload: body,
                request,
            },
        }
    }

    /// The body went to the runtime; `request` (as forwarded, with its
    /// charge) is kept for the observer, and the answer is copied when
    /// there is one.
    pub(super) fn sent(&mut self, request: Option<(Bytes, Charge)>) {
        self.state = State::Sent;
        self.response = request.is_some().then(BytesMut::new);
        self.request = request;
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
        let (Some(observer), Some((req, _)), Some(resp)) =
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

/// The request bodies one connection holds: the bytes charged to the hold
/// budgets, and the calls parked until the node model is ready.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// Bytes of request bodies held on this connection.
    bytes: usize,
    /// Observed calls waiting for the node model.
    parked: usize,
}

impl Held {
    /// Bytes held, charged to the shared budget.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether a body waits for the node model.
    pub(super) fn wants_ready(&self) -> bool {
        self.parked > 0
    }

    /// Holds `payload`, a DATA frame (`head`) of the body of `obs`, charging
    /// it to `budget`, and says what comes next.
    pub(super) fn hold(
        &mut self,
        obs: &mut Observed,
        head: &Head,
        payload: &[u8],
        budget: &Budget,
    ) -> Next {
        obs.body.extend_from_slice(payload);
        obs.client_bytes += u64::from(head.len);
        let too_big = declared_len(&obs.body).is_some_and(|n| n > MAX_MESSAGE);
        let n = payload.len();
        let fits = budget.try_take(n);
        if !fits {
            // Given back with the rest of the body when it is passed on.
            budget.take_anyway(n);
            spent(budget);
        }
        self.bytes += n;
        if !fits || too_big || self.bytes > HOLD_BUDGET {
            tracing::debug!(
                stream = head.stream,
                held = self.bytes,
                "request body too large to observe; forwarded as is"
            );
            Next::Pass
        } else if head.has(flag::END_STREAM) {
            Next::Release
        } else {
            Next::Advance(u64::from(head.len))
        }
    }

    /// Takes from `budget` what the observer's reading of the complete
    /// body of `obs` needs while it runs ([`WORK_PER_BYTE`]); `None` (and
    /// the call counted as unheld) when that does not fit: the body then
    /// goes on unobserved, like one that outgrew the budget while held.
    pub(super) fn reserve_work(obs: &Observed, budget: &Budget) -> Option<usize> {
        let work = WORK_PER_BYTE * obs.body.len();
        if budget.try_take(work) {
            Some(work)
        } else {
            spent(budget);
            None
        }
    }

    /// The complete body of `obs` waits for the node model; returns the
    /// credit owed to the client meanwhile.
    pub(super) fn park(&mut self, obs: &mut Observed) -> u64 {
        obs.state = State::Parked;
        self.parked += 1;
        obs.owed()
    }

    /// Takes the body of `obs` out to be sent; its bytes stay charged to
    /// the shared budget until they have left for the runtime.
    pub(super) fn take_body(&mut self, obs: &mut Observed) -> Bytes {
        if obs.is_parked() {
            self.parked -= 1;
        }
        // Taken whole: a split would leave `obs.body` sharing (and keeping)
        // the buffer until the call ends.
        let body = std::mem::take(&mut obs.body).freeze();
        self.bytes -= body.len();
        body
    }

    /// Takes the body of `obs` out to go on unobserved, as do its later frames.
    pub(super) fn pass(&mut self, obs: &mut Observed) -> Bytes {
        let body = self.take_body(obs);
        obs.state = State::Passed;
        body
    }

    /// Lets go of the body of a call that was reset, giving its bytes back
    /// to `budget`; returns the credit still owed to the client, or `None`
    /// when nothing was held.
    pub(super) fn drop_body(&mut self, obs: &Observed, budget: &Budget) -> Option<u64> {
        if !obs.is_holding() {
            return None;
        }
        let n = obs.body.len();
        self.bytes -= n;
        budget.give(n);
        if obs.is_parked() {
            self.parked -= 1;
        }
        Some(obs.owed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(stream: u32, len: u32, end: bool) -> Head {
        Head {
            len,
            kind: frame::kind::DATA,
            flags: if end { flag::END_STREAM } else { 0 },
            stream,
        }
    }

    #[test]
    fn frames_are_held_and_credited_until_the_last_releases_the_body() {
        let budget = Budget::new(1 << 20);
        let mut held = Held::default();
        let mut obs = Observed::new(Method::CreateContainer, true);
        let next = held.hold(&mut obs, &data(1, 10, false), &[0; 10], &budget);
        assert_eq!(next, Next::Advance(10));
        obs.advance(10);
        assert_eq!(
            held.hold(&mut obs, &data(1, 4, true), &[0; 4], &budget),
            Next::Release
        );
        assert_eq!((held.bytes(), budget.used(), obs.owed()), (14, 14, 4));
        assert_eq!(held.park(&mut obs), 4);
        assert!(held.wants_ready() && obs.is_parked());
        let body = held.take_body(&mut obs);
        assert_eq!(
            (body.len(), held.bytes(), held.wants_ready()),
            (14, 0, false)
        );
        assert!(
            body.is_unique(),
            "the call keeps no share of the buffer: it goes when the body does"
        );
    }

    #[test]
    fn the_observers_work_is_charged_or_the_body_passes() {
        let budget = Budget::new(100);
        let mut held = Held::default();
        let mut obs = Observed::new(Method::CreateContainer, true);
        held.hold(&mut obs, &data(1, 30, true), &[0; 30], &budget);
        assert_eq!(Held::reserve_work(&obs, &budget), Some(60));
        assert_eq!(budget.used(), 90);
        budget.give(60);
        let unheld = UNHELD_BODIES.get();
        held.hold(&mut obs, &data(1, 10, true), &[0; 10], &budget);
        assert_eq!(
            Held::reserve_work(&obs, &budget),
            None,
            "80 of work do not fit beside 40 held"
        );
        assert_eq!(budget.used(), 40, "nothing taken");
        assert!(UNHELD_BODIES.get() > unheld, "counted as relayed unheld");
    }

    #[test]
    fn a_body_over_a_budget_passes_unobserved() {
        let budget = Budget::new(8);
        let mut held = Held::default();
        let mut obs = Observed::new(Method::CreateContainer, true);
        assert_eq!(
            held.hold(&mut obs, &data(1, 10, false), &[0; 10], &budget),
            Next::Pass
        );
        let body = held.pass(&mut obs);
        assert_eq!((body.len(), held.bytes()), (10, 0));
        assert!(!obs.is_holding());
        // A prefix announcing more than the runtime takes passes too.
        let budget = Budget::new(1 << 30);
        let mut obs = Observed::new(Method::CreateContainer, true);
        let prefix = [0, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(
            held.hold(&mut obs, &data(3, 5, false), &prefix, &budget),
            Next::Pass
        );
    }

    #[test]
    fn a_reset_call_gives_back_its_bytes_and_what_the_client_is_owed() {
        let budget = Budget::new(1 << 20);
        let mut held = Held::default();
        let mut obs = Observed::new(Method::CreateContainer, true);
        held.hold(&mut obs, &data(1, 12, true), &[0; 10], &budget);
        held.park(&mut obs);
        obs.advance(2);
        assert_eq!(held.drop_body(&obs, &budget), Some(10));
        assert_eq!(
            (held.bytes(), budget.used(), held.wants_ready()),
            (0, 0, false)
        );
        // A body already passed on holds nothing.
        let mut passed = Observed::new(Method::CreateContainer, true);
        held.pass(&mut passed);
        assert_eq!(held.drop_body(&passed, &budget), None);
    }

    #[test]
    fn credit_settles_as_debt_when_more_is_sent_and_at_once_when_less() {
        let mut obs = Observed::new(Method::CreateContainer, true);
        obs.client_bytes = 100;
        obs.advance(30);
        assert_eq!(obs.settle(90), Settle::Debt(20));
        assert_eq!(obs.owed(), 0);
        obs.client_bytes = 200;
        assert_eq!(obs.settle(60), Settle::Short(40));
        assert_eq!(obs.settle(0), Settle::Debt(0));
    }
}
