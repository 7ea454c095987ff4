//! The real `crictl` (cri-tools v1.37, built by `hack/k8s/build.sh`)
//! through criguard against a private containerd, whichever one
//! `CRIGUARD_CONTAINERD` selects: the same command sequence run straight
//! at containerd and then through criguard prints the same output, once
//! pod and container ids, times, pids and live usage figures are replaced
//! by placeholders. Skipped, saying so, when the cri-tools build is absent.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::containerd::{ContainerdVersion, CriguardProcess, PrivateContainerd, unique};
use common::pods::{BUSYBOX, CgroupRoot};

/// The bin dir of a finished cri-tools build of the pinned version, without
/// building one (`hack/k8s/build.sh --path` would): `CRIGUARD_CRICTL_DIR`,
/// else `$CRIGUARD_STACK_CACHE/cri-tools-<version>-*/bin` with `.complete`.
fn crictl_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CRIGUARD_CRICTL_DIR") {
        return Some(PathBuf::from(dir));
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let gomod = std::fs::read_to_string(repo.join("hack/k8s/cri-tools/go.mod")).ok()?;
    let version = gomod.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next() == Some("require") && w.next() == Some("sigs.k8s.io/cri-tools"))
            .then(|| w.next().map(str::to_owned))
            .flatten()
    })?;
    let cache = std::env::var_os("CRIGUARD_STACK_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/criguard/stack"));
    let prefix = format!("cri-tools-{version}-");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&cache)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .filter(|d| d.join(".complete").is_file() && d.join("bin/crictl").is_file())
        .collect();
    dirs.sort();
    dirs.pop().map(|d| d.join("bin"))
}

/// One crictl run: exit status, stdout, stderr.
#[derive(Debug)]
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// crictl with a config file of its own (endpoints, timeout; no debug).
struct Crictl {
    bin: PathBuf,
    config: PathBuf,
}

impl Crictl {
    fn new(bin: &Path, dir: &Path, endpoint: &Path) -> Self {
        let config = dir.join("crictl.yaml");
        let e = format!("unix://{}", endpoint.display());
        std::fs::write(
            &config,
            format!("runtime-endpoint: {e}\nimage-endpoint: {e}\ntimeout: 20\ndebug: false\n"),
        )
        .unwrap();
        Self {
            bin: bin.to_owned(),
            config,
        }
    }

