//! The shape of the code, checked: ARCHITECTURE.md's code map is true to the code (every crate has
//! a section, every module it names exists, and every module that exists is named, by its file or
//! by a folder it is in), and no two files of a crate import each other in a circle (through a
//! `use` tree or a path in code alike). The Python client and the dashboard's scripts have the
//! same check: `clients/python/tests/test_imports.py`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The workspace's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// For each `### \`crates/<name>\`` section, the crate and the paths its list items name before
/// their dash: `- \`a.rs\`, \`b/\` — what they hold`.
fn code_map(text: &str) -> Vec<(String, Vec<String>)> {
    let mut map: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("### `crates/").and_then(|rest| rest.strip_suffix('`')) {
            map.push((name.to_owned(), Vec::new()));
            continue;
        }
        // Any other heading (a section, or a part that is not a crate) ends the crate's list.
        if line.starts_with("## ") || line.starts_with("### ") {
            map.push((String::new(), Vec::new()));
            continue;
        }
        let (Some((_, paths)), Some(item)) = (map.last_mut(), line.strip_prefix("- ")) else { continue };
        let named = item.split(" — ").next().unwrap_or_default();
        paths.extend(
            named
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|path| path.ends_with(".rs") || path.ends_with('/'))
                .map(str::to_owned),
        );
    }
    map.retain(|(name, _)| !name.is_empty());
    map
}

/// Every `.rs` file under `dir`, relative to it.
fn sources(dir: &Path, under: &Path, found: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, under, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.insert(path.strip_prefix(under).unwrap().to_string_lossy().replace('\\', "/"));
        }
    }
}

#[test]
fn the_code_map_names_every_module_and_only_modules_that_exist() {
    let root = root();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let map = code_map(&text);
    let mapped: BTreeSet<&str> = map.iter().map(|(name, _)| name.as_str()).collect();
    let crates: BTreeSet<String> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(mapped, crates.iter().map(String::as_str).collect(), "one section per crate");

    let mut problems = Vec::new();
    for (name, paths) in &map {
        let src = root.join("crates").join(name).join("src");
        for path in paths {
            if !src.join(path).exists() {
                problems.push(format!("crates/{name}/src/{path} is named but does not exist"));
            }
        }
        let mut files = BTreeSet::new();
        sources(&src, &src, &mut files);
        for file in files.iter().filter(|f| !matches!(f.as_str(), "lib.rs" | "main.rs")) {
            let covered = paths.iter().any(|path| path == file || (path.ends_with('/') && file.starts_with(path)));
            if !covered {
                problems.push(format!("crates/{name}/src/{file} exists but ARCHITECTURE.md does not name it"));
            }
        }
    }
    assert!(problems.is_empty(), "ARCHITECTURE.md's code map is out of date:\n{}", problems.join("\n"));
}

#[test]
fn the_map_reader_sees_names_before_the_dash_only() {
    let text = "### `crates/x`\n\n- `a.rs`, `b/` — holds `c.rs`\n\n## Next\n\n- `d.rs` — not a crate's\n";
    assert_eq!(code_map(text), vec![("x".to_owned(), vec!["a.rs".to_owned(), "b/".to_owned()])]);
}

/// A module's path in its crate, from its file: `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`.
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file.trim_end_matches(".rs").split('/').map(str::to_owned).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// The modules of `modules` that `text` (the code of `module`, its unit tests left out) names
/// through `crate::` or `super::` paths, in `use` trees (`crate::{a, b::{c, self}}`) as in
/// expressions (`crate::a::f()`), other than its own ancestors and descendants: a child module
/// always sees its parent.
fn imports(module: &[String], text: &str, modules: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    let start = regex::Regex::new(r"\b(crate|(?:super\s*::\s*)*super)\s*::").unwrap();
    let mut found = BTreeSet::new();
    for caps in start.captures_iter(code) {
        let mut base: Vec<String> = module.to_vec();
        if &caps[1] == "crate" {
            base.clear();
        } else {
            // `super` is the parent; each further `super` one more step up.
            for _ in 0..caps[1].matches("super").count() {
                base.pop();
            }
        }
        let mut reader = UseTree { text: &code[caps.get(0).unwrap().end()..] };
        for tail in reader.tree() {
            let mut parts = base.clone();
            parts.extend(tail);
            let Some(target) = (0..=parts.len()).rev().map(|k| parts[..k].to_vec()).find(|t| modules.contains(t))
            else {
                continue;
            };
            let related = target.starts_with(module) || module.starts_with(&target);
            if !related {
                found.insert(target);
            }
        }
    }
    found
}

