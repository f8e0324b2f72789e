//! The engine's layout, checked: rooms depend only on rooms below them, no import circle is
//! larger than `MAX_CIRCLE` files, and no file under a worker crate's `src/` is longer than
//! `MAX_LINES`. docs/architecture.md ("Code map") draws the same order; when a change needs an
//! edge upwards, move the shared item down (there is no list of exceptions). The rooms are
//! private: the crate root's `pub use` list is the engine's whole surface.
//!
//! The import graph is read from the source text, not from the compiler: every `crate::…`,
//! `super::…` and `self::…` path in the production part of each file (its `#[cfg(test)]`
//! module and line comments dropped). A `crate::` path must name a module (or `Error` and
//! `Result`, the crate root's own items): the root's re-exports are not followed, so a path
//! through one would hide an edge.
//! A module's use of its own descendants is not an edge: a room's `mod.rs` declares, re-exports
//! and dispatches to its files, which in turn implement its types (`impl Store` in
//! `store/session.rs`); circles that count are among siblings and across rooms.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The engine's top-level modules ("rooms"), lowest first: a room may use only rooms listed
/// before it. Every top-level module must be listed, so a new one is placed on purpose.
const ROOMS: &[&str] = &[
    "error",
    "bufpool",
    "config",
    "progress",
    "format",
    "meta",
    "index",
    "store",
    "recipe",
    "source",
    "restore",
    "maintenance",
    "ingest",
    "scale",
    "fuzzing",
];

/// The largest import circle allowed, in files: a few sibling files of one room may use each
/// other; rooms may not.
const MAX_CIRCLE: usize = 5;

/// No file under a worker crate's `src/` is longer than this (test files under `tests/` are
/// not counted).
const MAX_LINES: usize = 900;

fn engine_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a source file: `src/restore/cache/mod.rs` → `restore::cache`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts.join("::")
}

