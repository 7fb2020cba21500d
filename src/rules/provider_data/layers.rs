//! Provider data comes in layers: the machine class over the chosen node's `nodes.<name>:` override
//! over the config's `defaults:`. Each layer is read on its own, with what is wrong in it, once: the
//! config's layers when the config is loaded, the class when it is used. The effective data takes
//! each top-level key whole from the highest layer that writes it (`ha` and lists are replaced,
//! never merged), and a finding about a value is reported under the path of the layer it came from
//! (`nodes.pve2.network_bridge`, `defaults.cores`).
//!
//! A layer is checked against the schema (every problem at once, with its key path), then read
//! into [`Keys`] leaving out each wrong value, so one wrong value does not hide the next.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use serde_json::{Map, Value};
use serde_path_to_error::Segment;

use super::keys::Keys;
use super::leave_out::read_leaving_out;
use super::schema::{self, inner_keys, top_keys};
use super::{LayerCheck, Problem, json_kind};
use crate::did_you_mean;
use crate::proxmox::property::NodeName;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Note {
    Problem(String),
    /// A key the provider does not know: ignored with a warning, as the official provider ignores it
    /// silently, or refused when the config says `strict: true`. The text is the "did you mean".
    Unknown(String),
}

/// One finding, its path relative to the layer (`additional_disks[1].disk_size`). Findings are
/// reported as one reading of the merged document would make them: the schema's, the missing
/// required keys, each key as it is read, then the rules between keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Finding {
    pub path: String,
    pub note: Note,
}

impl Finding {
    pub fn problem(path: &str, message: String) -> Self {
        let (path, note) = (path.to_string(), Note::Problem(message));
        Self { path, note }
    }
}

/// The top-level key a path is in, which decides the layer a finding about it is reported from.
fn top_key(path: &str) -> &str {
    path.split(['.', '[']).next().unwrap_or_default()
}

/// A report adds problems once per key path (the schema and the typed reading could both complain
/// about a mistyped value), and warnings, with their layer's path.
impl LayerCheck {
    pub(super) fn add(&mut self, prefix: &str, finding: &Finding, strict: bool) {
        let key = if finding.path.is_empty() {
            prefix.trim_end_matches('.').to_string()
        } else {
            format!("{prefix}{}", finding.path)
        };
        match &finding.note {
            Note::Problem(message) => self.problem(key, message.clone()),
            Note::Unknown(hint) if strict => self.problem(
                key,
                format!("is not a known key{hint} (refused because the provider config has `strict: true`)"),
            ),
            Note::Unknown(hint) => self.warnings.push(Problem {
                key,
                message: format!("is not a known key and is ignored{hint}"),
            }),
        }
    }

    pub(super) fn problem(&mut self, key: String, message: String) {
        if !self.problems.iter().any(|p| p.key == key) {
            self.problems.push(Problem { key, message });
        }
    }
}

/// The schema the declarations generate, compiled once for the process.
static VALIDATOR: LazyLock<Result<jsonschema::Validator, String>> =
    LazyLock::new(|| jsonschema::validator_for(&schema::schema()).map_err(|e| e.to_string()));

fn schema_findings(value: &Value) -> Vec<Finding> {
    let validator = match VALIDATOR.as_ref() {
        Ok(v) => v,
        Err(e) => {
            let message = format!("the provider-data JSON schema is invalid: {e}");
            return vec![Finding::problem("", message)];
        }
    };
    use jsonschema::error::ValidationErrorKind as Kind;
    use jsonschema::paths::LocationSegment;
    let finding = |error: jsonschema::ValidationError<'_>| {
        let key = error
            .instance_path()
            .iter()
            .fold(String::new(), |key, s| match s {
                LocationSegment::Index(index) => join(&key, Ok(index)),
                LocationSegment::Property(name) => join(&key, Err(&name)),
            });
        let (key, message) = match error.kind() {
            Kind::Required { property } => {
                let property = property.as_str().unwrap_or_default();
                (join(&key, Err(property)), "is required here".to_string())
            }
            // The validator's own message quotes the value: a class author's 70 KB string would
            // land whole in the status and the log.
            Kind::MaxLength { limit } => {
                let length = error.instance().as_str().map_or(0, |s| s.chars().count());
                let message = format!("is {length} characters long, more than the {limit} allowed");
                (key, message)
            }
            Kind::Enum { options } => (key, not_one_of(error.instance(), options)),
            _ => (key, crate::rules::shortened(&error.to_string(), 400, 400)),
        };
        Finding::problem(&key, message)
    };
    validator.iter_errors(value).map(finding).collect()
}