/// Reads the paths of a use tree (or of a path in an expression) from its start: `a::{b, c::*}`
/// names `a::b` and `a::c`; `self` in braces names the path before them.
struct UseTree<'a> {
    text: &'a str,
}

impl UseTree<'_> {
    fn skip_space(&mut self) {
        self.text = self.text.trim_start();
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip_space();
        let eaten = self.text.starts_with(token);
        if eaten {
            self.text = &self.text[token.len()..];
        }
        eaten
    }

    /// Every path the tree here names, relative to where it starts.
    fn tree(&mut self) -> Vec<Vec<String>> {
        if self.eat("{") {
            let mut paths = Vec::new();
            while !self.eat("}") {
                let before = self.text.len();
                paths.extend(self.tree());
                self.eat(",");
                if self.text.len() == before {
                    break; // not a use tree after all
                }
            }
            return paths;
        }
        if self.eat("*") {
            return vec![Vec::new()];
        }
        self.skip_space();
        let len = self.text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(self.text.len());
        let (name, rest) = self.text.split_at(len);
        self.text = rest;
        if name.is_empty() || name == "self" {
            return vec![Vec::new()];
        }
        // A `::` right after a name goes on; `::<` (turbofish) ends the path.
        let after = self.text.trim_start();
        let more = after.starts_with("::") && !after[2..].trim_start().starts_with('<');
        if !more {
            return vec![vec![name.to_owned()]];
        }
        self.eat("::");
        let mut paths = self.tree();
        for path in &mut paths {
            path.insert(0, name.to_owned());
        }
        paths
    }
}

/// No file of a crate imports, through others, a file that imports it.
#[test]
fn no_two_files_of_a_crate_import_each_other_in_a_circle() {
    let root = root();
    let mut cycles = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        let mut files = BTreeSet::new();
        sources(&src, &src, &mut files);
        let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(f)).collect();
        let edges: Vec<(Vec<String>, BTreeSet<Vec<String>>)> = files
            .iter()
            .map(|f| {
                let module = module_of(f);
                let found = imports(&module, &std::fs::read_to_string(src.join(f)).unwrap(), &modules);
                (module, found)
            })
            .collect();
        let next = |m: &Vec<String>| edges.iter().find(|(n, _)| n == m).map(|(_, e)| e.clone()).unwrap_or_default();
        // A module is in a circle if it can reach itself.
        for (start, _) in &edges {
            let mut seen = BTreeSet::new();
            let mut todo: Vec<Vec<String>> = next(start).into_iter().collect();
            while let Some(m) = todo.pop() {
                if &m == start {
                    cycles.push(format!("{}: {}", src.display(), start.join("::")));
                    break;
                }
                if seen.insert(m.clone()) {
                    todo.extend(next(&m));
                }
            }
        }
    }
    assert!(cycles.is_empty(), "modules that import themselves through others:\n{}", cycles.join("\n"));
}

#[test]
fn the_import_reader_sees_siblings_not_parents() {
    let modules: BTreeSet<Vec<String>> =
        [vec![], vec!["a".to_owned()], vec!["b".to_owned()], vec!["b".to_owned(), "c".to_owned()]].into();
    let text = "use crate::a::Thing;\nuse super::Other;\nuse super::c::X;\n#[cfg(test)]\nmod tests { use crate::b; }";
    let found = imports(&["b".to_owned()], text, &modules);
    assert_eq!(found, [vec!["a".to_owned()]].into(), "the parent, the child and the tests are left out");
}

#[test]
fn the_import_reader_sees_use_trees_and_paths_in_code() {
    let names = ["a", "b", "c", "d", "e"];
    let mut modules: BTreeSet<Vec<String>> = names.iter().map(|n| vec![n.to_string()]).collect();
    modules.extend([vec![], vec!["e".to_owned(), "f".to_owned()]]);
    let module = |name: &str| vec![name.to_owned()];
    let text = "use crate::{a, b::{self, Thing}};\nfn go() { crate::c::run::<u8>(); super::d::X; }";
    assert_eq!(imports(&module("e"), text, &modules), [module("a"), module("b"), module("c"), module("d")].into());
    let nested = "use super::super::{a, e::f::*};";
    assert_eq!(
        imports(&["e".to_owned(), "f".to_owned()], nested, &modules),
        [module("a")].into(),
        "`super::super` is the crate's root; its own path is left out"
    );
}
