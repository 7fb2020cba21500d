//! Reading the file into its derived structs so that every problem is found at once, each with its
//! key path.
//!
//! Each value serde refuses is reported at its key path and left out ([`read_leaving_out`]): one
//! load names every wrong value. Unknown keys are named by serde too, with the keys their struct
//! declares: warnings, or problems under `strict: true` (after the values refused).

use std::collections::BTreeSet;

use serde::de::{self, Deserialize, DeserializeOwned, Deserializer, Visitor};
use serde_json::Value;
use serde_path_to_error::Segment;

use crate::did_you_mean;
use crate::rules::provider_data::{json_kind, read_leaving_out};

/// A newtype of the file read from any value through `TryFrom<Value>`: `$parse` gives the inner
/// value, or the message that reads on from the key path (`: …` or ` must …`).
macro_rules! value_type {
    ($(#[$doc:meta])* $name:ident($inner:ty), |$v:ident| $parse:expr) => {
        $(#[$doc])*
        #[derive(serde::Deserialize)]
        #[serde(try_from = "serde_json::Value")]
        pub(super) struct $name(pub $inner);

        impl TryFrom<serde_json::Value> for $name {
            type Error = String;
            fn try_from($v: serde_json::Value) -> Result<Self, String> {
                $parse.map(Self)
            }
        }
    };
}
pub(super) use value_type;

/// A string read by `parse`; anything else is refused as not `what`.
pub(super) fn string<T>(
    v: Value,
    what: &str,
    parse: impl FnOnce(String) -> Result<T, String>,
) -> Result<T, String> {
    match v {
        Value::String(s) => parse(s),
        other => Err(format!("{what}, found {}", kind(&other))),
    }
}

/// Problems and warnings while reading the file.
#[derive(Default)]
pub(super) struct Found {
    pub problems: Vec<String>,
    pub warnings: Vec<String>,
    /// Key paths whose value was refused and left out: what would call them missing keeps quiet.
    pub failed: BTreeSet<String>,
    /// `strict: true` in the file: unknown keys are problems, else warnings (the official provider
    /// ignores them, so a file that works there loads here).
    pub strict: bool,
    /// The problems of unknown keys, reported after the values refused.
    unknown: Vec<String>,
}

impl Found {
    /// Reads `root` into `T`; each value serde refuses is a problem at its key path.
    pub fn read<T: DeserializeOwned>(&mut self, mut root: Value) -> Option<T> {
        let read = read_leaving_out(&mut root, |refused| {
            if let Some((key, known)) = refused.unknown() {
                // Every struct denies unknown fields so that serde names each with the keys it
                // knows; it is left out and the file read again, so it is never fatal here.
                let parent = shown_path(&refused.path[..refused.path.len() - 1]);
                let dot = if parent.is_empty() { "" } else { "." };
                let shown = format!("{parent}{dot}{}", shown_key(key));
                let hint = did_you_mean::hint(key, &known);
                if self.strict {
                    let refused = "(refused because of `strict: true`)";
                    self.unknown
                        .push(format!("unknown key `{shown}`{hint} {refused}"));
                } else {
                    let warning = format!("unknown key `{shown}` is ignored{hint}");
                    self.warnings.push(warning);
                }
                return;
            }
            // Nothing left out (serde's own structure failed): reported, never quoting.
            let value = refused.value.unwrap_or(Value::Null);
            let path = shown_path(&refused.path);
            let reads_on = reads_on(&refused.said, &value);
            self.problems.push(format!("`{path}`{reads_on}"));
            self.failed.insert(path);
        });
        self.problems.append(&mut self.unknown);
        read
    }
}

/// What follows the key path in a problem: a type mismatch in the file's words (`must be true or
/// false, found a string`), never quoting the value (it may be a secret); otherwise the message of
/// the value's own type, which starts with its separator (`: …` or ` must …`).
fn reads_on(said: &str, value: &Value) -> String {
    let mismatch = said
        .strip_prefix("invalid type: ")
        .or_else(|| said.strip_prefix("invalid value: "))
        .and_then(|rest| rest.rsplit_once(", expected "));
    let Some((_, expected)) = mismatch else {
        return said.to_owned();
    };
    let expected = match expected {
        "a boolean" => " must be true or false".to_owned(),
        "a sequence" => " must be a list".to_owned(),
        "a map" => " must be a mapping".to_owned(),
        // An expectation in the words of the message that follows the path (`: must be …`).
        own if own.starts_with(": ") => own.to_owned(),
        other => format!(" must be {other}"),
    };
    format!("{expected}, found {}", kind(value))
}

/// `ipPools.talos-net.range[1]`; a key that is not a plain name is quoted (`ipPools."a."`).
fn shown_path(path: &[Segment]) -> String {
    path.iter()
        .fold(String::new(), |shown, segment| match segment {
            Segment::Seq { index } => format!("{shown}[{index}]"),
            Segment::Map { key } => child(&shown, key),
            Segment::Enum { .. } | Segment::Unknown => shown + ".?",
        })
}

/// The path of `key` under `parent`.
pub(super) fn child(parent: &str, key: &str) -> String {
    let key = if plain_name(key) {
        key.to_owned()
    } else {
        Value::String(key.to_owned()).to_string()
    };
    if parent.is_empty() {
        key
    } else {
        format!("{parent}.{key}")
    }
}

/// 1 to 63 letters, digits, '-' or '_', starting with a letter or digit: a pool name, and how every
/// key the file declares is written.
pub(super) fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
}

/// An unknown key as a message shows it. An empty key (`"": 1`) is shown quoted, or the message
/// would name no key; a key is shown up to its first character no key name has, because a line
/// typed wrong (`tokenSecret= 0c3b…: x`) makes a key of the secret.
fn shown_key(key: &str) -> String {
    if key.is_empty() {
        return "\"\"".to_string();
    }
    match key.find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))) {
        Some(cut) => format!("{}…", &key[..cut]),
        None => key.to_string(),
    }
}

/// A short name for a JSON value's type, for error messages.
pub(super) fn kind(v: &Value) -> &'static str {
    if v.is_null() { "nothing" } else { json_kind(v) }
}

/// One value or a list of them (`nameservers: 10.0.0.1` or `nameservers: [10.0.0.1, 10.0.0.2]`).
pub(super) enum OneOrList<T> {
    One(T),
    List(Vec<T>),
}

/// What a key expects, for its message (` must be ` goes before it, unless it starts with `: `):
/// `Section<Self>` a mapping, `OneOrList<Self>` one or more.
pub(super) trait Expecting {
    const EXPECTING: &'static str;
}

/// A section read into `T`, from a mapping only (serde would read a struct from a list too, by
/// position).
pub(super) struct Section<T>(pub T);

impl<'de, T: Deserialize<'de> + Expecting> Deserialize<'de> for Section<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Mapping<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de> + Expecting> Visitor<'de> for Mapping<T> {
            type Value = Section<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(T::EXPECTING)
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Section)
            }
        }
        d.deserialize_map(Mapping(std::marker::PhantomData))
    }
}

impl<'de, T: Deserialize<'de> + Expecting> Deserialize<'de> for OneOrList<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct OneOrMore<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de> + Expecting> Visitor<'de> for OneOrMore<T> {
            type Value = OneOrList<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(T::EXPECTING)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                T::deserialize(de::value::StrDeserializer::new(s)).map(OneOrList::One)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(OneOrList::List(items))
            }
        }
        d.deserialize_any(OneOrMore(std::marker::PhantomData))
    }
}
