//! The container lifecycle as NRI tells it, for criguard attached to
//! containerd as an NRI plugin: the same node model, admission and
//! `oom_score_adj` as from the relayed CRI calls ([`Observer`]), learnt
//! from NRI's pod and container messages instead. A message criguard
//! cannot decode is logged and answered with no change, so criguard never
//! fails a container's creation by its own fault; only admission fails a
//! RunPodSandbox, with the proxy's message.

use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use prost::Message;
use tokio::sync::Notify;

use super::Observer;
use crate::lock::{Locked, RwLocked};
use crate::model::{ContainerInfo, ContainerResources, ContainerState, SandboxInfo, SandboxState};
use crate::nri::PLUGIN_SERVICE;
use crate::nri::api::{self, Event};
use crate::nri::conn::Handler;
use crate::nri::ttrpc::Response;

/// The events criguard subscribes to, as `ConfigureResponse.events`: the
/// pod and container lifecycle, within events 1–11, which every NRI since
/// v0.8 (containerd 2.0) accepts.
pub fn events() -> i32 {
    [
        Event::RunPodSandbox,
        Event::StopPodSandbox,
        Event::RemovePodSandbox,
        Event::CreateContainer,
        Event::StartContainer,
        Event::UpdateContainer,
        Event::StopContainer,
        Event::RemoveContainer,
    ]
    .iter()
    .fold(0, |mask, e| mask | 1 << (*e as i32 - 1))
}

/// Model inputs from an NRI pod.
pub fn sandbox_from_nri(p: &api::PodSandbox) -> SandboxInfo {
    SandboxInfo {
        id: p.id.clone(),
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        uid: p.uid.clone(),
        attempt: 0,
        annotations: crate::model::convert::read_annotations(&p.annotations),
        cgroup_parent: (p.linux.as_ref()).map_or_else(String::new, |l| l.cgroup_parent.clone()),
        log_directory: String::new(),
        created_at_ns: 0,
        state: Some(SandboxState::Ready),
    }
}

/// Model inputs from an NRI container.
pub fn container_from_nri(c: &api::Container) -> ContainerInfo {
    let linux = c.linux.clone().unwrap_or_default();
    let res = resources(linux.resources.as_ref());
    ContainerInfo {
        id: c.id.clone(),
        sandbox_id: c.pod_sandbox_id.clone(),
        name: c.name.clone(),
        attempt: 0,
        image: String::new(),
        annotations: crate::model::convert::read_annotations(&c.annotations),
        cpu_shares: res.cpu_shares,
        cpu_quota: res.cpu_quota,
        cpu_period: res.cpu_period,
        memory_limit: res.memory_limit,
        oom_score_adj: linux.oom_score_adj.map_or(0, |o| o.value),
        created_at_ns: 0,
        state: Some(match api::ContainerState::try_from(c.state) {
            Ok(api::ContainerState::ContainerCreated) => ContainerState::Created,
            Ok(api::ContainerState::ContainerRunning) => ContainerState::Running,
            Ok(api::ContainerState::ContainerStopped) => ContainerState::Exited,
            _ => ContainerState::Unknown,
        }),
    }
}

/// A container's resources from NRI's (absent: none).
pub fn resources(r: Option<&api::LinuxResources>) -> ContainerResources {
    let mem = r.and_then(|r| r.memory.as_ref());
    let cpu = r.and_then(|r| r.cpu.as_ref());
    ContainerResources {
        cpu_shares: cpu
            .and_then(|c| c.shares.as_ref())
            .map_or(0, |v| v.value as i64),
        cpu_quota: cpu.and_then(|c| c.quota.as_ref()).map_or(0, |v| v.value),
        cpu_period: cpu
            .and_then(|c| c.period.as_ref())
            .map_or(0, |v| v.value as i64),
        memory_limit: mem.and_then(|m| m.limit.as_ref()).map_or(0, |v| v.value),
    }
}

/// The annotation containerd's CRI gives a container: its image as the
/// pod spec names it (NRI before v0.11 carries no image).
const IMAGE_NAME_ANNOTATION: &str = "io.kubernetes.cri.image-name";

