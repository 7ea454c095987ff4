//! A real Kubernetes API for criguard's report tests: etcd and
//! kube-apiserver from `hack/k8s/build.sh` (no controllers, no kubelets),
//! on loopback, with TLS, the Node and RBAC authorizers, the
//! NodeRestriction admission plugin, an audit log and `deploy/rbac.yaml`
//! applied.
//!
//! One control plane serves every test of a binary ([`shared`], started on
//! first use: 3 s on an idle 2-core machine, 5 to 10 s under load), stopped
//! by PID when the binary exits; each test takes its own [`Tenant`]: a
//! namespace, a Node object, and a
//! ServiceAccount bound to `deploy/rbac.yaml`'s ClusterRole, whose token
//! criguard's kubeconfig carries, so that the audit log tells each test's
//! requests apart. [`ControlPlane::private`] starts one a test can stop.
//!
//! The processes are forked by a thread that lives as long as the test
//! binary, with `PR_SET_PDEATHSIG`, so that even a test binary killed
//! outright takes them with it. Without the binaries
//! (`hack/k8s/build.sh`), [`available`] says why and the tests that need
//! them skip.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use super::containerd::unique;
use super::metrics::free_port;

/// The audit policy: every request of every ServiceAccount at Request level
/// (verb, URI, user, user agent, status, and the body criguard sent).
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\n\
omitStages: [\"RequestReceived\"]\nrules:\n\
- level: Request\n  userGroups: [\"system:serviceaccounts\"]\n- level: None\n";

/// The bin directory of a finished `hack/k8s/build.sh` build of
/// `component` as pinned now, without building one (`build.sh --path`
/// would): `$CRIGUARD_STACK_CACHE/NAME-VERSION-HASH/bin` with `.complete`,
/// HASH the first 12 hex digits of the SHA-256 of its go.mod and go.sum.
fn bin_dir(component: &str) -> Option<PathBuf> {
    let module = match component {
        "kubernetes" => "k8s.io/kubernetes",
        "etcd" => "go.etcd.io/etcd/server/v3",
        _ => return None,
    };
    let here = crate::repo().join("hack/k8s").join(component);
    let gomod = std::fs::read_to_string(here.join("go.mod")).ok()?;
    let version = gomod.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.len() >= 3 && w[0] == "require" && w[1] == module).then(|| w[2].to_owned())
    })?;
    let out = Command::new("sh")
        .args(["-c", "cat go.mod go.sum | sha256sum"])
        .current_dir(&here)
        .output()
        .ok()?;
    let hash: String = String::from_utf8(out.stdout)
        .ok()?
        .chars()
        .take(12)
        .collect();
    let cache = std::env::var_os("CRIGUARD_STACK_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/criguard/stack"));
    let dir = cache.join(format!("{component}-{version}-{hash}"));
    dir.join(".complete").is_file().then(|| dir.join("bin"))
}

/// `Err(why)` when the control plane's binaries are not built
/// (`hack/k8s/build.sh` builds and caches them).
pub fn available() -> Result<(), String> {
    for (c, bin) in [("kubernetes", "kube-apiserver"), ("etcd", "etcd")] {
        match bin_dir(c) {
            Some(d) if d.join(bin).is_file() => {}
            _ => return Err(format!("no {bin} build (hack/k8s/build.sh {c})")),
        }
    }
    Ok(())
}

/// Processes of shared control planes, stopped at exit.
static AT_EXIT: Mutex<Vec<(Child, PathBuf)>> = Mutex::new(Vec::new());

