//! The stand-in's objects and the writes criguard makes to them, with the
//! API's preconditions, subresource and resourceVersion rules.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};

use super::Request;
use super::merge::{json_patch, merge_patch, strategic_merge};

#[derive(Default)]
pub(super) struct State {
    pub(super) rv: u64,
    pub(super) objects: BTreeMap<(String, String, String), Value>,
    /// (resourceVersion, resource, namespace, name, type, object).
    pub(super) history: Vec<(u64, String, String, String, &'static str, Value)>,
    pub(super) requests: Vec<Request>,
    pub(super) denied: BTreeSet<(String, String)>,
    pub(super) delay: Duration,
    pub(super) uids: u64,
}

/// A `Status` failure, as the API answers errors.
pub(super) fn failure(code: u16, reason: &str, message: String) -> (u16, Value) {
    let v = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code});
    (code, v)
}

fn kind_of(resource: &str) -> &'static str {
    match resource {
        "pods" => "Pod",
        "nodes" => "Node",
        "events" => "Event",
        _ => "Unknown",
    }
}

impl State {
    pub(super) fn bump(
        &mut self,
        resource: &str,
        ns: &str,
        name: &str,
        kind: &'static str,
        obj: &mut Value,
    ) {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.history.push((
            self.rv,
            resource.into(),
            ns.into(),
            name.into(),
            kind,
            obj.clone(),
        ));
    }

    pub(super) fn not_found(resource: &str, name: &str) -> (u16, Value) {
        failure(404, "NotFound", format!("{resource} \"{name}\" not found"))
    }

    /// UID and resourceVersion preconditions against `stored`.
    fn preconditions(
        stored: &Value,
        uid: Option<&Value>,
        rv: Option<&Value>,
    ) -> Result<(), (u16, Value)> {
        if let Some(uid) = uid.filter(|u| !u.is_null())
            && Some(uid) != stored["metadata"].get("uid")
        {
            return Err(failure(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled: Precondition failed: UID in precondition: {}, UID in object meta: {}",
                    uid.as_str().unwrap_or_default(),
                    stored["metadata"]["uid"].as_str().unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = rv.filter(|r| !r.is_null())
            && Some(rv) != stored["metadata"].get("resourceVersion")
        {
            return Err(failure(409, "Conflict", "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again".into()));
        }
        Ok(())
    }

    pub(super) fn patch(
        &mut self,
        key: (String, String, String),
        sub: Option<&str>,
        ctype: &str,
        body: &Value,
    ) -> (u16, Value) {
        let (resource, ns, name) = key.clone();
        let Some(stored) = self.objects.get(&key).cloned() else {
            return Self::not_found(&resource, &name);
        };
        if let Err(e) = Self::preconditions(
            &stored,
            body["metadata"].get("uid"),
            body["metadata"].get("resourceVersion"),
        ) {
            return e;
        }
        let mut patched = stored.clone();
        match ctype.split(';').next().unwrap_or("").trim() {
            "application/strategic-merge-patch+json" => strategic_merge(&mut patched, body, ""),
            "application/merge-patch+json" => merge_patch(&mut patched, body),
            "application/json-patch+json" => {
                if let Err(e) = json_patch(&mut patched, body) {
                    return failure(422, "Invalid", e);
                }
            }
            other => {
                return failure(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (this stand-in serves all but apply-patch+yaml, which criguard never sends; got {other})"
                    ),
                );
            }
        }
        // The subresource decides what may change; server fields never do.
        let mut out = stored.clone();
        if sub == Some("status") {
            out["status"] = patched["status"].take();
        } else {
            let meta = stored["metadata"].clone();
            out = patched;
            out["status"] = stored["status"].clone();
            for f in ["uid", "name", "namespace", "creationTimestamp"] {
                out["metadata"][f] = meta[f].clone();
            }
        }
        self.bump(&resource, &ns, &name, "MODIFIED", &mut out);
        self.objects.insert(key, out.clone());
        (200, out)
    }

    pub(super) fn create(&mut self, resource: &str, ns: &str, mut obj: Value) -> (u16, Value) {
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if name.is_empty() {
            return failure(
                422,
                "Invalid",
                format!(
                    "{} \"\" is invalid: metadata.name: Required value",
                    kind_of(resource)
                ),
            );
        }
        if obj["metadata"]["namespace"]
            .as_str()
            .is_some_and(|n| n != ns)
        {
            return failure(400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request".into());
        }
        let key = (resource.to_owned(), ns.to_owned(), name.clone());
        if self.objects.contains_key(&key) {
            return failure(
                409,
                "AlreadyExists",
                format!("{resource} \"{name}\" already exists"),
            );
        }
        self.uids += 1;
        obj["metadata"]["namespace"] = json!(ns);
        obj["metadata"]["uid"] = json!(format!("standin-{:08}", self.uids));
        self.bump(resource, ns, &name, "ADDED", &mut obj);
        self.objects.insert(key, obj.clone());
        (201, obj)
    }

    pub(super) fn delete(&mut self, key: (String, String, String), opts: &Value) -> (u16, Value) {
        let (resource, ns, name) = key.clone();
        let Some(mut stored) = self.objects.get(&key).cloned() else {
            return Self::not_found(&resource, &name);
        };
        let pre = &opts["preconditions"];
        if let Err(e) = Self::preconditions(&stored, pre.get("uid"), pre.get("resourceVersion")) {
            return e;
        }
        if opts["gracePeriodSeconds"].as_i64().unwrap_or(30) == 0 {
            self.objects.remove(&key);
            self.bump(&resource, &ns, &name, "DELETED", &mut stored);
        } else {
            stored["metadata"]["deletionTimestamp"] = json!("1970-01-01T00:00:00Z");
            stored["metadata"]["deletionGracePeriodSeconds"] = opts["gracePeriodSeconds"].clone();
            self.bump(&resource, &ns, &name, "MODIFIED", &mut stored);
            self.objects.insert(key, stored.clone());
        }
        (200, stored)
    }
}
