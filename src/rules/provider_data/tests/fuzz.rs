//! Provider data built from the key declarations and filled with junk: nothing panics, and every
//! problem names a key the user can find.

use proptest::prelude::*;
use serde_json::{Map, Value};

use super::super::schema::{inner_keys, top_keys};
use super::super::*;
use super::{MINIMAL, parse, parse_strict, resolve};

/// [`testkit::junk::junk_scalar`] with the values provider-data keys take.
fn junk_scalar() -> impl Strategy<Value = Value> {
    testkit::junk::junk_scalar(vec![
        "",
        "0",
        "1",
        "-1",
        "4096",
        "9000",
        "1e400",
        "18446744073709551616",
        "true",
        "no",
        "vmbr0",
        "vmbr0,firewall=0",
        "a;b",
        "x=y",
        "line\nbreak",
        "local-lvm",
        "talos",
        "2MB",
        "1GB",
        "iso",
        "clone",
        "image",
        "full",
        "linked",
        "ovmf",
        "q35",
        "std",
        "writeback",
        "io_uring",
        "name == \"local-lvm\"",
        "true",
        "1 +",
        "size(",
        "pve1",
        "-pve",
        "ünïcødé",
        "\u{202e}",
        "nvidia-180",
        "BC:24:11:00:00:01",
        "started",
    ])
}

/// An unknown key: empty, close to a real one, or unicode (no `.` or `[`, so paths stay readable).
fn unknown_key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z_]{1,10}",
        prop::sample::select(vec!["coress", "Memory", "disk-size", "ünï", " ", "tags "])
            .prop_map(str::to_string),
    ]
}

fn any_key(known: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(known.to_vec()).prop_map(str::to_string),
        1 => unknown_key(),
    ]
}

/// A nested value: junk, or a mapping / list of mappings with the keys in `known`.
fn nested(known: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let object = prop::collection::btree_map(any_key(known), junk_scalar(), 0..6)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
        .boxed();
    prop_oneof![
        junk_scalar(),
        object.clone(),
        prop::collection::vec(prop_oneof![3 => object, 1 => junk_scalar()], 0..4)
            .prop_map(Value::Array),
    ]
}

/// One layer of provider data, structure-aware: the known keys (nested ones too) with values of any
/// type, unknown keys, optionally over a valid minimal class so the later rules run as well.
fn layer() -> impl Strategy<Value = Map<String, Value>> {
    let entry = any_key(top_keys()).prop_flat_map(|key| {
        let list = super::super::schema::schema()["properties"][&key]["type"] == "array";
        let value = match (inner_keys(&key), list) {
            (inner, _) if !inner.is_empty() => nested(inner).boxed(),
            (_, true) => prop_oneof![
                junk_scalar(),
                prop::collection::vec(junk_scalar(), 0..4).prop_map(Value::Array),
            ]
            .boxed(),
            _ => junk_scalar().boxed(),
        };
        (Just(key), value)
    });
    (any::<bool>(), prop::collection::vec(entry, 0..8)).prop_map(|(valid_base, entries)| {
        let mut map = if valid_base {
            serde_json::from_str(
                r#"{"cores":2,"memory":4096,"disk_size":20,"storage_selector":"true"}"#,
            )
            .unwrap()
        } else {
            Map::new()
        };
        map.extend(entries);
        map
    })
}

/// Whether `path` (`additional_disks[1].disk_size`, `tags[0]`, `ha`) names a key in `known` or a
/// key actually written in `value`, down the nesting the declarations allow.
fn names_a_key(path: &str, value: &Value, known: &[&str]) -> bool {
    let (head, rest) = match path.split_once('.') {
        Some((head, rest)) => (head, Some(rest)),
        None => (path, None),
    };
    // `name[3]` → `name`, and the item it points at.
    let (name, index) = match head.rfind('[') {
        Some(i) if head.ends_with(']') => (&head[..i], head[i + 1..head.len() - 1].parse().ok()),
        _ => (head, None),
    };
    // An empty key is named as `""`.
    let name = if name == "\"\"" { "" } else { name };
    let map = value.as_object();
    let written = map.and_then(|m| m.get(name));
    let declared = known.contains(&name);
    if !declared && written.is_none() {
        return false;
    }
    let Some(rest) = rest else {
        return true;
    };
    let inner = match declared.then(|| inner_keys(name)) {
        Some(inner) if !inner.is_empty() => inner,
        _ => return false,
    };
    let item = match (written, index) {
        (Some(Value::Array(items)), Some(i)) => items.get::<usize>(i).cloned(),
        (Some(v), None) => Some(v.clone()),
        _ => None,
    };
    !rest.contains('.') && names_a_key(rest, &item.unwrap_or(Value::Null), inner)
}

