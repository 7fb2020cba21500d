//! Proxmox VE API types: identifiers and the responses we read.
//!
//! Proxmox is loose with JSON types: the same field arrives as `4` from one endpoint and `"4"` from
//! another (values written through the form API come back as strings), booleans arrive as `0`/`1`, and
//! optional fields are often simply missing (for instance every usage figure of an offline node). The
//! [`lenient`] deserializers accept all of those forms so one odd field never fails a whole listing.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A Proxmox guest ID (VMID). Proxmox allows 100 ..= 999_999_999.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct VmId(u32);

impl VmId {
    pub const MIN: u32 = 100;
    pub const MAX: u32 = 999_999_999;

    pub fn new(id: u32) -> Result<Self, String> {
        let (min, max) = (Self::MIN, Self::MAX);
        let outside = || format!("VMID {id} is outside Proxmox's range {min}..={max}");
        (min..=max)
            .contains(&id)
            .then_some(Self(id))
            .ok_or_else(outside)
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for VmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de> Deserialize<'de> for VmId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = lenient::u64(d)?;
        u32::try_from(n)
            .map_err(|_| format!("VMID {n} is too large"))
            .and_then(VmId::new)
            .map_err(serde::de::Error::custom)
    }
}

pub use super::property::NodeName;

/// A task ID: `UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>:`. The node in it is where the
/// task runs, which is where its status must be asked (a clone to another node runs on the source).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct Upid {
    raw: String,
    node: NodeName,
}

impl Upid {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let invalid = || format!("{raw:?} is not a Proxmox task ID (UPID)");
        let mut parts = raw.split(':');
        match (parts.next(), parts.next()) {
            (Some("UPID"), Some(node)) if parts.count() >= 6 => Ok(Self {
                raw: raw.to_owned(),
                node: NodeName::new(node).map_err(|_| invalid())?,
            }),
            _ => Err(invalid()),
        }
    }

    /// The node the task runs on.
    pub fn node(&self) -> NodeName {
        self.node.clone()
    }

    /// The task type, e.g. `qmclone`, `qmstart`, `download`.
    pub fn task_type(&self) -> &str {
        self.raw.split(':').nth(5).unwrap_or_default()
    }

    pub fn as_str(&self) -> &str {
        &self.raw
    }
}

impl TryFrom<String> for Upid {
    type Error = String;
    fn try_from(raw: String) -> Result<Self, String> {
        Self::parse(&raw)
    }
}

impl fmt::Display for Upid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Version {
    pub version: String,
}

/// Online state of a node as `/nodes` and `/cluster/resources` report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    Online,
    Offline,
    #[default]
    #[serde(other)]
    Unknown,
}

impl NodeState {
    /// How messages name a node's state; `None` is a node not in the cluster.
    pub fn word(state: Option<NodeState>) -> &'static str {
        match state {
            Some(NodeState::Online) => "online",
            Some(NodeState::Offline) => "offline",
            Some(NodeState::Unknown) => "in an unknown state",
            None => "not in the cluster",
        }
    }
}

/// `GET /cluster/resources`: one call that describes the whole cluster (nodes, guests, storages).
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type")]
pub enum ClusterResource {
    #[serde(rename = "qemu")]
    Vm(VmResource),
    #[serde(rename = "lxc")]
    Container(VmResource),
    #[serde(rename = "node")]
    Node(NodeResource),
    #[serde(rename = "storage")]
    Storage(StorageResource),
    /// Pools, SDN zones and whatever later versions add.
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VmResource {
    pub vmid: VmId,
    pub node: NodeName,
    pub name: Option<String>,
    pub status: Option<String>,
    #[serde(default, deserialize_with = "lenient::bool")]
    pub template: bool,
    /// Semicolon-separated, as Proxmox stores them.
    pub tags: Option<String>,
    pub pool: Option<String>,
    pub lock: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub maxmem: Option<u64>,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub maxcpu: Option<u64>,
    /// Set for HA-managed guests (pve-manager PVE/API2/Cluster.pm `resources`: read from the HA
    /// manager's status or resources config on every call, so fresh, unlike the rrd-fed stats).
    pub hastate: Option<String>,
}

impl VmResource {
    /// Tags split the way Proxmox writes them (`;`, also `,` and spaces in older versions).
    pub fn tag_list(&self) -> Vec<&str> {
        split_list(self.tags.as_deref().unwrap_or_default())
    }

