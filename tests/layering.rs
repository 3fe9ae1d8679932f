//! The runtime's layering, checked from its sources: which top-level modules each module names
//! (through `crate::module::...` paths, `use crate::{...}` groups, and names `lib.rs` re-exports,
//! resolved to the module that defines them), the "never" rules docs/ARCHITECTURE.md states, and
//! that no two modules name each other, directly or around a longer cycle. Prints the dependency
//! table (`--nocapture`), so a review can see every edge.

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

/// `name -> defining module` for every `pub use module::{A, B}` / `pub use module::A` in lib.rs,
/// a group spread over several lines included.
fn reexports() -> BTreeMap<String, String> {
    let lib = fs::read_to_string(format!("{RUNTIME}/lib.rs")).expect("lib.rs");
    reexports_of(&lib)
}

fn reexports_of(lib: &str) -> BTreeMap<String, String> {
    let code: String = lib.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join(" ");
    let mut map = BTreeMap::new();
    for stmt in code.split(';').map(str::trim) {
        let Some(at) = stmt.find("pub use ") else { continue };
        let rest = stmt[at + "pub use ".len()..].trim_start_matches("crate::");
        let Some((module, names)) = rest.split_once("::") else { continue };
        let names = match names.split_once('{') {
            Some((_, group)) => group.trim_end_matches('}'),
            None => names,
        };
        for n in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            map.insert(n.rsplit("::").next().unwrap_or(n).to_string(), module.trim().to_string());
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
            let to = to.filter(|t| modules.contains(t)); // not an outside crate (`half`, the macros)
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
        &["graphed", "graph", "ops", "optim", "dist", "checkpoint", "hooks", "module", "param", "state_dict"],
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
    ("pool", &["graph", "graphed", "ops", "device"], "the pool hands out memory; graphs use it, it does not know them"),
    (
        "device",
        &["tensor", "rng", "ops", "graph", "graphed", "dist", "module"],
        "a device holds the backend and its pools; tensors and generators live on it, not in it",
    ),
    (
        "error",
        &["backend", "device", "kernel", "module", "dist", "cx", "param"],
        "errors sit below everything that returns them: what they name (Arg, Slot, Launcher) lives in error/, \
         beside the plain values dtype and capabilities",
    ),
    (
        "module",
        &["graphed", "graph", "dist", "checkpoint", "hooks"],
        "the module interface is what graphed, dist and the wrappers build on",
    ),
    ("checkpoint", &["graphed", "dist"], "a checkpointed module is a module; make_graphed captures it like any other"),
    ("graphed", &["dist"], "dist builds on make_graphed; graphed asks ranks to agree through Module::collectives"),
    (
        "order_entry",
        &["module", "graphed", "dist", "error", "tensor"],
        "an order entry is a plain value that modules, make_graphed and the ranks read",
    ),
];

/// Whether `name` is a top-level module of the runtime (a file or a folder).
fn is_module(name: &str) -> bool {
    Path::new(&format!("{RUNTIME}/{name}.rs")).exists() || Path::new(&format!("{RUNTIME}/{name}")).is_dir()
}

/// The modules of a cycle in `deps`, if there is one (a depth-first search).
fn cycle(deps: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        deps: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut c = path[i..].to_vec();
            c.push(m.to_string());
            return Some(c);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for n in deps.get(m).into_iter().flatten() {
            if let Some(c) = visit(n, deps, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    deps.keys().find_map(|m| visit(m, deps, &mut Vec::new(), &mut done))
}

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
        assert!(is_module(module), "rule for `{module}`, which is no module of the runtime");
        for n in *never {
            assert!(is_module(n), "rule for `{module}` names `{n}`, which is no module of the runtime");
            if named.contains(*n) {
                broken.push(format!("{module} names {n} ({why})"));
            }
        }
    }
    assert!(broken.is_empty(), "layering rules broken:\n{}", broken.join("\n"));
    assert!(mutual.is_empty(), "modules that name each other (move the item to the lower one): {mutual:?}");
    let cycle = cycle(&deps);
    assert!(cycle.is_none(), "the modules name each other in a cycle: {}", cycle.unwrap_or_default().join(" -> "));
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

#[test]
fn the_cycle_finder_finds_cycles() {
    let deps = |edges: &[(&str, &str)]| {
        let mut d: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            d.entry(a.to_string()).or_default().insert(b.to_string());
        }
        d
    };
    assert_eq!(cycle(&deps(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
    assert_eq!(
        cycle(&deps(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

#[test]
fn the_scanner_reads_reexports_over_several_lines() {
    let lib = "pub use dtype::DType;\npub use error::{\n    BucketError, Error, // the one error\n    Result,\n};\n#[doc(hidden)]\npub use kernel::host::{HostArgs};";
    let map = reexports_of(lib);
    let got: Vec<(&str, &str)> = map.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(
        got,
        [("BucketError", "error"), ("DType", "dtype"), ("Error", "error"), ("HostArgs", "kernel"), ("Result", "error")]
    );
}
