//! Generators of hostile input for the property tests of several modules.

use proptest::prelude::*;
use serde_json::{Value, json};

/// A scalar a user (or a broken generator) could write for any key: wrong types, numbers past every
/// limit, strings that look like numbers, unicode, and `words` (the values that mean something where
/// the caller uses it, and near misses of them).
pub fn junk_scalar(words: Vec<&'static str>) -> impl Strategy<Value = Value> {
    let mut all = vec![
        "",
        " ",
        "0",
        "1",
        "-1",
        "1e400",
        "18446744073709551616",
        "true",
        "no",
        "yes",
        "4.0",
        "ünïcødé",
        "\u{202e}",
        "line\nbreak",
    ];
    all.extend(words);
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,24}".prop_map(Value::from),
        prop::sample::select(all).prop_map(Value::from),
    ]
}
