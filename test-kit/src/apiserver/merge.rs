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

/// A JSON patch (RFC 6902): `add`, `remove`, `replace` and `test`, with
/// JSON pointers; `Err` names the operation that failed (the API answers 422).
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), String> {
    let Some(ops) = ops.as_array() else {
        return Err("a JSON patch is a list of operations".into());
    };
    for op in ops {
        let (kind, path) = (
            op["op"].as_str().unwrap_or(""),
            op["path"].as_str().unwrap_or(""),
        );
        let (parent, last) = path.rsplit_once('/').ok_or(format!("bad path {path:?}"))?;
        let last = last.replace("~1", "/").replace("~0", "~");
        let fail = || format!("{kind} {path}: no such location");
        if kind == "test" {
            if target.pointer(path) != Some(&op["value"]) {
                return Err(format!("test {path}: value differs"));
            }
            continue;
        }
        let holder = target.pointer_mut(parent).ok_or_else(fail)?;
        match (kind, holder) {
            ("add" | "replace", Value::Object(m)) => {
                if kind == "replace" && !m.contains_key(&last) {
                    return Err(fail());
                }
                m.insert(last, op["value"].clone());
            }
            ("add", Value::Array(a)) if last == "-" => a.push(op["value"].clone()),
            ("add" | "replace", Value::Array(a)) => {
                let i: usize = last.parse().map_err(|_| fail())?;
                match kind {
                    "add" if i <= a.len() => a.insert(i, op["value"].clone()),
                    "replace" if i < a.len() => a[i] = op["value"].clone(),
                    _ => return Err(fail()),
                }
            }
            ("remove", Value::Object(m)) => {
                m.remove(&last).ok_or_else(fail)?;
            }
            ("remove", Value::Array(a)) => {
                let i: usize = last.parse().map_err(|_| fail())?;
                if i >= a.len() {
                    return Err(fail());
                }
                a.remove(i);
            }
            _ => return Err(format!("unsupported operation {kind:?} at {path}")),
        }
    }
    Ok(())
}
