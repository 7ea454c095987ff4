//! Repository paths named in prose and code, checked to exist.
//!
//! This test reads `README.md`, `Cargo.toml` and every text file under
//! `docs/`, `src/`, `tests/`, `hack/`, `benches/`, `examples/`, `fuzz/`,
//! `packaging/`, `systemd/`, `deploy/` and `.ci/`, and fails on a path that
//! starts with one of the tree's top-level folders (not `etc/`, which names
//! installed files as often as the repository's) and names nothing in the
//! tree (relative to the root or to the file's own folder). Globs,
//! placeholders (`DIR`, `NAME`, `<x>`, `…`, `{}`, `$VAR`) and paths built
//! at run time (a fragment followed by `{`) are skipped.

use std::path::{Path, PathBuf};

/// The top-level folders a named path may start with.
const TOPS: &[&str] = &[
    "src/",
    "tests/",
    "hack/",
    "docs/",
    "deploy/",
    "systemd/",
    "proto/",
    "examples/",
    "benches/",
    "fuzz/",
    "packaging/",
    ".ci/",
];

/// The folders whose files are read.
const READ: &[&str] = &[
    "docs",
    "src",
    "tests",
    "hack",
    "benches",
    "examples",
    "fuzz",
    "packaging",
    "systemd",
    "deploy",
    ".ci",
];

/// Whether `c` may be part of a path.
fn path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-')
}

/// The repository paths `text` names: each starts with one of [`TOPS`] at
/// the start of a word (not after a path character or `~`, `$`, `}`), and
/// runs while [`path_char`]; trailing dots and slashes are dropped.
/// Placeholders and paths continued by a format argument are skipped.
fn named_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.char_indices() {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|b| path_char(b) || matches!(b, '~' | '$' | '}' | '{' | '*' | ':')) {
            continue;
        }
        let rest = &text[i..];
        if !TOPS.iter().any(|t| rest.starts_with(t)) {
            continue;
        }
        let end = rest.find(|c: char| !path_char(c)).unwrap_or(rest.len());
        let after = rest[end..].chars().next();
        if matches!(after, Some('{' | '*' | '$' | '<' | '…' | '[')) {
            continue;
        }
        let p = rest[..end].trim_end_matches(['.', '/']);
        let placeholder = p.split(['/', '.', '-', '_']).any(|w| {
            w.len() >= 3
                && w.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        });
        if !placeholder && p.contains('/') {
            out.push(p.to_owned());
        }
    }
    out
}

/// Every file under `dir` (recursively), but `target/` and hidden entries
/// other than `.ci`.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "target" || (name.starts_with('.') && name != ".ci") {
            continue;
        }
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

#[test]
fn every_repository_path_named_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut read = vec![root.join("README.md"), root.join("Cargo.toml")];
    for dir in READ {
        files(&root.join(dir), &mut read);
    }
    let mut missing = Vec::new();
    for file in &read {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue; // not text
        };
        let here = file.parent().unwrap_or(root);
        for p in named_paths(&text) {
            let exists = [root.join(&p), here.join(&p), root.join(format!("{p}.rs"))]
                .iter()
                .any(|c| c.exists());
            if !exists {
                let shown = file
                    .strip_prefix(root)
                    .unwrap_or(file)
                    .display()
                    .to_string();
                missing.push(format!("{shown} names {p}"));
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "paths named that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn named_paths_skip_placeholders_globs_and_built_paths() {
    let text = "see `src/layers.rs`, hack/vm/NAME.sh, docs/*.md, tests/it/{name}.rs, \
                /usr/src/linux, $DIR/hack/x.sh, (tests/it/main.rs). and src/kube/";
    assert_eq!(
        named_paths(text),
        ["src/layers.rs", "tests/it/main.rs", "src/kube"]
    );
}