    /// In any case: Proxmox lowercases tags unless datacenter.cfg's `tag-style` is case-sensitive.
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tag_list().iter().any(|t| t.eq_ignore_ascii_case(tag))
    }

    pub fn is_running(&self) -> bool {
        self.status.as_deref() == Some("running")
    }
}

/// Splits a Proxmox list the way pve-common's `split_list` does (`a;b`, `a,b` or `a b`): tags, an HA
/// rule's resources and nodes.
pub fn split_list(list: &str) -> Vec<&str> {
    list.split([';', ',', ' '])
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

/// A node; usage figures are absent for offline nodes. Serialized under the names the `cluster`
/// command's report gives them.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct NodeResource {
    #[serde(rename(serialize = "name"))]
    pub node: NodeName,
    #[serde(default)]
    pub status: NodeState,
    #[serde(default, deserialize_with = "lenient::opt_f64")]
    #[serde(rename(serialize = "cpu_usage"))]
    pub cpu: Option<f64>,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    #[serde(rename(serialize = "cpus"))]
    pub maxcpu: Option<u64>,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    #[serde(rename(serialize = "memory_used"))]
    pub mem: Option<u64>,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    #[serde(rename(serialize = "memory_total"))]
    pub maxmem: Option<u64>,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub uptime: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct StorageResource {
    pub storage: String,
    pub node: NodeName,
    pub status: Option<String>,
    pub content: Option<String>,
    pub plugintype: Option<String>,
    #[serde(default, deserialize_with = "lenient::bool")]
    pub shared: bool,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub disk: Option<u64>,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub maxdisk: Option<u64>,
}

/// One entry of `GET /nodes/{node}/storage`: the storages as seen from that node, with real free
/// space. Serialized under the names the `cluster` command's report gives them.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct NodeStorage {
    #[serde(rename(serialize = "name"))]
    pub storage: String,
    #[serde(rename = "type")]
    pub storage_type: String,
    /// Comma-separated content types (`images,rootdir`, `iso,vztmpl,backup`), written as a list.
    #[serde(default, serialize_with = "content_list")]
    pub content: String,
    #[serde(default, deserialize_with = "lenient::bool")]
    pub shared: bool,
    #[serde(default, deserialize_with = "lenient::bool")]
    pub active: bool,
    #[serde(default = "yes", deserialize_with = "lenient::bool")]
    pub enabled: bool,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub used: Option<u64>,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub total: Option<u64>,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    #[serde(rename(serialize = "available"))]
    pub avail: Option<u64>,
}

fn yes() -> bool {
    true
}

fn content_list<S: serde::Serializer>(content: &str, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(content_types(content))
}

/// The types of a storage's comma-separated `content`.
pub fn content_types(content: &str) -> impl Iterator<Item = &str> {
    content.split(',').map(str::trim).filter(|c| !c.is_empty())
}

impl NodeStorage {
    pub fn holds(&self, content: &str) -> bool {
        content_types(&self.content).any(|c| c == content)
    }
}

/// One volume from `GET /nodes/{node}/storage/{storage}/content`.
#[derive(Debug, Clone, Deserialize)]
pub struct StorageVolume {
    pub volid: String,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub size: Option<u64>,
}

/// A VM's configuration as `GET …/config` returns it. Values stay as JSON because Proxmox mixes numbers
/// and strings; [`VmConfig::get`] gives every value as the text Proxmox would show.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(transparent)]
pub struct VmConfig(pub BTreeMap<String, serde_json::Value>);

impl VmConfig {
    pub fn get(&self, key: &str) -> Option<String> {
        match self.0.get(key)? {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Null => None,
            other => Some(other.to_string()),
        }
    }
}

