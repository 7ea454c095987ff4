//! Strategic merge and JSON merge patches, as the API server applies them
//! to the fields criguard touches.

use serde_json::{Value, json};

/// The merge key of a list at `path` in a strategic merge patch (`None`:
/// the list is replaced whole).
fn merge_key(path: &str) -> Option<&'static str> {
    match path {
        ".status.conditions" => Some("type"),
        ".spec.containers" | ".status.containerStatuses" | ".spec.volumes" => Some("name"),
        _ => None,
    }
}

fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
        other => other.clone(),
    }
}

/// A strategic merge patch of `target` at `path`.
pub fn strategic_merge(target: &mut Value, patch: &Value, path: &str) {
    let (Some(t), Some(p)) = (target.as_object_mut(), patch.as_object()) else {
        *target = strip(patch);
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = strip(patch);
        return;
    }
    for (k, v) in p {
        if k.starts_with('$') {
            continue; // $setElementOrder/…, $retainKeys: ordering hints only
        }
        let child = format!("{path}.{k}");
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match (t.get_mut(k), v, merge_key(&child)) {
            (Some(Value::Array(items)), Value::Array(patches), Some(key)) => {
                for item in patches {
                    let id = item.get(key).cloned();
                    let pos = items.iter().position(|i| i.get(key) == id.as_ref());
                    match (item.get("$patch").and_then(Value::as_str), pos) {
                        (Some("delete"), _) => items.retain(|i| i.get(key) != id.as_ref()),
                        (_, Some(i)) => strategic_merge(&mut items[i], item, &child),
                        (_, None) => items.push(strip(item)),
                    }
                }
            }
            (Some(existing @ Value::Object(_)), Value::Object(_), _) => {
                strategic_merge(existing, v, &child)
            }
            _ => {
                t.insert(k.clone(), strip(v));
            }
        }
    }
}

/// A JSON merge patch (RFC 7386).
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().unwrap();
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}
