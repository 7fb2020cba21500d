//! Where a value comes from: the class's YAML over the config's `nodes:` and `defaults:`, so each
//! finding names the key where the user must change it.

use serde_json::{Map, Value, json};

use crate::config::ProviderConfig;
use crate::rules::ip_pool::{self, IpPool};
use crate::rules::provider_data::{ConfigLayers, Problem, ProviderData, ProviderDataSchema};

/// Where the provider data comes from: the class's YAML over the config's `nodes:` and `defaults:`.
#[derive(Debug, Clone, Copy)]
pub struct Layers<'a> {
    pub class_yaml: &'a str,
    pub defaults: &'a Map<String, Value>,
    pub nodes: &'a Map<String, Value>,
    /// The config's static IP pools: a pool's bridge and VLAN replace the NIC's, as provisioning does.
    pub ip_pools: &'a [IpPool],
    /// The config's `defaults:` on their own, without a class: the keys a class must set that
    /// `defaults:` leave out get stand-ins ([`STAND_INS`]), and findings about stand-ins are dropped.
    pub stand_ins: bool,
}

/// A key and its stand-in value.
type StandIn = (&'static str, fn() -> Value);

/// Values that satisfy the schema for the keys a machine class must set, used when `defaults:` leaves
/// them out.
const STAND_INS: [StandIn; 4] = [
    ("cores", || json!(1)),
    ("memory", || json!(2048)),
    ("disk_size", || json!(5)),
    ("storage_selector", || json!("true")),
];

/// Keys whose built-in default a machine class usually relies on; checked for `defaults:` only when
/// set there (or in a node override).
const CHECKED_ONLY_WHEN_SET: [&str; 2] = ["network_bridge", "iso_storage_selector"];

impl<'a> Layers<'a> {
    pub fn new(class_yaml: &'a str, config: &'a ProviderConfig) -> Self {
        Self {
            class_yaml,
            defaults: &config.defaults,
            nodes: &config.nodes,
            ip_pools: &config.ip_pools,
            stand_ins: false,
        }
    }

    /// The config's `defaults:` (with its `nodes:` overrides) on their own.
    pub fn of_defaults(config: &'a ProviderConfig) -> Self {
        Self {
            stand_ins: true,
            ..Self::new("{}", config)
        }
    }

    fn node_override(&self, node: &str) -> Option<&'a Map<String, Value>> {
        self.nodes.get(node).and_then(Value::as_object)
    }

    /// The provider data as it would be on `node` (its override applied, and the NICs on their IP
    /// pools' networks: `ip_pool::apply_networks`, as provisioning resolves it), or the problems. A pool
    /// that does not exist is left to the pool findings, which name it once.
    pub(crate) fn resolve_on(
        &self,
        schema: &ProviderDataSchema,
        node: Option<&str>,
    ) -> Result<ProviderData, Vec<Problem>> {
        let mut filled = self.defaults.clone();
        for (key, value) in STAND_INS.iter().filter(|_| self.stand_ins) {
            filled.entry(*key).or_insert_with(value);
        }
        let config = ConfigLayers::read(&filled, self.nodes);
        let mut data = schema.resolve_with(self.class_yaml, node, &config)?;
        let _unknown_pools = ip_pool::apply_networks(&mut data, self.ip_pools);
        Ok(data)
    }

    fn class_has(&self, key: &str) -> bool {
        ProviderDataSchema::class_map(self.class_yaml).is_ok_and(|m| m.contains_key(key))
    }

    /// `key` as the user must change it: in the class, under `nodes.<node>.`, or under `defaults.`.
    pub(crate) fn key(&self, key: &str, node: Option<&str>) -> String {
        let in_node = node.filter(|n| self.node_override(n).is_some_and(|m| m.contains_key(key)));
        match in_node {
            _ if self.class_has(key) => key.to_string(),
            Some(n) => format!("nodes.{n}.{key}"),
            None if self.defaults.contains_key(key) => format!("defaults.{key}"),
            None => key.to_string(),
        }
    }

    /// True when the value is a stand-in (checking `defaults:`, the key is set nowhere real).
    pub(crate) fn is_stand_in(&self, key: &str, node: Option<&str>) -> bool {
        let stand_in = CHECKED_ONLY_WHEN_SET.contains(&key) || STAND_INS.iter().any(|s| s.0 == key);
        self.stand_ins && stand_in && self.key(key, node) == key && !self.class_has(key)
    }
}