/// A value outside a key's list of values: the whole list, and the closest value when the given one
/// looks like a typo of it.
fn not_one_of(value: &Value, options: &Value) -> String {
    // Every choice the declarations make is a string.
    let known: Vec<&str> = options
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let hint = value
        .as_str()
        .map(|v| crate::did_you_mean::hint(v, &known))
        .unwrap_or_default();
    format!("{value} is not one of {}{hint}", known.join(", "))
}

/// `additional_disks[1].disk_size`: `path` with a list index or a key name after it.
fn join(path: &str, next: Result<usize, &str>) -> String {
    match next {
        Ok(index) => format!("{path}[{index}]"),
        Err(name) if path.is_empty() => name.to_string(),
        Err(name) => format!("{path}.{name}"),
    }
}

/// One layer of provider data, read.
#[derive(Debug, Clone, Default)]
pub(super) struct Layer {
    /// The top-level keys written, `null` included: it still hides a lower layer's value.
    written: BTreeSet<String>,
    /// The known top-level keys whose values read without a problem.
    valid: Map<String, Value>,
    /// The schema's findings (or that the layer is not a mapping), then the reading's.
    schema: Vec<Finding>,
    read: Vec<Finding>,
}

impl Layer {
    /// Reads one layer on its own, as it is given: a mapping, nothing (`null`, in the config), or a
    /// mistake. The schema, then the keys (no required keys, no rules between keys: those need
    /// every layer).
    pub(super) fn read(mut root: Value) -> Self {
        let written = match &root {
            Value::Object(map) => map.keys().cloned().collect(),
            Value::Null => return Self::default(),
            other => {
                let kind = json_kind(other);
                let message = format!("must be a mapping of provider-data keys, not {kind}");
                let schema = vec![Finding::problem("", message)];
                return Self {
                    schema,
                    ..Self::default()
                };
            }
        };
        let schema = schema_findings(&root);
        let covered =
            |path: &str| (schema.iter()).any(|r| within(&r.path, path) || within(path, &r.path));
        let (mut read, mut wrong) = (Vec::new(), BTreeSet::new());
        let keys: Option<Keys> = read_leaving_out(&mut root, |refused| {
            if let Some((key, known)) = refused.unknown() {
                let parent = key_path(&refused.path[..refused.path.len() - 1]);
                let path = join(&parent, Err(shown(key)));
                let note = Note::Unknown(did_you_mean::hint(key, &known));
                read.push(Finding { path, note });
                return;
            }
            let path = key_path(&refused.path);
            wrong.insert(top_key(&path).to_owned());
            // A required key missing from an item is the schema's to report (or left so by a value
            // refused in it).
            if !refused.said.starts_with("missing field") && !covered(&path) {
                read.push(Finding::problem(&path, refused.said));
            }
        });
        let mut valid = root.as_object_mut().map(std::mem::take).unwrap_or_default();
        valid.retain(|key, _| !wrong.contains(key) && !covered(key));
        for (path, message) in keys.as_ref().map(layer_rules).unwrap_or_default() {
            if valid.contains_key(top_key(path)) {
                read.push(Finding::problem(path, message));
            }
        }
        read.sort_by_key(reading_order);
        Self {
            written,
            valid,
            schema,
            read,
        }
    }

    /// What is wrong with the layer on its own, under `prefix` (`nodes.pve2.`).
    pub(super) fn check(&self, prefix: &str, strict: bool) -> LayerCheck {
        let mut report = LayerCheck::default();
        for finding in self.schema.iter().chain(&self.read) {
            report.add(prefix, finding, strict);
        }
        report
    }
}

