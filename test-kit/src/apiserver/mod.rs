//! A stand-in for kube-apiserver, in process, on loopback: just the calls
//! criguard makes, with the real API's semantics. The report's tests run
//! against a real kube-apiserver (`common::kubeapi`); this one stays for the
//! one fault a real server cannot be made to show: answers that come late
//! ([`ApiServer::set_delay`]; tests/it/kube.rs's slow API, benches/kube.rs),
//! and for the benchmark's refusals ([`ApiServer::deny`]).
//!
//! What it keeps of the real server: objects as JSON under
//! `/api/v1/[namespaces/NS/]RESOURCE/NAME[/status]`; one resourceVersion
//! counter bumped by every write; `metadata.uid` and `metadata.resourceVersion`
//! in a patch body as preconditions (409 Conflict when they differ); the
//! status subresource (a patch to `/status` changes only `.status`, a patch
//! to the object never does); strategic merge patches with the merge keys of
//! the fields criguard touches (pod and node `status.conditions` by `type`,
//! containers by `name`; `spec.taints` has none and is replaced whole),
//! `$patch: delete` and `$setElementOrder`; JSON merge patches (RFC 7386)
//! and JSON patches (RFC 6902); 415 for server-side apply, which criguard
//! never sends; DeleteOptions with UID and
//! resourceVersion preconditions and grace periods; event creation (409
//! AlreadyExists on a taken name); watches by `metadata.name` field selector
//! from a resourceVersion, replaying every change since; bearer-token
//! authentication (401) and a verb/resource authorization table (403 with
//! the RBAC message). Each request's `User-Agent` is recorded. Where it
//! differs from the real server (found by running the same tests against
//! both): a condition new to a list is appended, where the real server's
//! strategic merge puts it first; a new node gets no
//! `node.kubernetes.io/not-ready` taint (TaintNodesByCondition).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

mod merge;
mod store;

#[allow(unused_imports)] // used by some test binaries only
pub use merge::{json_patch, merge_patch, strategic_merge};
use store::{State, failure};

/// The token criguard's kubeconfig carries.
pub const TOKEN: &str = "criguard-test-token";

/// One request as it arrived.
#[derive(Clone, Debug)]
pub struct Request {
    /// When it arrived.
    pub at: SystemTime,
    /// HTTP method.
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// The query string.
    pub query: String,
    /// `content-type`, if any.
    pub content_type: String,
    /// The body as JSON (`Null` when empty or not JSON).
    pub body: Value,
    /// The HTTP status answered.
    pub status: u16,
    /// `user-agent`, if any.
    pub user_agent: String,
}

/// The stand-in server; stops serving when dropped.
pub struct ApiServer {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    changed: broadcast::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

type Answer = hyper::Response<BoxBody<Bytes, Infallible>>;

fn full(status: u16, v: &Value) -> Answer {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .unwrap()
}

/// `/api/v1/[namespaces/NS/]RESOURCE[/NAME[/SUB]]` → (ns, resource, name, sub).
fn route(path: &str) -> Option<(String, String, Option<String>, Option<String>)> {
    let rest = path.strip_prefix("/api/v1/")?;
    let parts: Vec<&str> = rest.split('/').collect();
    let (ns, parts) = match parts.as_slice() {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (ns.to_string(), tail.to_vec()),
        all => (String::new(), all.to_vec()),
    };
    let s = |i: usize| parts.get(i).map(|p| p.to_string());
    (parts.len() <= 3).then(|| (ns, parts[0].to_owned(), s(1), s(2)))
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.replace("%3D", "=").replace("%3d", "="))
    })
}

