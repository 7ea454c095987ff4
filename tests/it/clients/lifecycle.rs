//! The kubelet's pod lifecycle, made by one client kind against a private
//! containerd twice: once directly (pod A) and once through criguard (pod B).
//! Every read is made on both paths at that moment and must come back byte
//! for byte the same (status, metadata, message bytes); the two runs'
//! transcripts must then match once pod ids, uids and timestamps, which
//! legitimately differ, are normalised.

use std::collections::HashMap;

use k8s_cri::v1 as cri;
use prost::Message;

use super::decoded::{Decoded, Meta, decode, replace};
use crate::common::clients::{Answer, Call, Client, Kind};
use crate::common::containerd::{ContainerdVersion, CriguardProcess, PrivateContainerd, unique};
use crate::common::pods::{BUSYBOX, CgroupRoot, mem_total};
use criguard_test_kit::kubelet::{ContainerSpec, PodSpec};

const RT: &str = "/runtime.v1.RuntimeService/";
const IMG: &str = "/runtime.v1.ImageService/";

/// One run's answers, normalised: (method, decoded answer, header, trailer).
type Transcript = Vec<(String, Decoded, Meta, Meta)>;

/// Runs the lifecycle directly and through criguard with clients of `kind`.
pub async fn matches_direct(kind: Kind) {
    // Declared first so that it is dropped last, after containerd.
    let root = format!("/{}", unique("criguard-clients"));
    let _cg = CgroupRoot(root.clone());
    let ctrd = PrivateContainerd::start();
    let guard =
        CriguardProcess::start(&ctrd.dir.join("criguard/criguard.sock"), &ctrd.socket, &[]).await;
    let direct = Client::connect(&kind, &ctrd.socket).await;
    let proxied = Client::connect(&kind, &super::through(&guard, &ctrd.socket)).await;
    let log_root = ctrd.dir.join("pods");
    let a = Run::new(ctrd.version, (&direct, "direct"), (&proxied, "criguard"))
        .lifecycle(&root, &log_root)
        .await;
    let b = Run::new(ctrd.version, (&proxied, "criguard"), (&direct, "direct"))
        .lifecycle(&root, &log_root)
        .await;
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            x, y,
            "{kind:?}: direct run (left) vs run through criguard (right)"
        );
    }
}

/// Mutations go through `via`; reads go through `via` and `peer` and must agree.
struct Run<'a> {
    /// The containerd both paths lead to.
    version: ContainerdVersion,
    via: (&'a Client, &'static str),
    peer: (&'a Client, &'static str),
    answers: Vec<(String, Answer)>,
    /// Strings that differ between the runs, and a stand-in of equal length.
    ids: Vec<(String, String)>,
}

impl<'a> Run<'a> {
    fn new(
        version: ContainerdVersion,
        via: (&'a Client, &'static str),
        peer: (&'a Client, &'static str),
    ) -> Self {
        Self {
            version,
            via,
            peer,
            answers: Vec::new(),
            ids: Vec::new(),
        }
    }

    /// Remembers that `id` differs between runs; `mark` stands in for it.
    fn differs(&mut self, id: &str, mark: char) {
        self.ids
            .push((id.to_owned(), mark.to_string().repeat(id.len())));
    }

    /// A call through `via` only.
    async fn write(&mut self, method: &str, req: &impl Message) -> Answer {
        let a = self
            .via
            .0
            .call(Call::unary(method, req.encode_to_vec()))
            .await;
        self.answers.push((method.to_owned(), a.clone()));
        a
    }

    /// The same call on both paths at once; the answers must agree.
    async fn read(&mut self, method: &str, req: &impl Message) -> Answer {
        self.both(Call::unary(method, req.encode_to_vec())).await
    }

    async fn both(&mut self, call: Call) -> Answer {
        let method = call.method.clone();
        let a = self.via.0.call(call.clone()).await;
        let b = self.peer.0.call(call).await;
        assert_eq!(
            decode(&method, &a),
            decode(&method, &b),
            "{:?} {method}: {} (left) and {} (right) answer differently",
            self.via.0.kind,
            self.via.1,
            self.peer.1
        );
        self.answers.push((method, a.clone()));
        a
    }

