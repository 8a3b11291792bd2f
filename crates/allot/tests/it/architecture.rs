//! The shape of the code, checked: what ARCHITECTURE.md names exists (every path, every type and
//! item in backticks, every crate), every crate of the workspace is named, no crate depends on one
//! its table of crates lists after it, no two files of a crate import each other in a circle
//! (through a `use` tree or a path in code alike; the Python client and the dashboard's scripts
//! have the same check: `clients/python/tests/test_imports.py`), and the real sleeps left in tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file under `dir` whose name ends with `ext`, relative to `under`.
fn files(dir: &Path, under: &Path, ext: &str, found: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, under, ext, found);
        } else if path.to_string_lossy().ends_with(ext) {
            found.insert(path.strip_prefix(under).unwrap().to_string_lossy().replace('\\', "/"));
        }
    }
}

/// Every `.rs` file under `dir`, relative to it.
fn sources(dir: &Path, under: &Path, found: &mut BTreeSet<String>) {
    files(dir, under, ".rs", found);
}

/// What the workspace defines, read from its sources (every crate's `src/`, `tests/` and
/// `benches/`, and the Python client).
struct Workspace {
    root: PathBuf,
    /// The crates: the folders of `crates/`, each named as its crate.
    crates: BTreeSet<String>,
    /// Structs, enums, traits, unions and type aliases; the Python client's classes.
    types: BTreeSet<String>,
    /// Capitalised identifiers that open a line of Rust: enum variants, among others.
    variants: BTreeSet<String>,
    /// Functions and methods.
    fns: BTreeSet<String>,
    /// The functions of each crate's `src/`.
    crate_fns: BTreeMap<String, BTreeSet<String>>,
}

