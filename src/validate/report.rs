//! What the checks found, and how it is shown to people and scripts.

use std::fmt::{self, Write as _};

use serde::Serialize;

use crate::rules::provider_data::Problem;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Fine.
    Pass,
    /// Could not be checked (the cluster does not offer the data); says why.
    Skipped,
    /// Worth knowing, but provisioning can work (a candidate node is offline, ...).
    Warning,
    /// Provisioning would fail (or fail on some node): fix the key named.
    Problem,
}

impl Outcome {
    /// The word of the text report, in the order of the variants; four wide whatever the findings,
    /// so reports line up with each other.
    fn label(self) -> &'static str {
        ["ok  ", "skip", "warn", "FAIL"][self as usize]
    }

    /// A finding of this outcome about `key`, on no node in particular (see [`Finding::on`]).
    pub(crate) fn finding(self, key: impl Into<String>, message: impl Into<String>) -> Finding {
        Finding {
            outcome: self,
            key: key.into(),
            node: None,
            message: message.into(),
        }
    }

    /// The provider data's `problems` (or warnings) as findings of this outcome.
    pub(crate) fn findings(self, problems: Vec<Problem>) -> impl Iterator<Item = Finding> {
        problems
            .into_iter()
            .map(move |p| self.finding(p.key, p.message))
    }
}

/// One result: which key, on which node, and what was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub outcome: Outcome,
    /// The key to change, with the layer it came from: `storage_selector`,
    /// `additional_disks[0].storage_selector`, `nodes.pve2.network_bridge`, `defaults.template`.
    pub key: String,
    /// The node the finding is about, when it is about one.
    pub node: Option<String>,
    pub message: String,
}

impl Finding {
    /// The finding about `node`.
    pub(crate) fn on(self, node: impl Into<String>) -> Self {
        Self {
            node: Some(node.into()),
            ..self
        }
    }
}

/// `a, b, c`, or `none`.
pub(crate) fn list_or_none<S: std::borrow::Borrow<str>>(items: &[S]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.node {
            Some(node) => write!(f, "{} (on {node}): {}", self.key, self.message),
            None => write!(f, "{}: {}", self.key, self.message),
        }
    }
}

/// Everything found, in check order. `ok` is false when there is at least one problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub ok: bool,
    pub problems: usize,
    pub warnings: usize,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn new(findings: Vec<Finding>) -> Self {
        let count = |o| findings.iter().filter(|f| f.outcome == o).count();
        let problems = count(Outcome::Problem);
        Self {
            ok: problems == 0,
            problems,
            warnings: count(Outcome::Warning),
            findings,
        }
    }

    /// The report for people: one line per finding, then a verdict.
    pub fn render_text(&self) -> String {
        let rows = self.findings.iter().map(|f| {
            let (label, node) = (f.outcome.label(), f.node.as_deref().unwrap_or("-"));
            vec![label.into(), f.key.clone(), node.into(), f.message.clone()]
        });
        let mut out = String::new();
        crate::table::render(&mut out, "", &[], rows);
        out.push('\n');
        if self.ok {
            let _ = writeln!(out, "OK: no problems found ({} warning(s)).", self.warnings);
        } else {
            let _ = writeln!(
                out,
                "{} problem(s), {} warning(s): fix the keys marked FAIL before using this provider data.",
                self.problems, self.warnings
            );
        }
        out
    }
}
