//! What ships: the `allot` binary (daemon, CLI and load generator) is built from its crates'
//! normal dependencies only, and none of them turns on test support (a crate's `testing` feature:
//! a Lua test clock, a manual clock, seeded generators). The load generator reaches the machine
//! through `allot-host`, never through the server's internals.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Each package of `package`'s normal and build dependency graph (itself included), with the
/// features turned on for it, as `cargo tree` resolves them for a build of that package alone.
fn shipped_graph(package: &str, depth: Option<u32>) -> BTreeMap<String, Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .args(["tree", "--offline", "--locked", "-p", package, "-e", "normal,build", "--prefix", "none"])
        .args(["--format", "{p}|{f}"]);
    if let Some(depth) = depth {
        command.args(["--depth", &depth.to_string()]);
    }
    let out = command.output().expect("cargo runs");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut graph = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((package, features)) = line.split_once('|') else { continue };
        let name = package.split_whitespace().next().unwrap_or_default().to_owned();
        let features = features.trim_end_matches(" (*)").split(',').filter(|f| !f.is_empty()).map(str::to_owned);
        graph.entry(name).or_insert_with(Vec::new).extend(features);
    }
    graph
}

#[test]
fn the_shipped_binary_carries_no_test_support() {
    let graph = shipped_graph("allot", None);
    assert!(graph.contains_key("allot-bench"), "the load generator ships in the binary: {graph:?}");
    let with_testing: Vec<_> = graph
        .iter()
        .filter(|(name, features)| name.starts_with("allot") && features.iter().any(|f| f == "testing"))
        .collect();
    assert!(with_testing.is_empty(), "crates built with their test support into the binary: {with_testing:?}");
}

#[test]
fn the_load_generator_does_not_reach_into_the_server() {
    let direct = shipped_graph("allot-bench", Some(1));
    assert!(direct.contains_key("allot-host"), "{direct:?}");
    assert!(!direct.contains_key("allot-server"), "allot-bench depends on allot-server: {direct:?}");
}

/// The decisions a store makes under its lock (`allot-core`) have no panic path: what a caller
/// was trusted to have checked is checked where it is relied on, and a broken invariant is a
/// value ([`allot_core::apps::Outcome::broken`]) that stops the store, not a panic. The builders
/// documented to panic on a bad literal (`Resources::with`, `SizeWeights::with`) are the exceptions.
#[test]
fn the_core_has_no_panic_path_outside_its_tests() {
    fn visit(dir: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                visit(&path, found);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("testing.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let shipped = text.split("#[cfg(test)]").next().unwrap_or_default();
            for (number, line) in shipped.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                let panics = [".expect(", ".unwrap()", "unreachable!(", "panic!(", "todo!(", "unimplemented!("]
                    .iter()
                    .any(|p| code.contains(p));
                let documented_builder = code.contains("Resources::with: ") || code.contains("SizeWeights::with: ");
                if panics && !documented_builder {
                    found.push(format!("{}:{}: {}", path.display(), number + 1, line.trim()));
                }
            }
        }
    }
    let mut found = Vec::new();
    visit(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../allot-core/src"), &mut found);
    assert!(found.is_empty(), "panic paths in allot-core:\n{}", found.join("\n"));
}
