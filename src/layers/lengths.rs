//! Function lengths, checked against a limit.
//!
//! This test reads every `.rs` file under `src/` and fails on a function
//! longer than [`LIMIT`] lines: the non-blank lines from the line of its
//! `fn` to the line of its closing brace, comments inside included (doc
//! comments and attributes above it are not). Test code is left out: files
//! named `tests.rs`, and everything from a `#[cfg(test)]` followed by an
//! inline `mod tests {` (of any visibility) to the end of a file. Braces are matched over the code
//! with comments, strings and character literals blanked out.
//!
//! Known long functions are listed in [`KNOWN`] with their reason; one that
//! is no longer too long must be taken off the list, so the list only
//! shrinks.

use std::collections::BTreeSet;
use std::path::Path;

/// The most lines a function may have.
const LIMIT: usize = 80;

/// Functions the tree still has over [`LIMIT`]: (function, file under
/// `src/`, why).
const KNOWN: &[(&str, &str, &str)] = &[];

/// `text` with comments, string and character literals blanked out (each
/// character replaced by as many spaces as its UTF-8 bytes, newlines
/// kept), so braces and `fn` in them do not count, and byte offsets and
/// line numbers stay those of `text`.
fn blank(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        match hidden_end(&c, i) {
            Some(end) => {
                for &ch in &c[i..end.min(c.len())] {
                    match ch {
                        '\n' => out.push('\n'),
                        _ => out.extend(std::iter::repeat_n(' ', ch.len_utf8())),
                    }
                }
                i = end;
            }
            None => {
                out.push(c[i]);
                i += 1;
            }
        }
    }
    out
}

/// Where the comment or literal starting at `c[i]` ends (one past it);
/// `None` when none starts there.
fn hidden_end(c: &[char], i: usize) -> Option<usize> {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let prev_ident = i > 0 && ident(c[i - 1]);
    // `b'x'` is a literal too.
    let byte_prefix = i > 0 && c[i - 1] == 'b' && (i < 2 || !ident(c[i - 2]));
    match (at(i), at(i + 1)) {
        ('/', '/') => Some((i..c.len()).find(|&k| c[k] == '\n').unwrap_or(c.len())),
        ('/', '*') => Some(block_comment_end(c, i)),
        ('r', _) | ('b', 'r') if !prev_ident => raw_string_end(c, i),
        ('"', _) => {
            let mut k = i + 1;
            while k < c.len() && c[k] != '"' {
                k += if c[k] == '\\' { 2 } else { 1 };
            }
            Some(k + 1)
        }
        // A character literal ('x', '\n', '\''), else a lifetime.
        ('\'', '\\') if !prev_ident || byte_prefix => {
            (i + 3..c.len()).find(|&k| c[k] == '\'').map(|k| k + 1)
        }
        ('\'', _) if (!prev_ident || byte_prefix) && at(i + 2) == '\'' => Some(i + 3),
        _ => None,
    }
}

/// The end of the block comment at `c[i]` (they nest).
fn block_comment_end(c: &[char], i: usize) -> usize {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let (mut depth, mut k) = (0usize, i);
    while k < c.len() {
        if at(k) == '/' && at(k + 1) == '*' {
            depth += 1;
            k += 2;
        } else if at(k) == '*' && at(k + 1) == '/' {
            depth -= 1;
            k += 2;
            if depth == 0 {
                break;
            }
        } else {
            k += 1;
        }
    }
    k
}

/// The end of the raw string (`r".."`, `r#".."#`, `br".."`) at `c[i]`, if
/// one starts there.
fn raw_string_end(c: &[char], i: usize) -> Option<usize> {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let start = if at(i) == 'b' { i + 2 } else { i + 1 };
    let hashes = (start..c.len()).take_while(|&k| c[k] == '#').count();
    if at(start + hashes) != '"' {
        return None;
    }
    let mut k = start + hashes + 1;
    while k < c.len() && !(c[k] == '"' && (1..=hashes).all(|h| at(k + h) == '#')) {
        k += 1;
    }
    Some(k + 1 + hashes)
}

