//! Property tests for what Proxmox VE and the guest agent answer: numbers as strings, missing
//! fields, nulls, huge and out-of-range numbers, unicode and nested junk. Decoding an answer returns
//! `Ok` or `Err`, never panics, and nothing the provider derives from a decoded answer (the cluster
//! snapshot, a template's drives, the boot disk, cloud-init drives, usable addresses) panics either.
//! Bounded (256 cases each) so CI runs them with the rest of the suite.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use omni_infra_provider_proxmox::model::cluster::ClusterSnapshot;
use omni_infra_provider_proxmox::model::template::TemplateFacts;
use omni_infra_provider_proxmox::model::vm::{BootDisk, cloud_init_drives};
use omni_infra_provider_proxmox::pipeline::discover_ip::usable_addresses;
use omni_infra_provider_proxmox::proxmox::cluster::{NetworkInterface, ResourceMapping};
use omni_infra_provider_proxmox::proxmox::types::{
    AgentInterfaces, ClusterResource, NodeResource, NodeStorage, StorageVolume, TaskLogLine,
    TaskStatus, Upid, Version, VmConfig, VmId, VmResource,
};
use omni_infra_provider_proxmox::rules::placement;

/// Stand-ins replaced in the JSON text by numbers `serde_json::Value` cannot hold.
const HUGE_INT: &str = "\"@huge-int@\"";
const HUGE_FLOAT: &str = "\"@huge-float@\"";

/// Every field name the decoded types read, so structure-aware objects hit them.
const FIELDS: &[&str] = &[
    "type",
    "vmid",
    "node",
    "name",
    "status",
    "template",
    "tags",
    "pool",
    "lock",
    "maxmem",
    "mem",
    "maxdisk",
    "disk",
    "maxcpu",
    "cpu",
    "uptime",
    "storage",
    "content",
    "plugintype",
    "shared",
    "active",
    "enabled",
    "avail",
    "total",
    "used",
    "volid",
    "format",
    "size",
    "qmpstatus",
    "version",
    "release",
    "repoid",
    "exitstatus",
    "n",
    "t",
    "result",
    "hardware-address",
    "ip-addresses",
    "ip-address",
    "ip-address-type",
    "prefix",
    "iface",
    "id",
    "map",
    "boot",
    "bootdisk",
    "scsi0",
    "virtio0",
    "sata1",
    "ide2",
    "efidisk0",
    "tpmstate0",
    "digest",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,16}",
        prop::sample::select(vec![
            "",
            " ",
            "0",
            "1",
            "-1",
            "105",
            " 42 ",
            "1.5e3",
            "-0.5",
            "NaN",
            "inf",
            "-inf",
            "1e400",
            "18446744073709551616",
            "true",
            "yes",
            "on",
            "qemu",
            "lxc",
            "node",
            "storage",
            "pool",
            "online",
            "offline",
            "running",
            "stopped",
            "pve1",
            "../x",
            "local-lvm",
            "local-lvm:vm-104-disk-0,size=4G",
            "local:iso/talos.iso,media=cdrom",
            "local-lvm:vm-104-cloudinit",
            "order=scsi0;ide2;net0",
            "order=;;",
            "scsi0",
            "virtio99999999999",
            "10.0.0.5",
            "fe80::1",
            "::",
            "bogus",
            "a;b,c d",
            "UPID:pve1:000A1B2C:0001E240:65A1B2C3:qmclone:9000:root@pam:",
            "UPID:",
            "node=pve1,path=0000:01:00.0",
            "node=",
            "ünïcødé\u{202e}",
            "\u{0}",
        ])
        .prop_map(str::to_string),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(Value::from),
        Just(Value::String(HUGE_INT.trim_matches('"').into())),
        Just(Value::String(HUGE_FLOAT.trim_matches('"').into())),
        text().prop_map(Value::String),
    ]
}

