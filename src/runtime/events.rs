//! containerd's events service (`containerd.services.events.v1.Events`):
//! task exits and OOM notifications as they happen.
//!
//! criguard subscribes to two topics of the CRI plugin's namespace,
//! `/tasks/exit` and `/tasks/oom`, through `containerd-client`. This module
//! is the edge: an [`Envelope`](containerd_client::types::Envelope) with a
//! `google.protobuf.Any` payload goes in, a [`TaskEvent`] comes out; nothing
//! past it sees a containerd message.
//!
//! Two facts about the stream shape its users:
//! - containerd's Subscribe sends no response headers until its first event
//!   (grpc-go sends them with the first message), so
//!   [`Events::subscribe`] resolves only then; an idle node keeps it
//!   pending, which is not a failure.
//! - A subscriber only gets events published after containerd registered
//!   it; what happened before (or while containerd was down) must be read
//!   from the runtime's lists (`runtime::sync`).

use containerd_client::events::{TaskExit as ProtoTaskExit, TaskOom};
use containerd_client::services::v1::SubscribeRequest;
use containerd_client::services::v1::events_client::EventsClient;
use containerd_client::types::Envelope;
use prost::Message;
use tonic::transport::Channel;

use super::CRI_NAMESPACE;

/// The topic of a task's process exit.
pub const TOPIC_EXIT: &str = "/tasks/exit";
/// The topic of a memory cgroup OOM notification for a task's cgroup.
pub const TOPIC_OOM: &str = "/tasks/oom";

/// A process of a task exited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskExit {
    /// The task: for CRI, the container id (or the sandbox id for the
    /// sandbox's pause process).
    pub container_id: String,
    /// The process: the task's id for its init process, an exec id otherwise.
    pub process_id: String,
    /// Host pid of the process.
    pub pid: u32,
    /// Exit status as the shim reports it (128 + signal when killed).
    pub exit_status: u32,
    /// When the shim reaped it, ms since the epoch.
    pub exited_at_unix_ms: u64,
}

impl TaskExit {
    /// True for the task's init process: the container itself ended (an
    /// exec's exit leaves the container running).
    pub fn is_init(&self) -> bool {
        self.process_id.is_empty() || self.process_id == self.container_id
    }

    /// True when the process ended by SIGKILL (status 137), the OOM
    /// killer's signal.
    pub fn sigkilled(&self) -> bool {
        self.exit_status == 128 + 9
    }
}

/// A task event criguard acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskEvent {
    /// `/tasks/exit`.
    Exit(TaskExit),
    /// `/tasks/oom`: the memory cgroup of task `container_id` reported an
    /// OOM. On cgroup v1 the kernel notifies every cgroup below the one
    /// that ran out, so this names a task that may or may not have lost a
    /// process; the cgroup's `oom_kill` counter says.
    Oom {
        /// The task (container or sandbox id).
        container_id: String,
        /// When containerd published it, ms since the epoch.
        at_unix_ms: u64,
    },
}

/// Why events could not be received or read.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// containerd refused or failed the Subscribe call.
    #[error("events Subscribe: {status}")]
    Subscribe {
        /// containerd's (or the transport's) answer.
        status: tonic::Status,
    },
    /// The stream broke (containerd stopped, the connection closed).
    #[error("events stream: {status}")]
    Stream {
        /// The status the stream ended with.
        status: tonic::Status,
    },
    /// containerd ended the stream cleanly (it is shutting down).
    #[error("events stream ended by containerd")]
    Ended,
    /// A payload did not decode as its topic's message.
    #[error("event {topic} (type {type_url:?}): {source}")]
    Decode {
        /// The topic.
        topic: String,
        /// The payload's type URL.
        type_url: String,
        /// prost's error.
        source: prost::DecodeError,
    },
    /// An event of a subscribed topic came without a payload.
    #[error("event {topic}: no payload")]
    NoPayload {
        /// The topic.
        topic: String,
    },
}