extern "C" fn stop_at_exit() {
    let Ok(mut procs) = AT_EXIT.lock() else {
        return;
    };
    let mut dirs = Vec::new();
    for (mut child, dir) in procs.drain(..) {
        stop(&mut child);
        dirs.push(dir);
    }
    for dir in dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// TERM, then KILL after 10 s, and reap; by the child's PID only.
fn stop(child: &mut Child) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    // SAFETY: kill(2) on our own child's PID.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Starts `cmd` with its output in `log`, killed (`PR_SET_PDEATHSIG`) when
/// the test binary ends however it ends: the signal fires when the thread
/// that forked the process ends, so every process is forked by one thread
/// that lives as long as the binary.
fn spawn(mut cmd: Command, log: &Path) -> Child {
    use std::os::unix::process::CommandExt;
    type Job = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<std::sync::mpsc::Sender<Job>>> = OnceLock::new();
    let out = std::fs::File::create(log).unwrap();
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("kubeapi-spawner".into())
            .spawn(move || {
                for (mut cmd, answer) in rx {
                    let _ = answer.send(cmd.spawn());
                }
                // Never reached while the binary runs: the sender is static.
                loop {
                    std::thread::park();
                }
            })
            .unwrap();
        Mutex::new(tx)
    });
    let (tx, rx) = std::sync::mpsc::channel();
    spawner.lock().unwrap().send((cmd, tx)).unwrap();
    rx.recv().unwrap().unwrap()
}

/// The last lines of `log`, for a failure message.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// A kubeconfig with one cluster (this plane) and one user (`user_lines`,
/// indented four spaces).
fn kubeconfig_text(server: &str, ca: &Path, user_lines: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kubeapi\n  cluster:\n    server: {server}\n    \
         certificate-authority: {}\nusers:\n- name: user\n  user:\n{user_lines}\ncontexts:\n- name: kubeapi\n  \
         context:\n    cluster: kubeapi\n    user: user\ncurrent-context: kubeapi\n",
        ca.display()
    )
}

fn cert_user(pki: &Path, name: &str) -> String {
    format!(
        "    client-certificate: {}\n    client-key: {}",
        pki.join(format!("{name}.crt")).display(),
        pki.join(format!("{name}.key")).display()
    )
}

/// Runs pki.sh's functions with `PKI_DIR=pki`: `script` is bash. One at a
/// time: openssl keeps the CA's serial in a file.
fn pki(pki: &Path, script: &str) {
    static ONE: Mutex<()> = Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let ok = Command::new("bash")
        .args([
            "-c",
            &format!("set -euo pipefail; source \"$0\"; {script}"),
            &format!("{}/hack/cluster/pki.sh", crate::repo().display()),
        ])
        .env("PKI_DIR", pki)
        .status()
        .unwrap()
        .success();
    assert!(ok, "pki.sh: {script}");
}

/// etcd and kube-apiserver, on loopback.
pub struct ControlPlane {
    /// Everything under here: pki/, etcd/, logs, audit.log, kubeconfigs.
    pub dir: PathBuf,
    /// kube-apiserver's secure port on 127.0.0.1.
    pub port: u16,
    /// When it took to start (PKI, etcd, kube-apiserver ready, RBAC applied).
    pub started_in: Duration,
    /// The processes, for a private plane (a shared one's are in AT_EXIT).
    own: Mutex<Vec<Child>>,
}

/// The plane every test of this binary shares, started on first use and
/// stopped by PID when the binary exits.
pub fn shared() -> &'static ControlPlane {
    static PLANE: OnceLock<ControlPlane> = OnceLock::new();
    PLANE.get_or_init(|| {
        let (plane, children) = ControlPlane::start();
        let mut at_exit = AT_EXIT.lock().unwrap();
        if at_exit.is_empty() {
            // SAFETY: registering a plain extern "C" function.
            unsafe { libc::atexit(stop_at_exit) };
        }
        // kube-apiserver first, then etcd.
        for c in children.into_iter().rev() {
            at_exit.push((c, plane.dir.clone()));
        }
        plane
    })
}

impl ControlPlane {
    /// A plane of the calling test's own, stopped by [`Self::stop`] or on
    /// drop.
    pub fn private() -> Self {
        let (mut plane, children) = Self::start();
        plane.own = Mutex::new(children.into_iter().rev().collect());
        plane
    }

    /// Stops kube-apiserver, then etcd, by PID; the API is unreachable from
    /// then on.
    pub fn stop(&self) {
        for c in self.own.lock().unwrap().iter_mut() {
            stop(c);
        }
    }

