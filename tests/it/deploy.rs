//! deploy/: the Prometheus alert rules and the Grafana dashboard, checked
//! against what criguard really exports, and the DaemonSet's kustomization
//! rendered by kubectl (the cluster tier applies it: tests/it/cluster_vm/daemonset.rs).
//! - `promtool check rules` and `promtool test rules` on the rules and their
//!   unit tests (deploy/prometheus/criguard-alerts_test.yaml);
//! - a real `criguard serve` in front of a private containerd runs a pod,
//!   takes a reload whose threshold every machine is under, evicts the pod
//!   and refuses the next one; its scrape then passes `promtool check
//!   metrics`, and every metric named in every dashboard query and in every
//!   alert rule is in it. The few families that only appear after an event
//!   this test does not cause (a kernel OOM kill, an API report, image GC, a
//!   refused connection: tests/it/oom.rs, tests/it/kube.rs, tests/it/image_gc.rs
//!   and tests/bounds.rs scrape those) are listed in [`NOT_CAUSED_HERE`], and
//!   must then be registered by that name in criguard's source.

use crate::common;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::containerd::{PrivateContainerd, unique};
use common::metrics::scrape;
use common::pods::{CgroupRoot, remove_pods, run_pod, sleeper};
use common::served::Served;
use criguard_test_kit::kubelet::PodSpec;
use k8s_cri::v1 as cri;

const RULES: &str = "deploy/prometheus/criguard-alerts.yaml";
const RULES_TEST: &str = "deploy/prometheus/criguard-alerts_test.yaml";
const DASHBOARD: &str = "deploy/grafana/criguard-dashboard.json";

/// Metric families that appear in a scrape only once their first series is
/// made, by an event this test does not cause; each with that event.
const NOT_CAUSED_HERE: &[(&str, &str)] = &[
    ("criguard_kernel_oom_kills", "a kernel OOM kill in a pod"),
    ("criguard_kube_writes", "a Kubernetes API report"),
    ("criguard_reclaimed_bytes", "an image or container GC pass"),
    ("criguard_cri_connections_refused", "a refused connection"),
];

/// The suffixes a family's samples carry in the text format.
const SUFFIXES: &[&str] = &["", "_total", "_bucket", "_count", "_sum", "_created"];

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The text of every `.rs` file under `dir`.
fn rust_sources(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(rust_sources(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(std::fs::read_to_string(&p).unwrap());
        }
    }
    out
}

/// Every `criguard_*` metric name in `text` (PromQL, YAML or JSON).
fn metric_names(text: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r"\bcriguard_[a-z0-9_]+").unwrap();
    re.find_iter(text).map(|m| m.as_str().to_owned()).collect()
}

/// The queries of the dashboard: every panel's targets and the variables'.
fn dashboard_queries(json: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut panels: Vec<&serde_json::Value> = json["panels"].as_array().unwrap().iter().collect();
    while let Some(p) = panels.pop() {
        if let Some(inner) = p["panels"].as_array() {
            panels.extend(inner);
        }
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(t["expr"].as_str().unwrap().to_owned());
        }
    }
    for v in json["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["definition"].as_str() {
            out.push(q.to_owned());
        }
    }
    out
}

/// The families (`# TYPE` lines) and sample names of a scrape.
fn scraped_names(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let families = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    let samples = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_owned())
        .collect();
    (families, samples)
}

/// The family of `name` among `families`, if it is one of its samples'.
fn family_of<'a>(name: &str, families: &'a BTreeSet<String>) -> Option<&'a String> {
    families.iter().find(|f| {
        SUFFIXES
            .iter()
            .any(|s| name.strip_suffix(s) == Some(f.as_str()))
    })
}

