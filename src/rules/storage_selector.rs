//! CEL storage selectors (`storage_selector`, `additional_disks[].storage_selector`,
//! `iso_storage_selector`), compiled and checked once when provider data is accepted.
//!
//! The Go provider compiles the selector only when it creates the VM, so a typo surfaces late and
//! cryptically. The `cel` crate has no type checker, so we check by running the program against a
//! dummy storage with every variable set: an undeclared variable, a type mismatch or a non-boolean
//! result shows up there, at validation time, with the expression in the message.
//!
//! Selectors are written by machine-class authors, who need not be Proxmox administrators, so a
//! selector is bounded before it costs anything: at most [`MAX_LEN`] characters before the parser
//! sees it, only the grammar a condition over one storage needs (see [`grammar`]), so evaluation
//! takes time linear in its length, and every evaluation runs on a thread of its own
//! ([`evaluator`]) within [`BUDGET`]. Compiled selectors are cached by their text: every reconcile
//! and every topology round reads the class again.

mod evaluator;
pub mod grammar;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cel::Program;

use crate::model::StorageSnapshot;
use crate::proxmox::property::StorageId;
use evaluator::{Outcome, Refusal};

/// The longest selector accepted, in characters: real selectors are a line; the limit keeps the
/// parser (which fails on columns past 65,535) and every later step cheap.
pub const MAX_LEN: usize = 1024;

/// How long one evaluation may take. A selector within the grammar takes microseconds.
pub const BUDGET: Duration = Duration::from_millis(250);

/// A compiled, checked selector. Cheap to clone.
#[derive(Clone)]
pub struct StorageSelector {
    source: Arc<str>,
    program: Arc<Program>,
}

/// Why a selector is unusable. Always names the expression (shortened when it is too long).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error(
        "storage selector {expression:?} is empty: write an expression such as `name == \"local-lvm\"`"
    )]
    Empty { expression: String },
    #[error(
        "storage selector {expression:?} is {length} characters long, more than the {MAX_LEN} allowed: write a shorter condition"
    )]
    TooLong { expression: String, length: usize },
    #[error("storage selector {expression:?} does not compile: {reason}")]
    Syntax { expression: String, reason: String },
    #[error(
        "storage selector {expression:?} uses {what}, which selectors do not allow: {}",
        grammar::ALLOWED
    )]
    NotAllowed { expression: String, what: String },
    #[error(
        "storage selector {expression:?} is a bare name, not a condition: write `name == \"{expression}\"` to select that storage"
    )]
    BareName { expression: String },
    #[error(
        "storage selector {expression:?} gives {kind}, not true/false: write a condition over name, node, storageType (strings) and availableSpace (bytes, uint), e.g. `name == \"local-lvm\"`"
    )]
    NotBoolean { expression: String, kind: String },
    #[error(
        "storage selector {expression:?} fails: {reason} (variables: name, node, storageType are strings, availableSpace is a uint; write `availableSpace > 10u * 1024u * 1024u * 1024u` for sizes)"
    )]
    Evaluation { expression: String, reason: String },
    #[error(
        "storage selector {expression:?} took longer than {BUDGET:?} to evaluate: write a simpler condition"
    )]
    TooSlow { expression: String },
}

const VARIABLES: [&str; 4] = ["name", "node", "storageType", "availableSpace"];

/// Compiled selectors (and refusals) by text, so a class read again costs a lookup.
type Cache = BTreeMap<Arc<str>, Result<StorageSelector, SelectorError>>;

/// Distinct selectors kept; past it the cache starts over (classes rarely hold more than a few).
const CACHE_ENTRIES: usize = 512;

fn cache() -> std::sync::MutexGuard<'static, Cache> {
    static CACHE: Mutex<Cache> = Mutex::new(BTreeMap::new());
    CACHE.lock().unwrap_or_else(|p| p.into_inner())
}

