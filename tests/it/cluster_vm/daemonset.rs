//! criguard rolled out by Kubernetes itself on the VM node: `deploy/`
//! (the DaemonSet, criguard in NRI mode) applied with `kubectl apply -k`
//! through an overlay for this cluster, after the package's criguard is
//! stopped and the kubelet dials containerd (the undo before this).
//!
//! - the DaemonSet's pod becomes Ready (`criguard status --ready`:
//!   attached to containerd's NRI, the model reconciled), its image
//!   imported into the node's containerd as a node without a registry
//!   would have it;
//! - a memory hog grows until the DaemonSet's criguard evicts it: the API
//!   shows it Failed/Evicted with its DisruptionTarget condition, criguard
//!   records the eviction, the kubelet saw no pressure of its own, and
//!   criguard's condition and taint go after the transition period;
//! - a new image tag rolls the DaemonSet while pods are created: each of
//!   them runs, no warning event, and the new criguard's model has them;
//! - `kubectl delete -k`: the pod goes, no criguard runs on the node and a
//!   new pod runs on containerd alone.
//!
//! The cluster has no pod network (hostNetwork pods only) nor kube-proxy:
//! the overlay runs criguard's pod on the host network and names the API
//! server's address in the guest; a cluster with both needs neither.

use super::*;

/// The DaemonSet's namespace and label.
const DS_NS: &str = "kube-system";
const DS_LABEL: &str = "app.kubernetes.io/name=criguard";
/// The image's name and its two tags: the rollout's before and after.
const IMAGE: &str = "localhost/criguard";
const TAGS: [&str; 2] = ["one", "two"];

/// In the guest (no procps there): fails while a process named criguard runs.
const NO_CRIGUARD: &str = "! grep -qx criguard /proc/[0-9]*/comm 2>/dev/null";

/// What the DaemonSet phase measured.
pub(super) struct Rollout {
    /// `kubectl apply -k` to the node's criguard pod Ready.
    pub install: Duration,
    /// The tag changed to the new pod Ready (the old one gone).
    pub upgrade: Duration,
    /// The hog applied to its eviction.
    pub eviction: Duration,
    /// `kubectl delete -k` to the pod gone.
    pub removal: Duration,
}

/// The overlay's directory under the cluster's.
fn overlay_dir(c: &Cluster) -> PathBuf {
    c.dir.join("daemonset-overlay")
}

/// `path` relative to `from` (kustomize takes no absolute base).
fn relative(from: &std::path::Path, path: &std::path::Path) -> String {
    let up = from.components().count() - 1;
    format!(
        "{}{}",
        "../".repeat(up),
        path.strip_prefix("/").unwrap().display()
    )
}

/// Writes the overlay of `deploy/` for this cluster with image tag `tag`.
fn write_overlay(c: &Cluster, tag: &str) {
    let dir = overlay_dir(c);
    std::fs::create_dir_all(&dir).unwrap();
    let base = relative(&dir, &repo().join("deploy"));
    let kustomization = format!(
        r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [{base}]
images: [{{name: {IMAGE}, newTag: {tag}}}]
configMapGenerator:
  - name: criguard-config
    namespace: {DS_NS}
    behavior: replace
    literals:
      - |
        config.toml=evictionHard = {{ "allocatableMemory.available" = "250Mi" }}
        evictionPressureTransitionPeriod = "{TRANSITION_MS}ms"
        kubeconfig = "in-cluster"
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {{name: criguard, namespace: {DS_NS}}}
      spec:
        template:
          spec:
            hostNetwork: true
            dnsPolicy: ClusterFirstWithHostNet
            nodeSelector: {{kubernetes.io/hostname: {NODE}}}
            containers:
              - name: criguard
                env:
                  - {{name: KUBERNETES_SERVICE_HOST, value: "10.0.2.100"}}
                  - {{name: KUBERNETES_SERVICE_PORT, value: "6443"}}
"#
    );
    std::fs::write(dir.join("kustomization.yaml"), kustomization).unwrap();
}

/// criguard's pods of the DaemonSet.
fn ds_pods(c: &Cluster) -> Vec<Value> {
    let list = c.json(&["-n", DS_NS, "get", "pods", "-l", DS_LABEL]);
    list["items"].as_array().cloned().unwrap_or_default()
}

