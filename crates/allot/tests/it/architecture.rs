//! The shape of the code, checked: ARCHITECTURE.md's code map is true to the code (every crate has
//! a section, every module it names exists, and every module that exists is named, by its file or
//! by a folder it is in), and no two files of a crate import each other in a circle.

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
/// through `crate::` or `super::`, other than its own ancestors and descendants: a child module
/// always sees its parent.
fn imports(module: &[String], text: &str, modules: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    let path = regex::Regex::new(r"\b(crate|super)((?:::[a-z_][a-z0-9_]*)+)").unwrap();
    let mut found = BTreeSet::new();
    for caps in path.captures_iter(code) {
        let mut parts: Vec<String> =
            if &caps[1] == "crate" { Vec::new() } else { module[..module.len().saturating_sub(1)].to_vec() };
        parts.extend(caps[2].split("::").filter(|p| !p.is_empty()).map(str::to_owned));
        let Some(target) = (0..=parts.len()).rev().map(|k| parts[..k].to_vec()).find(|t| modules.contains(t)) else {
            continue;
        };
        let related = target.starts_with(module) || module.starts_with(&target);
        if !related {
            found.insert(target);
        }
    }
    found
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

/// The most real sleeps the tests may keep: a test waits for a condition (a polling helper's one
/// pause counts once) or moves a clock it is given, never for a duration. A ratchet: issue 40's
/// target is 10, each with its reason; lower both numbers as waits become conditions, never raise.
const MOST_SLEEPS: usize = 81;
/// The most of them without their reason on the line above (the target: none).
const MOST_UNEXPLAINED: usize = 72;

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
        if code.contains("thread::sleep(") || code.contains("time::sleep(") {
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
        "{} real sleeps in tests, at most {MOST_SLEEPS}: wait for a condition (the crate's `eventually`) \
         or move a clock instead:\n{}",
        all.len(),
        all.join("\n")
    );
    assert!(
        unexplained.len() <= MOST_UNEXPLAINED,
        "{} sleeps without their reason on the line above, at most {MOST_UNEXPLAINED}:\n{}",
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