impl StorageSelector {
    /// Compiles `expression` and checks it against a dummy storage (once per distinct text).
    pub fn new(expression: &str) -> Result<Self, SelectorError> {
        if let Some(known) = cache().get(expression) {
            return known.clone();
        }
        let verdict = Self::compile(expression);
        let mut cache = cache();
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        // A text too long to be a selector is not worth remembering: it is refused before parsing.
        // Running out of time may be the machine's load, not the selector's: asked again, it runs.
        let lasting = !matches!(verdict, Err(SelectorError::TooSlow { .. }));
        if lasting && expression.len() <= MAX_LEN * 4 {
            cache.insert(Arc::from(expression), verdict.clone());
        }
        verdict
    }

    fn compile(text: &str) -> Result<Self, SelectorError> {
        let expression = super::shortened(text, 160, 80);
        if text.trim().is_empty() {
            return Err(SelectorError::Empty { expression });
        }
        let length = text.chars().count();
        if length > MAX_LEN {
            return Err(SelectorError::TooLong { expression, length });
        }
        Err(match evaluator::parse(Arc::from(text), BUDGET) {
            Some(Ok(program)) => {
                let (source, program) = (Arc::from(text), Arc::new(program));
                return Self { source, program }.check_on_dummy();
            }
            Some(Err(Refusal::Syntax(_))) if looks_like_storage_name(text) => {
                SelectorError::BareName { expression }
            }
            Some(Err(Refusal::Syntax(reason))) => SelectorError::Syntax { expression, reason },
            Some(Err(Refusal::NotAllowed(what))) => SelectorError::NotAllowed { expression, what },
            None => SelectorError::TooSlow { expression },
        })
    }

    /// Runs the selector on a dummy storage, where a mistake that only evaluation finds shows.
    fn check_on_dummy(self) -> Result<Self, SelectorError> {
        let expression = &*self.source;
        let dummy = StorageSnapshot {
            name: StorageId::known("local-lvm"),
            storage_type: "lvmthin".into(),
            content: Vec::new(),
            active: true,
            shared: false,
            available: 1 << 40,
        };
        let bare_name =
            looks_like_storage_name(expression) && !VARIABLES.contains(&expression.trim());
        match self.matches(&dummy, "pve") {
            Ok(_) => Ok(self),
            Err(SelectorError::NotBoolean { expression, .. })
            | Err(SelectorError::Evaluation { expression, .. })
                if bare_name =>
            {
                Err(SelectorError::BareName { expression })
            }
            // Arithmetic overflow depends on the real numbers; everything else is a mistake.
            Err(SelectorError::Evaluation { reason, .. }) if reason.contains("verflow") => Ok(self),
            Err(e) => Err(e),
        }
    }

    /// Whether `storage` of `node` is selected. A runtime error is a configuration error.
    pub fn matches(&self, storage: &StorageSnapshot, node: &str) -> Result<bool, SelectorError> {
        let expression = self.source.to_string();
        let (program, storage) = (self.program.clone(), storage.clone());
        match evaluator::run(program, storage, node.to_owned(), BUDGET) {
            Some(Outcome::Bool(b)) => Ok(b),
            Some(Outcome::Other(kind)) => Err(SelectorError::NotBoolean { expression, kind }),
            Some(Outcome::Failed(reason)) => Err(SelectorError::Evaluation { expression, reason }),
            None => Err(SelectorError::TooSlow { expression }),
        }
    }
}

/// `local-lvm`, `ceph_pool`, `local`: something that reads as a storage ID rather than a condition.
fn looks_like_storage_name(expression: &str) -> bool {
    let e = expression.trim();
    !e.is_empty()
        && e.starts_with(|c: char| c.is_ascii_alphabetic())
        && e.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !matches!(e, "true" | "false")
}

impl fmt::Debug for StorageSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StorageSelector")
            .field(&&*self.source)
            .finish()
    }
}

impl fmt::Display for StorageSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl PartialEq for StorageSelector {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for StorageSelector {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A storage as the selector sees it, on node `pve1`.
    fn facts() -> StorageSnapshot {
        StorageSnapshot {
            name: StorageId::known("local-lvm"),
            storage_type: "lvmthin".into(),
            content: Vec::new(),
            active: true,
            shared: false,
            available: 73_014_444_032,
        }
    }

