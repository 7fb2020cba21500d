//! The README's provider-data reference stays in step with the schema Omni shows and with the key
//! declarations both are generated from.

use omni_infra_provider_proxmox::rules::provider_data::keys::{self, Place};
use omni_infra_provider_proxmox::rules::provider_data::schema;

#[test]
fn readme_documents_every_provider_data_key() {
    let readme = include_str!("../README.md");
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../schema/provider-data.schema.json")).unwrap();
    let props = schema["properties"].as_object().unwrap();
    let missing: Vec<&String> = props
        .keys()
        .filter(|k| !readme.contains(&format!("`{k}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "README lacks provider-data keys: {missing:?}"
    );
    for (key, value) in props {
        if let Some(nested) = value["properties"].as_object() {
            for sub in nested.keys() {
                assert!(
                    readme.contains(&format!("`{sub}`")),
                    "README lacks `{key}.{sub}`"
                );
            }
        }
        if let Some(items) = value["items"]["properties"].as_object() {
            for sub in items.keys() {
                assert!(
                    readme.contains(&format!("`{sub}`")),
                    "README lacks `{key}[].{sub}`"
                );
            }
        }
    }
}

/// The provider-data table in the README, from its header to the first line that is not a row.
fn readme_table(readme: &str) -> Vec<&str> {
    readme
        .lines()
        .skip_while(|l| !l.starts_with("| Key | Type | Default | Meaning |"))
        .take_while(|l| l.starts_with('|'))
        .collect()
}

/// Every declared top-level key has its row, with the declared type, default and meaning, in the
/// declared order, and the table has no other row.
#[test]
fn readme_table_is_the_key_declarations() {
    let readme = include_str!("../README.md");
    let table = readme_table(readme);
    let expected = schema::readme_table();
    let expected: Vec<&str> = expected.lines().collect();
    let key_of = |row: &str| row.split('|').nth(1).map(|c| c.trim().to_string());
    let declared: Vec<String> = keys::at(Place::Top)
        .map(|k| format!("`{}`", k.name))
        .collect();
    let documented: Vec<String> = table.iter().skip(2).filter_map(|r| key_of(r)).collect();
    let undeclared: Vec<&String> = documented
        .iter()
        .filter(|k| !declared.contains(k))
        .collect();
    let undocumented: Vec<&String> = declared
        .iter()
        .filter(|k| !documented.contains(k))
        .collect();
    assert!(
        undeclared.is_empty() && undocumented.is_empty(),
        "README rows for undeclared keys {undeclared:?}, declared keys without a row {undocumented:?}"
    );
    for (found, wanted) in table.iter().zip(&expected) {
        assert_eq!(
            found, wanted,
            "the README row differs from the key's declaration (src/rules/provider_data/keys.rs)"
        );
    }
    assert_eq!(table.len(), expected.len(), "{}", expected.join("\n"));
}

#[test]
fn readme_commands_exist() {
    let readme = include_str!("../README.md");
    let makefile = include_str!("../Makefile");
    for target in ["demo", "test", "bench"] {
        assert!(
            readme.contains(&format!("make {target}")),
            "README names make {target}"
        );
        assert!(
            makefile.contains(&format!("\n{target}:")),
            "Makefile has {target}"
        );
    }
    let ci = include_str!("../.ci/run");
    assert!(
        ci.contains("make test"),
        ".ci/run runs the README's test command"
    );
}
