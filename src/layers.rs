//! The layering written in `docs/design.md`, checked against the code.
//!
//! The table there lists the top-level modules layer by layer, lowest
//! first; a module may use its own layer and those below it. This test
//! reads that table and every `crate::`/`criguard::` path in `src/`, and
//! fails on an arrow from a lower layer to a higher one, on a circle between
//! two modules, and on a module the table does not place. Known breaks are
//! listed in [`KNOWN`] with their reason; one that no longer occurs must be
//! taken off the list, so the list only shrinks.
//!
//! A second test looks inside each module: the files of one module (`a.rs`,
//! or `a/` with everything below it, beside the module's root) must not use
//! each other in a circle, through `super::x` or `crate::m::x`. Known
//! circles are listed in [`KNOWN_FILE_CIRCLES`], and shrink the same way.

mod lengths;
mod paths;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Arrows the tree still has against the table: (from, to, why).
const KNOWN: &[(&str, &str, &str)] = &[];

/// Circles between files of one module the tree still has: (the files,
/// as `module/file`, sorted; why).
const KNOWN_FILE_CIRCLES: &[(&[&str], &str)] = &[];

/// The units of the layer table in `docs/design.md` (rows `| layer | units
/// | does |`, units in backticks) and their layer (0: lowest). A unit is a
/// top-level module (`eviction`) or a module below one (`eviction::thresholds`),
/// which then leaves its parent's unit.
fn layers(design: &str) -> BTreeMap<String, usize> {
    table_rows(design)
        .into_iter()
        .enumerate()
        .flat_map(|(layer, (_, units))| units.into_iter().map(move |u| (u, layer)))
        .collect()
}

/// The table's rows: each layer's name and its units.
fn table_rows(design: &str) -> Vec<(String, Vec<String>)> {
    design
        .lines()
        .skip_while(|l| !l.starts_with("| layer | units |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            let mut cells = row.split('|').skip(1);
            let name = cells.next().unwrap_or_default().trim().to_owned();
            let units = cells.next().unwrap_or_default();
            let units = units.split('`').skip(1).step_by(2).map(str::to_owned);
            (name, units.collect())
        })
        .collect()
}

/// The module path of a file under `src/` (`a/b.rs` and `a/b/mod.rs` are
/// `[a, b]`); `None` for the crate roots.
fn module_path(src: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(src).ok()?;
    let mut path: Vec<String> = rel
        .iter()
        .map(|c| {
            c.to_str()
                .unwrap_or_default()
                .trim_end_matches(".rs")
                .to_owned()
        })
        .collect();
    if path.last().is_some_and(|l| l == "mod") {
        path.pop();
    }
    let root = path.first()?;
    (!matches!(root.as_str(), "lib" | "main" | "layers")).then_some(path)
}

/// The unit a module path belongs to: the longest unit of the table it
/// starts with, else its top-level module.
fn unit_of(path: &[String], units: &BTreeMap<String, usize>) -> String {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|u| units.contains_key(u))
        .unwrap_or_else(|| path.first().cloned().unwrap_or_default())
}

/// The module paths `text` (the file of module `own`) names through
/// `crate::`, `criguard::` or `super::`, comments left out; `super::` only
/// before an inline `mod tests`, where it would name the file itself.
fn uses(text: &str, own: &[String]) -> Vec<Vec<String>> {
    let code = code_of(text);
    let mut out: Vec<Vec<String>> = ["crate::", "criguard::"]
        .iter()
        .flat_map(|prefix| paths_after(&code, prefix))
        .collect();
    let before_tests = text.split("mod tests {").next().unwrap_or_default();
    for rel in paths_after(&code_of(before_tests), "super::") {
        // `super::super::x` climbs once more per `super`.
        let ups = 1 + rel.iter().take_while(|s| *s == "super").count();
        let base = &own[..own.len().saturating_sub(ups)];
        let rest = rel.iter().skip_while(|s| *s == "super").cloned();
        out.push(base.iter().cloned().chain(rest).collect());
    }
    out.retain(|p| !p.is_empty());
    out
}

/// `text` without its `//` comments, its lines joined: a `use` group may
/// span lines.
fn code_of(text: &str) -> String {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The paths after each `prefix` in `code`, groups expanded (`prefix
/// a::{b, c::d}` is `a::b` and `a::c::d`), a prefix inside a longer path
/// left out.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        let before = code[..i].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        out.extend(expand(&code[i + prefix.len()..]));
    }
    out
}