    #[test]
    fn evaluates_like_the_go_provider() {
        for (expr, expected) in [
            ("name == \"local-lvm\" && availableSpace > 100", true),
            ("availableSpace > 100u", true),
            ("availableSpace >= 50 * 1024 * 1024 * 1024", true),
            ("availableSpace / 1073741824u > 50u", true),
            ("storageType in [\"lvmthin\",\"zfspool\"]", true),
            ("name.startsWith(\"local\") && node == \"pve1\"", true),
            ("name.matches(\"^local-.*$\")", true),
            ("name == \"ceph\"", false),
            ("true", true),
        ] {
            let selector = StorageSelector::new(expr).unwrap();
            assert_eq!(selector.matches(&facts(), "pve1"), Ok(expected), "{expr}");
            assert_eq!(selector.to_string(), expr);
        }
    }

    #[test]
    fn rejects_mistakes_with_the_expression_in_the_message() {
        let bare = StorageSelector::new("local-lvm").unwrap_err();
        assert_eq!(
            bare,
            SelectorError::BareName {
                expression: "local-lvm".into()
            }
        );
        assert!(bare.to_string().contains("name == \"local-lvm\""));
        assert!(matches!(
            StorageSelector::new("local").unwrap_err(),
            SelectorError::BareName { .. }
        ));
        assert!(matches!(
            StorageSelector::new("name").unwrap_err(),
            SelectorError::NotBoolean { .. }
        ));
        assert!(matches!(
            StorageSelector::new("name == \"a\" &&").unwrap_err(),
            SelectorError::Syntax { .. }
        ));
        assert!(matches!(
            StorageSelector::new("unknownVar == 1").unwrap_err(),
            SelectorError::Evaluation { .. }
        ));
        assert!(matches!(
            StorageSelector::new("availableSpace > \"x\"").unwrap_err(),
            SelectorError::Evaluation { .. }
        ));
        assert!(matches!(
            StorageSelector::new("  ").unwrap_err(),
            SelectorError::Empty { .. }
        ));
        let err = StorageSelector::new("unknownVar == 1")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknownVar == 1"), "{err}");
    }

    #[test]
    fn runtime_errors_are_configuration_errors() {
        let selector = StorageSelector::new("availableSpace - 100000000000u > 0u").unwrap();
        let err = selector.matches(&facts(), "pve1").unwrap_err();
        assert!(matches!(err, SelectorError::Evaluation { .. }));
        assert!(err.to_string().contains("availableSpace - 100000000000u"));
    }

    /// Seven nested `all` macros over ten items: 10^7 evaluations of the inner condition, over a
    /// minute of CPU when it is run.
    pub(crate) const NESTED_MACROS: &str = "[0,1,2,3,4,5,6,7,8,9].all(a,[0,1,2,3,4,5,6,7,8,9].all(b,[0,1,2,3,4,5,6,7,8,9].all(c,[0,1,2,3,4,5,6,7,8,9].all(d,[0,1,2,3,4,5,6,7,8,9].all(e,[0,1,2,3,4,5,6,7,8,9].all(f,[0,1,2,3,4,5,6,7,8,9].all(g,name != \"\" && storageType != \"\" && node != \"xyzw\")))))))";

    /// A selector of about 70 KB whose syntax error lies past column 65,535, where the `cel`
    /// parser panics.
    pub(crate) fn past_the_parsers_columns() -> String {
        format!("name == \"{}\" &&", "a".repeat(70_000))
    }

