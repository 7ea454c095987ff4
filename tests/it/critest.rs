//! critest v1.37.0 (cri-tools' validation suite for CRI runtimes, built
//! from its Go module by `hack/k8s/build.sh`) run with one seed against a
//! private containerd directly, against a second one through criguard
//! and, on containerd 2, against a third one with criguard attached as an
//! NRI plugin. The runs must agree spec by spec: the same specs pass,
//! fail and are skipped, and every failure says the same thing once ids,
//! addresses and times are normalised. A runtime that fails a spec fails it
//! through criguard too, and criguard never adds a failure of its own.
//!
//! The suite pulls its images for real, from a private registry on
//! loopback (`hack/registry.sh`: Debian's docker-registry, images pushed
//! with skopeo) that holds the locally built busybox and pause images
//! under the names critest asks for (`-registry-prefix`; critest v1.37.0's
//! prefixing keeps the repository and drops the tag, so each is pushed as
//! `:latest` too). The specs that need images we cannot build (digests of
//! upstream images, an nginx web server, images with a `USER`) fail on both
//! sides alike. Pods get a network from Debian's CNI plugins: a bridge of
//! the test's own, with no gateway and no masquerading, so nothing leaves
//! the machine; it is deleted at the end.
//!
//! Run it on the containerd `CRIGUARD_CONTAINERD` selects (CI runs it on
//! 2.x). One run of the suite takes about 1.5 minutes here.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::containerd::{ContainerdVersion, CriguardProcess, NRI_ON, PrivateContainerd, unique};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The critest binary of `hack/k8s/build.sh` (built if missing).
fn critest() -> PathBuf {
    let out = Command::new(repo().join("hack/k8s/build.sh"))
        .args(["--path", "cri-tools"])
        .stderr(Stdio::inherit())
        .output()
        .expect("run hack/k8s/build.sh");
    assert!(out.status.success(), "hack/k8s/build.sh --path cri-tools");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join("critest")
}

/// A private registry on loopback, stopped and removed on drop.
struct Registry {
    dir: PathBuf,
    addr: String,
}

impl Registry {
    fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("criguard-registry-")
            .tempdir()
            .unwrap()
            .keep();
        let out = Command::new(repo().join("hack/registry.sh"))
            .arg("start")
            .arg(&dir)
            .stderr(Stdio::inherit())
            .output()
            .expect("run hack/registry.sh");
        assert!(out.status.success(), "hack/registry.sh start");
        let addr = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .last()
            .expect("registry address")
            .to_owned();
        Self { dir, addr }
    }

    fn push(&self, archive: &Path, refs: &[&str]) {
        let ok = Command::new(repo().join("hack/registry.sh"))
            .arg("push")
            .arg(&self.dir)
            .arg(archive)
            .args(refs)
            .status()
            .expect("run hack/registry.sh push");
        assert!(ok.success(), "push {} as {refs:?}", archive.display());
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("hack/registry.sh"))
            .arg("stop")
            .arg(&self.dir)
            .arg("--purge")
            .status();
    }
}

/// The archives `hack/images.sh` builds: (pause, busybox), or a filler.
fn archives(extra: &[&str]) -> Vec<PathBuf> {
    let cache = std::env::var_os("CRIGUARD_IMAGE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/criguard-images"));
    let mut cmd = Command::new(repo().join("hack/images.sh"));
    cmd.arg(&cache).args(extra);
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .expect("run hack/images.sh");
    assert!(out.status.success(), "hack/images.sh {extra:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(PathBuf::from)
        .collect()
}