/// `GET /nodes/{node}/tasks/{upid}/status`.
#[derive(Debug, Clone, Deserialize)]
pub struct TaskStatus {
    /// `running` or `stopped`.
    pub status: String,
    pub exitstatus: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TaskLogLine {
    #[serde(default)]
    pub t: String,
}

/// The guest agent's answer to `network-get-interfaces`.
#[derive(Debug, Clone, Deserialize)]
pub struct AgentInterfaces {
    #[serde(default)]
    pub result: Vec<GuestInterface>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct GuestInterface {
    #[serde(default, rename = "ip-addresses")]
    pub ip_addresses: Vec<GuestAddress>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct GuestAddress {
    #[serde(rename = "ip-address")]
    pub ip_address: String,
}

/// Deserializers that accept what Proxmox actually sends.
pub mod lenient {
    use serde::Deserialize;
    use serde::de::{Deserializer, Error};
    use serde_json::Value;

    pub fn opt_f64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        let v = Value::deserialize(d)?;
        let number = match &v {
            Value::Null => return Ok(None),
            Value::String(s) if s.trim().is_empty() => return Ok(None),
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse().ok(),
            Value::Bool(b) => Some(f64::from(u8::from(*b))),
            _ => None,
        };
        number
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("expected a number, found {v}")))
    }

    pub fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        let v = Value::deserialize(d)?;
        let exact = v.as_u64().or_else(|| v.as_str()?.trim().parse().ok());
        if exact.is_some() {
            return Ok(exact);
        }
        // Usage figures may be fractional or (briefly) negative: `as` clamps them into u64.
        let finite = |f: f64| if f.is_finite() { f as u64 } else { 0 };
        Ok(opt_f64(v).map_err(D::Error::custom)?.map(finite))
    }

    pub fn u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        opt_u64(d)?.ok_or_else(|| D::Error::custom("expected a number, found nothing"))
    }

    pub fn bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::Bool(b) => b,
            Value::Null => false,
            Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
            Value::String(s) => matches!(s.trim(), "1" | "true" | "yes" | "on"),
            other => {
                return Err(D::Error::custom(format!(
                    "expected a boolean, found {other}"
                )));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_as_strings_and_missing_fields() {
        let json = r#"[
            {"type":"qemu","vmid":"105","node":"pve2","name":"a","template":"1","maxmem":"2147483648","tags":"x;machine-request.set1"},
            {"type":"node","node":"pve3","status":"offline"},
            {"type":"storage","storage":"local","node":"pve1","shared":0,"disk":1.5e3,"maxdisk":100},
            {"type":"pool","pool":"p"},
            {"type":"sdn","sdn":"z"}
        ]"#;
        let r: Vec<ClusterResource> = serde_json::from_str(json).unwrap();
        match &r[0] {
            ClusterResource::Vm(vm) => {
                assert_eq!(vm.vmid.get(), 105);
                assert!(vm.template);
                assert_eq!(vm.maxmem, Some(2_147_483_648));
                assert!(vm.has_tag("machine-request.set1"));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(&r[1], ClusterResource::Node(n) if n.status == NodeState::Offline && n.mem.is_none())
        );
        assert!(matches!(&r[2], ClusterResource::Storage(s) if s.disk == Some(1500)));
        assert!(matches!(r[3], ClusterResource::Other));
    }

    #[test]
    fn upid_parsing() {
        let u = Upid::parse("UPID:pve1:000A1B2C:0001E240:65A1B2C3:qmclone:9000:root@pam:").unwrap();
        assert_eq!(u.node().as_str(), "pve1");
        assert_eq!(u.task_type(), "qmclone");
        assert!(Upid::parse("UPID:../x:1").is_err());
        assert!(Upid::parse("nonsense").is_err());
    }

    #[test]
    fn ids_are_checked() {
        assert!(VmId::new(99).is_err());
        assert_eq!(VmId::new(104).unwrap().get(), 104);
        assert!(NodeName::new("pve1").is_ok());
        assert!(NodeName::new("../etc").is_err());
    }
}
