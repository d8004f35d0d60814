//! The layering rule, enforced: inside every crate, the top-level modules import each other
//! along a DAG (data flows one way), and state-service/README.md's module map is that DAG. A module is a
//! top-level `src/NAME.rs` and everything under `src/NAME/`; an edge `a -> b` is any
//! `crate::b` path in `a`'s code (comments and strings aside). A cycle fails the test with
//! the modules on it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const CRATES: [&str; 9] = ["core", "kv", "score", "filter", "state-service", "sim", "tokenize", "bench", "tests"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source with comments, string literals and char literals blanked out.
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let (mut out, mut i) = (String::with_capacity(text.len()), 0);
    while i < c.len() {
        match (at(i), at(i + 1)) {
            ('/', '/') => {
                while i < c.len() && at(i) != '\n' {
                    i += 1;
                }
            }
            ('/', '*') => {
                i += 2;
                while i < c.len() && !(at(i) == '*' && at(i + 1) == '/') {
                    i += 1;
                }
                i += 2;
            }
            ('"', _) => {
                i += 1;
                while i < c.len() && at(i) != '"' {
                    i += if at(i) == '\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            // A char literal ('x', '\n', '"'); a lifetime ('a) has no closing quote there.
            ('\'', '\\') => i += c.iter().skip(i + 2).position(|&ch| ch == '\'').map_or(1, |p| p + 3),
            ('\'', _) if at(i + 2) == '\'' => i += 3,
            (ch, _) => {
                out.push(ch);
                i += 1;
            }
        }
    }
    out
}

/// Names used as `crate::NAME` or inside `use crate::{NAME, NAME::...}`.
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let body = &group[..group.find(';').unwrap_or(group.len())];
            // Top-level items of the group: after `{` or a `,` at depth 0.
            let mut depth = 0;
            let mut start = true;
            for (j, c) in body.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        refs.insert(ident(&body[j..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            refs.insert(ident(rest));
        }
    }
    refs
}

/// Top-level module -> the top-level modules it refers to.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in fs::read_dir(src).expect("src dir").flatten() {
        let path = entry.path();
        let name = path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        if name == "lib" || name == "main" {
            continue;
        }
        let files = modules.entry(name).or_default();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(name, files)| {
            let refs = files
                .iter()
                .flat_map(|f| crate_refs(&code_only(&fs::read_to_string(f).expect("readable source"))))
                .filter(|r| r != name && names.contains(r))
                .collect();
            (name.clone(), refs)
        })
        .collect()
}

/// A cycle, as the modules on it, if there is one.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(n: &str, g: &BTreeMap<String, BTreeSet<String>>, done: &mut BTreeSet<String>, path: &mut Vec<String>) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            return Some(path[i..].to_vec());
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, done, path) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys().find_map(|n| visit(n, g, &mut done, &mut Vec::new()))
}

#[test]
fn top_level_modules_of_every_crate_form_a_dag() {
    let mut cycles = Vec::new();
    for krate in CRATES {
        let g = graph(&repo().join(krate).join("src"));
        assert!(!g.is_empty(), "{krate}: no modules found");
        if let Some(cycle) = find_cycle(&g) {
            cycles.push(format!("{krate}: {}", cycle.join(" -> ")));
        }
    }
    assert!(cycles.is_empty(), "import cycles between top-level modules:\n{}", cycles.join("\n"));
}

/// The module names of the first table under `## Module map` in `readme`, in row order.
fn module_map(readme: &str) -> Vec<String> {
    let section = readme.split("## Module map").nth(1).unwrap_or_default();
    let section = section.split("\n## ").next().unwrap_or_default();
    section
        .lines()
        .skip_while(|l| !l.starts_with("| module"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.split('|').nth(1))
        .map(|cell| cell.trim().trim_matches('`').to_string())
        .collect()
}

/// What is wrong with a module map against the code's graph: a module missing from it, one
/// listed that does not exist or twice, and a row importing a row below it.
fn map_errors(rows: &[String], g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut errors = Vec::new();
    let listed: BTreeSet<&String> = rows.iter().collect();
    if listed.len() != rows.len() {
        errors.push("a module is listed twice".to_string());
    }
    errors.extend(g.keys().filter(|m| !listed.contains(m)).map(|m| format!("`{m}` is not in the map")));
    errors.extend(rows.iter().filter(|m| !g.contains_key(*m)).map(|m| format!("`{m}` is in the map but not in the code")));
    for (i, m) in rows.iter().enumerate() {
        for imported in g.get(m).into_iter().flatten() {
            if rows[..i].iter().all(|above| above != imported) {
                errors.push(format!("`{m}` imports `{imported}`, which is not above it"));
            }
        }
    }
    errors
}

#[test]
fn the_state_service_module_map_is_the_code() {
    let readme = fs::read_to_string(repo().join("state-service/README.md")).expect("state-service/README.md");
    let rows = module_map(&readme);
    assert!(!rows.is_empty(), "no module map table in state-service/README.md");
    let errors = map_errors(&rows, &graph(&repo().join("state-service/src")));
    assert!(errors.is_empty(), "state-service/README.md's module map is out of date:\n{}", errors.join("\n"));
}

#[test]
fn the_map_checker_sees_missing_extra_and_upward_rows() {
    let g: BTreeMap<String, BTreeSet<String>> =
        [("a", vec![]), ("b", vec!["a"]), ("c", vec!["b"])].into_iter().map(|(k, v)| (k.into(), v.into_iter().map(String::from).collect())).collect();
    let rows = |r: &[&str]| r.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(map_errors(&rows(&["a", "b", "c"]), &g).is_empty());
    assert_eq!(map_errors(&rows(&["b", "a", "c"]), &g), ["`b` imports `a`, which is not above it"]);
    assert_eq!(map_errors(&rows(&["a", "b"]), &g), ["`c` is not in the map"]);
    assert_eq!(map_errors(&rows(&["a", "b", "c", "d"]), &g), ["`d` is in the map but not in the code"]);
    let readme = "x\n## Module map\n\ntext\n\n| module | what |\n|---|---|\n| `a` | A |\n| `b` | B |\n\nmore\n## Next\n| `z` | |";
    assert_eq!(module_map(readme), ["a", "b"]);
}

#[test]
fn the_checker_sees_cycles_and_grouped_imports() {
    let code = code_only("use crate::{a::X, b::{Y, Z}};\n// crate::c\nlet s = \"crate::d\"; let q = '\"'; crate::e::f(); /* crate::g */ fn x<'a>() {}");
    assert_eq!(crate_refs(&code), ["a", "b", "e"].map(String::from).into_iter().collect());
    let g: BTreeMap<String, BTreeSet<String>> =
        [("a", vec!["b"]), ("b", vec!["c"]), ("c", vec!["a"]), ("d", vec![])].into_iter().map(|(k, v)| (k.into(), v.into_iter().map(String::from).collect())).collect();
    assert_eq!(find_cycle(&g), Some(vec!["a".to_string(), "b".to_string(), "c".to_string()]));
    let dag: BTreeMap<String, BTreeSet<String>> = [("a", vec!["b"]), ("b", vec![])].into_iter().map(|(k, v)| (k.into(), v.into_iter().map(String::from).collect())).collect();
    assert_eq!(find_cycle(&dag), None);
}