/// criguard's OpenMetrics exposition in Prometheus's text format 0.0.4,
/// which `promtool check metrics` (2.42) lints: a counter's HELP and TYPE
/// name its `_total` samples there, and `# EOF` and `# UNIT` are not part
/// of it. Samples are unchanged.
fn to_text_format(openmetrics: &str) -> String {
    let counters: BTreeSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::new();
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta.and_then(|(p, rest)| rest.split_once(' ').map(|(n, r)| (p, n, r))) {
            Some((p, name, rest)) if counters.contains(name) => {
                out.push_str(&format!("{p}{name}_total {rest}\n"))
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[test]
fn openmetrics_counters_become_text_format_counters() {
    let om = "# HELP a Things.\n# TYPE a counter\na_total 1\n# HELP b Now.\n# TYPE b gauge\nb 2\n# EOF\n";
    assert_eq!(
        to_text_format(om),
        "# HELP a_total Things.\n# TYPE a_total counter\na_total 1\n# HELP b Now.\n# TYPE b gauge\nb 2\n"
    );
}

fn promtool(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(repo("."))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (hack/install-deps.sh installs Debian's prometheus package)");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let (ok, out) = promtool(&["check", "rules", RULES], None);
    assert!(ok, "promtool check rules:\n{out}");
    assert!(out.contains("SUCCESS"), "{out}");
    let (ok, out) = promtool(&["test", "rules", RULES_TEST], None);
    assert!(ok, "promtool test rules:\n{out}");
    // Every alert has at least one unit test that expects it to fire.
    let rules = std::fs::read_to_string(repo(RULES)).unwrap();
    let tests = std::fs::read_to_string(repo(RULES_TEST)).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 9, "{alerts:?}");
    for a in alerts {
        assert!(
            tests.contains(&format!(
                "alertname: {a}\n        exp_alerts:\n          - exp_labels"
            )),
            "no unit test expects {a} to fire"
        );
    }
}

#[test]
fn dashboard_panels_each_have_a_unique_id_and_a_query() {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo(DASHBOARD)).unwrap()).unwrap();
    let mut ids = BTreeSet::new();
    for p in json["panels"].as_array().unwrap() {
        assert!(ids.insert(p["id"].as_i64().unwrap()), "duplicate id: {p}");
        if p["type"] != "row" {
            let targets = p["targets"].as_array().unwrap();
            assert!(!targets.is_empty(), "{}", p["title"]);
            for t in targets {
                assert!(
                    !metric_names(t["expr"].as_str().unwrap()).is_empty(),
                    "{}: {t}",
                    p["title"]
                );
            }
        }
    }
    // The four views the dashboard is for.
    let queries = dashboard_queries(&json).join("\n");
    for needed in [
        "criguard_signal_threshold",
        "criguard_evictions_total",
        "criguard_cri_request_duration_seconds_bucket",
        "criguard_pressure_to_kill_seconds_bucket",
    ] {
        assert!(queries.contains(needed), "{needed}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_in_the_dashboard_and_the_alerts_is_in_a_live_scrape() {
    let root = format!("/{}", unique("criguard-deploy"));
    let _cg = CgroupRoot(root.clone());
    let ctrd = PrivateContainerd::start();
    let served = Served::start(
        &ctrd,
        "deploy",
        "evictionHard = { \"memory.available\" = \"1Mi\" }\nimageGCHighThresholdPercent = 100\n",
        &[],
    )
    .await;
    let mut rt = common::containerd::Clients::new(&served.socket).rt;

    // CRI calls through the relay, a running pod.
    let mut pod = PodSpec::new("deploy", &unique("deploy")).container(sleeper("sleep"));
    pod.cgroup_root = format!("{root}/kubepods");
    pod.log_root = ctrd.dir.join("pods").to_str().unwrap().into();
    let (sandbox, _) = run_pod(&mut rt, &pod, None).await;

    // A threshold every machine is under: the pod is evicted, the next
    // BestEffort pod refused.
    std::fs::write(
        &served.config,
        "evictionHard = { \"memory.available\" = \"1Ei\" }\nimageGCHighThresholdPercent = 100\n",
    )
    .unwrap();
    served.hangup();
    common::poll_until(Duration::from_secs(30), "the pod evicted", || async {
        scrape(served.port)
            .contains("criguard_evictions_total{")
            .then_some(())
    })
    .await;
    let refused = PodSpec::new("refused", &unique("refused"));
    let err = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(refused.sandbox_config()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_err();
    assert!(err.message().contains("MemoryPressure"), "{err:?}");
    let text = common::poll_until(Duration::from_secs(10), "the refusal counted", || async {
        let t = scrape(served.port);
        (t.contains("criguard_admission_refusals_total{")
            && t.contains("criguard_containerd_events_total{"))
        .then_some(t)
    })
    .await;

    let (ok, out) = promtool(&["check", "metrics"], Some(&to_text_format(&text)));
    assert!(
        ok && out.trim().is_empty(),
        "promtool check metrics:\n{out}\n{text}"
    );

    let (families, samples) = scraped_names(&text);
    let rules = std::fs::read_to_string(repo(RULES)).unwrap();
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo(DASHBOARD)).unwrap()).unwrap();
    let mut named = metric_names(&rules);
    named.extend(metric_names(&dashboard_queries(&dashboard).join("\n")));
    assert!(named.len() >= 15, "{named:?}");
    // Each module registers its own metrics: read them all.
    let source = rust_sources(&repo("src")).join("\n");
    let mut missing = Vec::new();
    for name in &named {
        if samples.contains(name) || family_of(name, &families).is_some() {
            continue;
        }
        let late = NOT_CAUSED_HERE
            .iter()
            .find(|(f, _)| SUFFIXES.iter().any(|s| name.strip_suffix(s) == Some(*f)));
        match late {
            Some((family, _)) if source.contains(&format!("\"{family}\"")) => {}
            _ => missing.push(name.clone()),
        }
    }
    assert!(
        missing.is_empty(),
        "named in deploy/ but not exported by criguard: {missing:?}\nscrape:\n{text}"
    );

    remove_pods(&mut rt, [sandbox]).await;
}

/// `kubectl kustomize DIR` with the kubectl of `hack/k8s/build.sh`.
fn kustomize(dir: &Path) -> String {
    let out = Command::new(repo("hack/k8s/build.sh"))
        .args(["--path", "kubernetes"])
        .output()
        .unwrap();
    assert!(out.status.success(), "hack/k8s/build.sh --path kubernetes");
    let bin = String::from_utf8_lossy(&out.stdout);
    let kubectl = Path::new(bin.lines().last().unwrap().trim()).join("kubectl");
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {err}",
        dir.display()
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_daemonset_renders_node_critical_unready_until_attached_and_without_an_open_port() {
    let ds = kustomize(&repo("deploy"));
    for want in [
        "kind: DaemonSet",
        "priorityClassName: system-node-critical",
        "- operator: Exists",
        "maxUnavailable: 1",
        "- --mode=nri",
        "- --metrics-address=127.0.0.1:9809",
        "- --ready",
        "name: criguard-config-",
        "kind: ClusterRoleBinding",
    ] {
        assert!(ds.contains(want), "{want} not in deploy/:\n{ds}");
    }
    // The package's long-lived token stays out; nothing on the node's network.
    assert!(!ds.contains("kind: Secret"), "{ds}");
    assert!(!ds.contains("hostNetwork"), "{ds}");
    assert!(!ds.contains("hostPort"), "{ds}");

    // With the metrics proxy: an authenticating sidecar and its delegation.
    let work = tempfile::tempdir().unwrap();
    let up = "../".repeat(work.path().components().count() - 1);
    let deploy = repo("deploy");
    let base = format!("{up}{}", deploy.strip_prefix("/").unwrap().display());
    std::fs::write(
        work.path().join("kustomization.yaml"),
        format!("resources: [{base}]\ncomponents: [{base}/metrics-proxy]\n"),
    )
    .unwrap();
    let proxied = kustomize(work.path());
    for want in [
        "name: kube-rbac-proxy",
        "--upstream=http://127.0.0.1:9809/",
        "tokenreviews",
        "subjectaccessreviews",
        "nonResourceURLs",
    ] {
        assert!(
            proxied.contains(want),
            "{want} not in the metrics proxy:\n{proxied}"
        );
    }
}