/// Every problem names a key: the class's, `defaults.<key>` or `nodes.<node>.<key>`, each a declared
/// key path or the unknown key as written, or `provider_data` for a class that is not a mapping.
fn check_named(
    problems: &[Problem],
    class: &Value,
    node: Option<(&str, &Value)>,
    defaults: &Value,
) -> Result<(), TestCaseError> {
    prop_assert!(!problems.is_empty());
    for p in problems {
        prop_assert!(!p.key.is_empty(), "a problem without a key: {p:?}");
        prop_assert!(!p.message.is_empty(), "a problem without a message: {p:?}");
        let named = p.key == "provider_data"
            || names_a_key(&p.key, class, top_keys())
            || p.key
                .strip_prefix("defaults.")
                .is_some_and(|k| names_a_key(k, defaults, top_keys()))
            || node.is_some_and(|(name, layer)| {
                p.key
                    .strip_prefix(&format!("nodes.{name}."))
                    .is_some_and(|k| names_a_key(k, layer, top_keys()))
                    || p.key == format!("nodes.{name}")
            });
        prop_assert!(
            named,
            "{p:?} names no key of {class} / {node:?} / {defaults}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Known keys with values of any type, nested junk and unknown keys, written as YAML (JSON is
    /// YAML) or given as maps, in the class, a node override and the defaults, strict or not: never a
    /// panic, and every problem names its key.
    #[test]
    fn structured_junk_is_refused_by_key(
        class in layer(),
        node in prop::option::of(layer()),
        defaults in layer(),
        strict in any::<bool>(),
    ) {
        let class_yaml = Value::Object(class.clone()).to_string();
        let node_ref = node.as_ref().map(|n| ("pve1", n));
        if let Err(problems) = resolve(strict, &class_yaml, node_ref, &defaults) {
            check_named(
                &problems,
                &Value::Object(class.clone()),
                node.clone().map(|n| ("pve1", Value::Object(n))).as_ref().map(|(n, v)| (*n, v)),
                &Value::Object(defaults.clone()),
            )?;
        }
        if let Err(problems) = resolve(strict, &class_yaml, None, &Map::new()) {
            check_named(&problems, &Value::Object(class.clone()), None, &Value::Null)?;
        }
        let layers = ConfigLayers::read(&Map::new(), &Map::new(), strict);
        let check = layers.check_class(&class);
        for p in check.problems.iter().chain(&check.warnings) {
            prop_assert!(
                !p.key.is_empty() && names_a_key(&p.key, &Value::Object(class.clone()), top_keys()),
                "{p:?}"
            );
        }
        let nodes: Map<String, Value> = node.iter().map(|n| ("pve1".to_string(), Value::Object(n.clone()))).collect();
        let layers = ConfigLayers::read(&defaults, &nodes, strict);
        let check = layers.check();
        for p in check.problems.iter().chain(&check.warnings) {
            prop_assert!(!p.key.is_empty(), "{p:?}");
            prop_assert!(p.key.starts_with("defaults.") || p.key.starts_with("nodes.pve1"), "{p:?}");
        }
        let _ = layers.resolve(&class_yaml, Some("pve1"));
    }

    /// YAML-only shapes: anchors, aliases and merge keys, tags, non-string keys, numbers past any
    /// integer, special floats, flow and block collections mixed with known keys. Never a panic; a
    /// problem always has a key.
    #[test]
    fn yaml_shapes_never_panic_and_name_a_key(
        lines in prop::collection::vec(
            (
                prop_oneof![
                    prop::sample::select(top_keys().to_vec()).prop_map(str::to_string),
                    prop::sample::select(vec!["? [a, b]", "{a: 1}", "<<", "1", "~", "\"\"", "'x'", "&k cores", "*k"]).prop_map(str::to_string),
                ],
                prop::sample::select(vec![
                    "", "~", "null", "1e400", "-1e400", ".inf", ".nan", "0x1F", "0o17", "99999999999999999999999",
                    "-9223372036854775809", "!!binary aGVsbG8=", "!!str 5", "!!int \"x\"", "!custom 1", "&a [1, 2]", "*a",
                    "*undefined", "[1, {a: b}, [c]]", "{bridge: vmbr0, vlan: x}", "|\n  block\n  text", ">-\n  folded",
                    "\"unterminated", "'it''s'", "\"\\u0000\"", "yes", "no", "on", "off", "2001-01-01", "[", "}", "- a\n- b",
                    "\n  - {disk_size: 1e3}\n  - 5", "\n  failback: yes\n  state: 1", "ünïcødé", "\t",
                ]).prop_map(str::to_string),
            ),
            0..8,
        ),
        base in any::<bool>(),
    ) {
        let mut text = if base { MINIMAL.to_string() } else { String::new() };
        for (key, value) in &lines {
            text.push_str(&format!("{key}: {value}\n"));
        }
        for result in [parse(&text), parse_strict(&text)] {
            if let Err(problems) = result {
                prop_assert!(!problems.is_empty());
                for p in &problems {
                    prop_assert!(!p.key.is_empty(), "{p:?} from {text:?}");
                    prop_assert!(!p.message.is_empty(), "{p:?} from {text:?}");
                }
            }
        }
    }
}
