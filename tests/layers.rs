//! The crate's layers, checked: each top-level module imports only from the layers below it, so the
//! rules never depend on the steps, the steps never on the controller, and nothing on `cli`
//! (`docs/architecture.md`, "Layers"). A `use crate::x` or `crate::x::` path that climbs fails here.
//! Within a layer, no two sibling files import each other, and no function of the shipped code is
//! longer than 80 lines: a reader finds each concept in one place, in a piece that fits a screen.

use std::collections::BTreeMap;
use std::path::Path;

/// Bottom first. A module may use any module of a lower layer, and none of its own layer or above.
const LAYERS: &[&[&str]] = &[
    &[
        "secret",
        "fence",
        "contain",
        "tls",
        "error_chain",
        "yaml",
        "did_you_mean",
        "table",
    ],
    &["metrics", "telemetry"],
    &["proxmox", "omni"],
    &["model"],
    &["rules"],
    &["config"],
    &["pipeline"],
    &["validate"],
    &["controller"],
    &["cli"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules a file names through `crate::`, outside comments.
fn used_modules(text: &str) -> Vec<String> {
    let mut used = Vec::new();
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            used.push(name);
        }
    }
    used
}

#[test]
fn every_module_imports_only_from_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut climbing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut unplaced = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let top = rel
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_owned();
        if top == "lib" || top == "main" {
            continue;
        }
        let Some(own) = layer_of(&top) else {
            unplaced.push(top);
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        for used in used_modules(&text) {
            if used == top {
                continue;
            }
            match layer_of(&used) {
                Some(l) if l < own => {}
                _ => climbing
                    .entry(rel.clone())
                    .or_default()
                    .push(format!("crate::{used}")),
            }
        }
    }
    unplaced.sort();
    unplaced.dedup();
    assert!(
        unplaced.is_empty(),
        "modules not placed in LAYERS: {unplaced:?}"
    );
    assert!(
        climbing.is_empty(),
        "imports from the same or a higher layer: {climbing:#?}"
    );
}

/// The shipped code of a file: its lines before its `#[cfg(test)]` module. Files that are tests
/// themselves (`tests.rs`, anything under a `tests/` folder) have none.
fn shipped_lines(src: &Path, file: &Path) -> Vec<String> {
    let rel = file
        .strip_prefix(src)
        .unwrap()
        .to_string_lossy()
        .into_owned();
    if rel.ends_with("tests.rs") || rel.contains("/tests/") {
        return Vec::new();
    }
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"))
        .map(str::to_owned)
        .collect()
}

/// Whether `line` starts a function: `fn`, after visibility, `const` and `async` if any.
fn starts_function(line: &str) -> bool {
    let mut rest = line.trim_start();
    for prefix in ["pub(crate) ", "pub(super) ", "pub ", "const ", "async "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    rest.starts_with("fn ")
}

/// Each function of the shipped code longer than `limit` lines, with its file and first line. A
/// function ends where the braces its body opens are closed again.
fn long_functions(src: &Path, limit: usize) -> Vec<String> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut long = Vec::new();
    for file in files {
        let lines = shipped_lines(src, &file);
        let mut i = 0;
        while i < lines.len() {
            if !starts_function(&lines[i]) {
                i += 1;
                continue;
            }
            let (mut depth, mut opened, mut end) = (0i32, false, i);
            for (j, line) in lines.iter().enumerate().skip(i) {
                let code = line.split("//").next().unwrap_or("");
                for c in code.chars() {
                    match c {
                        '{' => (depth, opened) = (depth + 1, true),
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                end = j;
                if (opened && depth <= 0) || (!opened && code.trim_end().ends_with(';')) {
                    break;
                }
            }
            if end + 1 - i > limit {
                long.push(format!(
                    "{}:{} ({} lines)",
                    file.display(),
                    i + 1,
                    end + 1 - i
                ));
            }
            i = end + 1;
        }
    }
    long
}

#[test]
fn no_function_is_longer_than_80_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let long = long_functions(&src, 80);
    assert!(long.is_empty(), "functions over 80 lines: {long:#?}");
}

/// Where a file sits among its siblings: the folder they share, the file's own module name, and the
/// module path of that folder. A folder module (`x/mod.rs`) is the sibling `x` of its folder.
fn place(src: &Path, file: &Path) -> (std::path::PathBuf, String, String) {
    let (dir, own) = if file.file_stem().is_some_and(|s| s == "mod") {
        let folder = file.parent().unwrap();
        (folder.parent().unwrap(), folder.file_name().unwrap())
    } else {
        (file.parent().unwrap(), file.file_stem().unwrap())
    };
    let module = dir
        .strip_prefix(src)
        .unwrap()
        .to_string_lossy()
        .replace('/', "::");
    (dir.to_owned(), own.to_string_lossy().into_owned(), module)
}

/// The first segment of each item of the `{…}` groups that follow `prefix` in `code`:
/// `super::{a::X, b}` names `a` and `b`.
fn grouped(code: &str, prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in code.match_indices(&format!("{prefix}{{")) {
        let (mut depth, mut item_start) = (0, true);
        let mut current = String::new();
        for c in code[at + prefix.len()..].chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                ',' if depth == 1 => {
                    if !current.is_empty() {
                        names.push(std::mem::take(&mut current));
                    }
                    item_start = true;
                }
                _ if depth == 1 && item_start => {
                    if c.is_ascii_alphanumeric() || c == '_' {
                        current.push(c);
                    } else if !current.is_empty() {
                        names.push(std::mem::take(&mut current));
                        item_start = false;
                    }
                }
                _ => {}
            }
        }
        if !current.is_empty() {
            names.push(current);
        }
    }
    names
}

/// The sibling modules (files or folders beside it) that the shipped code of `file` names, through
/// `super::` or its full `crate::` path, alone or in a `{…}` group.
fn siblings_named(src: &Path, file: &Path) -> Vec<String> {
    let (dir, own, module_of_dir) = place(src, file);
    let code: String = shipped_lines(src, file)
        .iter()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| format!("{l}\n"))
        .collect();
    let names_path = |path: &str| {
        code.match_indices(path).any(|(at, _)| {
            !code[at + path.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        })
    };
    let full = format!("crate::{module_of_dir}::");
    let mut in_groups = grouped(&code, "super::");
    if !module_of_dir.is_empty() {
        in_groups.extend(grouped(&code, &full));
    }
    let mut named = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == own || ["mod", "lib", "main", "tests"].contains(&name.as_str()) {
            continue;
        }
        if names_path(&format!("super::{name}"))
            || (!module_of_dir.is_empty() && names_path(&format!("{full}{name}")))
            || in_groups.contains(&name)
        {
            named.push(name);
        }
    }
    named
}

#[test]
fn no_two_sibling_files_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut cycles = Vec::new();
    for file in &files {
        if file.parent() == Some(src.as_path())
            && file.file_stem().is_some_and(|s| s == "lib" || s == "main")
        {
            continue;
        }
        let (dir, own, _) = place(&src, file);
        for sibling in siblings_named(&src, file) {
            let other = [
                dir.join(format!("{sibling}.rs")),
                dir.join(&sibling).join("mod.rs"),
            ]
            .into_iter()
            .find(|p| p.exists());
            let Some(other) = other else {
                continue;
            };
            if own < sibling && siblings_named(&src, &other).contains(&own) {
                cycles.push(format!("{} <-> {}", file.display(), other.display()));
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "sibling files importing each other: {cycles:#?}"
    );
}
