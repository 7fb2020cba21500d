//! What is generated from the key declarations (`keys.rs`): the JSON schema Omni shows for machine
//! classes (and validation uses), the README's provider-data table, and what the reader needs to
//! know about each top-level key.

use std::cell::Cell;
use std::sync::LazyLock;

use schemars::generate::SchemaSettings;
use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde_json::{Map, Value};

use super::keys::{AdditionalDisk, AdditionalNic, HaSettings, Keys};
use crate::proxmox::property::{HostPci, Usb};

/// The schema with the README's and the reader's `x-` extensions (the README's table is generated
/// from them), generated once.
pub static DECLARED: LazyLock<Value> = LazyLock::new(|| {
    let schema = SchemaSettings::draft07()
        .with(|s| s.inline_subschemas = true)
        .into_generator()
        .into_root_schema_for::<Keys>();
    let mut value = schema.to_value();
    each_schema(&mut value, &mut tidy);
    value
});

/// Calls `f` on every mapping in `value`, outermost first.
fn each_schema(value: &mut Value, f: &mut impl FnMut(&mut Map<String, Value>)) {
    match value {
        Value::Object(map) => {
            f(map);
            map.values_mut().for_each(|v| each_schema(v, f));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| each_schema(v, f)),
        _ => {}
    }
}

/// Joins the doc comment's lines (Omni shows each description as one paragraph), drops the `null`
/// schemars allows in an optional field (a key written as `null` is a mistake) and the Rust value
/// of a field's default (the description says it in the user's words).
fn tidy(map: &mut Map<String, Value>) {
    if let Some(Value::String(text)) = map.get_mut("description") {
        *text = text.replace('\n', " ");
    }
    if let Some(Value::Array(words)) = map.get_mut("enum") {
        words.retain(|w| !w.is_null());
    }
    if let Some(Value::Array(types)) = map.get_mut("type") {
        types.retain(|t| t != "null");
        if let [one] = types.as_slice() {
            let one = one.clone();
            map.insert("type".into(), one);
        }
    }
    map.remove("format");
    // Unknown keys are ignored with a warning, as the official provider ignores them.
    map.remove("additionalProperties");
    map.remove("default");
}

/// The JSON schema registered with Omni (it shows it for machine classes) and used for validation:
/// the declarations without their `x-` extensions.
pub fn schema() -> Value {
    let mut schema = DECLARED.clone();
    each_schema(&mut schema, &mut |map| {
        map.retain(|k, _| !k.starts_with("x-"))
    });
    schema
}

/// The declaration of top-level key `name`, with its extensions.
fn key(name: &str) -> Option<&'static Map<String, Value>> {
    DECLARED["properties"].get(name)?.as_object()
}

/// The names of the top-level keys, in declaration order.
pub fn top_keys() -> &'static [&'static str] {
    field_names::<Keys>()
}

/// The required top-level keys, in declaration order, each with how to write it
/// (", e.g. `cores: 2`").
pub fn required_keys() -> impl Iterator<Item = (&'static str, &'static str)> {
    top_keys().iter().filter_map(|name| {
        let example = key(name)?.get("x-required")?.as_str()?;
        Some((*name, example))
    })
}

/// Whether a `nodes.<name>:` override may set top-level key `name`.
pub fn per_node(name: &str) -> bool {
    key(name).and_then(|k| k.get("x-per-node")) != Some(&Value::Bool(false))
}

/// The keys of the mappings inside the top-level key `key` (`ha`, the items of `additional_nics`, …),
/// in declaration order.
pub fn inner_keys(key: &str) -> &'static [&'static str] {
    match key {
        "ha" => field_names::<HaSettings>(),
        "additional_nics" => field_names::<AdditionalNic>(),
        "usb_devices" => field_names::<Usb>(),
        "pci_devices" => field_names::<HostPci>(),
        "additional_disks" => field_names::<AdditionalDisk>(),
        _ => &[],
    }
}

/// The field names of a derived struct in declaration order: serde's derive hands them to the
/// deserializer, which is all this one asks for.
pub fn field_names<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    struct Probe<'a>(&'a Cell<&'static [&'static str]>);
    impl<'de> Deserializer<'de> for Probe<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("only structs are probed"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0.set(fields);
            Err(de::Error::custom("probed"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }
    let fields = Cell::new(&[][..]);
    let _ = T::deserialize(Probe(&fields));
    fields.get()
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use serde::ser::{Serialize, SerializeMap, Serializer};

    use super::*;

    const SCHEMA_JSON: &str = include_str!("../../../schema/provider-data.schema.json");

    /// The schema as the text of `schema/provider-data.schema.json`: properties in declaration order.
    pub fn schema_text() -> String {
        let schema = schema();
        let mut text = serde_json::to_string_pretty(&Ordered {
            value: &schema,
            fields: top_keys(),
            properties: false,
        })
        .unwrap_or_default();
        text.push('\n');
        text
    }

    /// The order of a schema's keywords in the file, as a reader expects them.
    const KEYWORDS: &[&str] = &[
        "type",
        "title",
        "description",
        "enum",
        "minimum",
        "maximum",
        "maxItems",
        "minLength",
        "maxLength",
        "pattern",
        "properties",
        "items",
        "required",
    ];

    /// A schema written with its keywords in [`KEYWORDS`] order, or (`properties`) a schema's
    /// properties in declaration order (`fields`).
    struct Ordered<'a> {
        value: &'a Value,
        fields: &'static [&'static str],
        properties: bool,
    }

    impl Serialize for Ordered<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let Value::Object(map) = self.value else {
                return self.value.serialize(s);
            };
            let order = match (self.properties, map.contains_key("$schema")) {
                (true, _) => self.fields,
                (false, true) => &["$schema", "title", "type", "properties"],
                (false, false) => KEYWORDS,
            };
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by_key(|(k, _)| order.iter().position(|o| o == k).unwrap_or(usize::MAX));
            let mut out = s.serialize_map(Some(entries.len()))?;
            for (key, value) in entries {
                let child = match (self.properties, key.as_str()) {
                    (true, name) => (inner_keys(name), false),
                    (false, "properties") => (self.fields, true),
                    (false, _) => (self.fields, false),
                };
                let (fields, properties) = child;
                out.serialize_entry(
                    key,
                    &Ordered {
                        value,
                        fields,
                        properties,
                    },
                )?;
            }
            out.end()
        }
    }

    /// The schema Omni is given (the file `controller/registration.rs` embeds) is the one the key
    /// declarations generate, and validation uses the same one.
    #[test]
    fn schema_file_is_generated_from_the_declarations() {
        let generated = schema_text();
        let file: Value = serde_json::from_str(SCHEMA_JSON).unwrap();
        assert_eq!(
            file,
            schema(),
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

    /// Every top-level key has its README text and its description; a mapping's README text names
    /// each key inside it; every nested key has a description.
    #[test]
    fn declarations_are_complete() {
        for name in top_keys() {
            let key = &DECLARED["properties"][name];
            assert!(key["x-readme"].is_string(), "{name} has no README text");
            assert!(key["description"].is_string(), "{name} has no description");
            for sub in inner_keys(name) {
                assert!(
                    key["x-readme"]
                        .as_str()
                        .unwrap()
                        .contains(&format!("`{sub}`")),
                    "the README text of `{name}` does not name `{sub}`"
                );
                let inner = key.get("properties").unwrap_or(&key["items"]["properties"]);
                assert!(inner.is_object(), "{name} has no keys inside");
                assert!(inner[sub]["description"].is_string(), "{name}.{sub}");
            }
        }
    }
}
