//! The repository documents itself: no file points at notes that live outside it, and every `§N.M` a
//! code comment cites is a section of `docs/omni-protocol.md`.

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Text files of the project a reader follows references from (the test venv and build output are
/// not the project's).
fn project_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for top in [
        "src", "testkit", "tests", "examples", "scripts", "docs", "proto", "schema", ".ci",
    ] {
        collect(&Path::new(ROOT).join(top), &mut files);
    }
    for single in [
        "README.md",
        "BENCHMARKS.md",
        "Makefile",
        "Dockerfile",
        "Cargo.toml",
        "build.rs",
    ] {
        files.push(Path::new(ROOT).join(single));
    }
    files
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "__pycache__") {
                continue;
            }
            collect(&path, out);
        } else {
            out.push(path);
        }
    }
}

#[test]
fn no_file_refers_to_notes_outside_the_repository() {
    // Built from pieces so this file does not match itself.
    let outside = [
        format!("../{}", "shared"),
        format!("shared/{}", "reference"),
        format!("design{}", ".md"),
        format!("upstream-cost{}", ".md"),
        format!("landscape{}", ".md"),
        format!("omni-infra-protocol{}", ".md"),
        format!("reference {}", "§"),
        format!("design {}", "§"),
    ];
    let mut hits = Vec::new();
    for file in project_files() {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (no, line) in text.lines().enumerate() {
            if outside.iter().any(|needle| line.contains(needle.as_str())) {
                hits.push(format!("{}:{}: {}", file.display(), no + 1, line.trim()));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "lines pointing outside the repository:\n{}",
        hits.join("\n")
    );
}

#[test]
fn every_cited_protocol_section_exists() {
    let protocol = std::fs::read_to_string(Path::new(ROOT).join("docs/omni-protocol.md")).unwrap();
    let headings: Vec<String> = protocol
        .lines()
        .filter(|l| l.starts_with('#'))
        .filter_map(|l| l.trim_start_matches('#').split_whitespace().next())
        .map(|n| n.trim_end_matches('.').to_string())
        .collect();
    let mut missing = Vec::new();
    for file in project_files() {
        if file.extension().is_none_or(|e| e != "rs") || file.ends_with("tests/docs.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (at, _) in text.match_indices('§') {
            let number: String = text[at + '§'.len_utf8()..]
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let number = number.trim_end_matches('.');
            if number.is_empty() || !headings.iter().any(|h| h == number) {
                missing.push(format!("{}: §{number}", file.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "sections cited but not in docs/omni-protocol.md:\n{}",
        missing.join("\n")
    );
}