/// The production part of a file: without its test module (`#[cfg(test)] mod … { … }`, as
/// rustfmt lays it out, closing at column 0) and without line comments.
fn production_text(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.starts_with("#[cfg(test)]") && lines.peek().is_some_and(|l| l.starts_with("mod ")) {
            if !lines.next().is_some_and(|l| l.ends_with(';')) {
                lines.by_ref().take_while(|l| *l != "}").for_each(drop);
            }
            continue;
        }
        let code = match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path that starts at `at` in `text` (`a::b::C`, or a brace group `a::{b, c::{D}}`),
/// expanded to plain `::`-separated paths.
fn paths_at(text: &str, at: usize) -> Vec<String> {
    let mut out = Vec::new();
    expand(&text[at..], String::new(), &mut out);
    out
}

fn expand(rest: &str, prefix: String, out: &mut Vec<String>) -> usize {
    let mut path = prefix;
    let mut i = 0;
    let bytes = rest.as_bytes();
    loop {
        let start = i;
        while i < bytes.len() && is_ident(bytes[i] as char) {
            i += 1;
        }
        if i > start {
            if !path.is_empty() {
                path.push_str("::");
            }
            path.push_str(&rest[start..i]);
        }
        if rest[i..].starts_with("::{") {
            i += 3;
            loop {
                while rest[i..].starts_with(|c: char| c.is_whitespace() || c == ',') {
                    i += 1;
                }
                if rest[i..].starts_with('}') {
                    return i + 1;
                }
                i += expand(&rest[i..], path.clone(), out);
            }
        } else if rest[i..].starts_with("::") {
            i += 2;
        } else {
            out.push(path);
            // Skip an `as` alias so the caller's scan resumes after it.
            return i;
        }
    }
}

struct Graph {
    /// module path → modules it uses.
    edges: BTreeMap<String, BTreeSet<String>>,
    /// module path → names after `crate::` that name no module.
    unknown: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    fn read(src: &Path) -> Graph {
        let mut files = Vec::new();
        rust_files(src, &mut files);
        let modules: BTreeSet<String> = files.iter().map(|f| module_of(src, f)).collect();
        let (mut edges, mut unknown) = (BTreeMap::new(), BTreeMap::new());
        for file in &files {
            let module = module_of(src, file);
            if module.is_empty() {
                continue; // lib.rs: the crate surface, not a room
            }
            let text = production_text(&fs::read_to_string(file).unwrap());
            let (used, names) = uses_and_unknown(&module, &text, &modules);
            if !names.is_empty() {
                unknown.insert(module.clone(), names);
            }
            edges.insert(module, used);
        }
        Graph { edges, unknown }
    }
}

/// Items the crate root defines (everything else there is a module or a re-export).
const ROOT_ITEMS: &[&str] = &["Error", "Result"];

/// The modules `module` uses, resolved to the longest module path each reference names, and
/// the names after `crate::` that are neither a module nor a root item.
fn uses_and_unknown(
    module: &str,
    text: &str,
    modules: &BTreeSet<String>,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let parent: Vec<&str> = module.split("::").collect();
    let mut used = BTreeSet::new();
    let mut unknown = BTreeSet::new();
    let mut i = 0;
    while i < text.len() {
        let c = text[i..].chars().next().unwrap();
        let at_word = i == 0 || !is_ident(text[..i].chars().next_back().unwrap());
        if !(at_word && is_ident(c)) {
            i += c.len_utf8();
            continue;
        }
        for path in paths_at(text, i) {
            let segs: Vec<&str> = path.split("::").collect();
            if segs[0] == "crate"
                && segs.len() > 1
                && !modules.contains(segs[1])
                && !ROOT_ITEMS.contains(&segs[1])
            {
                unknown.insert(segs[1].to_string());
            }
            let absolute: Option<Vec<&str>> = match segs[0] {
                "crate" => Some(segs[1..].to_vec()),
                "super" => {
                    let ups = segs.iter().take_while(|s| **s == "super").count();
                    let base = &parent[..parent.len().saturating_sub(ups)];
                    Some(base.iter().chain(&segs[ups..]).copied().collect())
                }
                "self" => Some(parent.iter().chain(&segs[1..]).copied().collect()),
                _ => None,
            };
            if let Some(target) = absolute.and_then(|p| longest_module(&p, modules)) {
                if target != module && !is_descendant(&target, module) {
                    used.insert(target);
                }
            }
        }
        while i < text.len()
            && (is_ident(text[i..].chars().next().unwrap()) || text[i..].starts_with("::"))
        {
            i += if text[i..].starts_with("::") { 2 } else { 1 };
        }
    }
    (used, unknown)
}

/// Whether `module` lies inside `ancestor` (`store::view` inside `store`).
fn is_descendant(module: &str, ancestor: &str) -> bool {
    module
        .strip_prefix(ancestor)
        .is_some_and(|rest| rest.starts_with("::"))
}

fn longest_module(path: &[&str], modules: &BTreeSet<String>) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|m| modules.contains(m))
}

fn room_of(module: &str) -> &str {
    module.split("::").next().unwrap()
}

/// The strongly connected components of the graph with more than one module (Tarjan).
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.edges.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.edges.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

/// What breaks the order of `rooms` in `graph`: a room not listed, a listed room that does
/// not exist, a module that uses a room listed after its own.
fn room_problems(graph: &Graph, rooms: &[&str]) -> Vec<String> {
    let rank = |room: &str| rooms.iter().position(|r| *r == room);
    let present: BTreeSet<&str> = graph.edges.keys().map(|m| room_of(m)).collect();
    let mut problems: Vec<String> = present
        .iter()
        .filter(|room| rank(room).is_none())
        .map(|room| format!("room `{room}` is not listed in ROOMS"))
        .collect();
    problems.extend(
        rooms
            .iter()
            .filter(|room| !present.contains(*room))
            .map(|room| format!("ROOMS lists `{room}`, which is no module")),
    );
    for (from, tos) in &graph.edges {
        for to in tos {
            if let (Some(a), Some(b)) = (rank(room_of(from)), rank(room_of(to))) {
                if b > a {
                    problems.push(format!("`{from}` uses `{to}`, a room above it"));
                }
            }
        }
    }
    problems
}