    /// The answers with this run's ids replaced and times zeroed.
    fn transcript(&self) -> Transcript {
        self.answers
            .iter()
            .map(|(method, a)| {
                let mut a = a.clone();
                for (id, mark) in &self.ids {
                    for m in &mut a.msgs {
                        replace(m, id.as_bytes(), mark.as_bytes());
                    }
                    a.message = a.message.replace(id.as_str(), mark);
                }
                let (d, h, t) = decode(method, &a);
                (method.clone(), d, h, t)
            })
            .collect()
    }

    async fn lifecycle(mut self, root: &str, log_root: &std::path::Path) -> Transcript {
        let v = cri::VersionRequest {
            version: "v1".into(),
        };
        let version = self.read(&format!("{RT}Version"), &v).await;
        assert_eq!(
            cri::VersionResponse::decode(version.ok())
                .unwrap()
                .runtime_name,
            "containerd"
        );
        self.read(
            &format!("{RT}Status"),
            &cri::StatusRequest { verbose: false },
        )
        .await;
        // containerd 1.6 does not know RuntimeConfig: the same error both ways.
        self.read(&format!("{RT}RuntimeConfig"), &cri::RuntimeConfigRequest {})
            .await;

        // Images: the local ones, and a pull that fails the same way.
        let images = self
            .read(
                &format!("{IMG}ListImages"),
                &cri::ListImagesRequest { filter: None },
            )
            .await;
        let listed = cri::ListImagesResponse::decode(images.ok()).unwrap();
        assert!(
            listed
                .images
                .iter()
                .any(|i| i.repo_tags.iter().any(|t| t == BUSYBOX))
        );
        let image = |name: &str| {
            Some(cri::ImageSpec {
                image: name.into(),
                ..Default::default()
            })
        };
        let status = cri::ImageStatusRequest {
            image: image(BUSYBOX),
            verbose: false,
        };
        self.read(&format!("{IMG}ImageStatus"), &status).await;
        let bad = cri::PullImageRequest {
            image: image("Not/A:Valid::Reference"),
            ..Default::default()
        };
        let pulled = self.read(&format!("{IMG}PullImage"), &bad).await;
        assert_ne!(pulled.code, 0, "{pulled:?}");

        // A Burstable pod, the kubelet's way.
        // The same length in both runs, like the ids containerd makes.
        let uid = format!("uid-{:016x}", rand_u64());
        let mut pod = PodSpec::new("web", &uid).container(ContainerSpec {
            name: "app".into(),
            image: BUSYBOX.into(),
            command: vec!["sleep".into(), "3600".into()],
            memory_request: 32 << 20,
            memory_limit: 64 << 20,
            cpu_request_milli: 100,
            ..Default::default()
        });
        pod.cgroup_root = format!("{root}/kubepods");
        // The kubelet's oom_score_adj formula with this node's memory: the
        // score criguard computes too, so its patch changes nothing here.
        pod.node_memory = mem_total();
        pod.log_root = log_root.to_str().unwrap().to_owned();
        pod.annotations = HashMap::from([("kubernetes.io/config.source".into(), "api".into())]);
        std::fs::create_dir_all(pod.log_directory()).unwrap();
        self.differs(&uid, 'U');
        let config = pod.sandbox_config();
        let run = cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        };
        let sandbox = cri::RunPodSandboxResponse::decode(
            self.write(&format!("{RT}RunPodSandbox"), &run).await.ok(),
        )
        .unwrap()
        .pod_sandbox_id;
        self.differs(&sandbox, 'S');
        let ps = cri::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox.clone(),
            verbose: false,
        };
        self.read(&format!("{RT}PodSandboxStatus"), &ps).await;
        let lps = cri::ListPodSandboxRequest { filter: None };
        self.read(&format!("{RT}ListPodSandbox"), &lps).await;

        let create = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(pod.container_config(0)),
            sandbox_config: Some(config),
        };
        let created = cri::CreateContainerResponse::decode(
            self.write(&format!("{RT}CreateContainer"), &create)
                .await
                .ok(),
        )
        .unwrap()
        .container_id;
        self.differs(&created, 'C');
        let id = cri::StartContainerRequest {
            container_id: created.clone(),
        };
        self.write(&format!("{RT}StartContainer"), &id).await.ok();
        let cs = cri::ContainerStatusRequest {
            container_id: created.clone(),
            verbose: false,
        };
        let st = self.read(&format!("{RT}ContainerStatus"), &cs).await;
        let state = cri::ContainerStatusResponse::decode(st.ok())
            .unwrap()
            .status
            .unwrap()
            .state;
        assert_eq!(state, cri::ContainerState::ContainerRunning as i32);
        let lc = cri::ListContainersRequest { filter: None };
        self.read(&format!("{RT}ListContainers"), &lc).await;
        let exec = cri::ExecSyncRequest {
            container_id: created.clone(),
            cmd: vec![
                "sh".into(),
                "-c".into(),
                "echo hello; echo oops >&2; exit 3".into(),
            ],
            timeout: 10,
        };
        let out = self.read(&format!("{RT}ExecSync"), &exec).await;
        assert_eq!(
            cri::ExecSyncResponse::decode(out.ok()).unwrap().exit_code,
            3
        );

        // Errors and a server stream containerd 1.6 does not serve.
        let missing = cri::ContainerStatusRequest {
            container_id: "does-not-exist".into(),
            verbose: false,
        };
        let err = self.read(&format!("{RT}ContainerStatus"), &missing).await;
        assert_eq!(err.code, tonic::Code::NotFound as i32, "{err:?}");
        let mut events = Call::unary(&format!("{RT}GetContainerEvents"), vec![]);
        events.stream = true;
        match self.version {
            // Unimplemented, the same answer both ways.
            ContainerdVersion::V1_6 => {
                let a = self.both(events).await;
                assert_eq!(a.code, tonic::Code::Unimplemented as i32, "{a:?}");
            }
            // Served. containerd 2.x hands the events that found no
            // subscriber (kept five minutes) to the next one to subscribe
            // and the later ones to every live subscriber (tests/it/lifecycle.rs
            // checks that fan-out through criguard). A first call takes
            // the queued ones (not always all: a subscription that ended
            // stays listed until the next event, which may go into its
            // dead buffer instead); then, with nothing happening, each
            // path must hold its stream open until the deadline and end it
            // there with no event. Who ends it (the client's or the
            // server's timer; grpc-go resets the stream) decides code and
            // message: timing, not the path.
            ContainerdVersion::V2 => {
                let deadline = std::time::Duration::from_secs(1);
                events.timeout = Some(deadline);
                let drained = self.via.0.call(events.clone()).await;
                assert!(
                    [
                        tonic::Code::DeadlineExceeded as i32,
                        tonic::Code::Cancelled as i32
                    ]
                    .contains(&drained.code),
                    "the first stream must end by its deadline: {drained:?}"
                );
                for (client, side) in [self.via, self.peer] {
                    let t0 = std::time::Instant::now();
                    let a = client.call(events.clone()).await;
                    let held = t0.elapsed();
                    assert!(
                        [
                            tonic::Code::DeadlineExceeded as i32,
                            tonic::Code::Cancelled as i32
                        ]
                        .contains(&a.code),
                        "{:?} {side}: the stream must end by its deadline: {a:?}",
                        client.kind
                    );
                    assert!(
                        held + std::time::Duration::from_millis(100) >= deadline,
                        "{side}: ended after {held:?}, before its {deadline:?} deadline: {a:?}"
                    );
                    assert!(a.msgs.is_empty(), "{side}: nothing happened: {a:?}");
                }
            }
        }

        // Teardown, the kubelet's order.
        let stop = cri::StopContainerRequest {
            container_id: created.clone(),
            timeout: 0,
        };
        self.write(&format!("{RT}StopContainer"), &stop).await.ok();
        let st = self.read(&format!("{RT}ContainerStatus"), &cs).await;
        let state = cri::ContainerStatusResponse::decode(st.ok())
            .unwrap()
            .status
            .unwrap()
            .state;
        assert_eq!(state, cri::ContainerState::ContainerExited as i32);
        let rm = cri::RemoveContainerRequest {
            container_id: created,
        };
        self.write(&format!("{RT}RemoveContainer"), &rm).await.ok();
        let sps = cri::StopPodSandboxRequest {
            pod_sandbox_id: sandbox.clone(),
        };
        self.write(&format!("{RT}StopPodSandbox"), &sps).await.ok();
        self.read(&format!("{RT}PodSandboxStatus"), &ps).await;
        let rps = cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox,
        };
        self.write(&format!("{RT}RemovePodSandbox"), &rps)
            .await
            .ok();
        let left = self.read(&format!("{RT}ListPodSandbox"), &lps).await;
        assert!(
            cri::ListPodSandboxResponse::decode(left.ok())
                .unwrap()
                .items
                .is_empty()
        );
        self.read(&format!("{RT}ListContainers"), &lc).await;
        self.transcript()
    }
}

/// 64 bits that differ from call to call.
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    h.finish()
}
