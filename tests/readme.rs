//! The README's provider-data reference stays in step with the schema Omni shows and with the key
//! declarations both are generated from.

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

/// The README's provider-data table generated from the key declarations: header and one row per
/// top-level key.
fn generated_table() -> String {
    let mut table = String::from("| Key | Type | Default | Meaning |\n|---|---|---|---|\n");
    for name in schema::top_keys() {
        let key = &schema::DECLARED["properties"][name];
        let text = |k: &str| key[k].as_str().unwrap_or_default();
        let kind = match (text("x-type"), text("type")) {
            ("", "array") => "list",
            ("", "object") => "mapping",
            ("", kind) => kind,
            (kind, _) => kind,
        };
        let default = match key.get("x-required").is_some() {
            true => "required",
            false => text("x-default"),
        };
        let ours = match key.get("x-ours") {
            Some(serde_json::Value::Bool(true)) => "*ours*: ",
            _ => "",
        };
        let row = format!(
            "| `{name}` | {kind} | {default} | {ours}{} |",
            text("x-readme")
        );
        table.push_str(&row.replace("|  |", "| |"));
        table.push('\n');
    }
    table
}

/// Every declared top-level key has its row, with the declared type, default and meaning, in the
/// declared order, and the table has no other row.
#[test]
fn readme_table_is_the_key_declarations() {
    let readme = include_str!("../README.md");
    let table = readme_table(readme);
    let expected = generated_table();
    let expected: Vec<&str> = expected.lines().collect();
    let key_of = |row: &str| row.split('|').nth(1).map(|c| c.trim().to_string());
    let declared: Vec<String> = schema::top_keys()
        .iter()
        .map(|k| format!("`{k}`"))
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
            "the README row differs from the key's declaration (src/rules/provider_data/keys.rs); regenerate it with `cargo test --test readme write_readme_table -- --ignored`"
        );
    }
    assert_eq!(table.len(), expected.len(), "{}", expected.join("\n"));
}

/// Writes the README's provider-data table from the key declarations.
#[test]
#[ignore = "rewrites README.md; run after changing a key declaration"]
fn write_readme_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let readme = std::fs::read_to_string(path).unwrap();
    let old = readme_table(&readme).join("\n") + "\n";
    std::fs::write(path, readme.replacen(&old, &generated_table(), 1)).unwrap();
}

#[test]
fn readme_commands_exist() {
    let readme = include_str!("../README.md");
    let makefile = include_str!("../Makefile");
    for target in ["demo", "sandbox", "test", "bench", "setup", "build"] {
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

/// The README's `omnictl apply` example of step 6 is a MachineClass Omni takes, with provider data
/// this provider takes in strict mode.
///
/// Omni's side, as read in siderolabs/omni: client/pkg/omni/resources/omni/machine_class.go
/// (`MachineClassType` = `MachineClasses.omni.sidero.dev`, namespace `resources.DefaultNamespace` =
/// `default`); client/api/omni/specs/omni.proto `MachineClassSpec` (`match_labels`,
/// `auto_provision` with `provider_id`, `kernel_args`, `meta_values`, `provider_data`,
/// `grpc_tunnel`), which omnictl reads through cosi-project/runtime pkg/resource/protobuf
/// `ResourceSpec.UnmarshalYAML` with gopkg.in/yaml.v3, whose keys are the Go field names lowercased
/// (`autoprovision`, `providerid`, `providerdata`); internal/backend/runtime/omni/validations/
/// machine_class.go `machineClassValidationOptions` (a non-empty provider ID, not both auto
/// provision and match labels, provider data checked against the provider's published schema) and
/// validations/machine_set.go (no `Unlimited` size for an auto-provisioned class).
#[test]
fn readme_machine_class_is_one_omni_and_this_provider_take() {
    let readme = include_str!("../README.md");
    let start = readme
        .find("   # proxmox-workers.yaml\n")
        .expect("README step 6 shows proxmox-workers.yaml");
    let block: String = readme[start..]
        .lines()
        .take_while(|l| l.trim() != "```")
        .map(|l| format!("{}\n", l.strip_prefix("   ").unwrap_or(l)))
        .collect();
    let class = omni_infra_provider_proxmox::yaml::from_str(&block).unwrap();
    assert_eq!(class["metadata"]["type"], "MachineClasses.omni.sidero.dev");
    assert_eq!(class["metadata"]["namespace"], "default");
    let spec = class["spec"].as_object().unwrap();
    assert_eq!(spec.keys().collect::<Vec<_>>(), ["autoprovision"]);
    let auto = spec["autoprovision"].as_object().unwrap();
    for key in auto.keys() {
        assert!(
            [
                "providerid",
                "kernelargs",
                "metavalues",
                "providerdata",
                "grpctunnel"
            ]
            .contains(&key.as_str()),
            "{key} is no field of MachineClassSpec.Provision"
        );
    }
    assert_eq!(auto["providerid"], "proxmox");
    let provider_data = auto["providerdata"].as_str().unwrap();
    use omni_infra_provider_proxmox::rules::provider_data::ConfigLayers;
    let strict = ConfigLayers::read(&Default::default(), &Default::default(), true);
    strict
        .resolve(provider_data, None)
        .unwrap_or_else(|p| panic!("README provider data: {p:?}"));
    // The cluster template asks for a number of machines of each class.
    let template = &readme[readme.find("kind: Workers\n").expect("a Workers example")..];
    let size_line = template
        .lines()
        .find(|l| l.trim().starts_with("size:"))
        .unwrap();
    assert!(
        size_line.trim()["size:".len()..]
            .trim()
            .parse::<u32>()
            .is_ok()
    );
}