impl Workspace {
    fn read(root: &Path) -> Workspace {
        let crates: BTreeSet<String> = std::fs::read_dir(root.join("crates"))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.join("Cargo.toml").exists())
            .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        let item = |keywords: &str, name: &str| {
            regex::Regex::new(&format!(r"(?m)^\s*(?:pub(?:\([^)]*\))?\s+)?(?:{keywords})\s+({name})")).unwrap()
        };
        let type_def = item("struct|enum|trait|unsafe trait|union|type", r"[A-Z][A-Za-z0-9_]*");
        let fn_def = item(r"(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn", r"[a-z_][a-z0-9_]*");
        let variant = regex::Regex::new(r"(?m)^\s*([A-Z][A-Za-z0-9]*)\s*(?:[,({]|$)").unwrap();
        let class = regex::Regex::new(r"(?m)^class\s+([A-Za-z_][A-Za-z0-9_]*)").unwrap();
        let mut workspace = Workspace {
            root: root.to_owned(),
            crates,
            types: BTreeSet::new(),
            variants: BTreeSet::new(),
            fns: BTreeSet::new(),
            crate_fns: BTreeMap::new(),
        };
        for name in &workspace.crates {
            for dir in ["src", "tests", "benches"] {
                let path = root.join("crates").join(name).join(dir);
                if !path.is_dir() {
                    continue;
                }
                let mut found = BTreeSet::new();
                sources(&path, &path, &mut found);
                for text in found.iter().map(|file| std::fs::read_to_string(path.join(file)).unwrap()) {
                    workspace.types.extend(type_def.captures_iter(&text).map(|c| c[1].to_owned()));
                    workspace.variants.extend(variant.captures_iter(&text).map(|c| c[1].to_owned()));
                    let fns: Vec<String> = fn_def.captures_iter(&text).map(|c| c[1].to_owned()).collect();
                    if dir == "src" {
                        workspace.crate_fns.entry(name.clone()).or_default().extend(fns.iter().cloned());
                    }
                    workspace.fns.extend(fns);
                }
            }
        }
        let python = root.join("clients/python");
        let mut found = BTreeSet::new();
        files(&python, &python, ".py", &mut found);
        for file in found {
            let text = std::fs::read_to_string(python.join(file)).unwrap();
            workspace.types.extend(class.captures_iter(&text).map(|c| c[1].to_owned()));
        }
        workspace
    }

    /// Whether `path` (its segments `*` for any folder) names a file or folder under `base`.
    fn exists(base: &Path, path: &str) -> bool {
        let mut bases = vec![base.to_owned()];
        for segment in path.trim_end_matches('/').split('/') {
            bases = bases
                .into_iter()
                .flat_map(|base| -> Vec<PathBuf> {
                    if segment != "*" {
                        return vec![base.join(segment)];
                    }
                    std::fs::read_dir(&base).map_or(Vec::new(), |dir| dir.map(|e| e.unwrap().path()).collect())
                })
                .filter(|path| path.exists())
                .collect();
        }
        !bases.is_empty()
    }

    /// Whether `module` (segments below the crate's root) is a module of crate `name`.
    fn is_module(&self, name: &str, module: &[&str]) -> bool {
        let src = self.root.join("crates").join(name).join("src").join(module.join("/"));
        src.with_extension("rs").exists() || src.join("mod.rs").exists()
    }

    /// What is wrong with `span`, one name in backticks, read in the section of crate `section`
    /// (paths there may be relative to the crate's folder). Spans that are not a path, a crate or
    /// a Rust item (words, flags, routes, commands) are not checked.
    fn check(&self, span: &str, section: Option<&str>) -> Option<String> {
        let span = span.split('(').next().unwrap_or_default();
        if span.is_empty() || span.contains(char::is_whitespace) || span.starts_with(['/', '-', '[', '.']) {
            return None;
        }
        let extensions = [".rs", ".md", ".py", ".lua", ".toml", ".html", ".js", ".css", ".json", ".yaml"];
        if span.contains('/') || extensions.iter().any(|ext| span.ends_with(ext)) {
            let in_crate = section.is_some_and(|name| Self::exists(&self.root.join("crates").join(name), span));
            return (!in_crate && !Self::exists(&self.root, span)).then(|| format!("path `{span}` does not exist"));
        }
        if regex::Regex::new(r"^allot(-[a-z]+)*$").unwrap().is_match(span) {
            return (!self.crates.contains(span)).then(|| format!("crate `{span}` is not in the workspace"));
        }
        let is_item = regex::Regex::new(r"^[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*$").unwrap();
        let capital = |s: &str| s.starts_with(|c: char| c.is_ascii_uppercase());
        if !is_item.is_match(span) || !(span.contains("::") || capital(span)) {
            return None;
        }
        let mut segments: Vec<&str> = span.split("::").collect();
        if !capital(segments[0]) {
            // A crate's path: its modules, then an item.
            let Some(name) = self.crates.iter().find(|name| name.replace('-', "_") == segments[0]) else {
                return Some(format!("`{span}` starts with no crate of the workspace"));
            };
            let modules = segments.iter().skip(1).take_while(|s| !capital(s)).count();
            let mut known = 0;
            while known < modules && self.is_module(name, &segments[1..=known + 1]) {
                known += 1;
            }
            let rest = &segments[1 + known..];
            let last_is_fn = rest.len() == 1 && self.crate_fns.get(name).is_some_and(|fns| fns.contains(rest[0]));
            if !(rest.is_empty() || capital(rest[0]) || last_is_fn) {
                return Some(format!("`{span}`: `{}` is neither a module of {name} nor a function", rest[0]));
            }
            segments = rest.to_vec();
            if segments.is_empty() || last_is_fn {
                return None;
            }
        }
        if !self.types.contains(segments[0]) {
            return Some(format!("type `{}` is defined nowhere in the workspace", segments[0]));
        }
        segments[1..].iter().find_map(|s| {
            let known =
                if capital(s) { self.types.contains(*s) || self.variants.contains(*s) } else { self.fns.contains(*s) };
            (!known).then(|| format!("`{span}`: `{s}` is defined nowhere in the workspace"))
        })
    }

    /// Everything named in `text` (a Markdown document) that does not exist, and every crate it
    /// does not name.
    fn problems(&self, text: &str) -> Vec<String> {
        let mut problems = Vec::new();
        let mut named = BTreeSet::new();
        let mut section: Option<String> = None;
        let mut fenced = false;
        for line in text.lines() {
            if line.starts_with("```") {
                fenced = !fenced;
            }
            if fenced || line.starts_with("```") {
                continue;
            }
            if line.starts_with('#') {
                section = line.strip_prefix("### `crates/").and_then(|rest| rest.split('`').next()).map(str::to_owned);
            }
            if line.matches('`').count() % 2 == 1 {
                problems.push(format!("a name in backticks runs over a line's end: {line}"));
            }
            for span in line.split('`').skip(1).step_by(2) {
                named.insert(span.trim_start_matches("crates/").to_owned());
                problems.extend(self.check(span, section.as_deref()));
            }
        }
        for name in &self.crates {
            if !named.contains(name) {
                problems.push(format!("crate `{name}` is in the workspace but not named"));
            }
        }
        problems
    }
}

#[test]
fn architecture_md_names_only_what_exists_and_every_crate() {
    let workspace = Workspace::read(&root());
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let problems = workspace.problems(&text);
    assert!(problems.is_empty(), "ARCHITECTURE.md names what is not there:\n{}", problems.join("\n"));
}

#[test]
fn the_name_checker_finds_what_does_not_exist() {
    let workspace = Workspace::read(&root());
    let real = "`crates/allot-core/src/quotas.rs` `Ledger` `Ledger::check_invariants` `allot_store::conformance` \
                `allot_server::run(listener)` `ErrorCode` `AsyncClient` `allot serve` `quotas` `--store` `/v1/watch`";
    let mut crates = String::new();
    for name in &workspace.crates {
        crates += &format!(" `{name}`");
    }
    assert_eq!(workspace.problems(&format!("{real}{crates}")), Vec::<String>::new());
    let bogus = "### `crates/allot-core`\n`src/nope.rs` `NoSuchType` `Ledger::no_such_method` `allot-nope` \
                 `allot_core::nope` `allot_nope::Ledger` `allot_core::baseline_server`";
    let problems = workspace.problems(bogus);
    assert_eq!(problems.len(), 7 + workspace.crates.len() - 1, "{problems:#?}");
}

