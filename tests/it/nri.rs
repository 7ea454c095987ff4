//! criguard's NRI protocol (`criguard::nri`) against containerd 2's own
//! NRI, the Go trunk and ttRPC it ships: a plugin of ours registers on a
//! private containerd 2 with NRI on, is configured and synchronised, fails
//! a RunPodSandbox with its message, and sets a container's
//! `oom_score_adj` in its CreateContainer answer. containerd 1.6 has no NRI
//! on by default: `hack/test.sh` runs this module in its containerd 2 group
//! only, and on 1.6 the test says so and passes.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::containerd::{ContainerdVersion, PrivateContainerd, unique};
use common::kubelet::PodSpec;
use common::pods::{proc_oom_score_adj, remove_pods, run_pod, sleeper};
use criguard::nri::api;
use criguard::nri::conn::{Handler, serve};
use criguard::nri::ttrpc::Response;
use k8s_cri::v1 as cri;
use prost::Message;
use tokio::sync::{mpsc, oneshot};

/// Refuses pods named `refused`, gives every container `oom_score_adj`
/// 321, and reports each call it answers.
struct Plugin {
    calls: mpsc::UnboundedSender<String>,
}

const REFUSAL: &str = "criguard-test: the node is under memory pressure";

impl Handler for Plugin {
    async fn call(&self, service: &str, method: &str, payload: &[u8]) -> Response {
        let _ = self.calls.send(method.to_owned());
        assert_eq!(service, "nri.pkg.api.v1alpha1.Plugin");
        let refused = |pod: Option<&api::PodSandbox>| pod.is_some_and(|p| p.name == "refused");
        match method {
            // Bits of RUN_POD_SANDBOX (1) and CREATE_CONTAINER (4).
            "Configure" => Response::ok(&api::ConfigureResponse { events: 0b1001 }),
            "Synchronize" => {
                let req = api::SynchronizeRequest::decode(payload).unwrap();
                Response::ok(&api::SynchronizeResponse {
                    update: vec![],
                    more: req.more,
                })
            }
            "RunPodSandbox" => {
                let req = api::PodSandboxRequest::decode(payload).unwrap();
                if refused(req.pod.as_ref()) {
                    return Response::error(tonic::Code::FailedPrecondition, REFUSAL);
                }
                Response::ok(&api::Empty {})
            }
            "CreateContainer" => {
                let adjust = api::ContainerAdjustment {
                    linux: Some(api::LinuxContainerAdjustment {
                        oom_score_adj: Some(api::OptionalInt { value: 321 }),
                    }),
                };
                Response::ok(&api::CreateContainerResponse {
                    adjust: Some(adjust),
                    update: vec![],
                })
            }
            other => Response::error(tonic::Code::Unimplemented, format!("method {other}")),
        }
    }
}

#[tokio::test]
async fn a_plugin_of_ours_registers_with_containerd_2_and_is_obeyed() {
    if ContainerdVersion::selected() != ContainerdVersion::V2 {
        eprintln!("NRI is tested on containerd 2 (CRIGUARD_CONTAINERD=2): skipped here");
        return;
    }
    // hack/containerd.sh disables NRI (its default socket would be shared);
    // this instance has it on, its socket under its own directory.
    let on = "disabled_plugins = [\"io.containerd.snapshotter.v1.aufs\", \
              \"io.containerd.snapshotter.v1.btrfs\", \"io.containerd.snapshotter.v1.zfs\", \
              \"io.containerd.snapshotter.v1.devmapper\"]\n\
              [plugins.\"io.containerd.nri.v1.nri\"]\ndisable = false\n";
    let ctrd = PrivateContainerd::start_with_toml(on);
    let socket = ctrd.dir.join("nri/nri.sock");
    let stream = common::poll_until(Duration::from_secs(10), "containerd's NRI socket", || {
        let socket = socket.clone();
        async move { tokio::net::UnixStream::connect(&socket).await.ok() }
    })
    .await;
    let (calls_tx, mut calls) = mpsc::unbounded_channel();
    let (ready, client) = oneshot::channel();
    let served = tokio::spawn(serve(stream, Arc::new(Plugin { calls: calls_tx }), ready));
    let client = client.await.unwrap();
    let register = api::RegisterPluginRequest {
        plugin_name: "criguard-test".into(),
        plugin_idx: "10".into(),
        nri_version: String::new(),
    };
    let service = "nri.pkg.api.v1alpha1.Runtime";
    let t = Duration::from_secs(5);
    client
        .call(service, "RegisterPlugin", &register, t)
        .await
        .expect("registered");
    let next = |calls: &mut mpsc::UnboundedReceiver<String>| {
        let got = calls.try_recv();
        got.ok()
    };
    let first = tokio::time::timeout(t, calls.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first, "Configure");
    let second = tokio::time::timeout(t, calls.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second, "Synchronize");
    assert_eq!(next(&mut calls), None, "nothing else before a pod");

    // A refused pod: containerd fails the CRI call with the plugin's words.
    let mut c = ctrd.direct();
    let refused = PodSpec::new("refused", &unique("nri")).container(sleeper("app"));
    std::fs::create_dir_all(refused.log_directory()).unwrap();
    let err =
        c.rt.run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(refused.sandbox_config()),
            runtime_handler: String::new(),
        })
        .await
        .expect_err("RunPodSandbox refused by the plugin");
    assert!(err.message().contains(REFUSAL), "{err:?}");
    assert_eq!(next(&mut calls).as_deref(), Some("RunPodSandbox"));

    // An admitted pod: its container runs with the plugin's score.
    let pod = PodSpec::new("admitted", &unique("nri")).container(sleeper("app"));
    let (sandbox, ids) = run_pod(&mut c.rt, &pod, None).await;
    assert_eq!(proc_oom_score_adj(&mut c, Some(&ids[0]), None).await, 321);
    let seen: Vec<String> = std::iter::from_fn(|| next(&mut calls)).collect();
    assert_eq!(seen, ["RunPodSandbox", "CreateContainer"]);

    remove_pods(&mut c.rt, [sandbox]).await;
    drop(client);
    served.abort();
}