/// The Subscribe filters: either topic, in the CRI plugin's namespace
/// (containerd ORs the list; commas AND within one filter).
pub fn filters() -> Vec<String> {
    [TOPIC_EXIT, TOPIC_OOM]
        .iter()
        .map(|t| format!("topic=={t:?},namespace=={CRI_NAMESPACE}"))
        .collect()
}

fn unix_ms(t: Option<&prost_types::Timestamp>) -> u64 {
    t.map_or(0, |t| {
        (t.seconds.max(0) as u64) * 1000 + (t.nanos.max(0) as u64) / 1_000_000
    })
}

/// The task event in `env`; `None` for other namespaces and topics.
pub fn decode(env: &Envelope) -> Result<Option<TaskEvent>, EventError> {
    if env.namespace != CRI_NAMESPACE || (env.topic != TOPIC_EXIT && env.topic != TOPIC_OOM) {
        return Ok(None);
    }
    let any = env.event.as_ref().ok_or_else(|| EventError::NoPayload {
        topic: env.topic.clone(),
    })?;
    let err = |source| EventError::Decode {
        topic: env.topic.clone(),
        type_url: any.type_url.clone(),
        source,
    };
    // containerd's type URLs carry no leading slash ("containerd.events.TaskExit"),
    // so the payload is decoded by topic rather than through `Any::to_msg`.
    Ok(Some(if env.topic == TOPIC_EXIT {
        let e = ProtoTaskExit::decode(any.value.as_slice()).map_err(err)?;
        TaskEvent::Exit(TaskExit {
            container_id: e.container_id,
            process_id: e.id,
            pid: e.pid,
            exit_status: e.exit_status,
            exited_at_unix_ms: unix_ms(e.exited_at.as_ref()),
        })
    } else {
        let e = TaskOom::decode(any.value.as_slice()).map_err(err)?;
        TaskEvent::Oom {
            container_id: e.container_id,
            at_unix_ms: unix_ms(env.timestamp.as_ref()),
        }
    }))
}

/// A client of containerd's events service.
#[derive(Clone, Debug)]
pub struct Events {
    channel: Channel,
}

impl Events {
    /// A client over `channel` (containerd's socket).
    pub fn new(channel: Channel) -> Self {
        Self { channel }
    }

    /// Subscribes to [`filters`]. Resolves with containerd's first event
    /// (see the module docs): keep it pending, not timed out, while idle.
    pub async fn subscribe(&self) -> Result<Subscription, EventError> {
        let req = SubscribeRequest { filters: filters() };
        let stream = EventsClient::new(self.channel.clone())
            .subscribe(req)
            .await
            .map_err(|status| EventError::Subscribe { status })?
            .into_inner();
        Ok(Subscription { stream })
    }
}

/// A live subscription.
#[derive(Debug)]
pub struct Subscription {
    stream: tonic::Streaming<Envelope>,
}

impl Subscription {
    /// The next task event. Envelopes of other topics are skipped; one
    /// that does not decode is returned as an error the caller may log and
    /// skip (the stream goes on). [`EventError::Stream`] and
    /// [`EventError::Ended`] end the subscription.
    pub async fn next(&mut self) -> Result<TaskEvent, EventError> {
        loop {
            let env = match self.stream.message().await {
                Ok(Some(env)) => env,
                Ok(None) => return Err(EventError::Ended),
                Err(status) => return Err(EventError::Stream { status }),
            };
            if let Some(ev) = decode(&env)? {
                return Ok(ev);
            }
        }
    }
}

impl EventError {
    /// True when the subscription is over and must be made again.
    pub fn ends_subscription(&self) -> bool {
        matches!(
            self,
            EventError::Subscribe { .. } | EventError::Stream { .. } | EventError::Ended
        )
    }