/// Arbitrary JSON, and objects made of the fields the types read with arbitrary values.
fn answer() -> impl Strategy<Value = Value> {
    let known = prop::collection::btree_map(
        prop::sample::select(FIELDS).prop_map(str::to_string),
        leaf(),
        0..12,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()));
    let base = prop_oneof![leaf(), known];
    base.prop_recursive(3, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    prop::sample::select(FIELDS).prop_map(str::to_string),
                    "\\PC{0,6}"
                ],
                inner,
                0..8
            )
            .prop_map(|m: BTreeMap<String, Value>| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// The answer as the JSON text Proxmox would send, with the huge-number stand-ins spelled out.
fn as_text(v: &Value) -> String {
    v.to_string()
        .replace(HUGE_INT, "184467440737095516160000000")
        .replace(HUGE_FLOAT, "1e400")
}

/// Decodes `text` as `T` both as it is and as the `data` of a Proxmox envelope; only `Ok` or `Err`.
fn decode<T: DeserializeOwned>(text: &str) -> Option<T> {
    let _ = serde_json::from_str::<Vec<T>>(text);
    serde_json::from_str::<T>(text).ok()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn proxmox_answers_decode_or_fail_without_panicking(v in answer()) {
        let text = as_text(&v);
        let wrapped = format!("{{\"data\":{text}}}");
        let _ = serde_json::from_str::<Value>(&wrapped);

        let resources: Option<Vec<ClusterResource>> = serde_json::from_str(&text).ok();
        let single: Option<ClusterResource> = decode(&text);
        let mut all = resources.unwrap_or_default();
        all.extend(single);
        let snapshot = ClusterSnapshot::from_resources(&all);
        for node in &snapshot.nodes {
            let limits = placement::PlacementLimits::default();
            let _ = (node.memory_max.saturating_sub(node.memory_used), placement::allocation(node, &limits, &Default::default(), ""));
        }

        let config: Option<VmConfig> = decode(&text);
        if let Some(config) = &config {
            let _ = (config.get("digest"), BootDisk::of(config).map(|b| b.volume().to_owned()));
            let _ = cloud_init_drives(config);
            for vm in all.iter().filter_map(|r| match r {
                ClusterResource::Vm(vm) | ClusterResource::Container(vm) => Some(vm),
                _ => None,
            }) {
                let _ = (vm.tag_list(), vm.is_running());
                let facts = TemplateFacts::from_config(vm, config, &snapshot);
                let _ = (facts.all_shared(), facts.local_storages());
            }
        }
        if let Some(vm) = decode::<VmResource>(&text) {
            let _ = (vm.tag_list(), vm.has_tag("x"));
        }
        if let Some(agent) = decode::<AgentInterfaces>(&text) {
            let _ = usable_addresses(&agent);
        }
        if let Some(storage) = decode::<NodeStorage>(&text) {
            let _ = storage.holds("images");
        }
        if let Some(mapping) = decode::<ResourceMapping>(&text) {
            let _ = mapping.nodes();
        }
        let _ = decode::<NetworkInterface>(&text);
        let _ = decode::<TaskStatus>(&text);
        let _ = decode::<NodeResource>(&text);
        let _ = decode::<StorageVolume>(&text);
        let _ = decode::<TaskLogLine>(&text);
        let _ = decode::<Version>(&text);
        let _ = decode::<VmId>(&text);
        if let Some(upid) = decode::<Upid>(&text) {
            let _ = (upid.node(), upid.task_type());
        }
    }

    /// The same types fed field by field: one known object with each field replaced by junk.
    #[test]
    fn known_answers_with_one_field_replaced(field in prop::sample::select(FIELDS), value in leaf()) {
        let bases = [
            json!({"type":"qemu","vmid":105,"node":"pve1","name":"a","template":0,"maxmem":"2147483648","tags":"a;b"}),
            json!({"type":"node","node":"pve1","status":"online","mem":1,"maxmem":2,"maxcpu":4,"cpu":0.5}),
            json!({"type":"storage","storage":"local","node":"pve1","shared":1,"disk":1,"maxdisk":2,"content":"images,iso"}),
            json!({"storage":"local","type":"dir","content":"iso","avail":"5","enabled":1}),
            json!({"volid":"local:iso/talos.iso","size":"12","vmid":"104"}),
            json!({"status":"stopped","exitstatus":"OK","type":"qmclone"}),
            json!({"result":[{"name":"eth0","ip-addresses":[{"ip-address":"10.0.0.5","prefix":24}]}]}),
            json!({"boot":"order=scsi0;ide2","scsi0":"local-lvm:vm-104-disk-0,size=4G","ide2":"none,media=cdrom","digest":"abc"}),
            json!({"version":"8.4.1","release":"8.4","repoid":"abc"}),
        ];
        for mut base in bases {
            base[field] = value.clone();
            let text = as_text(&base);
            let resource: Option<ClusterResource> = decode(&text);
            let _ = ClusterSnapshot::from_resources(&resource.into_iter().collect::<Vec<_>>());
            let _ = decode::<NodeStorage>(&text);
            let _ = decode::<StorageVolume>(&text);
            let _ = decode::<TaskStatus>(&text);
            let _ = decode::<Version>(&text);
            if let Some(agent) = decode::<AgentInterfaces>(&text) {
                let _ = usable_addresses(&agent);
            }
            if let Some(config) = decode::<VmConfig>(&text) {
                let _ = (BootDisk::of(&config), cloud_init_drives(&config));
            }
        }
    }
}