    #[test]
    fn a_selector_past_the_parsers_columns_is_refused_before_parsing() {
        let expression = past_the_parsers_columns();
        let err = StorageSelector::new(&expression).unwrap_err();
        assert!(
            matches!(err, SelectorError::TooLong { length, .. } if length == expression.len()),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(
            message.len() < 400,
            "the message quotes the start only: {message}"
        );
        assert!(message.contains("name == \\\"aaa"), "{message}");
    }

    #[test]
    fn the_parser_past_its_columns_gives_a_syntax_error() {
        // Only reached within MAX_LEN; past it, the parser's own message would panic.
        let parsed = evaluator::parse(Arc::from(past_the_parsers_columns()), BUDGET);
        let Some(Err(Refusal::Syntax(reason))) = parsed else {
            panic!("{parsed:?}");
        };
        assert!(reason.contains("column 70015"), "{reason}");
    }

    #[test]
    fn the_deepest_nesting_within_the_length_limit_is_refused_not_a_crash() {
        let half = MAX_LEN / 2 - 3;
        for deep in [
            format!("{}true{}", "(".repeat(half), ")".repeat(half)),
            format!("{}1 < 0", "1 + ".repeat(MAX_LEN / 4 - 2)),
            format!("{}1]", "[".repeat(MAX_LEN - 3)),
            format!("name{} == 1", ".a".repeat(MAX_LEN / 2 - 8)),
            format!(
                "{}true{}",
                "size(".repeat(MAX_LEN / 6 - 1),
                ")".repeat(MAX_LEN / 6 - 1)
            ),
        ] {
            assert!(deep.chars().count() <= MAX_LEN, "{}", deep.len());
            assert!(StorageSelector::new(&deep).is_err(), "{deep}");
        }
        // The parser folds runs of unary operators: these are plain conditions.
        let not = format!("{}true", "!".repeat(MAX_LEN - 4));
        assert!(StorageSelector::new(&not).is_ok());
        let negated = format!("{}1 < 0", "-".repeat(MAX_LEN - 5));
        assert!(StorageSelector::new(&negated).is_ok());
    }

    #[test]
    fn nested_macros_are_refused_before_they_run() {
        assert_eq!(NESTED_MACROS.len(), 252);
        let started = std::time::Instant::now();
        let err = StorageSelector::new(NESTED_MACROS).unwrap_err();
        assert!(matches!(err, SelectorError::NotAllowed { .. }), "{err:?}");
        assert!(err.to_string().contains("macro"), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn only_the_grammar_of_a_condition_is_allowed() {
        for refused in [
            "[1].exists(x, x == 1)",
            "[\"a\"].all(x, name == x)",
            "[1, 2].map(x, x * 2) == [2, 4]",
            "has(name.x)",
            "name in [node]",
            "name in {\"a\": 1}",
            "{\"a\": 1}[\"a\"] == 1",
            "name[0] == \"l\"",
            "true ? name == \"a\" : false",
            "name.size == 3",
            "string(availableSpace) == \"1\"",
            "[1] == [1]",
        ] {
            let err = StorageSelector::new(refused).unwrap_err();
            assert!(
                matches!(err, SelectorError::NotAllowed { .. }),
                "{refused}: {err:?}"
            );
        }
        let deep = format!("{}true{}", "!(".repeat(40), ")".repeat(40));
        assert!(StorageSelector::new(&deep).is_err());
        for allowed in [
            "!(name == \"a\") || -1 < 0",
            "size(name) > 2 && name.size() < 20",
            "name.contains(\"lvm\") && name.endsWith(\"lvm\")",
            "availableSpace % 2u == 0u || availableSpace - 1u >= 0u",
        ] {
            assert!(StorageSelector::new(allowed).is_ok(), "{allowed}");
        }
    }

    #[test]
    fn compiled_selectors_are_cached_by_text() {
        let a = StorageSelector::new("name == \"cached-once\"").unwrap();
        let b = StorageSelector::new("name == \"cached-once\"").unwrap();
        assert!(Arc::ptr_eq(&a.program, &b.program));
    }

    #[test]
    fn an_evaluation_past_its_budget_is_given_up_and_the_next_runs() {
        // Built past the grammar on purpose: only the budget stands between it and a minute of CPU.
        let slow = Arc::new(Program::compile(NESTED_MACROS).unwrap());
        let started = std::time::Instant::now();
        let outcome = evaluator::run(slow, facts(), "pve1".into(), Duration::from_millis(50));
        assert_eq!(outcome, None);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        let quick = StorageSelector::new("name == \"local-lvm\"").unwrap();
        assert_eq!(quick.matches(&facts(), "pve1"), Ok(true));
    }

    proptest! {
        #[test]
        fn name_equality_selects_exactly_that_name(wanted in "[a-z][a-z0-9-]{0,9}[a-z0-9]", actual in "[a-z][a-z0-9-]{0,9}[a-z0-9]", space: u64) {
            let selector = StorageSelector::new(&format!("name == {wanted:?}")).unwrap();
            let storage = StorageSnapshot { name: StorageId::new(actual.clone()).unwrap(), available: space, ..facts() };
            prop_assert_eq!(selector.matches(&storage, "pve1"), Ok(wanted == actual));
        }

        /// Selectors of every length up to past the limit, nested, with macros among them: each is
        /// answered quickly, never by a panic, and one with a macro never runs.
        #[test]
        fn any_selector_is_answered_quickly(expr in fuzz::selector()) {
            let started = std::time::Instant::now();
            let verdict = StorageSelector::new(&expr);
            if let Ok(selector) = &verdict {
                let _ = selector.matches(&facts(), "pve1");
            }
            prop_assert!(started.elapsed() < Duration::from_secs(2), "{:?} for {expr}", started.elapsed());
            if fuzz::MACROS.iter().any(|m| expr.contains(m)) {
                prop_assert!(verdict.is_err(), "{expr}");
            }
            if expr.chars().count() > MAX_LEN {
                let too_long = matches!(verdict, Err(SelectorError::TooLong { .. }));
                prop_assert!(too_long, "{expr}");
            }
        }

        #[test]
        fn arbitrary_input_never_panics(expr in "\\PC{0,40}") {
            if let Ok(selector) = StorageSelector::new(&expr) {
                let _ = selector.matches(&facts(), "pve1");
            }
        }
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    pub const MACROS: [&str; 6] = [
        ".all(",
        ".exists(",
        ".exists_one(",
        ".map(",
        ".filter(",
        "has(",
    ];

    /// Selectors built from the pieces a class author can write, nested up to eight levels, with
    /// literals long enough to cross [`super::MAX_LEN`].
    pub fn selector() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("name".to_string()),
            Just("node".to_string()),
            Just("storageType".to_string()),
            Just("availableSpace".to_string()),
            Just("1u".to_string()),
            Just("-3".to_string()),
            Just("true".to_string()),
            "\"[a-z(\\[{]{0,8}\"",
            (0..1400usize).prop_map(|n| format!("\"{}\"", "z".repeat(n))),
        ];
        leaf.prop_recursive(8, 64, 3, |inner| {
            let op = prop_oneof![
                Just("=="),
                Just("!="),
                Just("<"),
                Just(">="),
                Just("&&"),
                Just("||"),
                Just("+"),
                Just("*"),
                Just("/"),
                Just("%"),
                Just("in"),
            ];
            prop_oneof![
                (inner.clone(), op, inner.clone()).prop_map(|(a, op, b)| format!("({a} {op} {b})")),
                inner.clone().prop_map(|a| format!("!{a}")),
                inner.clone().prop_map(|a| format!("name in [{a}, \"x\"]")),
                inner.clone().prop_map(|a| format!("{a}.startsWith(\"l\")")),
                inner.clone().prop_map(|a| format!("size({a}) > 1")),
                inner.clone().prop_map(|a| format!("name.matches({a})")),
                (inner.clone(), prop::sample::select(&MACROS[..5]))
                    .prop_map(|(a, m)| format!("[1, 2, 3]{m}x, {a})")),
                inner.clone().prop_map(|a| format!("has({a}.x)")),
                inner.clone().prop_map(|a| format!("({a} ? true : false)")),
                inner.prop_map(|a| format!("{a}[0]")),
            ]
        })
    }
}

#[cfg(test)]
mod thread_safety {
    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn selector_can_be_shared_between_tasks() {
        assert_send_sync::<super::StorageSelector>();
    }
}
