//! Where a value comes from: the class's YAML over the config's `nodes:` and `defaults:`, so each
//! finding names the key where the user must change it.

use serde_json::{Value, json};

use crate::config::ProviderConfig;
use crate::rules::ip_pool;
use crate::rules::provider_data::{ConfigLayers, Problem, ProviderData, class_map};

/// Where the provider data comes from: the class's YAML over the config's `nodes:` and `defaults:`;
/// the config's static IP pools, whose bridge and VLAN replace the NIC's, as provisioning does.
#[derive(Debug, Clone, Copy)]
pub struct Layers<'a> {
    pub class_yaml: &'a str,
    pub config: &'a ProviderConfig,
    /// The config's `defaults:` on their own, without a class: the keys a class must set that
    /// `defaults:` leave out get stand-ins ([`STAND_INS`]), and findings about stand-ins are dropped.
    stand_ins: bool,
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
            config,
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

    /// The provider data as it would be on `node` (its override applied, and the NICs on their IP
    /// pools' networks: `ip_pool::apply_networks`, as provisioning resolves it), or the problems. A pool
    /// that does not exist is left to the pool findings, which name it once.
    pub(crate) fn resolve_on(&self, node: Option<&str>) -> Result<ProviderData, Vec<Problem>> {
        let mut filled = self.config.defaults.clone();
        for (key, value) in STAND_INS.iter().filter(|_| self.stand_ins) {
            filled.entry(*key).or_insert_with(value);
        }
        let config = ConfigLayers::read(&filled, &self.config.nodes, self.config.layers.strict);
        let mut data = config.resolve(self.class_yaml, node)?;
        let _unknown_pools = ip_pool::apply_networks(&mut data, &self.config.ip_pools);
        Ok(data)
    }

    /// `key` as the user must change it: in the class, under `nodes.<node>.`, or under `defaults.`.
    pub(crate) fn key(&self, key: &str, node: Option<&str>) -> String {
        let class = class_map(self.class_yaml).unwrap_or_default();
        self.config.layers.key_path(&class, key, node)
    }

    /// True when the value is a stand-in (checking `defaults:`, which have no class, the key is set
    /// in no layer).
    pub(crate) fn is_stand_in(&self, key: &str, node: Option<&str>) -> bool {
        let stand_in = CHECKED_ONLY_WHEN_SET.contains(&key) || STAND_INS.iter().any(|s| s.0 == key);
        self.stand_ins && stand_in && self.key(key, node) == key
    }
}