    /// True when the runtime has no containerd event service at all (it is
    /// not containerd, e.g. CRI-O): subscribing again cannot help.
    pub fn no_event_service(&self) -> bool {
        matches!(self, EventError::Subscribe { status } if status.code() == tonic::Code::Unimplemented)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(ns: &str, topic: &str, type_url: &str, value: Vec<u8>) -> Envelope {
        Envelope {
            timestamp: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 250_000_000,
            }),
            namespace: ns.into(),
            topic: topic.into(),
            event: Some(prost_types::Any {
                type_url: type_url.into(),
                value,
            }),
        }
    }

    fn exit(container: &str, id: &str, status: u32) -> Envelope {
        let e = ProtoTaskExit {
            container_id: container.into(),
            id: id.into(),
            pid: 42,
            exit_status: status,
            exited_at: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 7_000_000,
            }),
        };
        envelope(
            CRI_NAMESPACE,
            TOPIC_EXIT,
            "containerd.events.TaskExit",
            e.encode_to_vec(),
        )
    }

    #[test]
    fn an_init_exit_decodes_with_its_status_and_time() {
        let Some(TaskEvent::Exit(e)) = decode(&exit("c1", "c1", 137)).unwrap() else {
            panic!("not an exit");
        };
        assert_eq!(
            (e.container_id.as_str(), e.pid, e.exit_status),
            ("c1", 42, 137)
        );
        assert_eq!(e.exited_at_unix_ms, 1_700_000_000_007);
        assert!(e.is_init() && e.sigkilled());
    }

    #[test]
    fn an_exec_exit_is_not_the_containers() {
        let Some(TaskEvent::Exit(e)) = decode(&exit("c1", "exec-7", 0)).unwrap() else {
            panic!("not an exit");
        };
        assert!(!e.is_init() && !e.sigkilled());
    }

    #[test]
    fn an_oom_carries_the_envelopes_time() {
        let oom = TaskOom {
            container_id: "c2".into(),
        };
        let env = envelope(
            CRI_NAMESPACE,
            TOPIC_OOM,
            "containerd.events.TaskOOM",
            oom.encode_to_vec(),
        );
        assert_eq!(
            decode(&env).unwrap(),
            Some(TaskEvent::Oom {
                container_id: "c2".into(),
                at_unix_ms: 1_700_000_000_250
            })
        );
    }

    #[test]
    fn other_namespaces_and_topics_are_skipped_and_bad_payloads_named() {
        let mut other_ns = exit("c1", "c1", 0);
        other_ns.namespace = "moby".into();
        assert_eq!(decode(&other_ns).unwrap(), None);
        let create = envelope(CRI_NAMESPACE, "/tasks/create", "x", vec![]);
        assert_eq!(decode(&create).unwrap(), None);
        let bad = envelope(
            CRI_NAMESPACE,
            TOPIC_EXIT,
            "containerd.events.TaskExit",
            vec![0xff],
        );
        let err = decode(&bad).unwrap_err();
        assert!(!err.ends_subscription());
        assert!(err.to_string().contains("/tasks/exit"), "{err}");
        let mut empty = exit("c1", "c1", 0);
        empty.event = None;
        assert!(matches!(decode(&empty), Err(EventError::NoPayload { .. })));
    }

    #[test]
    fn filters_name_both_topics_in_the_cri_namespace() {
        assert_eq!(
            filters(),
            [
                r#"topic=="/tasks/exit",namespace==k8s.io"#,
                r#"topic=="/tasks/oom",namespace==k8s.io"#
            ]
        );
    }

    #[test]
    fn only_an_unimplemented_subscribe_means_no_event_service() {
        let subscribe = |code| EventError::Subscribe {
            status: tonic::Status::new(code, "x"),
        };
        assert!(subscribe(tonic::Code::Unimplemented).no_event_service());
        assert!(!subscribe(tonic::Code::Unavailable).no_event_service());
        let stream = EventError::Stream {
            status: tonic::Status::new(tonic::Code::Unimplemented, "x"),
        };
        assert!(!stream.no_event_service());
    }
}
