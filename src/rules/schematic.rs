//! The image-factory schematic for the boot ISO.
//!
//! The ISO is shared by every request with the same extensions and kernel args, so it must not carry
//! anything per-request: the join config (which embeds the request ID in its token) goes through the
//! NoCloud seed instead, and connection kernel args are never added here. The guest agent extension is
//! always added because IP discovery and graceful shutdown depend on it.

use std::collections::BTreeSet;

use super::cloud_init::quoted;

/// Added to every schematic: IP discovery and graceful shutdown need the QEMU guest agent.
pub const GUEST_AGENT_EXTENSION: &str = "siderolabs/qemu-guest-agent";

/// What the MachineRequest asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchematicRequest {
    pub extensions: Vec<String>,
    pub kernel_args: Vec<String>,
    /// META key/value pairs, in request order (keys are 0..=255 in Talos).
    pub meta_values: Vec<(u32, String)>,
    pub overlay: Option<Overlay>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlay {
    pub image: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("META key {0} is out of range: Talos META keys are 0 to 255")]
pub struct MetaKeyOutOfRange(u32);

/// The schematic YAML to hand to `CreateSchematicFromRaw` (or `POST /schematics` on the factory).
///
/// Extensions are the request's plus [`GUEST_AGENT_EXTENSION`], deduplicated and sorted; kernel args are
/// sorted (as the Go library does); meta values keep their order; empty sections are left out. Every
/// string is double-quoted, so no value can change the document's structure.
pub fn schematic_yaml(request: &SchematicRequest) -> Result<String, MetaKeyOutOfRange> {
    if let Some((key, _)) = request.meta_values.iter().find(|(k, _)| *k > 255) {
        return Err(MetaKeyOutOfRange(*key));
    }
    let extensions: BTreeSet<&str> = request
        .extensions
        .iter()
        .map(String::as_str)
        .chain(std::iter::once(GUEST_AGENT_EXTENSION))
        .collect();
    let mut kernel_args: Vec<&str> = request.kernel_args.iter().map(String::as_str).collect();
    kernel_args.sort_unstable();

    let mut out = String::new();
    if let Some(overlay) = &request.overlay {
        out.push_str("overlay:\n");
        out.push_str(&format!("  image: {}\n", quoted(&overlay.image)));
        out.push_str(&format!("  name: {}\n", quoted(&overlay.name)));
    }
    out.push_str("customization:\n");
    if !kernel_args.is_empty() {
        out.push_str("  extraKernelArgs:\n");
        for arg in kernel_args {
            out.push_str(&format!("    - {}\n", quoted(arg)));
        }
    }
    if !request.meta_values.is_empty() {
        out.push_str("  meta:\n");
        for (key, value) in &request.meta_values {
            out.push_str(&format!(
                "    - key: {key}\n      value: {}\n",
                quoted(value)
            ));
        }
    }
    out.push_str("  systemExtensions:\n    officialExtensions:\n");
    for ext in extensions {
        out.push_str(&format!("      - {}\n", quoted(ext)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn minimal_schematic_has_only_the_guest_agent() {
        let yaml = schematic_yaml(&SchematicRequest::default()).unwrap();
        assert_eq!(
            yaml,
            "customization:\n  systemExtensions:\n    officialExtensions:\n      - \"siderolabs/qemu-guest-agent\"\n"
        );
    }

    #[test]
    fn full_schematic() {
        let request = SchematicRequest {
            extensions: vec![
                "siderolabs/iscsi-tools".into(),
                "siderolabs/qemu-guest-agent".into(),
                "a/b".into(),
            ],
            kernel_args: vec!["net.ifnames=0".into(), "console=ttyS0".into()],
            meta_values: vec![(10, "x: y".into()), (5, "z".into())],
            overlay: Some(Overlay {
                image: "siderolabs/sbc-rpi".into(),
                name: "rpi_generic".into(),
            }),
        };
        let yaml = schematic_yaml(&request).unwrap();
        let v = crate::yaml::from_str(&yaml).unwrap();
        assert_eq!(v["overlay"]["name"], "rpi_generic");
        assert_eq!(
            v["customization"]["extraKernelArgs"],
            serde_json::json!(["console=ttyS0", "net.ifnames=0"])
        );
        assert_eq!(
            v["customization"]["meta"],
            serde_json::json!([{"key": 10, "value": "x: y"}, {"key": 5, "value": "z"}])
        );
        assert_eq!(
            v["customization"]["systemExtensions"]["officialExtensions"],
            serde_json::json!([
                "a/b",
                "siderolabs/iscsi-tools",
                "siderolabs/qemu-guest-agent"
            ])
        );
        assert!(!yaml.contains("siderolink"));
    }

    #[test]
    fn meta_keys_are_bytes() {
        let request = SchematicRequest {
            meta_values: vec![(256, "x".into())],
            ..Default::default()
        };
        assert_eq!(schematic_yaml(&request), Err(MetaKeyOutOfRange(256)));
    }

    proptest! {
        #[test]
        fn arbitrary_strings_never_change_the_structure(
            exts in proptest::collection::vec("\\PC{0,20}", 0..4),
            args in proptest::collection::vec("\\PC{0,20}", 0..4),
            meta in proptest::collection::vec((0u32..256, "\\PC{0,20}"), 0..3),
        ) {
            let request = SchematicRequest { extensions: exts.clone(), kernel_args: args.clone(), meta_values: meta.clone(), overlay: None };
            let yaml = schematic_yaml(&request).unwrap();
            let v = crate::yaml::from_str(&yaml).unwrap();
            let mut sorted_args = args.clone();
            sorted_args.sort();
            if !args.is_empty() {
                prop_assert_eq!(&v["customization"]["extraKernelArgs"], &serde_json::json!(sorted_args));
            }
            let listed = v["customization"]["systemExtensions"]["officialExtensions"].as_array().unwrap().len();
            let mut expected: BTreeSet<&str> = exts.iter().map(String::as_str).collect();
            expected.insert(GUEST_AGENT_EXTENSION);
            prop_assert_eq!(listed, expected.len());
            prop_assert_eq!(v.as_object().unwrap().len(), 1);
        }
    }
}