    fn run(&self, args: &[&str]) -> Run {
        let out = Command::new(&self.bin)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .expect("run crictl");
        Run {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs `args`, which must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let r = self.run(args);
        assert!(r.ok, "crictl {args:?} failed: {}", r.stderr);
        r.stdout
    }
}

/// The length of the match of `template` at the start of `s`: `#` stands
/// for one or more ASCII digits (greedy), every other character for itself.
fn match_at(s: &[u8], template: &[u8]) -> Option<usize> {
    let (mut i, mut t) = (0, 0);
    while t < template.len() {
        if template[t] == b'#' {
            let n = s[i..].iter().take_while(|b| b.is_ascii_digit()).count();
            if n == 0 {
                return None;
            }
            i += n;
        } else if s.get(i) == Some(&template[t]) {
            i += 1;
        } else {
            return None;
        }
        t += 1;
    }
    Some(i)
}

/// `s` with every match of `template` (see [`match_at`]) replaced by `with`.
fn sub(s: &str, template: &str, with: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut copied = 0;
    while i < b.len() {
        // Matches start at a char boundary: templates begin with ASCII.
        match match_at(&b[i..], template.as_bytes()) {
            Some(n) if s.is_char_boundary(i) => {
                out.push_str(&s[copied..i]);
                out.push_str(with);
                i += n;
                copied = i;
            }
            _ => i += 1,
        }
    }
    out.push_str(&s[copied..]);
    out
}

/// `s` with every run of exactly `len` digits (not part of a longer run)
/// replaced by `with`.
fn sub_digit_runs(s: &str, len: usize, with: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut run = String::new();
    for c in s.chars().chain(std::iter::once('\0')) {
        if c.is_ascii_digit() {
            run.push(c);
            continue;
        }
        if run.len() == len {
            out.push_str(with);
        } else {
            out.push_str(&run);
        }
        run.clear();
        if c != '\0' {
            out.push(c);
        }
    }
    out
}

/// `s` with what differs between two runs of the same commands replaced:
/// the given ids (full and crictl's 13-character short form), times
/// (RFC 3339, ns since the epoch, klog headers, "N seconds ago"), pids,
/// and live usage figures.
fn normalise(s: &str, ids: &[(&str, &str)]) -> String {
    let mut s = s.to_owned();
    for (id, name) in ids {
        s = s.replace(id, &format!("<{name}>"));
        s = s.replace(&id[..13], &format!("<{name}>"));
    }
    // Times: RFC 3339 with or without fraction and offset, ns since the
    // epoch, the age column of tables.
    for t in [
        "#-#-#T#:#:#.#Z",
        "#-#-#T#:#:#Z",
        "#-#-#T#:#:#.#+#:#",
        "#-#-#T#:#:#+#:#",
    ] {
        s = sub(&s, t, "<time>");
    }
    s = sub_digit_runs(&s, 19, "<ns>");
    // klog headers of crictl's errors: "E1125 16:09:29.996635    4699 file:line]".
    s = s
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let is_header = w.len() > 3
                && matches!(l.as_bytes().first(), Some(b'E' | b'I' | b'W'))
                && match_at(&l.as_bytes()[1..], b"# #:#:#.# ").is_some();
            if is_header {
                format!("<klog> {}", w[3..].join(" "))
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    for t in [
        "Less than a second ago",
        "About a minute ago",
        "# seconds ago",
        "# second ago",
        "# minutes ago",
    ] {
        s = sub(&s, t, "<ago>");
    }
    // Table columns are padded to the longest cell: an age's length
    // changes the padding.
    s = s
        .lines()
        .map(|l| {
            if l.contains("<ago>") {
                l.split_whitespace().collect::<Vec<_>>().join(" ")
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    // Pids, in inspect's info and in /proc paths.
    s = sub(&s, "\"pid\": #", "\"pid\": <pid>");
    s = sub(&s, "/proc/#/", "/proc/<pid>/");
    // Live usage figures in stats' JSON ({"value": "n"}).
    s = sub(&s, "\"value\": \"#\"", "\"value\": \"<n>\"");
    s
}

/// JSON text with every member named `key` removed, at any depth, pretty
/// printed again.
fn without_key(text: &str, key: &str) -> String {
    fn strip(v: &mut serde_json::Value, key: &str) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove(key);
                m.values_mut().for_each(|v| strip(v, key));
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(|v| strip(v, key)),
            _ => {}
        }
    }
    let mut v: serde_json::Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("crictl printed no JSON ({e}): {text}"));
    strip(&mut v, key);
    serde_json::to_string_pretty(&v).unwrap()
}

/// The stats table with its figures (CPU %, memory, disk) replaced.
fn normalise_stats_table(s: &str) -> String {
    s.lines()
        .map(|l| {
            l.split_whitespace()
                .map(|w| {
                    if w.starts_with(|c: char| c.is_ascii_digit()) {
                        "<n>"
                    } else {
                        w
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// containerd reports a CPU rate only once it holds an earlier sample
/// recent enough to compute it from: present or not by timing, so the
/// stats comparisons leave it out.
const RATE: &str = "usageNanoCores";

/// The command sequence, on one endpoint; the outputs, labelled.
fn sequence(c: &Crictl, dir: &Path, cgroup_parent: &str) -> Vec<(String, String)> {
    let pod = dir.join("pod.json");
    let ctr = dir.join("ctr.json");
    std::fs::write(
        &pod,
        serde_json::json!({
            "metadata": {"name": "crictl-pod", "namespace": "default", "uid": "crictl-uid-1", "attempt": 0},
            "log_directory": dir.join("logs"),
            "linux": {
                "cgroup_parent": cgroup_parent,
                "security_context": {"namespace_options": {"network": 2}}
            }
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        &ctr,
        serde_json::json!({
            "metadata": {"name": "sleeper"},
            "image": {"image": BUSYBOX},
            "command": ["sleep", "3600"],
            "log_path": "sleeper.log",
            "linux": {"resources": {"cpu_shares": 102, "memory_limit_in_bytes": 67108864}}
        })
        .to_string(),
    )
    .unwrap();
    let pod = pod.to_str().unwrap();
    let ctr = ctr.to_str().unwrap();
    let mut out: Vec<(String, String)> = Vec::new();
    {
        let mut record =
            |label: &str, text: String| out.push((label.to_owned(), normalise(&text, &[])));
        record("version", c.ok(&["version"]));
        record("info", c.ok(&["info", "-o", "json"]));
        record("images", c.ok(&["images"]));
        record("images json", c.ok(&["images", "-o", "json"]));
        let rc = c.run(&["runtime-config"]);
        record(
            "runtime-config",
            format!("ok={} {}\n{}", rc.ok, rc.stdout, rc.stderr),
        );
    }

    let pod_id = c.ok(&["runp", pod]).trim().to_owned();
    let ctr_id = c.ok(&["create", &pod_id, ctr, pod]).trim().to_owned();
    let ids = [(pod_id.as_str(), "pod"), (ctr_id.as_str(), "ctr")];
    let mut norm = |label: &str, text: String| out.push((label.to_owned(), normalise(&text, &ids)));
    norm("start", c.ok(&["start", &ctr_id]));
    norm("ps", c.ok(&["ps", "-a"]));
    norm("ps json", c.ok(&["ps", "-a", "-o", "json"]));
    norm("pods json", c.ok(&["pods", "-o", "json"]));
    norm("inspect", c.ok(&["inspect", "-o", "json", &ctr_id]));
    norm("inspectp", c.ok(&["inspectp", "-o", "json", &pod_id]));
    norm(
        "stats json",
        without_key(&c.ok(&["stats", "-o", "json", "--id", &ctr_id]), RATE),
    );
    // Ids first: a short id may begin with a digit.
    let table = normalise(&c.ok(&["stats", "--id", &ctr_id]), &ids);
    norm("stats table", normalise_stats_table(&table));
    norm(
        "statsp json",
        without_key(&c.ok(&["statsp", "-o", "json", "--id", &pod_id]), RATE),
    );
    norm("stop", c.ok(&["stop", "--timeout", "0", &ctr_id]));
    norm("ps exited", c.ok(&["ps", "-a", "--id", &ctr_id]));
    norm("rm", c.ok(&["rm", &ctr_id]));
    norm("stopp", c.ok(&["stopp", &pod_id]));
    norm("rmp", c.ok(&["rmp", &pod_id]));
    norm("ps after", c.ok(&["ps", "-a"]));
    norm("pods after", c.ok(&["pods"]));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crictl_prints_the_same_through_criguard() {
    let Some(bin) = crictl_dir().map(|d| d.join("crictl")) else {
        eprintln!(
            "SKIPPED: no cri-tools build (hack/k8s/build.sh cri-tools, or set CRIGUARD_CRICTL_DIR)"
        );
        return;
    };
    let root = format!("/{}", unique("criguard-crictl"));
    let _cg = CgroupRoot(root.clone());
    let ctrd = PrivateContainerd::start();
    let guard =
        CriguardProcess::start(&ctrd.dir.join("criguard/criguard.sock"), &ctrd.socket, &[]).await;
    let direct_dir = ctrd.dir.join("crictl-direct");
    let via_dir = ctrd.dir.join("crictl-via");
    std::fs::create_dir_all(&direct_dir).unwrap();
    std::fs::create_dir_all(&via_dir).unwrap();

    // Blocking crictl runs off the async workers (criguard is its own process).
    let (d, v) = {
        let (bin_d, bin_v) = (bin.clone(), bin.clone());
        let (sock_d, sock_v) = (ctrd.socket.clone(), guard.socket.clone());
        let (cg_d, cg_v) = (format!("{root}/direct"), format!("{root}/via"));
        let (dd, vd) = (direct_dir.clone(), via_dir.clone());
        let d = tokio::task::spawn_blocking(move || {
            sequence(&Crictl::new(&bin_d, &dd, &sock_d), &dd, &cg_d)
        })
        .await
        .unwrap();
        let v = tokio::task::spawn_blocking(move || {
            sequence(&Crictl::new(&bin_v, &vd, &sock_v), &vd, &cg_v)
        })
        .await
        .unwrap();
        (d, v)
    };

    assert_eq!(d.len(), v.len());
    for ((label, direct), (_, via)) in d.iter().zip(&v) {
        // The pods differ in their own directories and cgroup parents.
        let via = via
            .replace(via_dir.to_str().unwrap(), direct_dir.to_str().unwrap())
            .replace(&format!("{root}/via"), &format!("{root}/direct"));
        assert_eq!(
            direct, &via,
            "crictl {label}: direct (left) and through criguard (right) differ"
        );
    }

    // What the sequence saw is what this containerd does.
    let get = |l: &str| &d.iter().find(|(label, _)| label == l).unwrap().1;
    let version = get("version");
    let runtime_version = version
        .lines()
        .find_map(|l| l.strip_prefix("RuntimeVersion:"))
        .expect("crictl version prints RuntimeVersion")
        .trim();
    assert!(
        ctrd.version.matches(runtime_version),
        "{:?}: {version}",
        ctrd.version
    );
    let rc = get("runtime-config");
    match ctrd.version {
        // 1.6 has no RuntimeConfig: crictl fails with Unimplemented.
        ContainerdVersion::V1_6 => assert!(
            rc.starts_with("ok=false") && rc.contains("Unimplemented"),
            "{rc}"
        ),
        // 2.x reports its cgroup driver: cgroupfs (SystemdCgroup = false).
        ContainerdVersion::V2 => {
            assert!(rc.starts_with("ok=true") && rc.contains("CGROUPFS"), "{rc}")
        }
    }
    assert!(get("ps").contains("Running"), "{}", get("ps"));
    assert!(get("ps exited").contains("Exited"), "{}", get("ps exited"));
    assert!(get("images").contains("busybox"), "{}", get("images"));
    assert!(get("stats json").contains("<ctr>"), "{}", get("stats json"));
    assert_eq!(get("ps after").lines().count(), 1, "{}", get("ps after"));
    drop(guard);
}