/// Whether key path `path` is `parent` or inside it (`tags[1]` is inside `tags`, not `tag`).
fn within(path: &str, parent: &str) -> bool {
    path.strip_prefix(parent)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
}

/// An empty key (`"": 1`) is shown quoted, or the problem would name no key at all.
fn shown(key: &str) -> &str {
    if key.is_empty() { "\"\"" } else { key }
}

/// `additional_disks[1].disk_size`, as serde names a path.
fn key_path(path: &[Segment]) -> String {
    path.iter()
        .fold(String::new(), |key, segment| match segment {
            Segment::Seq { index } => join(&key, Ok(*index)),
            other => join(&key, Err(&other.to_string())),
        })
}

/// Where a finding of the reading goes in a layer's report, as one reading of the document goes:
/// the unknown top-level keys, then the known ones in declaration order, each item of a list in
/// turn, its unknown keys before its wrong values, those in declaration order; what is about a key
/// as a whole (a rule within its value) after its items.
fn reading_order(f: &Finding) -> (Option<usize>, usize, bool, Option<usize>) {
    let top = top_key(&f.path);
    let rest = &f.path[top.len()..];
    let item = rest.strip_prefix('[').and_then(|r| r.split(']').next());
    let inner = rest.split('.').nth(1).and_then(|k| k.split('[').next());
    (
        top_keys().iter().position(|k| *k == top),
        item.and_then(|i| i.parse().ok()).unwrap_or(usize::MAX),
        matches!(f.note, Note::Problem(_)),
        inner.and_then(|k| inner_keys(top).iter().position(|n| *n == k)),
    )
}

/// The rules within one key's value: `spread: true` is `resource_affinity: negative`, so the two
/// may not contradict; Proxmox has 31 more NIC slots.
fn layer_rules(keys: &Keys) -> Vec<(&'static str, String)> {
    let mut found = Vec::new();
    if let Some(ha) = &keys.ha
        && ha.spread == Some(true)
        && ha.resource_affinity == Some(super::values::ResourceAffinity::Positive)
    {
        found.push(("ha.spread", "keeps the set's VMs on different nodes, but `resource_affinity: positive` keeps them together: remove one of the two".to_string()));
    }
    if keys.additional_nics.len() > 31 {
        found.push((
            "additional_nics",
            "at most 31 additional NICs fit (net1 to net31)".to_string(),
        ));
    }
    found
}

/// The layers of one request, highest precedence first, each with the path prefix its findings are
/// reported under.
pub(super) struct Stack<'a> {
    layers: Vec<(String, &'a Layer)>,
}

impl<'a> Stack<'a> {
    /// The class over `node`'s override in `config` (once the node is known) over `defaults:`.
    pub fn new(class: &'a Layer, config: &'a ConfigLayers, node: Option<&str>) -> Self {
        let mut layers = vec![(String::new(), class)];
        let over = config
            .nodes
            .iter()
            .filter(|(n, _)| Some(n.as_str()) == node);
        layers.extend(over.map(|(name, layer)| (format!("nodes.{name}."), layer)));
        layers.push(("defaults.".to_string(), &config.defaults));
        Self { layers }
    }

    /// The prefix of the layer `key`'s value comes from ("" when none writes it).
    pub fn prefix_of(&self, key: &str) -> &str {
        self.layers
            .iter()
            .find(|(_, l)| l.written.contains(top_key(key)))
            .map_or("", |(p, _)| p.as_str())
    }

    pub fn writes(&self, key: &str) -> bool {
        self.layers.iter().any(|(_, l)| l.written.contains(key))
    }

    /// Unknown keys written in any layer (each once), in name order.
    pub fn unknown_keys(&self) -> BTreeSet<&str> {
        let written = self.layers.iter().flat_map(|(_, l)| &l.written);
        written
            .map(String::as_str)
            .filter(|k| !top_keys().contains(k))
            .collect()
    }

