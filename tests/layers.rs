//! The crate's layers, checked: each top-level module imports only from the layers below it, so the
//! rules never depend on the steps, the steps never on the controller, and nothing on `cli`
//! (`docs/architecture.md`, "Layers"). A `use crate::x` or `crate::x::` path that climbs fails here.

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
