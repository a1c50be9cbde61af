//! The layers of `docs/architecture.md`, held against the code: every
//! `crate::` path (and `super::`, `self::`, and a parent's use of its own child
//! modules) in `src/` is an import; no module may import one of a higher
//! layer, and no cycle may form, between files or between top-level
//! modules. The layer table is read from the document itself, so the
//! document and the test cannot disagree. Sizes are held too: no file of
//! `src/` over [`MAX_FILE_LINES`] lines, no function there over
//! [`MAX_FN_LINES`] (docs/development.md#where-a-change-goes).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The most lines a file of `src/` may have, its unit tests included.
const MAX_FILE_LINES: usize = 750;

/// The most lines a file of the decision core (`src/decision/`) may have:
/// the core is where a newcomer reads first.
const MAX_DECISION_FILE_LINES: usize = 500;

/// The most fields the `Limiter` may hold: what it needs besides deciding
/// belongs to the types beside it.
const MAX_LIMITER_FIELDS: usize = 10;

/// The most public types whose names say what was decided or what came
/// of it: one word per outcome (what a request's limits decided, what one
/// limit said, what the request came to).
const MAX_OUTCOME_TYPES: usize = 4;

/// The most lines a function of `src/` may span, signature to closing
/// brace, unit tests included.
const MAX_FN_LINES: usize = 100;

/// `module -> layer` from the table rows `| N | \`a\`, \`b\` | … |`.
fn layers() -> BTreeMap<String, u32> {
    let doc = std::fs::read_to_string(Path::new(ROOT).join("docs/architecture.md"))
        .expect("docs/architecture.md");
    let mut out = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 {
            continue;
        }
        let Ok(layer) = cells[1].parse::<u32>() else {
            continue;
        };
        for m in cells[2].split(',') {
            let m = m.trim().trim_matches('`');
            if !m.is_empty() {
                out.insert(m.to_owned(), layer);
            }
        }
    }
    assert!(!out.is_empty(), "no layer table in docs/architecture.md");
    out
}

/// Every `.rs` file under `src/`, as its module path (`pipeline/act`).
fn files() -> Vec<(String, PathBuf)> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<(String, PathBuf)>) {
        for entry in std::fs::read_dir(dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, base, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(base).expect("under src");
                let module = rel.with_extension("").to_string_lossy().replace('\\', "/");
                out.push((module, path));
            }
        }
    }
    let base = Path::new(ROOT).join("src");
    let mut out = Vec::new();
    walk(&base, &base, &mut out);
    out.sort();
    out
}

/// The code of a file without comments and without its unit tests.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read source");
    let text = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => &text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `a::b::c` paths that start at `prefix` (`crate::`, `super::`, `x::`).
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<Vec<&'a str>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().next_back();
        let after = &rest[i + prefix.len()..];
        rest = after;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let end = after
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(after.len());
        let segs: Vec<&str> = after[..end].split("::").filter(|s| !s.is_empty()).collect();
        out.push(segs);
    }
    out
}

/// The longest existing module file for `segs` (a path from the crate root).
fn resolve(known: &BTreeSet<String>, segs: &[&str]) -> Option<String> {
    (1..=segs.len())
        .rev()
        .map(|n| segs[..n].join("/"))
        .find(|m| known.contains(m))
}

/// File-level imports: `module -> modules it uses`.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let files = files();
    let known: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph = BTreeMap::new();
    for (module, path) in &files {
        if module.ends_with("tests") || module == "lib" || module == "main" {
            continue;
        }
        let code = code(path);
        let mut uses = BTreeSet::new();
        let here: Vec<&str> = module.split('/').collect();
        let mut add = |segs: Vec<&str>| {
            if let Some(t) = resolve(&known, &segs)
                && t != *module
            {
                uses.insert(t);
            }
        };
        for segs in paths_after(&code, "crate::") {
            add(segs);
        }
        // `super::x` from `a/b` is `a::x`; `super::super::x` is `x`.
        for segs in paths_after(&code, "super::") {
            let up = 1 + segs.iter().take_while(|s| **s == "super").count();
            let mut full: Vec<&str> = here[..here.len().saturating_sub(up)].to_vec();
            full.extend(segs.into_iter().skip(up - 1));
            add(full);
        }
        // `self::x` from `a/b` is `a::b::x`.
        for segs in paths_after(&code, "self::") {
            let mut full = here.clone();
            full.extend(segs);
            add(full);
        }
        // A parent's own children: `mod x;` then `x::…`.
        for line in code.lines() {
            let l = line.trim();
            let Some(name) = l
                .strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("mod "))
                .and_then(|r| r.strip_suffix(';'))
            else {
                continue;
            };
            for segs in paths_after(&code, &format!("{name}::")) {
                let mut full = here.clone();
                full.push(name);
                full.extend(segs);
                add(full);
            }
        }
        graph.insert(module.clone(), uses);
    }
    graph
}