/// `c`'s image reference, as the pod spec names it.
fn image_of(c: &api::Container) -> Option<&str> {
    let named = c.image.as_ref().map(|i| i.name.as_str());
    let annotated = c.annotations.get(IMAGE_NAME_ANNOTATION).map(String::as_str);
    named.filter(|n| !n.is_empty()).or(annotated)
}

/// The NRI plugin's metrics.
#[derive(Clone, Debug, Default)]
pub struct NriMetrics {
    /// 1 while criguard is registered with the runtime as an NRI plugin.
    pub attached: Gauge<i64, AtomicI64>,
    /// Registrations made (the first, and one after each runtime restart).
    pub registrations: Counter,
    /// Containers a synchronisation showed created with a score below
    /// criguard's (while it was not attached).
    pub unscored: Counter,
}

impl NriMetrics {
    /// Registers every metric of the group.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "criguard_nri_attached",
            "1 while criguard is registered with the runtime as an NRI plugin (--mode nri)",
            self.attached.clone(),
        );
        registry.register(
            "criguard_nri_registrations",
            "Registrations with the runtime as an NRI plugin: the first, and one after each runtime restart",
            self.registrations.clone(),
        );
        registry.register(
            "criguard_nri_unscored_containers",
            "Containers the runtime's synchronisation showed created with an oom_score_adj below criguard's, while criguard was not attached; criguard raises their processes to its score",
            self.unscored.clone(),
        );
    }

    /// Notes a registration (`true`) or its loss (`false`).
    pub fn set_attached(&self, on: bool) {
        self.attached.set(i64::from(on));
        if on {
            self.registrations.inc();
        }
    }
}

/// criguard as an NRI plugin: answers the runtime's calls from `observer`.
#[derive(Debug, Clone)]
pub struct NriObserver {
    observer: Observer,
    metrics: NriMetrics,
    synchronised: Option<Arc<Notify>>,
    missed: Arc<Mutex<Vec<Missed>>>,
}

/// A container a synchronisation showed created with a score below
/// criguard's (while criguard was not attached): its processes are to be
/// raised to `score`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missed {
    /// The container.
    pub container: String,
    /// criguard's score for it.
    pub score: i64,
}

impl NriObserver {
    /// A plugin keeping `observer`'s model and deciding with it.
    pub fn new(observer: Observer) -> Self {
        Self {
            observer,
            metrics: NriMetrics::default(),
            synchronised: None,
            missed: Arc::default(),
        }
    }

    /// The containers synchronisations showed unscored since the last call.
    pub fn take_missed(&self) -> Vec<Missed> {
        std::mem::take(&mut *self.missed.locked())
    }

    /// The same plugin, notifying `done` after each synchronisation's last
    /// part is taken in (the caller reconciles with the runtime's CRI list:
    /// containers created during a synchronisation can be missing from it,
    /// containerd #13698).
    pub fn on_synchronised(mut self, done: Arc<Notify>) -> Self {
        self.synchronised = Some(done);
        self
    }

