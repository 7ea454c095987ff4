//! criguard's node conditions and taints, kept in line with its pressure
//! conditions.
//!
//! One task follows the conditions the eviction manager publishes. On each
//! change (the first one included, which clears what a previous run left
//! behind unless its remembered pressure still holds) it reads the node and
//! writes only what differs: a strategic merge patch
//! of `status.conditions` (merged by type: the kubelet's and others'
//! conditions stay), and, with taints on, the whole taint list with the
//! node's resourceVersion as a precondition (taints have no merge key; a
//! 409 means someone else changed the node meanwhile, so it reads again).
//! Failures retry with backoff and never block anything else.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::metrics::KubeWrite;
use super::{Inner, backoff as new_backoff, body, bounded};
use crate::signals::table::Condition;

/// Conflicts (409) retried after [`CONFLICT_WAIT`] before the backoff.
const CONFLICT_RETRIES: u32 = 5;
/// The wait before reading the node again after a conflict.
const CONFLICT_WAIT: std::time::Duration = std::time::Duration::from_millis(10);

/// Runs until the sender is dropped.
pub(super) async fn reconcile(
    inner: Arc<Inner>,
    mut rx: watch::Receiver<Option<BTreeSet<Condition>>>,
) {
    let api: Api<Node> = Api::all(inner.client.clone());
    let mut applied: Option<BTreeSet<Condition>> = None;
    let mut backoff = new_backoff();
    let mut conflicts = 0;
    loop {
        let wanted = rx.borrow_and_update().clone();
        if let Some(wanted) = wanted.filter(|w| applied.as_ref() != Some(w)) {
            match apply(&inner, &api, &wanted).await {
                Ok(()) => {
                    inner.applied.send_replace(Some(wanted.clone()));
                    applied = Some(wanted);
                    backoff.reset();
                    conflicts = 0;
                }
                Err(err) => {
                    // A conflict is someone else's write meanwhile: read
                    // again at once, as client-go's RetryOnConflict does
                    // (retry.DefaultRetry: 10 ms, 5 steps), so that the
                    // taint still lands within the eviction's bound.
                    let wait = if super::code_of(&err) == Some(409) && conflicts < CONFLICT_RETRIES
                    {
                        conflicts += 1;
                        CONFLICT_WAIT
                    } else {
                        backoff.next_wait()
                    };
                    tracing::warn!(node = %inner.node, %err, retry_in = ?wait, "node conditions/taints not updated; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        r = rx.changed() => if r.is_err() { return },
                    }
                    continue;
                }
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Makes the node's criguard conditions and taints match `wanted`.
async fn apply(inner: &Inner, api: &Api<Node>, wanted: &BTreeSet<Condition>) -> Result<(), String> {
    let node = bounded(api.get(&inner.node)).await?;
    let present: BTreeSet<String> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .map(|c| c.type_.clone())
        .filter(|t| body::ALL.iter().any(|c| body::condition_type(*c) == t))
        .collect();
    let mut rv = node.metadata.resource_version.clone().unwrap_or_default();
    if let Some(patch) = body::node_conditions_patch(wanted, &present, SystemTime::now()) {
        let answer = bounded(api.patch_status(
            &inner.node,
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        ))
        .await;
        inner
            .metrics
            .write(KubeWrite::NodeConditions, answer.is_ok());
        let updated = answer?;
        tracing::info!(node = %inner.node, conditions = ?wanted.iter().map(|c| body::condition_type(*c)).collect::<Vec<_>>(), "criguard's node conditions updated");
        rv = updated.metadata.resource_version.unwrap_or_default();
    }
    if !inner.taints {
        return Ok(());
    }
    let current: Vec<Value> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| {
            t.iter()
                .filter_map(|t| serde_json::to_value(t).ok())
                .collect()
        })
        .unwrap_or_default();
    if let Some(taints) = body::taints_with(&current, wanted) {
        let patch = json!({ "metadata": { "resourceVersion": rv }, "spec": { "taints": taints } });
        let answer =
            bounded(api.patch(&inner.node, &PatchParams::default(), &Patch::Merge(&patch))).await;
        inner.metrics.write(KubeWrite::NodeTaints, answer.is_ok());
        answer?;
        tracing::info!(node = %inner.node, taints = ?wanted.iter().map(|c| body::taint_key(*c)).collect::<Vec<_>>(), "criguard's NoSchedule taints updated");
    }
    Ok(())
}