    fn start() -> (Self, Vec<Child>) {
        let t0 = Instant::now();
        let k8s = bin_dir("kubernetes").expect("no kubernetes build: hack/k8s/build.sh");
        let etcd_bin = bin_dir("etcd").expect("no etcd build: hack/k8s/build.sh");
        let dir = std::env::temp_dir().join(unique("criguard-kubeapi"));
        let pki_dir = dir.join("pki");
        std::fs::create_dir_all(dir.join("etcd")).unwrap();
        pki(
            &pki_dir,
            "pki_control_plane; pki_cert webhook /CN=criguard-test-webhook IP:127.0.0.1",
        );
        let (client, peer, port) = (free_port(), free_port(), free_port());
        let mut etcd = Command::new(etcd_bin.join("etcd"));
        etcd.args(["--name", "default", "--data-dir"])
            .arg(dir.join("etcd"))
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-cluster",
                &format!("default=http://127.0.0.1:{peer}"),
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
            ]);
        let mut children = vec![spawn(etcd, &dir.join("etcd.log"))];
        std::fs::write(dir.join("audit-policy.yaml"), AUDIT_POLICY).unwrap();
        let p = |f: &str| pki_dir.join(f).display().to_string();
        let mut api = Command::new(k8s.join("kube-apiserver"));
        api.args([
            "--etcd-servers",
            &format!("http://127.0.0.1:{client}"),
            "--bind-address",
            "127.0.0.1",
            "--advertise-address",
            "127.0.0.1",
            "--secure-port",
            &port.to_string(),
            "--endpoint-reconciler-type",
            "none",
            "--tls-cert-file",
            &p("apiserver.crt"),
            "--tls-private-key-file",
            &p("apiserver.key"),
            "--client-ca-file",
            &p("ca.crt"),
            "--service-account-issuer",
            &format!("https://127.0.0.1:{port}"),
            "--service-account-key-file",
            &p("sa.pub"),
            "--service-account-signing-key-file",
            &p("sa.key"),
            "--service-cluster-ip-range",
            "10.96.0.0/24",
            "--authorization-mode",
            "Node,RBAC",
            "--enable-admission-plugins",
            "NodeRestriction",
            "--audit-policy-file",
            &dir.join("audit-policy.yaml").display().to_string(),
            "--audit-log-path",
            &dir.join("audit.log").display().to_string(),
            "--audit-log-mode",
            "blocking",
            "--profiling=false",
            "--v=1",
        ]);
        let log = dir.join("kube-apiserver.log");
        children.push(spawn(api, &log));
        let mut plane = Self {
            dir: dir.clone(),
            port,
            started_in: Duration::ZERO,
            own: Mutex::new(Vec::new()),
        };
        std::fs::write(
            plane.admin_kubeconfig(),
            kubeconfig_text(&plane.server(), &plane.ca(), &cert_user(&pki_dir, "admin")),
        )
        .unwrap();
        let end = Instant::now() + Duration::from_secs(90);
        loop {
            let ready = Command::new("curl")
                .args(["-sf", "-o", "/dev/null", "--cacert", &p("ca.crt")])
                .args(["--cert", &p("admin.crt"), "--key", &p("admin.key")])
                .arg(format!("{}/readyz", plane.server()))
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                break;
            }
            for c in &mut children {
                if let Ok(Some(s)) = c.try_wait() {
                    panic!("a control plane process exited ({s}):\n{}", tail(&log));
                }
            }
            assert!(
                Instant::now() < end,
                "kube-apiserver not ready:\n{}",
                tail(&log)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        plane.kubectl(&[
            "apply",
            "-f",
            &format!("{}/deploy/rbac.yaml", crate::repo().display()),
        ]);
        plane.started_in = t0.elapsed();
        eprintln!(
            "kube-apiserver and etcd ready in {:?} ({})",
            plane.started_in,
            dir.display()
        );
        (plane, children)
    }

    /// `https://127.0.0.1:PORT`.
    pub fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The cluster CA.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("pki/ca.crt")
    }

    /// The admin's kubeconfig (O=system:masters).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// Runs kubectl as the admin; panics when it fails.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let k8s = bin_dir("kubernetes").unwrap();
        let out = Command::new(k8s.join("kubectl"))
            .arg("--kubeconfig")
            .arg(self.admin_kubeconfig())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// A client as the admin (for this test's runtime).
    pub async fn admin(&self) -> Kube {
        Kube::from_kubeconfig(&self.admin_kubeconfig()).await
    }

    /// A namespace, a ServiceAccount `criguard` in it bound to
    /// `deploy/rbac.yaml`'s ClusterRole, its token in a kubeconfig under
    /// `kubeconfig_dir`, and `node` (its object, from the kubelet's
    /// registration, created with `node`; its client certificate).
    pub async fn tenant(&self, prefix: &str, node: Value, kubeconfig_dir: &Path) -> Tenant {
        let ns = unique(prefix);
        let node_name = format!("node-{ns}");
        let admin = self.admin().await;
        admin
            .create("/api/v1/namespaces", json!({"metadata": {"name": ns}}))
            .await;
        // The pods' ServiceAccount (no controller-manager makes it here).
        for sa in ["default", "criguard"] {
            admin
                .create(
                    &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
                    json!({"metadata": {"name": sa}}),
                )
                .await;
        }
        let binding = format!("criguard-{ns}");
        admin
            .create(
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                json!({"metadata": {"name": binding},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "criguard"},
                    "subjects": [{"kind": "ServiceAccount", "name": "criguard", "namespace": ns}]}),
            )
            .await;
        let token = admin
            .create(
                &format!("/api/v1/namespaces/{ns}/serviceaccounts/criguard/token"),
                json!({"spec": {"expirationSeconds": 7200}}),
            )
            .await["status"]["token"]
            .as_str()
            .unwrap()
            .to_owned();
        let mut node = node;
        node["metadata"]["name"] = json!(node_name);
        let taints = node["spec"]["taints"].clone();
        admin.create("/api/v1/nodes", node).await;
        // The TaintNodesByCondition admission plugin adds the not-ready
        // taint to a new node; the node lifecycle controller (not run here)
        // removes it once the node is Ready, as this one is.
        let (code, v) = admin
            .send(
                "PATCH",
                &format!("/api/v1/nodes/{node_name}"),
                "application/merge-patch+json",
                &json!({"spec": {"taints": taints}}),
            )
            .await;
        assert_eq!(code, 200, "{v}");
        let pki_dir = self.dir.join("pki");
        let cert = format!("node-{node_name}");
        pki(
            &pki_dir,
            &format!("pki_cert {cert} /O=system:nodes/CN=system:node:{node_name}"),
        );
        let node_kubeconfig = self.dir.join(format!("{cert}.kubeconfig"));
        std::fs::write(
            &node_kubeconfig,
            kubeconfig_text(&self.server(), &self.ca(), &cert_user(&pki_dir, &cert)),
        )
        .unwrap();
        let kubeconfig = kubeconfig_dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            kubeconfig_text(&self.server(), &self.ca(), &format!("    token: {token}")),
        )
        .unwrap();
        Tenant {
            ns: ns.clone(),
            node: node_name,
            user: format!("system:serviceaccount:{ns}:criguard"),
            binding,
            kubeconfig,
            node_kubeconfig,
            audit: self.dir.join("audit.log"),
            ca: self.ca(),
            server: self.server(),
            webhook_pki: pki_dir,
            admin,
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let mut own = self.own.lock().unwrap();
        if own.is_empty() {
            return;
        }
        for c in own.iter_mut() {
            stop(c);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One test's share of a control plane.
pub struct Tenant {
    /// Its namespace (pods, events).
    pub ns: String,
    /// Its Node's name (criguard's `--node-name`).
    pub node: String,
    /// The ServiceAccount criguard's kubeconfig authenticates as.
    pub user: String,
    /// Its ClusterRoleBinding to `deploy/rbac.yaml`'s ClusterRole.
    pub binding: String,
    /// criguard's kubeconfig (the ServiceAccount's token, the CA).
    pub kubeconfig: PathBuf,
    /// The node's own kubeconfig (`system:node:NODE`, as its kubelet).
    pub node_kubeconfig: PathBuf,
    audit: PathBuf,
    ca: PathBuf,
    server: String,
    webhook_pki: PathBuf,
    /// A client as the admin.
    pub admin: Kube,
}

/// One request of criguard's, from the audit log.
#[derive(Clone, Debug)]
pub struct Request {
    /// When the API server received it.
    pub at: SystemTime,
    /// When it finished answering (for a watch, when it started).
    pub answered: SystemTime,
    /// The audit verb: get, list, watch, create, patch, delete.
    pub verb: String,
    /// HTTP method, from the verb.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The body criguard sent (`Null` when none).
    pub body: Value,
    /// The HTTP status answered.
    pub status: u16,
    /// The `User-Agent` header.
    pub user_agent: String,
}

/// Parses an RFC 3339 UTC timestamp as the audit log writes it
/// (`2026-01-02T03:04:05.123456Z`).
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (h, mi, sec) = (t.next()??, t.next()??, t.next()??);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = u64::try_from(days * 86_400 + h * 3600 + mi * 60 + sec).ok()?;
    let nanos = if frac.is_empty() {
        0
    } else {
        let digits: String = frac.chars().take(9).collect();
        digits.parse::<u64>().ok()? * 10u64.pow(9 - digits.len() as u32)
    };
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_nanos(nanos))
}

