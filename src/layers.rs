//! The layering written in `docs/design.md`, checked against the code.
//!
//! The table there lists the top-level modules layer by layer, lowest
//! first; a module may use its own layer and those below it. This test
//! reads that table and every `crate::`/`criguard::` path in `src/`, and
//! fails on an arrow from a lower layer to a higher one, on a circle between
//! two modules, and on a module the table does not place. Known breaks are
//! listed in [`KNOWN`] with their reason; one that no longer occurs must be
//! taken off the list, so the list only shrinks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Arrows the tree still has against the table: (from, to, why).
const KNOWN: &[(&str, &str, &str)] = &[
    (
        "cri",
        "intercept",
        "the relay's tests and fuzz harness drive it with the real observer",
    ),
    (
        "intercept",
        "kubelet",
        "the observer's tests build pods with the test fixture",
    ),
    (
        "cri",
        "eviction",
        "the relay's tests and fuzz harness give the real observer a node status",
    ),
    (
        "config",
        "kube",
        "the kubeconfig loader lives in kube; config only names its path",
    ),
    (
        "config",
        "policy",
        "image GC settings are validated by policy's own bounds",
    ),
    (
        "cri",
        "kubelet",
        "the relay's tests build pods with the test fixture",
    ),
    (
        "model",
        "reclaim",
        "the events loop drives the kernel OOM kill recorder",
    ),
    ("signals", "model", "the cgroup path tests build model pods"),
];

/// Top-level modules and their layer (0: lowest), from the table in
/// `docs/design.md` (rows `| layer | modules | does |`, modules in backticks).
fn layers(design: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let rows = design
        .lines()
        .skip_while(|l| !l.starts_with("| layer | modules |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'));
    for (layer, row) in rows.enumerate() {
        let modules = row.split('|').nth(2).unwrap_or_default();
        for m in modules.split('`').skip(1).step_by(2) {
            out.insert(m.trim_end_matches('*').to_owned(), layer);
        }
    }
    out
}

/// The top-level module a file under `src/` belongs to (`src/a/b.rs` and
/// `src/a.rs` are `a`); `None` for the crate roots.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.trim_end_matches(".rs");
    (!matches!(name, "lib" | "main")).then(|| name.to_owned())
}

/// The top-level modules `text` names through `crate::` or `criguard::`,
/// comments left out.
fn uses(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        for prefix in ["crate::", "criguard::"] {
            for (i, _) in code.match_indices(prefix) {
                let before = code[..i].chars().last();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let rest = &code[i + prefix.len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
        // `use crate::{a, b::c}`: the names in the braces.
        for prefix in ["crate::{", "criguard::{"] {
            if let Some(i) = code.find(prefix) {
                let inner = &code[i + prefix.len()..];
                for part in inner.split([',', '}']) {
                    let name: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        out.insert(name);
                    }
                }
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every arrow between two top-level modules: (from, to) → a file showing it.
fn arrows(src: &Path) -> BTreeMap<(String, String), PathBuf> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        let Some(from) = module_of(src, &f) else {
            continue;
        };
        if from == "layers" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        // A multi-line `use crate::{...}` names modules on later lines.
        let joined = text.replace('\n', " ");
        let mut named = uses(&text);
        named.extend(uses(&joined));
        for to in named {
            if to != from {
                out.entry((from.clone(), to)).or_insert_with(|| f.clone());
            }
        }
    }
    out
}

#[test]
fn no_module_uses_a_higher_layer_and_no_two_modules_use_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(root.join("docs/design.md")).unwrap();
    let layer = layers(&design);
    assert!(
        layer.len() > 10,
        "the layer table in docs/design.md: {layer:?}"
    );
    let src = root.join("src");
    let arrows = arrows(&src);
    let known: BTreeSet<(String, String)> = KNOWN
        .iter()
        .map(|(a, b, _)| (a.to_string(), b.to_string()))
        .collect();
    let mut wrong = Vec::new();
    let mut modules = BTreeSet::new();
    for ((from, to), file) in &arrows {
        modules.insert(from.clone());
        // Only arrows to modules of this crate (not `crate::` of a dependency).
        if !src.join(format!("{to}.rs")).exists() && !src.join(to).is_dir() {
            continue;
        }
        modules.insert(to.clone());
        let (Some(a), Some(b)) = (layer.get(from), layer.get(to)) else {
            continue;
        };
        let up = b > a;
        let circle = a == b && arrows.contains_key(&(to.clone(), from.clone()));
        let key = (from.clone(), to.clone());
        if (up || circle) && !known.contains(&key) {
            let what = if up { "a higher layer" } else { "a circle" };
            wrong.push(format!("{from} → {to} ({what}; {})", file.display()));
        }
    }
    let unplaced: Vec<_> = modules.iter().filter(|m| !layer.contains_key(*m)).collect();
    assert!(
        unplaced.is_empty(),
        "modules the layer table in docs/design.md does not place: {unplaced:?}"
    );
    let stale: Vec<_> = known.iter().filter(|k| !arrows.contains_key(*k)).collect();
    assert!(
        stale.is_empty(),
        "no longer in the tree, take them off KNOWN: {stale:?}"
    );
    assert!(
        wrong.is_empty(),
        "arrows against docs/design.md's layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn uses_finds_paths_and_braces_but_not_comments() {
    let text = "use crate::model::Pod;\nuse crate::{policy, signals::memory};\n// crate::kube\nlet x = criguard::cri::x();";
    let got: Vec<_> = uses(text).into_iter().collect();
    assert_eq!(got, ["cri", "model", "policy", "signals"]);
}