    /// The keys that take effect: each from the highest layer writing it, left to its default when
    /// that layer's value is wrong (its problem is reported).
    pub fn keys(&self) -> Result<Keys, Vec<Problem>> {
        let mut merged = Map::new();
        for (_, layer) in self.layers.iter().rev() {
            for key in &layer.written {
                match layer.valid.get(key) {
                    Some(value) => merged.insert(key.clone(), value.clone()),
                    None => merged.remove(key),
                };
            }
        }
        // Every value read on its own already, so reading them together cannot fail.
        serde_json::from_value(Value::Object(merged)).map_err(|e| {
            let (key, message) = ("provider_data".into(), e.to_string());
            vec![Problem { key, message }]
        })
    }

    /// Adds to `report` the reading's (`read`) or the schema's findings about the values that take
    /// effect (those of the highest layer writing each key), in the order one reading of the merged
    /// document would make them.
    pub fn report(&self, read: bool, report: &mut LayerCheck, strict: bool) {
        let mut out: Vec<(&str, &Finding)> = self
            .layers
            .iter()
            .flat_map(|(prefix, layer)| {
                let findings = if read { &layer.read } else { &layer.schema };
                findings
                    .iter()
                    .filter(move |f| self.prefix_of(top_key(&f.path)) == prefix)
                    .map(move |f| (prefix.as_str(), f))
            })
            .collect();
        // The schema reports keys in name order; reading goes through unknown keys (in name order),
        // then the known ones in declaration order.
        out.sort_by_key(
            |(_, f)| match top_keys().iter().position(|k| *k == top_key(&f.path)) {
                Some(n) if read => (1, n, String::new()),
                _ => (0, 0, top_key(&f.path).to_string()),
            },
        );
        for (prefix, finding) in out {
            report.add(prefix, finding, strict);
        }
    }
}

/// The provider config's `defaults:` and `nodes:`, read once when the config is loaded, and how
/// every layer is checked.
#[derive(Debug, Clone, Default)]
pub struct ConfigLayers {
    defaults: Layer,
    /// In the config's order.
    nodes: Vec<(String, Layer)>,
    /// `strict: true` in the config: unknown keys are problems instead of warnings.
    pub strict: bool,
}

impl ConfigLayers {
    pub fn read(defaults: &Map<String, Value>, nodes: &Map<String, Value>, strict: bool) -> Self {
        Self {
            defaults: Layer::read(Value::Object(defaults.clone())),
            nodes: nodes
                .iter()
                .map(|(name, value)| (name.clone(), Layer::read(value.clone())))
                .collect(),
            strict,
        }
    }

    /// What checking the machine class on its own finds.
    pub fn check_class(&self, class: &Map<String, Value>) -> LayerCheck {
        Layer::read(Value::Object(class.clone())).check("", self.strict)
    }

    /// Top-level `key` under the path of the highest layer writing it (`nodes.pve2.memory`,
    /// `defaults.memory`), for a class writing the keys of `class` on `node`: where the user changes it.
    pub fn key_path(&self, class: &Map<String, Value>, key: &str, node: Option<&str>) -> String {
        let class_layer = Layer {
            written: class.keys().cloned().collect(),
            ..Layer::default()
        };
        let stack = Stack::new(&class_layer, self, node);
        format!("{}{key}", stack.prefix_of(key))
    }

    /// Problems and warnings of `defaults:` and every `nodes.<name>:`.
    pub fn check(&self) -> LayerCheck {
        let mut found = self.defaults.check("defaults.", self.strict);
        for (node, layer) in &self.nodes {
            let prefix = format!("nodes.{node}.");
            if let Err(e) = NodeName::new(node.clone()) {
                found.problem(format!("nodes.{node}"), e.to_string());
            }
            let layer_found = layer.check(&prefix, self.strict);
            found.problems.extend(layer_found.problems);
            found.warnings.extend(layer_found.warnings);
            for key in top_keys()
                .iter()
                .filter(|k| !schema::per_node(k) && layer.written.contains(**k))
            {
                found.problems.push(Problem {
                    key: format!("{prefix}{key}"),
                    message: "cannot be set per node: it decides which node is chosen; set it under `defaults:` or in the machine class".into(),
                });
            }
        }
        found
    }
}
