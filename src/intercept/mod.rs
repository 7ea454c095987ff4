//! What criguard learns and decides from the CRI calls it relays: the
//! node model kept current from the lifecycle calls, RunPodSandbox
//! admitted against the node's conditions, CreateContainer patched with
//! criguard's `oom_score_adj`, and image uses noted for image GC. The relay
//! (`crate::cri`) calls it through [`Observe`]; if a message cannot be
//! decoded the call passes through untouched and criguard logs why.

pub mod nri;

use std::sync::{Arc, RwLock};

use k8s_cri::v1 as cri;
use prost::Message;

use crate::cri::observe::{Method, Observe, RequestPlan};
use crate::eviction::metrics::RefusalLabels;
use crate::eviction::{NodeStatus, admission};
use crate::gc::image_uses::ImageUses;
use crate::lock::RwLocked;
use crate::model::{
    ContainerInfo, ContainerState, NodeModel, SandboxInfo, SandboxState, convert, derive,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// Wire-level merge patches.
///
/// Protobuf parses two concatenated messages as their merge: a scalar set in
/// the second wins, nested messages merge field by field, and every other
/// field of the first, known to criguard or not, survives untouched. So a
/// patch is a tiny message holding only the fields to set, appended to the
/// original bytes. It is encoded by hand because prost omits zero scalars,
/// and a patch to 0 must still be written.
pub mod patch {
    use prost::encoding::{WireType, encode_key, encode_varint};

    fn nested(field: u32, inner: &[u8], out: &mut Vec<u8>) {
        encode_key(field, WireType::LengthDelimited, out);
        encode_varint(inner.len() as u64, out);
        out.extend_from_slice(inner);
    }

    /// A `CreateContainerRequest` that sets only
    /// `config.linux.resources.oom_score_adj` (fields 2 → 15 → 1 → 5).
    pub fn create_container_oom_score_adj(adj: i64) -> Vec<u8> {
        let mut resources = Vec::new();
        encode_key(5, WireType::Varint, &mut resources);
        encode_varint(adj as u64, &mut resources);
        let mut linux = Vec::new();
        nested(1, &resources, &mut linux);
        let mut config = Vec::new();
        nested(15, &linux, &mut config);
        let mut request = Vec::new();
        nested(2, &config, &mut request);
        request
    }
}

/// Decodes observed calls into the node model, patches CreateContainer and
/// admits RunPodSandbox.
#[derive(Debug, Clone)]
pub struct Observer {
    model: Arc<RwLock<NodeModel>>,
    status: Option<Arc<RwLock<NodeStatus>>>,
    refusals: Option<Family<RefusalLabels, Counter>>,
    image_uses: Option<ImageUses>,
    guarding: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Observer {
    /// An observer that keeps `model` current (and admits every pod).
    pub fn new(model: Arc<RwLock<NodeModel>>) -> Self {
        Self {
            model,
            status: None,
            refusals: None,
            image_uses: None,
            guarding: None,
        }
    }

    /// The same observer, changing requests (the `oom_score_adj` patch,
    /// admission refusals) only while `guarding` is true; while it is
    /// false every request is forwarded unchanged and the model is still
    /// kept current. `serve` clears it while it fails open on a
    /// configuration it cannot accept.
    pub fn with_guarding(mut self, guarding: Arc<std::sync::atomic::AtomicBool>) -> Self {
        self.guarding = Some(guarding);
        self
    }

    /// The same observer, telling image GC of each container created.
    pub fn with_image_uses(mut self, uses: ImageUses) -> Self {
        self.image_uses = Some(uses);
        self
    }

    /// The same observer, admitting pods against the node's `status`.
    pub fn with_admission(
        mut self,
        status: Arc<RwLock<NodeStatus>>,
        refusals: Family<RefusalLabels, Counter>,
    ) -> Self {
        self.status = Some(status);
        self.refusals = Some(refusals);
        self
    }

    /// The admission decision for a RunPodSandbox request.
    fn admit(&self, msg: &[u8]) -> Option<String> {
        let req = cri::RunPodSandboxRequest::decode(msg).ok()?;
        self.admit_sandbox(&convert::sandbox_from_request("", &req.config?))
    }

    /// The admission decision for the pod of `sandbox`, about to start:
    /// the refusal's message (the kubelet's), or `None` to admit it. Every
    /// pod is admitted without a node status to decide on.
    pub fn admit_sandbox(&self, sandbox: &SandboxInfo) -> Option<String> {
        let status = self.status.as_ref()?;
        let uid = &sandbox.uid;
        // Unknown class (no kubelet cgroup parent): not refused as BestEffort.
        let qos = derive::qos_from_cgroup_parent(&sandbox.cgroup_parent)
            .unwrap_or(crate::model::qos::QosClass::Burstable);
        let ann = |k: &str| sandbox.annotations.get(k).map(String::as_str);
        let static_pod = derive::is_static(ann(derive::CONFIG_SOURCE_ANNOTATION));
        // The API's pod where known (IsCriticalPod), else the annotation.
        let api_critical = self.model.read_locked().api_pod(uid).map(|p| p.critical());
        let critical = static_pod
            || api_critical.unwrap_or_else(|| {
                let priority = derive::priority(ann(derive::PRIORITY_ANNOTATION)).unwrap_or(0);
                derive::is_critical(static_pod, priority, qos, &[])
            });
        let now_ms = crate::clock::now_ms();
        let (refusal, why) = admission::decide(status, uid, qos, critical, now_ms).err()?;
        if let Some(r) = &self.refusals {
            r.get_or_create(&RefusalLabels { condition: refusal }).inc();
        }
        let pod = format!("{}/{}", sandbox.namespace, sandbox.name);
        crate::log_limited!(info, %pod, %uid, ?qos, reason = %why, "RunPodSandbox refused");
        Some(why)
    }

    /// The model this observer feeds.
    pub fn model(&self) -> &Arc<RwLock<NodeModel>> {
        &self.model
    }

    /// The `oom_score_adj` criguard gives a container about to be created:
    /// the kubelet's own rule applied to what the model knows of the pod.
    fn oom_score_adj_for(&self, req: &cri::CreateContainerRequest) -> Option<i64> {
        let config = req.config.as_ref()?;
        // Not seen through criguard (e.g. created before a restart and not
        // yet synced): the kubelet sends the sandbox config along.
        let fallback = req
            .sandbox_config
            .as_ref()
            .map(|sb| convert::sandbox_from_request(&req.pod_sandbox_id, sb));
        const PROBE: &str = "\0criguard-probe";
        let probe = convert::container_from_request(PROBE, &req.pod_sandbox_id, config);
        self.score_for(fallback, &probe)
    }

    /// The `oom_score_adj` criguard gives `container`, about to be created
    /// in its sandbox (the model's, else `fallback`): the kubelet's rule on
    /// what the model knows of the pod with it. `None` for a pod the
    /// kubelet did not make (no kubepods cgroup parent, e.g. crictl's),
    /// which keeps the score its client asked for.
    pub fn score_for(
        &self,
        fallback: Option<SandboxInfo>,
        container: &ContainerInfo,
    ) -> Option<i64> {
        // Under the read lock only to derive this one pod: no copy of the
        // model, no I/O.
        let (pod, capacity) = {
            let m = self.model.read_locked();
            (
                m.pod_with(&container.sandbox_id, fallback, container)?,
                m.memory_capacity(),
            )
        };
        derive::qos_from_cgroup_parent(&pod.cgroup_parent)?;
        let c = pod.containers.get(&container.id)?;
        // From the API's pod where known (v1.37's rule: pod-level share,
        // sidecars, node-critical), else the plain rule on what CRI tells.
        let to = c.api_oom_score_adj.unwrap_or_else(|| {
            derive::kubelet_oom_score_adj(
                pod.qos,
                pod.critical && c.oom_score_adj == crate::model::qos::GUARANTEED_OOM_SCORE_ADJ,
                c.memory_request,
                capacity,
            )
        });
        tracing::debug!(
            pod = %format_args!("{}/{}", pod.namespace, pod.name),
            container = %container.name,
            from = c.oom_score_adj,
            to,
            "CreateContainer oom_score_adj set"
        );
        Some(to)
    }

    /// Notes that a container was just created from `image` (image GC's
    /// last use of it).
    pub fn image_used(&self, image: &str) {
        if let Some(uses) = &self.image_uses {
            uses.touch(image);
        }
    }

    /// Whether requests are to be changed (patched, refused) now.
    pub fn guarding(&self) -> bool {
        let on =
            |g: &Arc<std::sync::atomic::AtomicBool>| g.load(std::sync::atomic::Ordering::Acquire);
        self.guarding.as_ref().is_none_or(on)
    }

    fn apply(&self, method: Method, req: &[u8], resp: &[u8]) -> Result<(), prost::DecodeError> {
        let mut m = self.model.write_locked();
        match method {
            Method::RunPodSandbox => {
                let r = cri::RunPodSandboxRequest::decode(req)?;
                let id = cri::RunPodSandboxResponse::decode(resp)?.pod_sandbox_id;
                let config = r.config.unwrap_or_default();
                m.upsert_sandbox(convert::sandbox_from_request(&id, &config));
                tracing::debug!(sandbox = %id, pod = ?config.metadata, "pod sandbox started");
            }
            Method::CreateContainer => {
                let r = cri::CreateContainerRequest::decode(req)?;
                let id = cri::CreateContainerResponse::decode(resp)?.container_id;
                if m.sandbox_info(&r.pod_sandbox_id).is_none()
                    && let Some(sandbox) = &r.sandbox_config
                {
                    m.upsert_sandbox(convert::sandbox_from_request(&r.pod_sandbox_id, sandbox));
                }
                let config = r.config.unwrap_or_default();
                if let Some(image) = &config.image {
                    self.image_used(&image.image);
                }
                m.upsert_container(convert::container_from_request(
                    &id,
                    &r.pod_sandbox_id,
                    &config,
                ));
            }
            Method::StartContainer => {
                let r = cri::StartContainerRequest::decode(req)?;
                m.set_container_state(&r.container_id, ContainerState::Running);
            }
            Method::StopContainer => {
                let r = cri::StopContainerRequest::decode(req)?;
                m.set_container_state(&r.container_id, ContainerState::Exited);
            }
            Method::RemoveContainer => {
                let r = cri::RemoveContainerRequest::decode(req)?;
                m.remove_container(&r.container_id);
            }
            Method::StopPodSandbox => {
                let r = cri::StopPodSandboxRequest::decode(req)?;
                m.set_sandbox_state(&r.pod_sandbox_id, SandboxState::NotReady);
            }
            Method::RemovePodSandbox => {
                let r = cri::RemovePodSandboxRequest::decode(req)?;
                m.remove_sandbox(&r.pod_sandbox_id);
            }
            Method::UpdateContainerResources => {
                let r = cri::UpdateContainerResourcesRequest::decode(req)?;
                if let Some(linux) = r.linux {
                    m.update_container_resources(&r.container_id, &convert::resources(&linux));
                }
            }
        }
        Ok(())
    }
}

/// An observer over an empty 8 GiB node model whose node is under
/// MemoryPressure (so BestEffort pods are refused): what the fuzz targets
/// and the corpus replay test drive the relay with (`cri::fuzz::relay`).
pub fn fuzz_observer() -> Observer {
    let status = NodeStatus {
        conditions: [crate::signals::table::Condition::MemoryPressure].into(),
        ..Default::default()
    };
    Observer::new(Arc::new(RwLock::new(NodeModel::new(8 << 30))))
        .with_admission(Arc::new(RwLock::new(status)), Default::default())
}

impl Observe for Observer {
    /// Looks at a request message before it is forwarded.
    fn on_request(&self, method: Method, msg: &[u8]) -> RequestPlan {
        if !self.guarding() {
            return RequestPlan::default();
        }
        match method {
            Method::RunPodSandbox => RequestPlan {
                patch: None,
                refuse: self.admit(msg),
            },
            Method::CreateContainer => match cri::CreateContainerRequest::decode(msg) {
                Ok(req) => RequestPlan {
                    patch: self
                        .oom_score_adj_for(&req)
                        .map(patch::create_container_oom_score_adj),
                    refuse: None,
                },
                Err(err) => {
                    crate::log_limited!(warn, %err, "CreateContainer request not decodable; forwarded unpatched");
                    RequestPlan::default()
                }
            },
            _ => RequestPlan::default(),
        }
    }

    /// Looks at a successful answer (gRPC status OK) and updates the model.
    fn on_response(&self, method: Method, req: &[u8], resp: &[u8]) {
        if let Err(err) = self.apply(method, req, resp) {
            crate::log_limited!(warn, ?method, %err, "observed call not decodable; model not updated");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures;

    #[test]
    fn patch_merges_into_a_full_request_and_keeps_every_other_field() {
        let original = cri::CreateContainerRequest {
            pod_sandbox_id: "sb".into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "app".into(),
                    attempt: 2,
                }),
                linux: Some(cri::LinuxContainerConfig {
                    resources: Some(cri::LinuxContainerResources {
                        cpu_shares: 512,
                        memory_limit_in_bytes: 1 << 30,
                        oom_score_adj: 500,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            sandbox_config: None,
        };
        for adj in [-998i64, -997, 0, 3, 999, 1000] {
            let mut bytes = original.encode_to_vec();
            bytes.extend(patch::create_container_oom_score_adj(adj));
            let merged = cri::CreateContainerRequest::decode(bytes.as_slice()).unwrap();
            let mut want = original.clone();
            want.config
                .as_mut()
                .unwrap()
                .linux
                .as_mut()
                .unwrap()
                .resources
                .as_mut()
                .unwrap()
                .oom_score_adj = adj;
            assert_eq!(merged, want, "adj {adj}");
        }
    }

    fn create_request(cgroup_parent: &str) -> Vec<u8> {
        cri::CreateContainerRequest {
            pod_sandbox_id: "sb1".into(),
            config: Some(fixtures::container_config()),
            sandbox_config: Some(fixtures::sandbox_config(cgroup_parent)),
        }
        .encode_to_vec()
    }

    #[test]
    fn kubelet_containers_are_patched_and_others_keep_their_score() {
        let observer = Observer::new(Arc::new(RwLock::new(NodeModel::new(8 << 30))));
        let kubelet = create_request("/kubepods/besteffort/poduid-1");
        let plan = observer.on_request(Method::CreateContainer, &kubelet);
        assert_eq!(
            plan.patch,
            Some(patch::create_container_oom_score_adj(1000))
        );
        // crictl's pods have no kubepods cgroup parent: nothing to rank them by.
        for parent in ["", "/", "/system.slice", "/criguard-test/pod1"] {
            let plan = observer.on_request(Method::CreateContainer, &create_request(parent));
            assert_eq!(plan.patch, None, "{parent:?}");
        }
    }

    #[test]
    fn with_the_apis_pod_the_patch_is_v1_37s_score_and_a_resize_reaches_the_model() {
        use crate::model::spec::{ApiContainer, ApiPod, ContainerKind, Resources};
        let model = Arc::new(RwLock::new(NodeModel::new(4_000_000_000)));
        let observer = Observer::new(model.clone());
        // No API pod: the plain rule on the container's 0 request.
        let create = create_request("/kubepods/burstable/poduid-1");
        let plain = observer.on_request(Method::CreateContainer, &create);
        assert_eq!(
            plain.patch,
            Some(patch::create_container_oom_score_adj(999))
        );
        // A 2e9 pod-level request shared by the one container: 500.
        model.write().unwrap().upsert_api_pod(ApiPod {
            uid: "uid-1".into(),
            containers: vec![ApiContainer {
                name: "app".into(),
                kind: ContainerKind::Regular,
                requests: Resources::default(),
                limits: Resources::default(),
            }],
            pod_level: true,
            pod_memory_request: Some(2_000_000_000),
            ..Default::default()
        });
        let plan = observer.on_request(Method::CreateContainer, &create);
        assert_eq!(plan.patch, Some(patch::create_container_oom_score_adj(500)));

        // UpdateContainerResources: the model's limit follows.
        let run = cri::RunPodSandboxRequest {
            config: cri::CreateContainerRequest::decode(create.as_slice())
                .unwrap()
                .sandbox_config,
            ..Default::default()
        };
        let ran = cri::RunPodSandboxResponse {
            pod_sandbox_id: "sb1".into(),
        };
        observer.on_response(
            Method::RunPodSandbox,
            &run.encode_to_vec(),
            &ran.encode_to_vec(),
        );
        let created = cri::CreateContainerResponse {
            container_id: "c1".into(),
        };
        observer.on_response(Method::CreateContainer, &create, &created.encode_to_vec());
        let update = cri::UpdateContainerResourcesRequest {
            container_id: "c1".into(),
            linux: Some(cri::LinuxContainerResources {
                memory_limit_in_bytes: 768 << 20,
                ..Default::default()
            }),
            ..Default::default()
        };
        observer.on_response(
            Method::UpdateContainerResources,
            &update.encode_to_vec(),
            &[],
        );
        let pod = model.read().unwrap().pod("sb1").unwrap();
        assert_eq!(pod.containers["c1"].memory_limit, 768 << 20);
    }

    #[test]
    fn a_dry_run_refuses_no_pod_for_a_condition_but_still_an_evicted_one() {
        let run = cri::RunPodSandboxRequest {
            config: Some(fixtures::sandbox_config("/kubepods/besteffort/poduid-1")),
            ..Default::default()
        }
        .encode_to_vec();
        let refused = |dry_run: bool, evicted: bool| {
            let mut status = NodeStatus {
                conditions: [crate::signals::table::Condition::MemoryPressure].into(),
                dry_run,
                ..Default::default()
            };
            if evicted {
                status.evicted.insert("uid-1", "default/p", "evicted", 0);
            }
            let observer = Observer::new(Arc::new(RwLock::new(NodeModel::new(8 << 30))))
                .with_admission(Arc::new(RwLock::new(status)), Default::default());
            observer
                .on_request(Method::RunPodSandbox, &run)
                .refuse
                .is_some()
        };
        assert!(refused(false, false), "BestEffort under MemoryPressure");
        // A critical pod by the API's priority is admitted.
        let status = NodeStatus {
            conditions: [crate::signals::table::Condition::MemoryPressure].into(),
            ..Default::default()
        };
        let model = Arc::new(RwLock::new(NodeModel::new(8 << 30)));
        model
            .write()
            .unwrap()
            .upsert_api_pod(crate::model::spec::ApiPod {
                uid: "uid-1".into(),
                priority: Some(2_000_000_000),
                ..Default::default()
            });
        let observer =
            Observer::new(model).with_admission(Arc::new(RwLock::new(status)), Default::default());
        assert!(
            observer
                .on_request(Method::RunPodSandbox, &run)
                .refuse
                .is_none()
        );
        assert!(!refused(true, false), "a dry run admits it");
        assert!(refused(true, true), "an evicted pod stays refused");
    }
}
