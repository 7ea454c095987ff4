//! `CriguardConfigInvalid`: the node condition that tells the cluster that
//! criguard fails open on this node (a configuration it cannot accept:
//! every CRI call relayed unchanged, nothing guarded), with the key, value
//! and rule in its message, so that `kubectl describe node` shows what the
//! journal says.
//!
//! Written only when the API report's own settings are valid (the caller
//! decides), True while criguard fails open and re-asserted at each of its
//! complaints; removed once a configuration is accepted, or at a start
//! with a valid one (a condition left behind by an earlier run). Patched by
//! type (strategic merge on `status.conditions`), so every other condition
//! stays; a node without it is not written to.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::{KubeSettings, body, bounded};
use crate::config::ConfigError;

/// The condition's type.
pub const CONFIG_INVALID: &str = "CriguardConfigInvalid";

/// The condition's reason while criguard fails open.
pub const REASON: &str = "InvalidConfiguration";

/// The patch that sets the condition (`invalid`: why criguard fails open;
/// its transition time only when the node does not carry it yet) or
/// removes it (`None`), given whether the node carries it now (`present`);
/// `None` when nothing needs writing.
pub fn patch(invalid: Option<&ConfigError>, present: bool, now: SystemTime) -> Option<Value> {
    let item = match invalid {
        Some(e) => {
            let t = body::rfc3339(now);
            let mut item = json!({
                "type": CONFIG_INVALID, "status": "True", "reason": REASON,
                "message": format!(
                    "criguard cannot accept its configuration ({e}): it relays every CRI call \
                     unchanged and does no eviction, garbage collection, oom_score_adj patch or \
                     admission refusal until a valid configuration is loaded"
                ),
                "lastHeartbeatTime": t,
            });
            if !present {
                // Set now; a re-assertion keeps the time it was first set.
                item["lastTransitionTime"] = json!(t);
            }
            item
        }
        None if present => json!({ "type": CONFIG_INVALID, "$patch": "delete" }),
        None => return None,
    };
    Some(json!({ "status": { "conditions": [item] } }))
}

/// Makes the node's `CriguardConfigInvalid` say `invalid` (`None`: no
/// condition), through the API `settings` name; the error says why not.
pub async fn report(settings: &KubeSettings, invalid: Option<&ConfigError>) -> Result<(), String> {
    let client = super::client(settings).await.map_err(|e| e.to_string())?;
    let api: Api<Node> = Api::all(client);
    let node = bounded(api.get(&settings.node_name)).await?;
    let present = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == CONFIG_INVALID));
    let Some(patch) = patch(invalid, present, SystemTime::now()) else {
        return Ok(());
    };
    bounded(api.patch_status(
        &settings.node_name,
        &PatchParams::default(),
        &Patch::Strategic(&patch),
    ))
    .await?;
    match invalid {
        Some(e) => {
            tracing::info!(node = %settings.node_name, key = %e.key, value = %e.value, "node condition {CONFIG_INVALID} set")
        }
        None => {
            tracing::info!(node = %settings.node_name, "node condition {CONFIG_INVALID} removed")
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_while_invalid_removed_only_when_present() {
        let e = ConfigError {
            key: "evictionHard".into(),
            value: "memory.available=lots".into(),
            rule: "not a quantity".into(),
        };
        let p = patch(Some(&e), false, SystemTime::UNIX_EPOCH).unwrap();
        let c = &p["status"]["conditions"][0];
        assert_eq!(c["type"], CONFIG_INVALID);
        assert_eq!(c["status"], "True");
        assert_eq!(c["reason"], REASON);
        let m = c["message"].as_str().unwrap();
        assert!(
            m.contains("evictionHard") && m.contains("memory.available=lots"),
            "{m}"
        );
        assert_eq!(c["lastTransitionTime"], "1970-01-01T00:00:00Z");
        let again = patch(Some(&e), true, SystemTime::UNIX_EPOCH).unwrap();
        let c = &again["status"]["conditions"][0];
        assert_eq!(c["lastHeartbeatTime"], "1970-01-01T00:00:00Z");
        assert!(c.get("lastTransitionTime").is_none(), "{c}");
        let gone = patch(None, true, SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(gone["status"]["conditions"][0]["$patch"], "delete");
        assert_eq!(patch(None, false, SystemTime::UNIX_EPOCH), None);
    }
}