/// The paths a `use` tree at the start of `rest` names.
fn expand(rest: &str) -> Vec<Vec<String>> {
    let mut segments = Vec::new();
    let mut rest = rest.trim_start();
    loop {
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() {
            break;
        }
        rest = &rest[ident.len()..];
        if ident != "self" {
            segments.push(ident);
        }
        match rest.trim_start().strip_prefix("::") {
            Some(r) => rest = r.trim_start(),
            None => return vec![segments],
        }
    }
    let Some(group) = rest.strip_prefix('{') else {
        return vec![segments];
    };
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (j, c) in group.char_indices() {
        let end = match c {
            '{' => {
                depth += 1;
                false
            }
            '}' if depth == 0 => true,
            '}' => {
                depth -= 1;
                false
            }
            ',' => depth == 0,
            _ => false,
        };
        if end {
            for tail in expand(&group[start..j]) {
                out.push(segments.iter().cloned().chain(tail).collect());
            }
            start = j + 1;
            if c == '}' {
                break;
            }
        }
    }
    out
}

/// Every `.rs` file below `dir`, into `out` (also the length check's walk).
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

/// Whether module path `p` names a module of this crate (not `crate::` of
/// a dependency's macro): its top-level module is a file or folder in `src/`.
fn in_crate(src: &Path, p: &[String]) -> bool {
    let top = &p[0];
    src.join(format!("{top}.rs")).exists() || src.join(top).is_dir()
}

/// Every arrow between two units: (from, to) → a file showing it.
fn arrows(src: &Path, units: &BTreeMap<String, usize>) -> BTreeMap<(String, String), PathBuf> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        let Some(own) = module_path(src, &f) else {
            continue;
        };
        let from = unit_of(&own, units);
        let text = std::fs::read_to_string(&f).unwrap();
        for p in uses(&text, &own) {
            let to = unit_of(&p, units);
            if to != from && in_crate(src, &p) {
                out.entry((from.clone(), to)).or_insert_with(|| f.clone());
            }
        }
    }
    out
}

