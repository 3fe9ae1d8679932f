//! The runtime's layering, checked from its sources: which top-level modules each module names
//! (through `crate::module::...` paths, `use crate::{...}` groups, and names `lib.rs` re-exports,
//! resolved to the module that defines them), and the "never" rules docs/ARCHITECTURE.md states.
//! Prints the dependency table (`--nocapture`), so a review can see every edge.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const RUNTIME: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/runtime");

/// The top-level module a source file belongs to (`ops` for runtime/ops/linear.rs).
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(RUNTIME).expect("under runtime/");
    let first = rel.components().next().expect("a component").as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_string()
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).expect("readable runtime/") {
        let p = e.expect("an entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `name -> defining module` for every `pub use module::{A, B}` / `pub use module::A` in lib.rs.
fn reexports() -> BTreeMap<String, String> {
    let lib = fs::read_to_string(format!("{RUNTIME}/lib.rs")).expect("lib.rs");
    let mut map = BTreeMap::new();
    for line in lib.lines().map(str::trim).filter(|l| l.starts_with("pub use ")) {
        let rest = line.trim_start_matches("pub use ").trim_end_matches(';');
        let Some((module, names)) = rest.split_once("::") else { continue };
        let names = names.trim_start_matches('{').trim_end_matches('}');
        for n in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            map.insert(n.rsplit("::").next().unwrap_or(n).to_string(), module.to_string());
        }
    }
    map
}

/// The identifiers right after each `crate::` (the items of a `crate::{...}` group included),
/// comments left out.
fn crate_paths(src: &str) -> Vec<String> {
    let code: String = src
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `graphed_macros_crate::` and the like
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(group.len(), |(j, _)| j);
            let mut items = Vec::new();
            let (mut d, mut from) = (0, 0);
            for (k, c) in group[..end].char_indices() {
                match c {
                    '{' => d += 1,
                    '}' => d -= 1,
                    ',' if d == 0 => {
                        items.push(&group[from..k]);
                        from = k + 1;
                    }
                    _ => {}
                }
            }
            items.push(&group[from..end]);
            for item in items {
                let ident: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !ident.is_empty() {
                    out.push(ident);
                }
            }
        } else {
            let ident: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !ident.is_empty() {
                out.push(ident);
            }
        }
    }
    out
}

/// `module -> modules it names` over the whole runtime.
fn edges() -> BTreeMap<String, BTreeSet<String>> {
    let re = reexports();
    let mut files = Vec::new();
    sources(Path::new(RUNTIME), &mut files);
    let modules: BTreeSet<String> = files.iter().map(|p| module_of(p)).collect();
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let from = module_of(f);
        if from == "lib" {
            continue;
        }
        let src = fs::read_to_string(f).expect("readable source");
        // A file's unit tests (its trailing `#[cfg(test)] mod tests`) are not its dependencies.
        let src = src.find("\n#[cfg(test)]\nmod tests").map_or(&src[..], |end| &src[..end]);
        for name in crate_paths(src) {
            let to = if modules.contains(&name) { Some(name) } else { re.get(&name).cloned() };
            if let Some(to) = to.filter(|t| *t != from) {
                deps.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    deps
}

/// The "never" rules of docs/ARCHITECTURE.md: `(module, modules it must never name, why)`.
const NEVER: &[(&str, &[&str], &str)] = &[
    (
        "backend",
        &["graphed", "graph", "ops", "optim", "dist", "checkpoint", "hooks", "module", "params", "state_dict"],
        "backend/ is the bottom layer: it knows CUDA from host and nothing of what runs on it",
    ),
    (
        "ops",
        &["graphed", "graph", "checkpoint", "hooks", "optim", "dist"],
        "an op is one piece of device work; capture belongs above it",
    ),
    (
        "optim",
        &["graphed", "checkpoint", "hooks", "dist"],
        "an optimizer step is device work that captures like any op",
    ),
    ("dtype", &["ops", "graph", "graphed", "tensor", "pool"], "dtypes are plain values"),
    ("shape", &["ops", "graph", "graphed", "tensor", "pool"], "shapes are plain values"),
    ("tensor", &["ops", "graph", "graphed", "optim", "dist"], "a tensor is storage; ops work on it, not the reverse"),
    ("error", &["graphed", "graph", "ops", "optim", "tensor", "pool"], "every layer returns these errors"),
    ("rng", &["ops", "graph", "graphed", "optim"], "the generator is device state that ops draw from, not an op"),
    ("pool", &["graph", "graphed", "ops"], "the pool hands out memory; graphs use it, it does not know them"),
];

#[test]
fn the_runtime_keeps_its_layers() {
    let deps = edges();
    println!("module -> the runtime modules it names");
    for (from, to) in &deps {
        println!("  {from:<12} -> {}", to.iter().cloned().collect::<Vec<_>>().join(", "));
    }
    // Pairs of modules that name each other: the cycles a layered design would remove.
    let mut mutual = Vec::new();
    for (a, to) in &deps {
        for b in to {
            if a < b && deps.get(b).is_some_and(|t| t.contains(a)) {
                mutual.push(format!("{a} <-> {b}"));
            }
        }
    }
    println!(
        "modules that name each other: {}",
        if mutual.is_empty() { "none".to_string() } else { mutual.join(", ") }
    );
    let mut broken = Vec::new();
    for (module, never, why) in NEVER {
        let named = deps.get(*module).cloned().unwrap_or_default();
        assert!(
            deps.contains_key(*module)
                || Path::new(&format!("{RUNTIME}/{module}.rs")).exists()
                || Path::new(&format!("{RUNTIME}/{module}")).is_dir(),
            "rule for `{module}`, which is no module of the runtime"
        );
        for n in *never {
            if named.contains(*n) {
                broken.push(format!("{module} names {n} ({why})"));
            }
        }
    }
    assert!(broken.is_empty(), "layering rules broken:\n{}", broken.join("\n"));
}

#[test]
fn the_macro_crate_never_depends_on_the_runtime() {
    let manifest =
        fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/macros/Cargo.toml")).expect("macros/Cargo.toml");
    let deps = manifest.split("[dependencies]").nth(1).unwrap_or("").split("\n[").next().unwrap_or("");
    assert!(!deps.lines().any(|l| l.trim_start().starts_with("graphed")), "graphed-macros must not depend on graphed");
}

#[test]
fn the_scanner_reads_groups_and_paths() {
    let src = "use crate::{ops::cpu, Error, Result};\nuse crate::backend::Exec; // crate::dist in a comment\nlet x = crate::pool::GraphPool::new;";
    assert_eq!(crate_paths(src), ["ops", "Error", "Result", "backend", "pool"]);
}