impl ApiServer {
    /// Starts serving on a free loopback port.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let (changed, _) = broadcast::channel(256);
        let (st, ch) = (state.clone(), changed.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (st, ch) = (st.clone(), ch.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let (st, ch) = (st.clone(), ch.clone());
                        async move { Ok::<_, Infallible>(handle(st, ch, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            state,
            changed,
            task,
        }
    }

    /// A kubeconfig for this server (current context, bearer token) in `dir`.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        write_kubeconfig(dir, &format!("http://{}", self.addr))
    }

    /// Stores `obj` (a full object with `metadata.name`) as if created.
    pub fn put(&self, resource: &str, ns: &str, mut obj: Value) {
        let mut s = self.state.lock().unwrap();
        let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
        s.bump(resource, ns, &name, "ADDED", &mut obj);
        s.objects.insert((resource.into(), ns.into(), name), obj);
        drop(s);
        let _ = self.changed.send(());
    }

    /// The stored object, if any.
    pub fn get(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let s = self.state.lock().unwrap();
        s.objects
            .get(&(resource.into(), ns.into(), name.into()))
            .cloned()
    }

    /// Deletes an object at once, as a controller or the pod GC would.
    pub fn delete_now(&self, resource: &str, ns: &str, name: &str) -> u16 {
        let key = (resource.to_owned(), ns.to_owned(), name.to_owned());
        let (code, _) = self
            .state
            .lock()
            .unwrap()
            .delete(key, &json!({"gracePeriodSeconds": 0}));
        let _ = self.changed.send(());
        code
    }

    /// The requests so far.
    pub fn requests(&self) -> Vec<Request> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Every answer waits `d` first (a slow API).
    pub fn set_delay(&self, d: Duration) {
        self.state.lock().unwrap().delay = d;
    }

    /// `verb` on `resource` (e.g. `patch`, `pods/status`) is forbidden from now on.
    pub fn deny(&self, verb: &str, resource: &str) {
        self.state
            .lock()
            .unwrap()
            .denied
            .insert((verb.into(), resource.into()));
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Writes a kubeconfig pointing at `server` into `dir`.
pub fn write_kubeconfig(dir: &Path, server: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: {server}\n\
         contexts:\n- name: standin\n  context:\n    cluster: standin\n    user: criguard\n\
         current-context: standin\nusers:\n- name: criguard\n  user:\n    token: {TOKEN}\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn handle(
    state: Arc<Mutex<State>>,
    changed: broadcast::Sender<()>,
    req: hyper::Request<Incoming>,
) -> Answer {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let header = |k: &str| {
        req.headers()
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (ctype, auth, user_agent) = (
        header("content-type"),
        header("authorization"),
        header("user-agent"),
    );
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let delay = state.lock().unwrap().delay;
    tokio::time::sleep(delay).await;
    let mut record = Request {
        at: SystemTime::now(),
        method: method.clone(),
        path: path.clone(),
        query: query.clone(),
        content_type: ctype.clone(),
        body: body.clone(),
        status: 0,
        user_agent,
    };
    let Some((ns, resource, name, sub)) = route(&path) else {
        return answer(
            &state,
            record,
            failure(
                404,
                "NotFound",
                "the server could not find the requested resource".into(),
            ),
        );
    };
    if auth != format!("Bearer {TOKEN}") {
        return answer(
            &state,
            record,
            failure(401, "Unauthorized", "Unauthorized".into()),
        );
    }
    let watching = query_param(&query, "watch").as_deref() == Some("true");
    let verb = match (method.as_str(), name.is_some()) {
        ("GET", true) => "get",
        ("GET", false) if watching => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        _ => "unknown",
    };
    let full_resource = match &sub {
        Some(s) => format!("{resource}/{s}"),
        None => resource.clone(),
    };
    if state
        .lock()
        .unwrap()
        .denied
        .contains(&(verb.to_owned(), full_resource.clone()))
    {
        let what = name
            .clone()
            .map(|n| format!("{resource} \"{n}\""))
            .unwrap_or(resource.clone());
        let scope = if ns.is_empty() {
            "at the cluster scope".to_owned()
        } else {
            format!("in the namespace \"{ns}\"")
        };
        return answer(
            &state,
            record,
            failure(
                403,
                "Forbidden",
                format!(
                    "{what} is forbidden: User \"system:serviceaccount:kube-system:criguard\" cannot {verb} resource \"{full_resource}\" in API group \"\" {scope}"
                ),
            ),
        );
    }
    if verb == "watch" {
        record.status = 200;
        state.lock().unwrap().requests.push(record);
        return watch(state, changed, &resource, &ns, &query);
    }
    let key = |n: &str| (resource.clone(), ns.clone(), n.to_owned());
    let result = {
        let mut s = state.lock().unwrap();
        match (verb, name.as_deref()) {
            ("get", Some(n)) => match s.objects.get(&key(n)) {
                Some(o) if sub.is_none() || sub.as_deref() == Some("status") => (200, o.clone()),
                _ => State::not_found(&resource, n),
            },
            ("patch", Some(n)) => s.patch(key(n), sub.as_deref(), &ctype, &body),
            ("create", None) => s.create(&resource, &ns, body.clone()),
            ("delete", Some(n)) => s.delete(key(n), &body),
            _ => failure(
                405,
                "MethodNotAllowed",
                format!("{method} {path} is not served by this stand-in"),
            ),
        }
    };
    if result.0 < 300 {
        let _ = changed.send(());
    }
    answer(&state, record, result)
}

fn answer(state: &Mutex<State>, mut record: Request, (code, v): (u16, Value)) -> Answer {
    record.status = code;
    state.lock().unwrap().requests.push(record);
    full(code, &v)
}

/// A watch: every change after `resourceVersion` to objects of `resource`
/// in `ns` matching the `metadata.name` field selector, one JSON line each,
/// until `timeoutSeconds`.
fn watch(
    state: Arc<Mutex<State>>,
    changed: broadcast::Sender<()>,
    resource: &str,
    ns: &str,
    query: &str,
) -> Answer {
    let name = query_param(query, "fieldSelector")
        .and_then(|f| f.strip_prefix("metadata.name=").map(str::to_owned));
    let mut since: u64 = query_param(query, "resourceVersion")
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let timeout = Duration::from_secs(
        query_param(query, "timeoutSeconds")
            .and_then(|t| t.parse().ok())
            .unwrap_or(300),
    );
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    let (resource, ns) = (resource.to_owned(), ns.to_owned());
    let mut woken = changed.subscribe();
    tokio::spawn(async move {
        let end = tokio::time::Instant::now() + timeout;
        loop {
            let lines: Vec<(u64, String)> = {
                let s = state.lock().unwrap();
                s.history
                    .iter()
                    .filter(|(rv, r, n, nm, _, _)| {
                        *rv > since
                            && *r == resource
                            && *n == ns
                            && name.as_ref().is_none_or(|x| x == nm)
                    })
                    .map(|(rv, _, _, _, ty, obj)| {
                        (*rv, format!("{}\n", json!({"type": ty, "object": obj})))
                    })
                    .collect()
            };
            for (rv, line) in lines {
                since = rv;
                if tx.send(Ok(Frame::data(Bytes::from(line)))).await.is_err() {
                    return;
                }
            }
            if since == 0 {
                since = state.lock().unwrap().rv;
            }
            match tokio::time::timeout_at(end, woken.recv()).await {
                Err(_) => return,
                Ok(_) => continue,
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    hyper::Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .unwrap()
}