/// Fills the registry with what critest pulls.
fn fill(registry: &Registry) {
    let base = archives(&[]);
    let pause = base.iter().find(|p| p.ends_with("pause.tar")).unwrap();
    let busybox = base.iter().find(|p| p.ends_with("busybox.tar")).unwrap();
    registry.push(pause, &["pause:3.9", "pause:latest"]);
    registry.push(
        busybox,
        &[
            "e2e-test-images/busybox:1.29-2",
            "e2e-test-images/busybox:latest",
            "k8s-staging-cri-tools/test-image-latest:latest",
            "k8s-staging-cri-tools/test-image-tag:test",
            "k8s-staging-cri-tools/test-image-tag:all",
            "k8s-staging-cri-tools/test-image-tag:latest",
            "k8s-staging-cri-tools/test-image-tags:1",
            "k8s-staging-cri-tools/test-image-tags:2",
            "k8s-staging-cri-tools/test-image-tags:3",
            "k8s-staging-cri-tools/test-image-tags:latest",
        ],
    );
    // "Different tags, different images": three distinct images.
    for i in 1..=3 {
        let name = format!("criguard-critest-{i}");
        let filler = archives(&["--filler", &name, "1"]);
        registry.push(
            filler.last().unwrap(),
            &[&format!("k8s-staging-cri-tools/test-image-{i}:latest")],
        );
    }
}

/// A CNI bridge of one runtime's, deleted on drop (the plugin creates it
/// on the first pod; deleting a missing one is fine).
struct Bridge(String);

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.0])
            .stderr(Stdio::null())
            .status();
    }
}

/// A private containerd that pulls from `registry` (plain HTTP through a
/// hosts.toml), with the registry's pause image as its sandbox image, and
/// a bridge network of its own (`net` picks the /24).
fn runtime(registry: &Registry, net: u8, nri: bool) -> (PrivateContainerd, Bridge) {
    let v = ContainerdVersion::selected();
    let certs = registry.dir.join("certs.d");
    // NRI's top-level keys before the sections.
    let mut toml = if nri {
        NRI_ON.to_owned()
    } else {
        String::new()
    };
    toml += &v.cri_toml(
        true,
        "registry",
        "config_path",
        &format!("{:?}", certs.display().to_string()),
    );
    let pause = format!("{:?}", format!("{}/pause:3.9", registry.addr));
    toml.push_str(&match v {
        ContainerdVersion::V1_6 => v.cri_toml(false, "", "sandbox_image", &pause),
        ContainerdVersion::V2 => v.cri_toml(true, "pinned_images", "sandbox", &pause),
    });
    let ctrd = PrivateContainerd::start_with_toml(&toml);
    // Bridge names are at most 15 bytes; unique() keeps tests apart.
    let id = unique("b");
    let bridge = format!("cgt{:x}", fnv(&id) & 0xff_ffff);
    let conf = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": format!("criguard-{bridge}"),
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": false,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": ctrd.dir.join("cni/ipam"),
                    "ranges": [[{"subnet": format!("10.254.{net}.0/24")}]],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
            {"type": "loopback"},
        ],
    });
    std::fs::write(
        ctrd.dir.join("cni/net.d/10-criguard-critest.conflist"),
        serde_json::to_vec_pretty(&conf).unwrap(),
    )
    .unwrap();
    (ctrd, Bridge(bridge))
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Waits until the runtime behind `socket` reports its pod network ready
/// (containerd picks up the conflist from its watched directory).
async fn network_ready(socket: &Path) {
    let c = common::containerd::Clients::new(socket);
    common::poll_until(Duration::from_secs(30), "NetworkReady", || {
        let mut rt = c.rt.clone();
        async move {
            let status = rt
                .status(k8s_cri::v1::StatusRequest { verbose: false })
                .await
                .ok()?
                .into_inner()
                .status?;
            status
                .conditions
                .iter()
                .any(|c| c.r#type == "NetworkReady" && c.status)
                .then_some(())
        }
    })
    .await;
}

/// One spec's outcome: its state and, when it failed, the normalised
/// failure message.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    state: String,
    message: String,
}