/// A cycle in `graph`, if any, as the path that closes it.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let from = stack.iter().position(|s| s == n).unwrap_or(0);
                let mut c = stack[from..].to_vec();
                c.push(n.to_owned());
                return Some(c);
            }
            _ => {}
        }
        state.insert(n.to_owned(), 1);
        stack.push(n.to_owned());
        for m in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, graph, state, stack) {
                return Some(c);
            }
        }
        stack.pop();
        state.insert(n.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if let Some(c) = visit(n, graph, &mut state, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

fn top(module: &str) -> String {
    module.split('/').next().unwrap_or(module).to_owned()
}

#[test]
fn no_file_imports_another_in_a_circle() {
    if let Some(c) = cycle(&imports()) {
        panic!("files import each other in a circle: {}", c.join(" -> "));
    }
}

#[test]
fn no_top_level_module_imports_another_in_a_circle() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in imports() {
        let entry = graph.entry(top(&from)).or_default();
        entry.extend(tos.iter().map(|t| top(t)).filter(|t| *t != top(&from)));
    }
    if let Some(c) = cycle(&graph) {
        panic!("modules import each other in a circle: {}", c.join(" -> "));
    }
}

#[test]
fn every_import_looks_down_the_layers_of_the_architecture_document() {
    let layers = layers();
    // The most specific entry: `config/load/routes` is in `config/load`'s layer.
    let layer_of = |m: &str| {
        let segs: Vec<&str> = m.split('/').collect();
        (1..=segs.len())
            .rev()
            .find_map(|n| layers.get(&segs[..n].join("/")))
            .copied()
            .unwrap_or_else(|| panic!("{m} is in no layer of docs/architecture.md"))
    };
    let mut wrong = Vec::new();
    for (from, tos) in imports() {
        for to in tos {
            let (lf, lt) = (layer_of(&from), layer_of(&to));
            if lt > lf {
                wrong.push(format!("{from} (layer {lf}) imports {to} (layer {lt})"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that look up:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_checker_sees_imports_and_cycles() {
    let code = "use crate::a::b::{C, D};\nfn f() { crate::x::y(); super::z::w(); }";
    assert_eq!(
        paths_after(code, "crate::"),
        [vec!["a", "b"], vec!["x", "y"]]
    );
    let mut g = BTreeMap::new();
    g.insert("a".to_owned(), BTreeSet::from(["b".to_owned()]));
    g.insert("b".to_owned(), BTreeSet::from(["a".to_owned()]));
    assert!(cycle(&g).is_some());
    g.insert("b".to_owned(), BTreeSet::new());
    assert!(cycle(&g).is_none());
}

#[test]
fn no_source_file_is_longer_than_the_limit() {
    let long: Vec<String> = files()
        .into_iter()
        .filter_map(|(module, path)| {
            let n = std::fs::read_to_string(&path)
                .expect("read")
                .lines()
                .count();
            let max = if module.starts_with("decision/") {
                MAX_DECISION_FILE_LINES
            } else {
                MAX_FILE_LINES
            };
            (n > max).then(|| format!("{module}.rs: {n} lines (at most {max})"))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files too long (split them by what they own):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_limiter_holds_few_fields() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("src/decision/limiter.rs"))
        .expect("read limiter.rs");
    let start = text
        .find("pub struct Limiter {")
        .expect("the Limiter struct");
    let body = &text[start..start + text[start..].find("\n}").expect("its end")];
    let fields = body
        .lines()
        .skip(1)
        .filter(|l| {
            let l = l.trim_start();
            !l.starts_with("//") && l.contains(": ")
        })
        .count();
    assert!(fields > 0, "no fields found: the checker is blind");
    assert!(
        fields <= MAX_LIMITER_FIELDS,
        "Limiter has {fields} fields (at most {MAX_LIMITER_FIELDS})"
    );
}

#[test]
fn few_public_types_name_an_outcome() {
    let words = ["Decision", "Verdict", "Decided", "Said", "Outcome"];
    let named: Vec<String> = public_types()
        .into_iter()
        .filter(|(name, _)| words.iter().any(|w| name.contains(w)))
        .map(|(name, module)| format!("{name} ({module})"))
        .collect();
    assert!(
        !named.is_empty(),
        "no such types found: the checker is blind"
    );
    assert!(
        named.len() <= MAX_OUTCOME_TYPES,
        "{} public types name an outcome (at most {MAX_OUTCOME_TYPES}): {}",
        named.len(),
        named.join(", ")
    );
}

/// The `pub` types (`struct`, `enum`, `type`, `trait`) each file of
/// `src/` declares outside its unit tests, with where.
fn public_types() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (module, path) in files() {
        for line in code(&path).lines() {
            let line = line.trim_start();
            let Some(rest) = line.strip_prefix("pub ") else {
                continue;
            };
            let Some(rest) = ["struct ", "enum ", "type ", "trait "]
                .iter()
                .find_map(|k| rest.strip_prefix(k))
            else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push((name, module.clone()));
        }
    }
    out
}

#[test]
fn no_two_public_types_share_a_name() {
    // The YAML mirror (`config/file/`) spells the file's shapes and may
    // share a name with the model it is loaded into.
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, module) in public_types() {
        if !module.starts_with("config/file") {
            seen.entry(name).or_default().push(module);
        }
    }
    assert!(
        seen.contains_key("Limiter"),
        "no types found: the checker is blind"
    );
    let twice: Vec<String> = seen
        .iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|(name, at)| format!("{name}: {}", at.join(", ")))
        .collect();
    assert!(
        twice.is_empty(),
        "public types sharing a name (a reader cannot tell them apart):\n{}",
        twice.join("\n")
    );
}

/// Each function of `text` with its first line (1-based) and the lines it
/// spans. A function ends at the first `}` at the indentation of its `fn`
/// line (rustfmt's layout); one written on one line spans one.
fn function_spans(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let mut words = body.split_whitespace().peekable();
        while let Some(w) = words.peek() {
            if w.starts_with("pub") || ["async", "const", "unsafe"].contains(w) {
                words.next();
            } else {
                break;
            }
        }
        if words.next() != Some("fn") {
            continue;
        }
        let name: String = words
            .next()
            .unwrap_or("")
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let trimmed = line.trim_end();
        if trimmed.ends_with('}') || trimmed.ends_with(';') {
            out.push((name, i + 1, 1));
            continue;
        }
        let closing = format!("{indent}}}");
        if let Some(end) = (i + 1..lines.len()).find(|&j| lines[j] == closing) {
            out.push((name, i + 1, end - i + 1));
        }
    }
    out
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let mut long = Vec::new();
    for (module, path) in files() {
        let text = std::fs::read_to_string(&path).expect("read");
        for (name, line, n) in function_spans(&text) {
            if n > MAX_FN_LINES {
                long.push(format!("{module}.rs:{line} {name}: {n} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them into named steps):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_size_checker_sees_functions() {
    let text = "fn a() {}\npub async fn b(\n    x: u8,\n) {\n    x;\n}\nimpl T {\n    pub(crate) fn c() {\n        1\n    }\n}\n";
    assert_eq!(
        function_spans(text),
        [
            ("a".to_owned(), 1, 1),
            ("b".to_owned(), 2, 5),
            ("c".to_owned(), 8, 3),
        ]
    );
}

/// The variants of `enum Algorithm` in `src/limit.rs`, read from its body.
fn algorithm_variants() -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("src/limit.rs")).expect("limit.rs");
    let start = text
        .find("pub enum Algorithm {")
        .expect("enum Algorithm in limit.rs");
    let body = &text[start..];
    let body = &body[..body.find("\n}").expect("end of enum Algorithm")];
    body.lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| l.starts_with(|c: char| c.is_ascii_uppercase()))
        .map(|l| {
            let end = l.find(|c: char| !c.is_alphanumeric()).unwrap_or(l.len());
            l[..end].to_owned()
        })
        .collect()
}

/// The files that own what differs per algorithm: `src/limit.rs` and its
/// modules (docs/development.md#where-a-change-goes, "add an algorithm").
fn owns_algorithms(module: &str) -> bool {
    module == "limit" || module.starts_with("limit/")
}

/// Where `code` names `Algorithm::<variant>` (not `JwtAlgorithm::…`).
fn named_variants(code: &str, variants: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("Algorithm::") {
        let before = rest[..i].chars().next_back();
        let after = &rest[i + "Algorithm::".len()..];
        rest = after;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let end = after
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        if variants.iter().any(|v| *v == after[..end]) {
            out.push(after[..end].to_owned());
        }
    }
    out
}

/// What differs per algorithm is asked of the algorithm, whose methods
/// match its variants exhaustively: a new variant does not compile until
/// each says what it does, and no other file decides by a variant.
#[test]
fn no_algorithm_variant_is_named_outside_the_files_that_own_them() {
    let variants = algorithm_variants();
    assert!(variants.len() >= 5, "read {variants:?} from enum Algorithm");
    let mut found = Vec::new();
    for (module, path) in files() {
        if owns_algorithms(&module) || module.ends_with("tests") {
            continue;
        }
        let code = code(&path);
        for v in named_variants(&code, &variants) {
            found.push(format!("src/{module}.rs: Algorithm::{v}"));
        }
        if code.contains("Algorithm::*") || code.contains("Algorithm::{") {
            found.push(format!("src/{module}.rs: imports Algorithm's variants"));
        }
    }
    assert!(
        found.is_empty(),
        "ask the algorithm (a method in src/limit.rs or src/limit/) instead of matching its variants: {found:#?}"
    );
}

#[test]
fn the_variant_checker_sees_variants() {
    let variants = vec!["SlidingWindow".to_owned(), "Gcra".to_owned()];
    let code = "match a { Algorithm::SlidingWindow => 1, crate::limit::Algorithm::Gcra { .. } => 2, JwtAlgorithm::Gcra => 3, Algorithm::SPELLINGS }";
    assert_eq!(named_variants(code, &variants), ["SlidingWindow", "Gcra"]);
}