/// The requests of `user` in audit log `lines`, in the order received.
pub fn audit_requests(lines: impl Iterator<Item = String>, user: &str) -> Vec<Request> {
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<Request> = lines
        .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
        .filter(|e| e["user"]["username"] == user)
        .filter(|e| seen.insert(e["auditID"].as_str().unwrap_or("").to_owned()))
        .map(|e| {
            let verb = e["verb"].as_str().unwrap_or("").to_owned();
            let method = match verb.as_str() {
                "create" => "POST",
                "patch" => "PATCH",
                "update" => "PUT",
                "delete" | "deletecollection" => "DELETE",
                _ => "GET",
            };
            let uri = e["requestURI"].as_str().unwrap_or("");
            let time = |k: &str| parse_rfc3339(e[k].as_str().unwrap_or("")).unwrap();
            Request {
                at: time("requestReceivedTimestamp"),
                answered: time("stageTimestamp"),
                method: method.to_owned(),
                verb,
                path: uri.split('?').next().unwrap().to_owned(),
                body: e["requestObject"].clone(),
                status: e["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
                user_agent: e["userAgent"].as_str().unwrap_or("").to_owned(),
            }
        })
        .collect();
    out.sort_by_key(|r| r.at);
    out
}

impl Tenant {
    /// criguard's requests so far (the audit log is written before each
    /// answer: `--audit-log-mode blocking`).
    pub fn requests(&self) -> Vec<Request> {
        let f = std::fs::File::open(&self.audit).unwrap();
        audit_requests(
            std::io::BufReader::new(f).lines().map_while(Result::ok),
            &self.user,
        )
    }

    /// A client as this node's kubelet (`system:node:NODE`: the Node
    /// authorizer and NodeRestriction apply).
    pub async fn kubelet(&self) -> Kube {
        Kube::from_kubeconfig(&self.node_kubeconfig).await
    }

    /// A kubeconfig like criguard's but for another port (nothing there).
    pub fn kubeconfig_for_port(&self, dir: &Path, port: u16) -> PathBuf {
        let text = std::fs::read_to_string(&self.kubeconfig)
            .unwrap()
            .replace(&self.server, &format!("https://127.0.0.1:{port}"));
        let path = dir.join("kubeconfig");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Removes the ServiceAccount's ClusterRoleBinding: every request of
    /// criguard's is refused (403) from then on.
    pub async fn unbind(&self) {
        let path = format!(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{}",
            self.binding
        );
        assert_eq!(self.admin.delete(&path).await, 200);
    }

    /// Registers a validating admission webhook served here that, on
    /// criguard's first patch of this node, first applies `change` (a JSON
    /// merge patch) to the node as another writer: the API server then
    /// answers criguard's patch with a real 409 when it carries the
    /// resourceVersion it read. Serves until the test's runtime ends.
    pub async fn interfere_with_next_node_patch(&self, change: Value) {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(self.webhook_pki.join("webhook.crt"))
                .unwrap()
                .map(Result::unwrap)
                .collect();
        let key = PrivateKeyDer::from_pem_file(self.webhook_pki.join("webhook.key")).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (admin, node) = (self.admin.clone(), self.node.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, fired, admin, node, change) = (
                    acceptor.clone(),
                    fired.clone(),
                    admin.clone(),
                    node.clone(),
                    change.clone(),
                );
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let (fired, admin, node, change) =
                                (fired.clone(), admin.clone(), node.clone(), change.clone());
                            async move {
                                let body = req.into_body().collect().await?.to_bytes();
                                let review: Value =
                                    serde_json::from_slice(&body).unwrap_or_default();
                                if !fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
                                    let (code, _) = admin
                                        .send(
                                            "PATCH",
                                            &format!("/api/v1/nodes/{node}"),
                                            "application/merge-patch+json",
                                            &change,
                                        )
                                        .await;
                                    assert_eq!(code, 200, "the other writer's change");
                                }
                                let answer = json!({
                                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                "response": {"uid": review["request"]["uid"], "allowed": true}});
                                Ok::<_, hyper::Error>(
                                    hyper::Response::builder()
                                        .header("content-type", "application/json")
                                        .body(Full::new(Bytes::from(answer.to_string())))
                                        .unwrap(),
                                )
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&self.ca).unwrap());
        let cel = format!(
            "request.userInfo.username == '{}' && request.name == '{}'",
            self.user, self.node
        );
        self.admin
            .create(
                "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                json!({"metadata": {"name": format!("interfere-{}", self.ns)},
                    "webhooks": [{
                        "name": "interfere.criguard.test",
                        "clientConfig": {"url": format!("https://127.0.0.1:{port}/"), "caBundle": ca},
                        "rules": [{"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                   "resources": ["nodes"], "scope": "Cluster"}],
                        "matchConditions": [{"name": "criguard-on-this-node", "expression": cel}],
                        "failurePolicy": "Fail", "sideEffects": "NoneOnDryRun",
                        "admissionReviewVersions": ["v1"], "timeoutSeconds": 5}]}),
            )
            .await;
    }
}