/// The functions of `text` longer than `limit` lines: (name, lines).
fn long_functions(text: &str, limit: usize) -> Vec<(String, usize)> {
    let code = blank(text);
    let code: Vec<char> = code.chars().collect();
    let raw_lines: Vec<&str> = text.lines().collect();
    let line_of = |pos: usize| code[..pos].iter().filter(|&&ch| ch == '\n').count();
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut out = Vec::new();
    for i in 0..code.len().saturating_sub(2) {
        let word_start = i == 0 || !ident(code[i - 1]);
        if !(word_start && code[i] == 'f' && code[i + 1] == 'n' && code[i + 2].is_whitespace()) {
            continue;
        }
        let mut k = i + 2;
        while k < code.len() && code[k].is_whitespace() {
            k += 1;
        }
        let name: String = code[k..].iter().take_while(|&&ch| ident(ch)).collect();
        if name.is_empty() {
            continue;
        }
        // The body's opening brace, or `;` for a function without one.
        let mut depth = 0i32;
        let mut open = None;
        for (j, &ch) in code.iter().enumerate().skip(k) {
            match ch {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                ';' if depth == 0 => break,
                '{' if depth == 0 => {
                    open = Some(j);
                    break;
                }
                _ => {}
            }
        }
        let Some(open) = open else {
            continue;
        };
        let mut braces = 0usize;
        let mut close = None;
        for (j, &ch) in code.iter().enumerate().skip(open) {
            match ch {
                '{' => braces += 1,
                '}' => {
                    braces -= 1;
                    if braces == 0 {
                        close = Some(j);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(close) = close else {
            continue;
        };
        let (first, last) = (line_of(i), line_of(close));
        let lines = raw_lines[first..=last.min(raw_lines.len() - 1)]
            .iter()
            .filter(|l| !l.trim().is_empty())
            .count();
        if lines > limit {
            out.push((name, lines));
        }
    }
    out
}

/// The code of a file that counts: up to its inline test module.
fn non_test(text: &str) -> &str {
    // `blank` keeps byte offsets: a match in its code is one in `text`.
    let code = blank(text);
    let mut from = 0;
    while let Some(at) = code[from..].find("#[cfg(test)]") {
        let at = from + at;
        // `mod tests {`, `pub(super) mod tests {`, …
        let rest = &code[at + "#[cfg(test)]".len()..];
        let item: Vec<&str> = rest
            .split('{')
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        if item.len() <= 3 && item.ends_with(&["mod", "tests"]) {
            return &text[..at];
        }
        from = at + 1;
    }
    text
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    super::rust_files(&src, &mut files);
    let known: BTreeSet<(String, String)> = KNOWN
        .iter()
        .map(|(f, file, _)| (f.to_string(), file.to_string()))
        .collect();
    let mut found = BTreeSet::new();
    let mut new = Vec::new();
    for f in files {
        if f.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&f).unwrap();
        for (name, n) in long_functions(non_test(&text), LIMIT) {
            let key = (name, rel.clone());
            if !known.contains(&key) {
                new.push(format!("{rel}: {} ({n} lines)", key.0));
            }
            found.insert(key);
        }
    }
    let stale: Vec<_> = known.difference(&found).collect();
    assert!(
        stale.is_empty(),
        "no longer over {LIMIT} lines, take them off KNOWN: {stale:?}"
    );
    assert!(
        new.is_empty(),
        "functions over {LIMIT} lines (split them into named steps):\n{}",
        new.join("\n")
    );
}

#[test]
fn lengths_skip_comments_strings_and_test_modules() {
    let body = |n: usize| "    let x = 1;\n\n".repeat(n);
    let text = format!(
        "/// fn doc() {{\nfn short() {{\n{}}}\n\nfn long<'a>(a: [u8; 4], s: &'a str) -> char {{\n    let b = \"}} fn x() {{\";\n    let r = r#\"}}\"#; // }}\n    /* {{ */\n    let c = '}}';\n{}    '{{'\n}}\n\n#[cfg(test)]\npub(super) mod tests {{\n    fn in_tests() {{\n{}    }}\n}}\n",
        body(3),
        body(5),
        body(9)
    );
    let code = non_test(&text);
    assert!(!code.contains("in_tests"));
    // `long`: its fn line, 4 lines of tricky literals and comments, 5 of
    // body, the char and the closing brace; `short` has 5.
    assert_eq!(
        long_functions(code, 4),
        [("short".to_owned(), 5), ("long".to_owned(), 12)]
    );
    assert_eq!(long_functions(code, 5), [("long".to_owned(), 12)]);
    assert_eq!(long_functions(code, 12), []);
    // With the test module: `in_tests` has 11.
    assert_eq!(
        long_functions(&text, 10),
        [("long".to_owned(), 12), ("in_tests".to_owned(), 11)]
    );
    assert_eq!(
        blank("let s = \"→{\"; // é}\nb'{'").len(),
        "let s = \"→{\"; // é}\nb'{'".len()
    );
    assert!(!blank("b'{' \"}\" '\\'' 'x'").contains(['{', '}', 'x']));
}
