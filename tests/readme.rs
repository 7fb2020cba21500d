//! The README's provider-data reference stays in step with the schema Omni shows.

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