#[test]
fn every_room_is_placed_and_uses_only_rooms_below_it() {
    let problems = room_problems(&Graph::read(&engine_src()), ROOMS);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Rooms the crate root declares public: only `fuzzing`, whose entry points the fuzz targets
/// call, may be (an inline `pub mod` of re-exports, like `tar`, is part of the curated list).
const PUBLIC_ROOMS: &[&str] = &["fuzzing"];

/// The rooms `lib_rs` declares with `pub mod NAME;` that `PUBLIC_ROOMS` does not allow.
fn public_rooms(lib_rs: &str) -> Vec<String> {
    production_text(lib_rs)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod ")?.strip_suffix(';'))
        .filter(|name| !PUBLIC_ROOMS.contains(name))
        .map(|name| format!("`pub mod {name};` in lib.rs: re-export what callers need instead"))
        .collect()
}

#[test]
fn the_rooms_are_private() {
    let lib = fs::read_to_string(engine_src().join("lib.rs")).unwrap();
    let problems = public_rooms(&lib);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let opened = public_rooms("mod error;\n#[doc(hidden)]\npub mod fuzzing;\npub mod store;\n");
    assert_eq!(
        opened.len(),
        1,
        "the check must find `pub mod store;`: {opened:?}"
    );
}

/// The rows of docs/architecture.md's "Code map" table, top to bottom, each the rooms its first
/// column names (a cell may name several: `` `error`, `config` ``; a trailing `/` marks a folder).
fn code_map_rows(doc: &str) -> Vec<Vec<String>> {
    let table = doc
        .split("## Code map")
        .nth(1)
        .expect("docs/architecture.md has a \"Code map\" section");
    table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // header and separator
        .filter_map(|l| l.split('|').nth(1))
        .map(|cell| {
            cell.split(',')
                .map(|n| n.trim().trim_matches('`').trim_end_matches('/').to_string())
                .filter(|n| !n.is_empty())
                .collect()
        })
        .collect()
}

/// Where the code map and `rooms` disagree: a room in one and not the other, or two rooms whose
/// rows are in the opposite order of `rooms` (rooms in one row may come in any order).
fn code_map_problems(rows: &[Vec<String>], rooms: &[&str]) -> Vec<String> {
    let row_of: BTreeMap<&str, usize> = rows
        .iter()
        .enumerate()
        .flat_map(|(i, row)| row.iter().map(move |r| (r.as_str(), i)))
        .collect();
    let mut problems: Vec<String> = rooms
        .iter()
        .filter(|r| !row_of.contains_key(*r))
        .map(|r| format!("room `{r}` has no row in the code map"))
        .collect();
    problems.extend(
        row_of
            .keys()
            .filter(|r| !rooms.contains(r))
            .map(|r| format!("the code map names `{r}`, which ROOMS does not list")),
    );
    for pair in rooms.windows(2) {
        if let (Some(a), Some(b)) = (row_of.get(pair[0]), row_of.get(pair[1])) {
            if a > b {
                problems.push(format!(
                    "the code map puts `{}` above `{}`",
                    pair[1], pair[0]
                ));
            }
        }
    }
    problems
}

#[test]
fn the_code_map_in_the_docs_lists_the_rooms_in_order() {
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md");
    let rows = code_map_rows(&fs::read_to_string(&doc_path).unwrap());
    let problems = code_map_problems(&rows, ROOMS);
    assert!(
        problems.is_empty(),
        "docs/architecture.md's Code map and ROOMS disagree:\n{}",
        problems.join("\n")
    );
    // The check finds each kind of drift.
    let row = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let rows = [row(&["error", "config"]), row(&["store"]), row(&["meta"])];
    assert_eq!(
        code_map_problems(&rows, &["error", "config", "meta", "store"]).len(),
        1
    );
    assert_eq!(
        code_map_problems(&rows, &["error", "config", "store", "meta", "index"]).len(),
        1
    );
    assert_eq!(
        code_map_problems(&rows, &["error", "store", "meta"]).len(),
        1
    );
}

/// A graph from `(module, [modules it uses])`.
fn graph_of(edges: &[(&str, &[&str])]) -> Graph {
    Graph {
        edges: edges
            .iter()
            .map(|(m, uses)| (m.to_string(), uses.iter().map(|u| u.to_string()).collect()))
            .collect(),
        unknown: BTreeMap::new(),
    }
}

#[test]
fn the_checks_find_what_they_are_for() {
    let g = graph_of(&[
        ("low", &[]),
        ("low::a", &["low::b"]),
        ("low::b", &["low::c"]),
        ("low::c", &["low::a", "high"]),
        ("high", &["low"]),
        ("stray", &[]),
    ]);
    assert_eq!(
        room_problems(&g, &["low", "high", "gone"]),
        [
            "room `stray` is not listed in ROOMS",
            "ROOMS lists `gone`, which is no module",
            "`low::c` uses `high`, a room above it",
        ]
    );
    // In the other order `low::c` → `high` goes down, and `high` → `low` goes up.
    assert_eq!(
        room_problems(&g, &["stray", "high", "low"]),
        ["`high` uses `low`, a room above it"]
    );
    assert_eq!(circles(&g), [vec!["low::a", "low::b", "low::c"]]);
}

#[test]
fn every_crate_path_names_a_module() {
    let graph = Graph::read(&engine_src());
    assert!(
        graph.unknown.is_empty(),
        "paths through the crate root's re-exports (use the room's path): {:#?}",
        graph.unknown
    );
}

#[test]
fn no_import_circle_is_larger_than_a_room() {
    let graph = Graph::read(&engine_src());
    let found = circles(&graph);
    let too_large: Vec<_> = found.iter().filter(|c| c.len() > MAX_CIRCLE).collect();
    assert!(
        too_large.is_empty(),
        "import circles over {MAX_CIRCLE} files: {too_large:#?}"
    );
}

#[test]
fn the_graph_reader_sees_every_kind_of_reference() {
    let modules: BTreeSet<String> = ["a", "a::b", "a::b::h", "c", "d", "e", "g", "k"]
        .into_iter()
        .map(String::from)
        .collect();
    let text =
        "mod h;\nuse crate::{c::X, d::{Y, Z as W}};\nfn x() { super::e::go(); self::h::go(); }\n\
                // crate::g in a comment\n#[cfg(test)]\nmod tests {\n    use crate::g;\n}\n\
                fn after_the_tests() { crate::k::go(); crate::gone::go(); crate::Error::x(); }\n";
    let (used, unknown) = uses_and_unknown("a::b", &production_text(text), &modules);
    // `super::e` names no module of its own: it resolves to the longest that exists (`a`).
    // `g` is only in a comment and a test; code after the test module counts (`k`). `h` is a
    // child: a module's use of its own files is no edge.
    let expected: BTreeSet<String> = ["a", "c", "d", "k"].into_iter().map(String::from).collect();
    assert_eq!(used, expected);
    assert_eq!(unknown, BTreeSet::from(["gone".to_string()]));
}

#[test]
fn no_source_file_is_longer_than_max_lines() {
    let worker = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut problems = Vec::new();
    for krate in fs::read_dir(worker).unwrap() {
        let src = krate.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for file in files {
            let lines = fs::read_to_string(&file).unwrap().lines().count();
            if lines > MAX_LINES {
                let name = file.strip_prefix(worker).unwrap().display();
                problems.push(format!("{name} has {lines} lines (at most {MAX_LINES})"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
