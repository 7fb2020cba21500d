//! CEL storage selectors (`storage_selector`, `additional_disks[].storage_selector`,
//! `iso_storage_selector`), compiled and checked once when provider data is accepted.
//!
//! The Go provider compiles the selector only when it creates the VM, so a typo surfaces late and
//! cryptically. The `cel` crate has no type checker, so we check by running the program against a
//! dummy storage with every variable set: an undeclared variable, a type mismatch or a non-boolean
//! result shows up there, at validation time, with the expression in the message.

use std::fmt;
use std::sync::Arc;

use cel::{Context, Program, Value};

pub use crate::model::StorageFacts;

/// A compiled, checked selector. Cheap to clone.
#[derive(Clone)]
pub struct StorageSelector {
    source: Arc<str>,
    program: Arc<Program>,
}

/// Why a selector is unusable. Always names the expression.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error(
        "storage selector {expression:?} is empty: write an expression such as `name == \"local-lvm\"`"
    )]
    Empty { expression: String },
    #[error("storage selector {expression:?} does not compile: {reason}")]
    Syntax { expression: String, reason: String },
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
}

const VARIABLES: [&str; 4] = ["name", "node", "storageType", "availableSpace"];

impl StorageSelector {
    /// Compiles `expression` and checks it against a dummy storage.
    pub fn new(expression: &str) -> Result<Self, SelectorError> {
        let expression_owned = expression.to_string();
        if expression.trim().is_empty() {
            return Err(SelectorError::Empty {
                expression: expression_owned,
            });
        }
        let program = Program::compile(expression).map_err(|e| {
            if looks_like_storage_name(expression) {
                SelectorError::BareName {
                    expression: expression_owned.clone(),
                }
            } else {
                SelectorError::Syntax {
                    expression: expression_owned.clone(),
                    reason: e.to_string(),
                }
            }
        })?;
        let selector = Self {
            source: Arc::from(expression),
            program: Arc::new(program),
        };
        let dummy = StorageFacts {
            name: "local-lvm".into(),
            node: "pve".into(),
            storage_type: "lvmthin".into(),
            available_space: 1 << 40,
        };
        match selector.evaluate(&dummy) {
            Ok(Value::Bool(_)) => Ok(selector),
            Ok(other) => {
                if looks_like_storage_name(expression) && !VARIABLES.contains(&expression.trim()) {
                    Err(SelectorError::BareName {
                        expression: expression_owned,
                    })
                } else {
                    Err(SelectorError::NotBoolean {
                        expression: expression_owned,
                        kind: kind_of(&other),
                    })
                }
            }
            // An undeclared identifier such as `local` in `local` or `local-lvm` is a bare name.
            Err(_)
                if looks_like_storage_name(expression)
                    && !VARIABLES.contains(&expression.trim()) =>
            {
                Err(SelectorError::BareName {
                    expression: expression_owned,
                })
            }
            // Arithmetic overflow depends on the real numbers; everything else is a mistake.
            Err(reason) if reason.contains("verflow") => Ok(selector),
            Err(reason) => Err(SelectorError::Evaluation {
                expression: expression_owned,
                reason,
            }),
        }
    }

    /// The expression as written.
    pub fn expression(&self) -> &str {
        &self.source
    }

    /// Whether the storage is selected. A runtime error is a configuration error.
    pub fn matches(&self, storage: &StorageFacts) -> Result<bool, SelectorError> {
        match self.evaluate(storage) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(SelectorError::NotBoolean {
                expression: self.source.to_string(),
                kind: kind_of(&other),
            }),
            Err(reason) => Err(SelectorError::Evaluation {
                expression: self.source.to_string(),
                reason,
            }),
        }
    }

    fn evaluate(&self, storage: &StorageFacts) -> Result<Value, String> {
        let mut context = Context::default();
        context.add_variable_from_value("name", storage.name.clone());
        context.add_variable_from_value("node", storage.node.clone());
        context.add_variable_from_value("storageType", storage.storage_type.clone());
        context.add_variable_from_value("availableSpace", Value::UInt(storage.available_space));
        self.program.execute(&context).map_err(|e| e.to_string())
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

fn kind_of(value: &Value) -> String {
    match value {
        Value::String(s) => format!("the string {:?}", s.as_str()),
        Value::Int(i) => format!("the number {i}"),
        Value::UInt(u) => format!("the number {u}"),
        Value::Float(f) => format!("the number {f}"),
        Value::Null => "null".to_string(),
        Value::List(_) => "a list".to_string(),
        Value::Map(_) => "a map".to_string(),
        _ => "a non-boolean value".to_string(),
    }
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

    fn facts() -> StorageFacts {
        StorageFacts {
            name: "local-lvm".into(),
            node: "pve1".into(),
            storage_type: "lvmthin".into(),
            available_space: 73_014_444_032,
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
            assert_eq!(selector.matches(&facts()), Ok(expected), "{expr}");
            assert_eq!(selector.expression(), expr);
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
        let err = selector.matches(&facts()).unwrap_err();
        assert!(matches!(err, SelectorError::Evaluation { .. }));
        assert!(err.to_string().contains("availableSpace - 100000000000u"));
    }

    proptest! {
        #[test]
        fn name_equality_selects_exactly_that_name(wanted in "[a-z][a-z0-9-]{0,10}", actual in "[a-z][a-z0-9-]{0,10}", space: u64) {
            let selector = StorageSelector::new(&format!("name == {wanted:?}")).unwrap();
            let storage = StorageFacts { name: actual.clone(), available_space: space, ..facts() };
            prop_assert_eq!(selector.matches(&storage), Ok(wanted == actual));
        }

        #[test]
        fn arbitrary_input_never_panics(expr in "\\PC{0,40}") {
            if let Ok(selector) = StorageSelector::new(&expr) {
                let _ = selector.matches(&facts());
            }
        }
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