/// The one Ready criguard pod whose image has `tag`, once it is the only one.
fn ready_alone(c: &Cluster, tag: &str) -> Option<Value> {
    let pods = ds_pods(c);
    let [p] = pods.as_slice() else { return None };
    let ready = condition(p, "Ready").is_some_and(|r| r["status"] == "True");
    let image = p["spec"]["containers"][0]["image"].as_str().unwrap_or("");
    (ready && image.ends_with(&format!(":{tag}")) && p["metadata"]["deletionTimestamp"].is_null())
        .then(|| p.clone())
}

/// The criguard pod's own log in the guest, for a failure message.
fn pod_log(vm: &VmNode) -> String {
    vm.try_guest("tail -n 40 /var/log/pods/kube-system_criguard-*/criguard/*.log")
        .unwrap_or_else(|e| e)
}

/// Installs, evicts with, rolls and removes the DaemonSet.
pub(super) fn the_daemonset(c: &Cluster, vm: &VmNode) -> Rollout {
    // The package's criguard stops; both tags' images go into containerd.
    vm.guest(&format!(
        "systemctl disable --now criguard.socket criguard.service && {NO_CRIGUARD}"
    ));
    let share = c.dir.join("vm-node/share");
    for tag in TAGS {
        let out = Command::new(repo().join("hack/images.sh"))
            .arg(&share)
            .args([
                "--criguard",
                env!("CARGO_BIN_EXE_criguard"),
                &format!("{IMAGE}:{tag}"),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "hack/images.sh: {out:?}");
        let tar = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        vm.guest(&format!(
            "source \"$CRIGUARD_VMNODE_DIR/node.env\" && \"$CONTAINERD_BIN/ctr\" -n k8s.io \
             images import --snapshotter overlayfs {tar} >/dev/null"
        ));
    }

    write_overlay(c, TAGS[0]);
    let overlay = overlay_dir(c);
    let t = Instant::now();
    c.kubectl(&["apply", "-k", overlay.to_str().unwrap()]);
    let first = poll(GUEST_DEADLINE, "criguard's DaemonSet pod Ready", || {
        ready_alone(c, TAGS[0])
    });
    let install = t.elapsed();
    println!(
        "cluster-vm: the DaemonSet's criguard pod Ready {:.1} s after kubectl apply -k",
        install.as_secs_f64()
    );
    let line = vm.guest(&format!("criguard status --ready --admin-socket {ADMIN}"));
    assert_eq!(line.trim(), "ready", "{}", pod_log(vm));
    let eviction = evicts(c, vm);
    let upgrade = rolls(c, vm, uid(&first));
    let removal = removed(c, vm);
    Rollout {
        install,
        upgrade,
        eviction,
        removal,
    }
}

/// A hog grows until the DaemonSet's criguard evicts it. How long it took.
fn evicts(c: &Cluster, vm: &VmNode) -> Duration {
    // The proxy mode's hog (eviction_with_a_restart_at_the_pressure): 200
    // MiB at once, then 10 MiB every 2 s.
    let base = hog_yaml(NS, NODE, "/var/lib/criguard-vm-test/hog-nri", "2");
    let hog = base
        .replace(r#"system("sleep 2")"#, r#"if (i >= 20) system("sleep 2")"#)
        .replace("name: hog,", "name: hog-nri,")
        .replace("app: hog}", "app: hog-nri}");
    assert!(
        hog.contains("if (i >= 20)") && !hog.contains("name: hog,") && !hog.contains("app: hog}"),
        "the hog's names changed: {base}"
    );
    let t = Instant::now();
    c.apply(&hog);
    let first = poll(GUEST_DEADLINE, "the NRI hog Running", || {
        c.pods(NS)
            .into_iter()
            .find(|p| p["metadata"]["labels"]["app"] == "hog-nri" && phase(p) == "Running")
    });
    let hog_uid = uid(&first).to_owned();
    let (evicted, _) = poll_evicted(GUEST_DEADLINE, "the NRI hog Failed/Evicted", || {
        c.pods(NS).into_iter().find(|p| uid(p) == hog_uid)
    });
    let took = t.elapsed();
    assert_evicted(&evicted);
    let report = vm.evictions();
    let e = report.evictions.iter().find(|e| e.uid == hog_uid);
    let e = e.unwrap_or_else(|| panic!("criguard's record of the NRI hog: {report:#?}"));
    assert_eq!(e.signal, "allocatableMemory.available");
    let n = c.json(&["get", "node", NODE]);
    assert_ne!(
        condition(&n, "MemoryPressure").map(|m| m["status"].clone()),
        Some("True".into()),
        "the kubelet saw memory pressure too"
    );
    println!(
        "cluster-vm: the DaemonSet's criguard evicted the hog {:.1} s after it was applied, at available {} MiB",
        took.as_secs_f64(),
        e.available >> 20
    );
    c.kubectl(&["-n", NS, "delete", "deployment", "hog-nri", "--wait=false"]);
    // Its condition and taint go one transition period after the pressure.
    poll(
        GUEST_DEADLINE,
        "criguard's condition and taint gone",
        || {
            let n = c.json(&["get", "node", NODE]);
            (pressure_reported(&n) == (false, false)).then_some(())
        },
    );
    took
}

/// A new tag rolls the DaemonSet while pods are created: they all run,
/// with no warning event, and the new criguard knows them. How long the
/// roll took.
fn rolls(c: &Cluster, vm: &VmNode, old_uid: &str) -> Duration {
    write_overlay(c, TAGS[1]);
    let t = Instant::now();
    c.kubectl(&["apply", "-k", overlay_dir(c).to_str().unwrap()]);
    let names: Vec<String> = (0..4).map(|i| format!("rolled-{i}")).collect();
    for name in &names {
        c.apply(&vm_pod_yaml(name, "{}"));
    }
    let new = poll(GUEST_DEADLINE, "the new criguard pod Ready", || {
        ready_alone(c, TAGS[1])
    });
    let took = t.elapsed();
    assert_ne!(uid(&new), old_uid, "the DaemonSet's pod replaced");
    poll(
        GUEST_DEADLINE,
        "the pods created during the roll Running",
        || {
            let pods = c.pods(NS);
            let running = |n: &String| {
                pods.iter()
                    .any(|p| p["metadata"]["name"] == n.as_str() && phase(p) == "Running")
            };
            names.iter().all(running).then_some(())
        },
    );
    let events = c.json(&["-n", NS, "get", "events"]);
    let warnings: Vec<String> = (events["items"].as_array().cloned().unwrap_or_default())
        .iter()
        .filter(|e| {
            // The kubelet's: a sandbox or container that failed.
            e["type"] == "Warning"
                && e["source"]["component"] == "kubelet"
                && names
                    .iter()
                    .any(|n| e["involvedObject"]["name"] == n.as_str())
        })
        .map(|e| {
            format!(
                "{} {}: {}",
                e["involvedObject"]["name"], e["reason"], e["message"]
            )
        })
        .collect();
    assert!(
        warnings.is_empty(),
        "warnings during the roll: {warnings:#?}"
    );
    let model = poll(
        GUEST_DEADLINE,
        "the pods in the new criguard's model",
        || {
            let model = vm.model();
            names
                .iter()
                .all(|n| {
                    model
                        .iter()
                        .any(|p| &p.name == n && !p.containers.is_empty())
                })
                .then_some(model)
        },
    );
    let unscored = criguard_metric(&vm.metrics(), "criguard_nri_unscored_containers_total");
    println!(
        "cluster-vm: DaemonSet rolled to :{} in {:.1} s with {} pods created meanwhile, all running; \
         the new criguard's model has {} pods, {unscored} containers it did not score at creation",
        TAGS[1],
        took.as_secs_f64(),
        names.len(),
        model.len()
    );
    took
}

/// `kubectl delete -k`: the pod goes, no criguard runs on the node, and a
/// pod runs on containerd alone. How long the removal took.
fn removed(c: &Cluster, vm: &VmNode) -> Duration {
    let t = Instant::now();
    c.kubectl(&[
        "delete",
        "-k",
        overlay_dir(c).to_str().unwrap(),
        "--wait=false",
    ]);
    poll(GUEST_DEADLINE, "criguard's pod gone", || {
        ds_pods(c).is_empty().then_some(())
    });
    let took = t.elapsed();
    poll(GUEST_DEADLINE, "no criguard process on the node", || {
        vm.try_guest(NO_CRIGUARD).ok()
    });
    c.apply(&vm_pod_yaml("after-daemonset", "{}"));
    poll(GUEST_DEADLINE, "a pod Running on containerd alone", || {
        c.pods(NS)
            .into_iter()
            .find(|p| p["metadata"]["name"] == "after-daemonset" && phase(p) == "Running")
    });
    let ready = vm.try_guest(&format!("criguard status --ready --admin-socket {ADMIN}"));
    assert!(ready.is_err(), "criguard still answers: {ready:?}");
    took
}

/// The value of the unlabelled sample `name` in `metrics` (0 when absent).
fn criguard_metric(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}
