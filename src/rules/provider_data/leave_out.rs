//! Reading a document into a derived struct so that every wrong value is named at once: serde stops
//! at the first value it refuses, so that value is handed to the caller with its key path, left out,
//! and the document read again, until a read succeeds. The provider config file and each layer of
//! provider data are read this way.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_path_to_error::Segment;

/// A value serde refused.
pub struct Refused {
    /// Where, each list item numbered as written (items left out before it still count).
    pub path: Vec<Segment>,
    /// What serde said.
    pub said: String,
    /// The value left out; `None` when there was none to leave out, and the reading stops.
    pub value: Option<Value>,
}

impl Refused {
    /// The key, and the keys its struct declares, when serde refused a key no struct declares (every
    /// struct read this way denies unknown fields so that serde names them).
    pub fn unknown(&self) -> Option<(&str, Vec<&str>)> {
        let Some(Segment::Map { key }) = self.path.last() else {
            return None;
        };
        let known = self
            .said
            .strip_prefix(&format!("unknown field `{key}`, expected "))?;
        Some((key, known.split('`').skip(1).step_by(2).collect()))
    }
}

/// Reads `root` into `T`, each value serde refuses handed to `refused` and left out of `root`.
pub fn read_leaving_out<T: DeserializeOwned>(
    root: &mut Value,
    mut refused: impl FnMut(Refused),
) -> Option<T> {
    // How many items were left out, by the path of their list as written. serde reads a list in
    // order and each item before the one it refuses reads the same in every later round, so every
    // item left out came before the one it names now.
    let mut removed: BTreeMap<String, usize> = BTreeMap::new();
    loop {
        let error = match serde_path_to_error::deserialize::<_, T>(&*root) {
            Ok(read) => return Some(read),
            Err(e) => e,
        };
        let segments: Vec<Segment> = error.path().iter().cloned().collect();
        let mut path: Vec<Segment> = Vec::new();
        for segment in &segments {
            let segment = match segment {
                Segment::Seq { index } => Segment::Seq {
                    index: index + removed.get(&format!("{path:?}")).unwrap_or(&0),
                },
                other => other.clone(),
            };
            path.push(segment);
        }
        let value = take(root, &segments);
        if let (Some(_), Some((Segment::Seq { .. }, list))) = (&value, path.split_last()) {
            *removed.entry(format!("{list:?}")).or_default() += 1;
        }
        let done = value.is_none();
        let said = error.into_inner().to_string();
        refused(Refused { path, said, value });
        // Each round takes a value out of the document, so the rounds end.
        if done {
            return None;
        }
    }
}

/// Takes the value at `path` out of `root`; `None` when the path names no value that can go.
fn take(root: &mut Value, path: &[Segment]) -> Option<Value> {
    let (last, parents) = path.split_last()?;
    let mut at = root;
    for segment in parents {
        at = match (segment, at) {
            (Segment::Map { key }, Value::Object(m)) => m.get_mut(key)?,
            (Segment::Seq { index }, Value::Array(items)) => items.get_mut(*index)?,
            _ => return None,
        };
    }
    match (last, at) {
        (Segment::Map { key }, Value::Object(m)) => m.remove(key),
        (Segment::Seq { index }, Value::Array(items)) if *index < items.len() => {
            Some(items.remove(*index))
        }
        _ => None,
    }
}