    /// The same plugin, counting in `metrics`.
    pub fn with_metrics(mut self, metrics: NriMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Answers `method`; an error only for a message that does not decode.
    fn answer(&self, method: &str, payload: &[u8]) -> Result<Response, prost::DecodeError> {
        let empty = || Response::ok(&api::Empty {});
        Ok(match method {
            "Configure" => Response::ok(&api::ConfigureResponse { events: events() }),
            "Synchronize" => {
                let req = api::SynchronizeRequest::decode(payload)?;
                self.synchronize(&req);
                if let (false, Some(done)) = (req.more, &self.synchronised) {
                    done.notify_one();
                }
                Response::ok(&api::SynchronizeResponse {
                    update: vec![],
                    more: req.more,
                })
            }
            "StateChange" => {
                let ev = api::StateChangeEvent::decode(payload)?;
                let event = Event::try_from(ev.event).unwrap_or(Event::Unknown);
                self.lifecycle(event, ev.pod.as_ref(), ev.container.as_ref())
            }
            "RunPodSandbox" | "StopPodSandbox" | "RemovePodSandbox" => {
                let req = api::PodSandboxRequest::decode(payload)?;
                let event = match method {
                    "RunPodSandbox" => Event::RunPodSandbox,
                    "StopPodSandbox" => Event::StopPodSandbox,
                    _ => Event::RemovePodSandbox,
                };
                self.lifecycle(event, req.pod.as_ref(), None)
            }
            "StartContainer" | "StopContainer" | "RemoveContainer" => {
                let req = api::ContainerRequest::decode(payload)?;
                let event = match method {
                    "StartContainer" => Event::StartContainer,
                    "StopContainer" => Event::StopContainer,
                    _ => Event::RemoveContainer,
                };
                self.lifecycle(event, req.pod.as_ref(), req.container.as_ref())
            }
            "CreateContainer" => self.create_container(&api::ContainerRequest::decode(payload)?),
            "UpdateContainer" => {
                let req = api::UpdateContainerRequest::decode(payload)?;
                if let Some(c) = &req.container {
                    let res = resources(req.linux_resources.as_ref());
                    self.observer
                        .model
                        .write_locked()
                        .update_container_resources(&c.id, &res);
                }
                Response::ok(&api::UpdateContainerResponse { update: vec![] })
            }
            "Shutdown" => empty(),
            other => Response::error(tonic::Code::Unimplemented, format!("method {other}")),
        })
    }

    /// Takes in what exists: every pod and container the runtime lists.
    /// A container whose score is below criguard's was created while
    /// criguard was not attached: said (log, metric) and kept for
    /// [`Self::take_missed`] (the caller raises its processes).
    fn synchronize(&self, req: &api::SynchronizeRequest) {
        let pods: Vec<SandboxInfo> = req.pods.iter().map(sandbox_from_nri).collect();
        let containers: Vec<ContainerInfo> =
            req.containers.iter().map(container_from_nri).collect();
        {
            let mut m = self.observer.model.write_locked();
            for p in &pods {
                m.upsert_sandbox(p.clone());
            }
        }
        for c in &containers {
            let want = self.observer.score_for(None, c);
            // The score criguard would have raised it to at its creation.
            if let Some(want) = want.filter(|w| *w > c.oom_score_adj) {
                self.metrics.unscored.inc();
                crate::log_limited!(warn, container = %c.id, name = %c.name, sandbox = %c.sandbox_id, created_with = c.oom_score_adj, criguard = want, "container created while criguard was not attached: its processes are raised to criguard's oom_score_adj");
                self.missed.locked().push(Missed {
                    container: c.id.clone(),
                    score: want,
                });
            }
        }
        let mut m = self.observer.model.write_locked();
        for c in containers {
            m.upsert_container(c);
        }
        tracing::debug!(
            pods = req.pods.len(),
            containers = req.containers.len(),
            more = req.more,
            "NRI synchronisation taken in"
        );
    }

    /// A pod or container event: the model follows; RunPodSandbox is
    /// admitted or refused.
    fn lifecycle(
        &self,
        event: Event,
        pod: Option<&api::PodSandbox>,
        container: Option<&api::Container>,
    ) -> Response {
        let ok = Response::ok(&api::Empty {});
        if event == Event::RunPodSandbox
            && let Some(p) = pod
        {
            let info = sandbox_from_nri(p);
            if self.observer.guarding()
                && let Some(why) = self.observer.admit_sandbox(&info)
            {
                // The proxy's code: containerd passes it through to the kubelet.
                return Response::error(tonic::Code::ResourceExhausted, why);
            }
            self.observer.model.write_locked().upsert_sandbox(info);
            return ok;
        }
        let mut m = self.observer.model.write_locked();
        match (event, pod, container) {
            (Event::StopPodSandbox, Some(p), _) => {
                m.set_sandbox_state(&p.id, SandboxState::NotReady)
            }
            (Event::RemovePodSandbox, Some(p), _) => m.remove_sandbox(&p.id),
            (Event::StartContainer, _, Some(c)) => {
                m.set_container_state(&c.id, ContainerState::Running)
            }
            (Event::StopContainer, _, Some(c)) => {
                m.set_container_state(&c.id, ContainerState::Exited)
            }
            (Event::RemoveContainer, _, Some(c)) => m.remove_container(&c.id),
            _ => {}
        }
        ok
    }

    /// A container about to be created: its `oom_score_adj` raised in the
    /// answer where criguard's is higher (the proxy's patch), and the model
    /// told of it. Never lowered: containerd applies an adjustment after
    /// its `restrict_oom_score_adj` clamp, and a score below what runc may
    /// set would fail the container's start; the proxy's patch goes into
    /// the request, before that clamp.
    fn create_container(&self, req: &api::ContainerRequest) -> Response {
        let Some(c) = &req.container else {
            return Response::ok(&api::CreateContainerResponse::default());
        };
        if let Some(image) = image_of(c) {
            self.observer.image_used(image);
        }
        let mut info = container_from_nri(c);
        let sandbox = req.pod.as_ref().map(sandbox_from_nri);
        let adj = if self.observer.guarding() {
            let want = self.observer.score_for(sandbox.clone(), &info);
            want.filter(|w| *w > info.oom_score_adj)
        } else {
            None
        };
        {
            let mut m = self.observer.model.write_locked();
            if let Some(s) = sandbox.filter(|s| m.sandbox_info(&s.id).is_none()) {
                m.upsert_sandbox(s);
            }
            info.oom_score_adj = adj.unwrap_or(info.oom_score_adj);
            info.state = Some(ContainerState::Created);
            m.upsert_container(info);
        }
        let adjust = adj.map(|value| api::ContainerAdjustment {
            linux: Some(api::LinuxContainerAdjustment {
                oom_score_adj: Some(api::OptionalInt { value }),
            }),
        });
        Response::ok(&api::CreateContainerResponse {
            adjust,
            update: vec![],
        })
    }
}

impl Handler for NriObserver {
    async fn call(&self, service: &str, method: &str, payload: &[u8]) -> Response {
        if service != PLUGIN_SERVICE {
            return Response::error(tonic::Code::Unimplemented, format!("service {service}"));
        }
        self.answer(method, payload).unwrap_or_else(|err| {
            crate::log_limited!(warn, method, %err, "NRI message not decodable; answered with no change");
            // An empty payload decodes as every answer with nothing set.
            Response {
                status: None,
                payload: Vec::new(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, RwLock};

    use super::*;
    use crate::eviction::NodeStatus;
    use crate::model::NodeModel;
    use crate::signals::table::Condition;

    const MI: i64 = 1 << 20;

    fn plugin(conditions: &[Condition]) -> NriObserver {
        let status = NodeStatus {
            conditions: conditions.iter().copied().collect(),
            ..Default::default()
        };
        let model = Arc::new(RwLock::new(NodeModel::new(8 << 30)));
        let observer =
            Observer::new(model).with_admission(Arc::new(RwLock::new(status)), Default::default());
        NriObserver::new(observer)
    }

    /// `p`'s answer to CreateContainer of `req`.
    async fn create(p: &NriObserver, req: &api::ContainerRequest) -> api::CreateContainerResponse {
        let r = p
            .call(PLUGIN_SERVICE, "CreateContainer", &req.encode_to_vec())
            .await;
        api::CreateContainerResponse::decode(r.into_result().unwrap().as_slice()).unwrap()
    }

    fn pod(id: &str, qos_parent: &str) -> api::PodSandbox {
        api::PodSandbox {
            id: id.into(),
            name: format!("name-{id}"),
            uid: format!("uid-{id}"),
            namespace: "default".into(),
            linux: Some(api::LinuxPodSandbox {
                cgroup_parent: format!("/kubepods/{qos_parent}pod{id}"),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_subscription_is_the_lifecycle_within_the_events_nri_0_8_accepts() {
        // RUN, STOP and REMOVE_POD_SANDBOX, CREATE, START, UPDATE, STOP and
        // REMOVE_CONTAINER: bits 0-3, 5, 7, 9, 10.
        assert_eq!(events(), 0b110_1010_1111);
        assert!(events() < 1 << 11, "within events 1-11");
    }

    #[test]
    fn an_nri_container_becomes_the_models_inputs() {
        let c = api::Container {
            id: "c1".into(),
            pod_sandbox_id: "sb".into(),
            name: "app".into(),
            state: api::ContainerState::ContainerRunning as i32,
            linux: Some(api::LinuxContainer {
                resources: Some(api::LinuxResources {
                    memory: Some(api::LinuxMemory {
                        limit: Some(api::OptionalInt64 { value: 256 * MI }),
                        ..Default::default()
                    }),
                    cpu: Some(api::LinuxCpu {
                        shares: Some(api::OptionalUInt64 { value: 512 }),
                        quota: Some(api::OptionalInt64 { value: 50_000 }),
                        period: Some(api::OptionalUInt64 { value: 100_000 }),
                    }),
                }),
                oom_score_adj: Some(api::OptionalInt { value: 937 }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let info = container_from_nri(&c);
        assert_eq!((info.id.as_str(), info.sandbox_id.as_str()), ("c1", "sb"));
        assert_eq!(info.memory_limit, 256 * MI);
        assert_eq!(
            (info.cpu_shares, info.cpu_quota, info.cpu_period),
            (512, 50_000, 100_000)
        );
        assert_eq!(info.oom_score_adj, 937);
        assert_eq!(info.state, Some(ContainerState::Running));
        let s = sandbox_from_nri(&pod("sb", "besteffort/"));
        assert_eq!(s.cgroup_parent, "/kubepods/besteffort/podsb");
        assert_eq!((s.name.as_str(), s.uid.as_str()), ("name-sb", "uid-sb"));
    }

    #[tokio::test]
    async fn a_besteffort_pod_is_refused_under_memory_pressure_and_others_admitted() {
        let p = plugin(&[Condition::MemoryPressure]);
        let run = |pod: api::PodSandbox| api::PodSandboxRequest { pod: Some(pod) }.encode_to_vec();
        let refused = p
            .call(
                PLUGIN_SERVICE,
                "RunPodSandbox",
                &run(pod("a", "besteffort/")),
            )
            .await;
        let status = refused.into_result().unwrap_err();
        assert_eq!(
            status.code,
            tonic::Code::ResourceExhausted as i32,
            "the proxy's code"
        );
        assert!(
            status.message.contains("MemoryPressure"),
            "{}",
            status.message
        );
        let admitted = p
            .call(
                PLUGIN_SERVICE,
                "RunPodSandbox",
                &run(pod("b", "burstable/")),
            )
            .await;
        assert!(admitted.into_result().is_ok());
        let model = p.observer.model.read_locked();
        assert_eq!(model.ids().0, ["b"], "only the admitted pod is kept");
    }

    #[tokio::test]
    async fn what_cannot_be_decoded_changes_nothing_and_fails_nothing() {
        let p = plugin(&[Condition::MemoryPressure]);
        let garbage = [0xff, 0xff, 0xff];
        let r = p.call(PLUGIN_SERVICE, "CreateContainer", &garbage).await;
        assert_eq!(r.into_result().unwrap(), Vec::<u8>::new());
        let r = p.call(PLUGIN_SERVICE, "NoSuchMethod", &[]).await;
        assert_eq!(
            r.into_result().unwrap_err().code,
            tonic::Code::Unimplemented as i32
        );
        let r = p.call("some.other.Service", "Configure", &[]).await;
        assert_eq!(
            r.into_result().unwrap_err().code,
            tonic::Code::Unimplemented as i32
        );
    }

    #[tokio::test]
    async fn a_score_is_raised_never_lowered() {
        // Guaranteed: criguard's score is -997; containerd's spec holds 0
        // (its restrict_oom_score_adj clamp): left as it is.
        let p = plugin(&[]);
        let c = api::Container {
            id: "g1".into(),
            pod_sandbox_id: "sb".into(),
            name: "app".into(),
            linux: Some(api::LinuxContainer {
                oom_score_adj: Some(api::OptionalInt { value: 0 }),
                resources: Some(api::LinuxResources {
                    memory: Some(api::LinuxMemory {
                        limit: Some(api::OptionalInt64 { value: 64 * MI }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let req = api::ContainerRequest {
            pod: Some(pod("sb", "")),
            container: Some(c),
        };
        let answer = create(&p, &req).await;
        assert_eq!(answer.adjust, None);
        let model = p.observer.model.read_locked();
        assert_eq!(model.pod("sb").unwrap().containers["g1"].oom_score_adj, 0);
    }

    #[tokio::test]
    async fn a_synchronisation_says_which_containers_criguard_did_not_score() {
        let p = plugin(&[]);
        let container = |id: &str, adj: i64| api::Container {
            id: id.into(),
            pod_sandbox_id: "sb".into(),
            name: id.into(),
            linux: Some(api::LinuxContainer {
                oom_score_adj: Some(api::OptionalInt { value: adj }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let sync = api::SynchronizeRequest {
            pods: vec![pod("sb", "besteffort/")],
            // BestEffort: criguard's score is 1000; one was created with 500.
            containers: vec![container("scored", 1000), container("unscored", 500)],
            more: false,
        };
        let r = p
            .call(PLUGIN_SERVICE, "Synchronize", &sync.encode_to_vec())
            .await;
        assert!(r.into_result().is_ok());
        assert_eq!(p.metrics.unscored.get(), 1);
        let missed = Missed {
            container: "unscored".into(),
            score: 1000,
        };
        assert_eq!(p.take_missed(), [missed]);
        assert_eq!(p.take_missed(), [], "taken once");
        let model = p.observer.model.read_locked();
        assert_eq!(model.pod("sb").expect("synchronised").containers.len(), 2);
    }

    #[tokio::test]
    async fn a_container_gets_its_classes_score_and_the_model_learns_it() {
        let p = plugin(&[]);
        let c = api::Container {
            id: "c1".into(),
            pod_sandbox_id: "sb".into(),
            name: "app".into(),
            linux: Some(api::LinuxContainer {
                oom_score_adj: Some(api::OptionalInt { value: 500 }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let req = api::ContainerRequest {
            pod: Some(pod("sb", "besteffort/")),
            container: Some(c),
        };
        let answer = create(&p, &req).await;
        let adj = answer
            .adjust
            .and_then(|a| a.linux)
            .and_then(|l| l.oom_score_adj);
        assert_eq!(
            adj,
            Some(api::OptionalInt { value: 1000 }),
            "BestEffort's score"
        );
        let model = p.observer.model.read_locked();
        let pod = model
            .pod("sb")
            .expect("the sandbox learnt from the request");
        assert_eq!(pod.containers["c1"].oom_score_adj, 1000);
    }

    #[tokio::test]
    async fn a_synchronisations_last_part_notifies_the_reconcile() {
        let done = Arc::new(Notify::new());
        let p = plugin(&[]).on_synchronised(done.clone());
        let part = |more| {
            api::SynchronizeRequest {
                pods: vec![pod("sb", "")],
                containers: vec![],
                more,
            }
            .encode_to_vec()
        };
        let notified = done.notified();
        tokio::pin!(notified);
        p.call(PLUGIN_SERVICE, "Synchronize", &part(true)).await;
        assert!(
            futures::poll!(notified.as_mut()).is_pending(),
            "a part with more to come"
        );
        p.call(PLUGIN_SERVICE, "Synchronize", &part(false)).await;
        assert!(
            futures::poll!(notified.as_mut()).is_ready(),
            "the last part"
        );
    }

    #[tokio::test]
    async fn a_created_containers_image_is_used_now_by_name_or_by_containerds_annotation() {
        let uses = crate::gc::image_uses::ImageUses::default();
        let observer = Observer::new(Arc::new(RwLock::new(NodeModel::new(8 << 30))))
            .with_image_uses(uses.clone());
        let p = NriObserver::new(observer);
        let request =
            |id: &str, image: Option<&str>, annotated: Option<&str>| api::ContainerRequest {
                pod: Some(pod("sb", "besteffort/")),
                container: Some(api::Container {
                    id: id.into(),
                    pod_sandbox_id: "sb".into(),
                    image: image.map(|name| api::Image { name: name.into() }),
                    annotations: annotated
                        .map(|a| [(IMAGE_NAME_ANNOTATION.to_owned(), a.to_owned())].into())
                        .unwrap_or_default(),
                    ..Default::default()
                }),
            };
        create(&p, &request("c1", Some("registry.k8s.io/app:1"), None)).await;
        create(&p, &request("c2", None, Some("docker.io/library/old:2"))).await;
        create(&p, &request("c3", None, None)).await;
        let seen = uses.take();
        let mut names: Vec<&str> = seen.keys().map(String::as_str).collect();
        names.sort();
        assert_eq!(names, ["docker.io/library/old:2", "registry.k8s.io/app:1"]);
    }
}
