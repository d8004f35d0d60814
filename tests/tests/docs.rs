//! Every reference in the project's Markdown resolves: a link to a file that exists (and, for
//! a `#fragment` into Markdown, a heading that has that anchor), and every repo path written
//! in backticks (`state-service/src/pick.rs`) names a file or folder that exists.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("repo root")
}

/// Folders that hold no documentation of ours (build output, downloads, fuzzing state).
const SKIP: [&str; 5] = ["target", ".cache", ".git", "node_modules", "corpus"];

fn markdown(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if path.is_dir() {
            if !SKIP.contains(&name.as_str()) && !name.starts_with('.') {
                markdown(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// GitHub's anchor for a heading: lowercase, spaces to `-`, punctuation other than `-` and
/// `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of inline links `[text](target)` outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            let before_backticks = rest[..i].matches('`').count();
            if before_backticks % 2 == 0 {
                out.push(after[..end].to_string());
            }
            rest = &after[end..];
        }
    }
    out
}

/// Repo paths in backticks: a first component that is one of the repo's top-level folders.
fn code_paths(text: &str, top: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for (i, span) in text.split('`').enumerate() {
        if i % 2 == 0 || span.contains(' ') || !span.contains('/') {
            continue;
        }
        let path = span.trim_end_matches([':', ',', '.']).split(['#', ':']).next().unwrap_or_default();
        let first = path.split('/').next().unwrap_or_default();
        let plain = path.chars().all(|c| c.is_alphanumeric() || "-_./".contains(c));
        if plain && top.contains(first) && !path.contains("..") {
            out.push(path.to_string());
        }
    }
    out
}

/// A folder's own subfolders (a crate's `tests/`, `src/`), for paths written relative to it.
fn subfolders(dir: &Path) -> Vec<String> {
    fs::read_dir(dir).into_iter().flatten().flatten().filter(|e| e.path().is_dir()).map(|e| e.file_name().to_string_lossy().to_string()).collect()
}

/// Whether `path` is where a run writes its output (a plain entry of the root `.gitignore`).
fn generated(root: &Path, path: &str) -> bool {
    let ignore = fs::read_to_string(root.join(".gitignore")).unwrap_or_default();
    let path = path.trim_end_matches('/');
    ignore.lines().map(|l| l.trim().trim_start_matches('/').trim_end_matches('/')).any(|l| {
        !l.is_empty() && !l.contains('*') && (path == l || path.starts_with(&format!("{l}/")))
    })
}

fn problems(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    markdown(root, &mut files);
    let top: BTreeSet<String> = fs::read_dir(root)
        .expect("repo root")
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| !n.starts_with('.') && !SKIP.contains(&n.as_str()))
        .collect();
    let mut problems = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("readable markdown");
        let shown = file.strip_prefix(root).unwrap_or(file).display().to_string();
        let dir = file.parent().unwrap_or(root);
        for link in links(&text) {
            let link = link.split_whitespace().next().unwrap_or_default();
            if link.is_empty() || link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = link.split_once('#').map_or((link, None), |(p, f)| (p, Some(f)));
            let target = if path.is_empty() { file.clone() } else { dir.join(path) };
            if !target.exists() {
                problems.push(format!("{shown}: link to {link}: no such file"));
                continue;
            }
            if let (Some(fragment), true) = (fragment, target.extension().is_some_and(|e| e == "md")) {
                let text = fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&text).contains(fragment) {
                    problems.push(format!("{shown}: link to {link}: no heading with that anchor"));
                }
            }
        }
        let local_top: BTreeSet<String> = top.iter().cloned().chain(subfolders(dir)).collect();
        for path in code_paths(&text, &local_top) {
            if !root.join(&path).exists() && !dir.join(&path).exists() && !generated(root, &path) {
                problems.push(format!("{shown}: `{path}`: no such file or folder"));
            }
        }
    }
    problems
}

#[test]
fn every_doc_reference_resolves() {
    let problems = problems(&repo());
    assert!(problems.is_empty(), "dead references in the docs:\n{}", problems.join("\n"));
}

#[test]
fn the_checker_sees_dead_links_anchors_and_paths() {
    let dir = std::env::temp_dir().join(format!("kvroute-docs-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("sub")).unwrap();
    fs::write(dir.join("sub/real.rs"), "").unwrap();
    fs::write(dir.join("sub/README.md"), "# Sub\n## Module map: the rows\n").unwrap();
    let readme = "see [ok](sub/README.md#module-map-the-rows), [bad anchor](sub/README.md#nope), \
        [gone](sub/gone.md), [web](https://x.y/z), `sub/real.rs`, `sub/missing.rs`, `other/x.rs`\n\
        ```\n[in code](nowhere.md)\n```\n";
    fs::write(dir.join("README.md"), readme).unwrap();
    let found = problems(&dir);
    let _ = fs::remove_dir_all(&dir);
    assert_eq!(
        found,
        [
            "README.md: link to sub/README.md#nope: no heading with that anchor",
            "README.md: link to sub/gone.md: no such file",
            "README.md: `sub/missing.rs`: no such file or folder",
        ]
    );
}
