//! What is generated from the key declarations: the JSON schema Omni shows for machine classes (and
//! validation uses), and the README's provider-data table.

use serde::ser::{Serialize, SerializeMap, Serializer};

use super::keys::{Key, Kind, Place, Text, at};

/// The README's provider-data table: header and one row per top-level key.
pub fn readme_table() -> String {
    let mut table = String::from("| Key | Type | Default | Meaning |\n|---|---|---|---|\n");
    for key in at(Place::Top) {
        table.push_str(&key.readme_row());
        table.push('\n');
    }
    table
}

/// The JSON schema registered with Omni (it shows it for machine classes) and used for validation.
pub fn schema() -> impl Serialize {
    Json::Object(vec![
        (
            "$schema",
            Json::Str("http://json-schema.org/draft-07/schema#"),
        ),
        ("title", Json::Str("Proxmox VE machine class")),
        ("type", Json::Str("object")),
        ("properties", properties(Place::Top)),
    ])
}

/// The schema as the text of `schema/provider-data.schema.json`.
pub fn schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&schema()).unwrap_or_default();
    text.push('\n');
    text
}

fn properties(place: Place) -> Json {
    Json::Object(at(place).map(|k| (k.name, property(k))).collect())
}

fn property(key: &Key) -> Json {
    let mut out = vec![("type", json_type(key.kind))];
    if let Some(title) = key.title {
        out.push(("title", Json::Str(title)));
    }
    out.push(("description", Json::Str(key.description)));
    if !key.one_of.is_empty() {
        out.push((
            "enum",
            Json::Array(key.one_of.iter().map(|v| Json::Str(v)).collect()),
        ));
    }
    let number = |n: Option<u64>| n.map(Json::Int);
    out.extend(
        [
            ("minimum", number(key.min)),
            ("maximum", number(key.max)),
            ("maxItems", number(key.max_items)),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?))),
    );
    out.extend(text_limits(key.text));
    match key.kind {
        Kind::Strings => {
            let mut item = vec![("type", Json::Str("string"))];
            item.extend(text_limits(key.items));
            out.push(("items", Json::Object(item)));
        }
        Kind::Objects(place) => {
            let required: Vec<Json> = at(place)
                .filter(|k| k.required)
                .map(|k| Json::Str(k.name))
                .collect();
            out.push((
                "items",
                Json::Object(vec![
                    ("type", Json::Str("object")),
                    ("properties", properties(place)),
                    ("required", Json::Array(required)),
                ]),
            ));
        }
        Kind::Mapping(place) => out.push(("properties", properties(place))),
        _ => {}
    }
    Json::Object(out)
}

fn text_limits(text: Text) -> Vec<(&'static str, Json)> {
    let mut out = Vec::new();
    if let Some(n) = text.min_len {
        out.push(("minLength", Json::Int(n)));
    }
    if let Some(n) = text.max_len {
        out.push(("maxLength", Json::Int(n)));
    }
    if let Some(p) = text.pattern {
        out.push(("pattern", Json::Str(p)));
    }
    out
}

fn json_type(kind: Kind) -> Json {
    match kind {
        Kind::Integer => Json::Str("integer"),
        Kind::Boolean => Json::Str("boolean"),
        Kind::String | Kind::Cel => Json::Str("string"),
        Kind::VmidOrName => Json::Array(vec![Json::Str("integer"), Json::Str("string")]),
        Kind::Strings | Kind::Objects(_) => Json::Str("array"),
        Kind::Mapping(_) => Json::Str("object"),
    }
}

/// JSON that keeps the order it is written in, so the schema file reads like the declarations.
enum Json {
    Str(&'static str),
    Int(u64),
    Array(Vec<Json>),
    Object(Vec<(&'static str, Json)>),
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Str(v) => s.serialize_str(v),
            Json::Int(n) => s.serialize_u64(*n),
            Json::Array(items) => items.serialize(s),
            Json::Object(fields) => {
                let mut map = s.serialize_map(Some(fields.len()))?;
                for (k, v) in fields {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::super::SCHEMA_JSON;
    use super::super::keys::{self, Place};
    use super::super::layers::Settings;
    use super::*;

    /// The parser reads the keys the declarations list, no more, no fewer.
    #[test]
    fn settings_hold_the_declared_top_level_keys() {
        assert_eq!(Settings::KEYS, keys::names(Place::Top));
    }

    /// The schema Omni is given (the file `controller/registration.rs` embeds) is the one the key
    /// declarations generate, and validation uses the same one.
    #[test]
    fn schema_file_is_generated_from_the_declarations() {
        let generated = schema_text();
        let file: Value = serde_json::from_str(SCHEMA_JSON).unwrap();
        let from_declarations: Value = serde_json::from_str(&generated).unwrap();
        assert_eq!(
            file, from_declarations,
            "schema/provider-data.schema.json differs from the key declarations; regenerate it with `cargo test --lib write_schema_file -- --ignored`"
        );
        assert!(
            SCHEMA_JSON == generated,
            "schema/provider-data.schema.json is not formatted as generated; regenerate it with `cargo test --lib write_schema_file -- --ignored`"
        );
    }

    /// Writes `schema/provider-data.schema.json` from the key declarations.
    #[test]
    #[ignore = "writes the schema file; run after changing a key declaration"]
    fn write_schema_file() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/schema/provider-data.schema.json"
        );
        std::fs::write(path, schema_text()).unwrap();
    }

    #[test]
    fn declarations_are_complete() {
        for key in keys::at(Place::Top) {
            assert!(!key.doc.is_empty(), "{} has no README text", key.name);
            assert!(
                !key.description.is_empty(),
                "{} has no description",
                key.name
            );
            assert!(
                !key.required || !key.example.is_empty(),
                "required {} has no example",
                key.name
            );
            let nested = match key.kind {
                keys::Kind::Mapping(place) | keys::Kind::Objects(place) => keys::names(place),
                _ => Vec::new(),
            };
            for sub in nested {
                assert!(
                    key.doc.contains(&format!("`{sub}`")),
                    "the README text of `{}` does not name `{sub}`",
                    key.name
                );
            }
        }
        for place in [
            Place::Ha,
            Place::AdditionalNics,
            Place::UsbDevices,
            Place::PciDevices,
            Place::AdditionalDisks,
        ] {
            assert!(keys::at(Place::Top).any(|k| matches!(
                k.kind,
                keys::Kind::Mapping(p) | keys::Kind::Objects(p) if p == place
            )));
            for key in keys::at(place) {
                assert!(
                    key.doc.is_empty() && !key.description.is_empty(),
                    "{}",
                    key.name
                );
            }
        }
    }
}