/// The crates in the order of ARCHITECTURE.md's table (`| \`name\` | ... |` rows under `## Crates`).
fn crate_table(text: &str) -> Vec<String> {
    let section = text.split("\n## Crates\n").nth(1).unwrap_or_default();
    let section = section.split("\n## ").next().unwrap_or_default();
    section.lines().filter_map(|line| line.strip_prefix("| `")?.split('`').next().map(str::to_owned)).collect()
}

/// The crates of the workspace that `manifest` (a Cargo.toml) depends on, dev-dependencies left out.
fn dependencies(manifest: &str) -> Vec<String> {
    let mut table = "";
    let mut found = Vec::new();
    for line in manifest.lines() {
        if line.starts_with('[') {
            table = line;
        } else if table == "[dependencies]" && line.starts_with("allot") {
            found.extend(line.split(['.', ' ', '=']).next().map(str::to_owned));
        }
    }
    found
}

/// The crates are layers: each depends only on crates listed above it in ARCHITECTURE.md.
#[test]
fn no_crate_depends_on_one_listed_after_it() {
    let root = root();
    let table = crate_table(&std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap());
    let crates = Workspace::read(&root).crates;
    assert_eq!(table.iter().cloned().collect::<BTreeSet<_>>(), crates, "the table lists every crate once");
    let mut upward = Vec::new();
    for (at, name) in table.iter().enumerate() {
        let manifest = std::fs::read_to_string(root.join("crates").join(name).join("Cargo.toml")).unwrap();
        for dependency in dependencies(&manifest) {
            if !table[..at].contains(&dependency) {
                upward.push(format!("{name} depends on {dependency}, listed after it"));
            }
        }
    }
    assert!(upward.is_empty(), "{}", upward.join("\n"));
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

/// The most real sleeps the tests may keep, each with its reason on the line above: a test waits
/// for a condition (`allot_host::wait`, the one polling loop) or moves a clock it is given, never
/// for a duration; what is left is time that must really pass (downtime, a slow disk or peer).
const MOST_SLEEPS: usize = 10;

/// The test code of every crate, as (path, text, the line it starts at): `tests/`, the test-only
/// modules of `src` (`testing.rs`, `fault.rs`, `conformance/`) and, of other files, what follows
/// `#[cfg(test)]`.
fn test_code(root: &Path) -> Vec<(String, String, usize)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let krate = entry.unwrap().path();
        for dir in ["tests", "src"] {
            let base = krate.join(dir);
            if !base.is_dir() {
                continue;
            }
            let mut files = BTreeSet::new();
            sources(&base, &base, &mut files);
            for file in files {
                let text = std::fs::read_to_string(base.join(&file)).unwrap();
                let name = format!("{}/{dir}/{file}", krate.file_name().unwrap().to_string_lossy());
                let test_only =
                    dir == "tests" || file == "testing.rs" || file == "fault.rs" || file.starts_with("conformance/");
                let from = if test_only { Some(1) } else { text.lines().position(|l| l.contains("#[cfg(test)]")) };
                if let Some(from) = from {
                    found.push((name, text, from));
                }
            }
        }
    }
    found
}

/// The real sleeps in `text`: `thread::sleep(` or `time::sleep(` outside a `//` comment, each
/// with whether the line above it is a `//` comment (its reason).
fn sleeps(text: &str) -> Vec<(usize, bool)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        // (The calls' names without their parenthesis here, so that this line is not one.)
        if ["thread::sleep", "time::sleep"].iter().any(|call| code.contains(&format!("{call}("))) {
            let reason = i > 0 && lines[i - 1].trim_start().starts_with("//");
            found.push((i + 1, reason));
        }
    }
    found
}

#[test]
fn real_sleeps_in_tests_are_counted_and_only_go_down() {
    let mut all = Vec::new();
    let mut unexplained = Vec::new();
    for (file, text, from) in test_code(&root()) {
        for (line, reason) in sleeps(&text).into_iter().filter(|(line, _)| *line >= from) {
            all.push(format!("{file}:{line}"));
            if !reason {
                unexplained.push(format!("{file}:{line}"));
            }
        }
    }
    assert!(
        all.len() <= MOST_SLEEPS,
        "{} real sleeps in tests, at most {MOST_SLEEPS}: wait for a condition (`allot_host::wait`) \
         or move a clock instead:\n{}",
        all.len(),
        all.join("\n")
    );
    assert!(
        unexplained.is_empty(),
        "{} sleeps without their reason on the line above:\n{}",
        unexplained.len(),
        unexplained.join("\n")
    );
    assert!(!all.is_empty(), "the scan found the polling helpers' sleeps: it reads the test code");
}

#[test]
fn the_sleep_counter_sees_calls_not_comments_and_their_reasons() {
    let text = "// polls\nstd::thread::sleep(d);\nx();\ntokio::time::sleep(d).await;\n// thread::sleep(d) here\n";
    assert_eq!(sleeps(text), vec![(2, true), (4, false)]);
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