/// Runs critest against `endpoint` and reads its JSON report.
fn run(
    critest: &Path,
    endpoint: &Path,
    registry: &Registry,
    out: &Path,
) -> BTreeMap<String, Outcome> {
    std::fs::create_dir_all(out).unwrap();
    let images = out.join("images.yaml");
    std::fs::write(
        &images,
        format!(
            "defaultTestContainerImage: {0}/e2e-test-images/busybox:latest\n\
             webServerTestImage: {0}/e2e-test-images/nginx:latest\n",
            registry.addr
        ),
    )
    .unwrap();
    let report = out.join("report.json");
    let endpoint = format!("unix://{}", endpoint.display());
    let started = std::time::Instant::now();
    let status = Command::new(critest)
        .current_dir(out)
        .args(["-runtime-endpoint", &endpoint, "-image-endpoint", &endpoint])
        .args(["-registry-prefix", &registry.addr])
        .arg("-test-images-file")
        .arg(&images)
        .args([
            "--ginkgo.seed=1",
            "--ginkgo.no-color",
            "--ginkgo.timeout=15m",
        ])
        .arg(format!("--ginkgo.json-report={}", report.display()))
        .stdout(std::fs::File::create(out.join("critest.log")).unwrap())
        .stderr(Stdio::null())
        .status()
        .expect("run critest");
    eprintln!(
        "critest against {endpoint}: exit {status}, {:.1} s (log {})",
        started.elapsed().as_secs_f64(),
        out.join("critest.log").display()
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("critest wrote no JSON report"))
            .unwrap();
    outcomes(&json, &[&endpoint, &registry.addr])
}