/// An API client on the test's runtime, answering status codes and JSON.
#[derive(Clone)]
pub struct Kube {
    client: kube::Client,
}

impl Kube {
    /// A client from a kubeconfig file.
    pub async fn from_kubeconfig(path: &Path) -> Self {
        let kc = kube::config::Kubeconfig::read_from(path).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        Self {
            client: kube::Client::try_from(config).unwrap(),
        }
    }

    /// Sends `body` (none when `Null`) and answers the status and the JSON.
    pub async fn send(&self, method: &str, path: &str, ctype: &str, body: &Value) -> (u16, Value) {
        let bytes = if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", ctype)
            .body(kube::client::Body::from(bytes))
            .unwrap();
        let resp = self.client.send(req).await.unwrap();
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect_bytes().await.unwrap();
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// The object at `path`, or `None` on 404.
    pub async fn get(&self, path: &str) -> Option<Value> {
        match self
            .send("GET", path, "application/json", &Value::Null)
            .await
        {
            (200, v) => Some(v),
            (404, _) => None,
            (code, v) => panic!("GET {path}: {code} {v}"),
        }
    }

    /// Creates `obj` under `path`; panics unless 201 (or 200).
    pub async fn create(&self, path: &str, obj: Value) -> Value {
        let (code, v) = self.send("POST", path, "application/json", &obj).await;
        assert!(code == 201 || code == 200, "POST {path}: {code} {v}");
        v
    }

    /// A strategic merge patch of a pod's status subresource, as the
    /// kubelet's status manager sends it; answers the status code.
    pub async fn patch_pod_status(&self, ns: &str, name: &str, patch: Value) -> u16 {
        let path = format!("/api/v1/namespaces/{ns}/pods/{name}/status");
        let ctype = "application/strategic-merge-patch+json";
        self.send("PATCH", &path, ctype, &patch).await.0
    }

    /// Deletes the object at `path` at once (grace 0).
    pub async fn delete(&self, path: &str) -> u16 {
        let body = json!({"gracePeriodSeconds": 0});
        self.send("DELETE", path, "application/json", &body).await.0
    }
}
