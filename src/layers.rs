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

/// The top-level module a file under `src/` belongs to (`a/b.rs` and
/// `a.rs` under `src/` are `a`); `None` for the crate roots.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.trim_end_matches(".rs");
    (!matches!(name, "lib" | "main")).then(|| name.to_owned())
}

/// The top-level modules `text` names through `crate::` or `criguard::`,
/// comments left out.
fn uses(text: &str) -> BTreeSet<String> {
    let code = code_of(text);
    ["crate::", "criguard::"]
        .iter()
        .flat_map(|prefix| names_after(&code, prefix, false))
        .collect()
}

/// `text` without its `//` comments, its lines joined: a `use` group may
/// span lines.
fn code_of(text: &str) -> String {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first names of the paths after each `prefix` in `code` (`a` of
/// `prefix a::b`, and `a`, `b` of `prefix {a::x, b}`), a prefix inside a
/// longer path left out (after a `:` too when `colon` is set).
fn names_after(code: &str, prefix: &str, colon: bool) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        let before = code[..i].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || (colon && c == ':')) {
            continue;
        }
        let rest = &code[i + prefix.len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.push(ident(rest));
            continue;
        };
        // The group's top-level entries, up to its closing brace.
        let (mut depth, mut start) = (0usize, 0);
        for (j, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    out.push(ident(&group[start..j]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(ident(&group[start..j]));
                    start = j + 1;
                }
                _ => {}
            }
        }
    }
    out.retain(|n| !n.is_empty());
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
        for to in uses(&text) {
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
    let text = "use crate::model::Pod;\nuse crate::{policy, signals::memory};\n// crate::kube\nlet x = criguard::cri::x();\nuse crate::{\n    cgroup::{fs, path},\n    // crate::metrics\n    lock,\n};\ncrate::clock::now_ms();";
    let got: Vec<_> = uses(text).into_iter().collect();
    assert_eq!(
        got,
        [
            "cgroup", "clock", "cri", "lock", "model", "policy", "signals"
        ]
    );
}

/// The file of module `module` that a path names: `x` of `super::x` (from
/// a file directly in the module) or of `crate::module::x`, when `x` is a
/// file (`x.rs`) or a folder (`x/`) of the module.
fn file_uses(text: &str, module: &str, direct: bool) -> BTreeSet<String> {
    let own = format!("crate::{module}::");
    let mut out: BTreeSet<String> = names_after(&code_of(text), &own, true)
        .into_iter()
        .collect();
    // `use super::*` and `super::x` in an inline test module name the file
    // itself, not a sibling: only the code before one counts for `super::`.
    if direct {
        let before_tests = text.split("mod tests {").next().unwrap_or_default();
        out.extend(names_after(&code_of(before_tests), "super::", true));
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