/// Spec name → outcome, from ginkgo's JSON report; `names` are strings
/// (endpoints, addresses) that differ between the two runs.
fn outcomes(report: &serde_json::Value, names: &[&str]) -> BTreeMap<String, Outcome> {
    let mut all = BTreeMap::new();
    for suite in report.as_array().expect("a list of suites") {
        for spec in suite["SpecReports"].as_array().expect("SpecReports") {
            let mut name: Vec<String> = spec["ContainerHierarchyTexts"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|t| t.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            name.push(format!(
                "{} {}",
                spec["LeafNodeType"].as_str().unwrap_or(""),
                spec["LeafNodeText"].as_str().unwrap_or("")
            ));
            let state = spec["State"].as_str().unwrap_or("?").to_owned();
            let message = if state == "passed" || state == "skipped" {
                String::new()
            } else {
                normalise(spec["Failure"]["Message"].as_str().unwrap_or(""), names)
            };
            all.insert(name.join(" / "), Outcome { state, message });
        }
    }
    all
}

/// Replaces what differs between two runs of one spec with placeholders:
/// the run-specific `names`, container and sandbox ids, UUIDs, pointers,
/// times and durations.
fn normalise(message: &str, names: &[&str]) -> String {
    let mut m = message.to_owned();
    for n in names {
        m = m.replace(n, "<name>");
    }
    let rules: [(&str, &str); 6] = [
        (
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "<uuid>",
        ),
        (r"[0-9a-f]{32,64}", "<id>"),
        (r"0x[0-9a-f]+", "<ptr>"),
        (
            r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?",
            "<time>",
        ),
        (r"\d{2}:\d{2}:\d{2}(\.\d+)?", "<time>"),
        (r"\d+(\.\d+)?(ns|µs|us|ms|s)\b", "<duration>"),
    ];
    for (pattern, by) in rules {
        m = regex::Regex::new(pattern)
            .unwrap()
            .replace_all(&m, by)
            .into_owned();
    }
    m
}

#[test]
fn normalise_hides_ids_times_and_run_names() {
    let a = "failed to find sandbox \"4694bb2bac595061b5a1c82fb2310878f920f0b5c90179d4989814c83487f3a3\" \
             at 2026-11-25T16:13:34.988Z after 1.5s via unix:///tmp/a.sock (0x29c25ea901a0) pod-6b1e4c1e-0c3b-4f0e-9d2b-1f6a3f2c9e11";
    let b = "failed to find sandbox \"8f581ae4ee6a7ef25d8452c50226d5f5ef2123f79addb16540fad03bc9310b7a\" \
             at 2026-11-25T16:14:40.001Z after 2s via unix:///tmp/b.sock (0x3147adf90368) pod-0d7d1f3e-5a8e-4d7c-8f66-0a9b8c7d6e5f";
    assert_eq!(
        normalise(a, &["unix:///tmp/a.sock"]),
        normalise(b, &["unix:///tmp/b.sock"])
    );
    // What a spec actually says is kept.
    assert_ne!(
        normalise("code = NotFound desc = image not found", &[]),
        normalise("code = Unavailable desc = image not found", &[])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn critest_passes_and_fails_the_same_specs_through_criguard() {
    let critest = critest();
    let registry = Registry::start();
    fill(&registry);
    let work = tempfile::Builder::new()
        .prefix("criguard-critest-")
        .tempdir()
        .unwrap();
    let net = (fnv(&unique("net")) % 200) as u8 + 20;

    let (direct, _direct_bridge) = runtime(&registry, net, false);
    let (behind, _behind_bridge) = runtime(&registry, net + 1, false);
    network_ready(&direct.socket).await;
    network_ready(&behind.socket).await;
    let criguard = CriguardProcess::start(
        &work.path().join("criguard.sock"),
        &behind.socket,
        &["--mode=proxy"],
    )
    .await;

    // One after the other: the suite has timing-sensitive specs, and two
    // runs at once on two cores would differ for that reason alone.
    let a = run(
        &critest,
        &direct.socket,
        &registry,
        &work.path().join("direct"),
    );
    let b = run(
        &critest,
        &criguard.socket,
        &registry,
        &work.path().join("criguard"),
    );
    drop(criguard);
    let mut differences = compare(&a, &b, "through criguard");
    // containerd 2: once more on a third containerd with criguard attached
    // as an NRI plugin, the suite dialling containerd.
    let attached =
        (direct.version == ContainerdVersion::V2).then(|| runtime(&registry, net + 2, true));
    if let Some((nri, _bridge)) = &attached {
        network_ready(&nri.socket).await;
        let socket = format!("--nri-socket={}", nri.dir.join("nri/nri.sock").display());
        let plugin = CriguardProcess::start(
            &work.path().join("nri.sock"),
            &nri.socket,
            &["--mode=nri", &socket],
        )
        .await;
        let c = run(&critest, &nri.socket, &registry, &work.path().join("nri"));
        differences.extend(compare(&a, &c, "with criguard as an NRI plugin"));
        drop(plugin);
    }
    assert!(
        count(&a, "passed") >= 40,
        "critest passed only {} specs directly: the harness (registry, CNI, images) is broken; logs in {}",
        count(&a, "passed"),
        work.path().display()
    );
    if !differences.is_empty() {
        let kept = work.keep();
        panic!(
            "{} specs differ from containerd direct (logs in {}):\n{}",
            differences.len(),
            kept.display(),
            differences.join("\n")
        );
    }
    eprintln!(
        "critest v1.37.0 on containerd {:?}: direct {} passed / {} failed / {} skipped; the same through criguard{}",
        direct.version,
        count(&a, "passed"),
        count(&a, "failed"),
        count(&a, "skipped"),
        if attached.is_some() {
            " and with criguard as an NRI plugin"
        } else {
            ""
        }
    );
}

/// How many of `o`'s specs ended in `state`.
fn count(o: &BTreeMap<String, Outcome>, state: &str) -> usize {
    o.values().filter(|x| x.state == state).count()
}

/// The specs whose outcome in `b` (the run `how`) is not `a`'s, each
/// with both outcomes.
fn compare(a: &BTreeMap<String, Outcome>, b: &BTreeMap<String, Outcome>, how: &str) -> Vec<String> {
    eprintln!(
        "critest {how}: {} passed / {} failed / {} skipped",
        count(b, "passed"),
        count(b, "failed"),
        count(b, "skipped"),
    );
    a.keys()
        .chain(b.keys().filter(|k| !a.contains_key(*k)))
        .filter(|name| a.get(*name) != b.get(*name))
        .map(|name| {
            format!(
                "{name} ({how})\n  direct:   {:?}\n  {how}: {:?}",
                a.get(name),
                b.get(name)
            )
        })
        .collect()
}