#[test]
fn no_unit_uses_a_higher_layer_and_no_two_units_use_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(root.join("docs/design.md")).unwrap();
    let layer = layers(&design);
    assert!(
        layer.len() > 10,
        "the layer table in docs/design.md: {layer:?}"
    );
    let src = root.join("src");
    let arrows = arrows(&src, &layer);
    let known: BTreeSet<(String, String)> = KNOWN
        .iter()
        .map(|(a, b, _)| (a.to_string(), b.to_string()))
        .collect();
    let mut wrong = Vec::new();
    let mut seen = BTreeSet::new();
    for ((from, to), file) in &arrows {
        seen.extend([from.clone(), to.clone()]);
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
    let unplaced: Vec<_> = seen.iter().filter(|m| !layer.contains_key(*m)).collect();
    assert!(
        unplaced.is_empty(),
        "units the layer table in docs/design.md does not place: {unplaced:?}"
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

/// What a pure file must not name: the clock, files, sockets, processes,
/// threads, the async runtime and the clients of the runtime and the API.
const IO: &[&str] = &[
    "std::fs",
    "std::net",
    "std::process",
    "std::thread",
    "std::os::",
    "SystemTime::now",
    "Instant::now",
    "tokio::",
    "nix::",
    "libc::",
    "tonic::",
    "hyper::",
    "containerd_client::",
    "k8s_openapi::",
    "crate::clock",
    "crate::cgroup::fs",
    "crate::cgroup::kill",
];

#[test]
fn the_pure_units_name_no_io() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(root.join("docs/design.md")).unwrap();
    let units = layers(&design);
    let pure: BTreeSet<String> = table_rows(&design)
        .into_iter()
        .filter(|(name, _)| matches!(name.as_str(), "state" | "pure decisions"))
        .flat_map(|(_, units)| units)
        .collect();
    assert!(pure.contains("model"), "the pure rows: {pure:?}");
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for f in files {
        let Some(own) = module_path(&src, &f) else {
            continue;
        };
        if !pure.contains(&unit_of(&own, &units)) || own.last().is_some_and(|l| l == "tests") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let code = code_of(text.split("mod tests {").next().unwrap_or_default());
        for io in IO.iter().filter(|io| code.contains(**io)) {
            wrong.push(format!("{} names {io}", f.display()));
        }
    }
    assert!(
        wrong.is_empty(),
        "pure units with I/O:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn uses_expands_groups_and_resolves_super_but_skips_comments() {
    let text = "use crate::model::Pod;\nuse crate::{policy, signals::{table::Signal, node}};\n// crate::kube\nlet x = criguard::cri::x();\nuse super::seams::X;\nuse super::super::lock;\ncrate::clock::now_ms();\nmod tests {\n    use super::*;\n}";
    let own: Vec<String> = ["eviction", "rank", "order"].map(String::from).into();
    let got: BTreeSet<String> = uses(text, &own).iter().map(|p| p.join("::")).collect();
    let want = [
        "model::Pod",
        "policy",
        "signals::table::Signal",
        "signals::node",
        "cri::x",
        "eviction::rank::seams::X",
        "eviction::lock",
        "clock::now_ms",
    ];
    assert_eq!(got, want.iter().map(|s| s.to_string()).collect());
    let units = BTreeMap::from([
        ("eviction".to_owned(), 6),
        ("eviction::rank::order".to_owned(), 3),
    ]);
    assert_eq!(unit_of(&own, &units), "eviction::rank::order");
    assert_eq!(unit_of(&own[..2], &units), "eviction");
}

/// The file of module `module` that a path names: `x` of `super::x` (from
/// a file directly in the module) or of `crate::module::x`, when `x` is a
/// file (`x.rs`) or a folder (`x/`) of the module.
fn file_uses(text: &str, module: &str, direct: bool) -> BTreeSet<String> {
    let own = format!("crate::{module}::");
    let first = |paths: Vec<Vec<String>>| -> Vec<String> {
        paths
            .into_iter()
            .filter_map(|p| p.into_iter().next())
            .collect()
    };
    let mut out: BTreeSet<String> = first(paths_after(&code_of(text), &own))
        .into_iter()
        .collect();
    // `use super::*` and `super::x` in an inline test module name the file
    // itself, not a sibling: only the code before one counts for `super::`.
    if direct {
        let before_tests = text.split("mod tests {").next().unwrap_or_default();
        out.extend(first(paths_after(&code_of(before_tests), "super::")));
    }
    out
}

/// Every arrow between two files of one module (`module/file`), the
/// module's root (`mod.rs`, or `module.rs` beside its folder) left out.
fn file_arrows(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    for f in files {
        let Ok(rel) = f.strip_prefix(src) else {
            continue;
        };
        let parts: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
        if parts.len() < 2 || parts[0] == "layers.rs" {
            continue;
        }
        let module = parts[0];
        let file = parts[1].trim_end_matches(".rs");
        if file == "mod" {
            continue;
        }
        // `module/file.rs` and `module/file/mod.rs` sit directly in the module.
        let direct = parts.len() == 2 || (parts.len() == 3 && parts[2] == "mod.rs");
        let text = std::fs::read_to_string(&f).unwrap();
        let named = file_uses(&text, module, direct);
        let dir = src.join(module);
        for to in named {
            let exists = dir.join(format!("{to}.rs")).exists() || dir.join(&to).is_dir();
            if to != file && to != "mod" && exists {
                out.entry(format!("{module}/{file}"))
                    .or_default()
                    .insert(format!("{module}/{to}"));
            }
        }
    }
    out
}

/// The groups of files that reach each other (strongly connected, more
/// than one file), each sorted.
fn circles(arrows: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<Vec<String>> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for m in arrows.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    todo.push(m.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        arrows.keys().map(|k| (k, reach(k))).collect();
    let mut out = BTreeSet::new();
    for (a, from_a) in &reached {
        let group: Vec<String> = from_a
            .iter()
            .filter(|b| *b == *a || reached.get(b).is_some_and(|r| r.contains(*a)))
            .cloned()
            .chain(std::iter::once((*a).clone()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if group.len() > 1 {
            out.insert(group);
        }
    }
    out
}

#[test]
fn no_two_files_of_a_module_use_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let arrows = file_arrows(&src);
    assert!(
        arrows.contains_key("cri/held"),
        "the file arrows are read: {arrows:?}"
    );
    let found = circles(&arrows);
    let known: BTreeSet<Vec<String>> = KNOWN_FILE_CIRCLES
        .iter()
        .map(|(files, _)| files.iter().map(|f| f.to_string()).collect())
        .collect();
    let stale: Vec<_> = known.difference(&found).collect();
    assert!(
        stale.is_empty(),
        "no longer in the tree, take them off KNOWN_FILE_CIRCLES: {stale:?}"
    );
    let new: Vec<_> = found.difference(&known).collect();
    assert!(new.is_empty(), "files of one module in a circle: {new:?}");
}

#[test]
fn file_uses_finds_siblings_but_not_the_test_module() {
    let text = "use super::{conn::Io, frame};\nuse crate::cri::held::X;\nuse crate::kube::Y;\nmod tests {\n    use super::out;\n}";
    let got: Vec<_> = file_uses(text, "cri", true).into_iter().collect();
    assert_eq!(got, ["conn", "frame", "held"]);
    let arrows = BTreeMap::from([
        ("m/a".to_owned(), BTreeSet::from(["m/b".to_owned()])),
        ("m/b".to_owned(), BTreeSet::from(["m/c".to_owned()])),
        ("m/c".to_owned(), BTreeSet::from(["m/a".to_owned()])),
        ("m/d".to_owned(), BTreeSet::from(["m/a".to_owned()])),
    ]);
    let got: Vec<_> = circles(&arrows).into_iter().collect();
    assert_eq!(got, [vec!["m/a", "m/b", "m/c"]]);
}
