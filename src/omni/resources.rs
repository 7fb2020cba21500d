//! The Omni resources a provider reads and writes (§2), as typed kinds.
//!
//! A [`Kind`] ties a namespace and a type string to its spec message, so the state client can hand
//! out decoded specs and nobody spells `MachineRequestStatuses.omni.sidero.dev` twice. The provider's
//! own state kind ([`ProviderMachine`]) is a value, not a constant, because its namespace and type
//! carry the provider ID.

use crate::omni::proto::cosi::resource::meta::ResourceDefinitionSpec;
use crate::omni::proto::provider::{LeaseSpec, MachineSpec};
use crate::omni::proto::specs::*;

/// Namespaces (§2).
pub mod namespace {
    pub const DEFAULT: &str = "default";
    pub const INFRA_PROVIDER: &str = "infra-provider";
    /// Not persisted across Omni restarts: heartbeats live here.
    pub const INFRA_PROVIDER_EPHEMERAL: &str = "infra-provider-ephemeral";
    pub const META: &str = "meta";
    /// Prefix of the provider-private namespace `infra-provider:<id>`.
    pub const PROVIDER_PRIVATE_PREFIX: &str = "infra-provider:";
}

/// Label keys (§2).
pub mod label {
    pub const INFRA_PROVIDER_ID: &str = "omni.sidero.dev/infra-provider-id";
    pub const MACHINE_REQUEST: &str = "omni.sidero.dev/machine-request";
    pub const MACHINE_REQUEST_SET: &str = "omni.sidero.dev/machine-request-set";
    /// Provider-specific machine ID (note: not "machine-infra-id").
    pub const INFRA_ID: &str = "omni.sidero.dev/infra-id";
}

/// Annotation keys (§2).
pub mod annotation {
    /// Last persisted provision step, shared with the Go library so its state can be resumed.
    pub const STEP: &str = "infra.omni.sidero.dev/step";
}

/// Fixed IDs.
pub const SIDEROLINK_CONFIG_ID: &str = "siderolink-config";
pub const FEATURES_CONFIG_ID: &str = "features-config";
/// ResourceDefinition ID whose presence means Omni ≥ 1.0 (v2 join tokens, §3.1).
pub const PROVIDER_JOIN_CONFIG_DEFINITION_ID: &str = "providerjoinconfigs.omni.sidero.dev";

/// Phases (§1.2).
pub const PHASE_RUNNING: &str = "running";
pub const PHASE_TEARING_DOWN: &str = "tearingDown";

/// Controller names the Go library uses; we keep them so state written by the official provider is
/// ours to continue (§2, §3).
pub fn provision_controller_name(provider_id: &str) -> String {
    format!("{provider_id}.ProvisionController")
}

pub fn health_controller_name(provider_id: &str) -> String {
    format!("{provider_id}.ProviderHealthStatusController")
}

/// A resource kind: where it lives and what its spec is.
pub trait Kind: Send + Sync {
    type Spec: prost::Message + Default + Clone + PartialEq + Send + Sync + 'static;
    fn namespace(&self) -> String;
    fn resource_type(&self) -> String;
    /// Best-effort YAML of the spec (§1.6). Omni regenerates it for its own types, so only kinds
    /// Omni does not know (our provider state) need one.
    fn yaml(&self, _spec: &Self::Spec) -> String {
        String::new()
    }
}

/// Declares Omni's kinds, one row each: name, namespace (of [`namespace`]), type, spec message (of
/// [`specs`], or the COSI meta spec).
macro_rules! omni_kinds {
    ($($(#[$doc:meta])* $name:ident: $ns:ident, $ty:literal, $spec:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $name;
        impl $name {
            pub const TYPE: &'static str = $ty;
            pub const NAMESPACE: &'static str = namespace::$ns;
        }
        impl Kind for $name {
            type Spec = $spec;
            fn namespace(&self) -> String {
                namespace::$ns.to_owned()
            }
            fn resource_type(&self) -> String {
                $ty.to_owned()
            }
        }
    )*};
}

omni_kinds! {
    /// What Omni wants provisioned. Read-only for providers except finalizers.
    MachineRequest: INFRA_PROVIDER, "MachineRequests.omni.sidero.dev", MachineRequestSpec;
    /// Progress of one request as Omni shows it; ID = MachineRequest ID.
    MachineRequestStatus: INFRA_PROVIDER, "MachineRequestStatuses.omni.sidero.dev",
        MachineRequestStatusSpec;
    /// Provider registration (name, icon, schema); ID = provider ID.
    InfraProviderStatus: INFRA_PROVIDER, "InfraProviderStatuses.omni.sidero.dev",
        InfraProviderStatusSpec;
    /// Heartbeat; ID = provider ID; lost when Omni restarts.
    InfraProviderHealthStatus: INFRA_PROVIDER_EPHEMERAL,
        "InfraProviderHealthStatuses.omni.sidero.dev", InfraProviderHealthStatusSpec;
    /// A config patch the provider asks Omni to apply to a machine.
    ConfigPatchRequest: INFRA_PROVIDER, "ConfigPatchRequests.omni.sidero.dev", ConfigPatchSpec;
    /// Per-provider join token (Omni ≥ 1.0); ID = provider ID.
    ProviderJoinConfig: INFRA_PROVIDER, "ProviderJoinConfigs.omni.sidero.dev",
        ProviderJoinConfigSpec;
    /// SideroLink endpoints (Omni ≥ 1.0); ID `siderolink-config`.
    SiderolinkApiConfig: DEFAULT, "SiderolinkAPIConfigs.omni.sidero.dev", SiderolinkApiConfigSpec;
    /// Legacy join parameters (Omni < 1.0); ID `siderolink-config`.
    ConnectionParams: DEFAULT, "ConnectionParams.omni.sidero.dev", ConnectionParamsSpec;
    /// Omni's features configuration; ID [`FEATURES_CONFIG_ID`]. Readable by any signed caller,
    /// infra providers included; it names the Image Factory Omni uses.
    FeaturesConfig: DEFAULT, "FeaturesConfigs.omni.sidero.dev", FeaturesConfigSpec;
    /// A Talos version Omni offers; ID = the version without a leading `v`. Names the Image Factory
    /// that serves it when Omni has a secondary one.
    TalosVersion: DEFAULT, "TalosVersions.omni.sidero.dev", TalosVersionSpec;
    /// COSI resource definitions; listing them tells which Omni features exist.
    ResourceDefinition: META, "ResourceDefinitions.meta.cosi.dev", ResourceDefinitionSpec;
}

/// Declares the provider's own kinds, one row each: name, first word of the type, spec message,
/// YAML writer. They live in the provider's namespace `infra-provider:<id>` with the type
/// `<word>.<id>.infraprovider.sidero.dev`, where Omni lets a provider create any type with that
/// suffix (`internal/backend/runtime/omni/infraprovider/state.go`, `checkNamespaceAndType`). Omni
/// does not know these types, so it keeps our YAML verbatim for `omnictl get`.
macro_rules! provider_kinds {
    ($($(#[$doc:meta])* $name:ident: $word:literal, $spec:ident, $yaml:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name {
            pub provider_id: String,
        }
        impl $name {
            pub fn new(provider_id: impl Into<String>) -> Self {
                Self { provider_id: provider_id.into() }
            }
        }
        impl Kind for $name {
            type Spec = $spec;
            fn namespace(&self) -> String {
                format!("{}{}", namespace::PROVIDER_PRIVATE_PREFIX, self.provider_id)
            }
            fn resource_type(&self) -> String {
                format!(concat!($word, ".{}.infraprovider.sidero.dev"), self.provider_id)
            }
            fn yaml(&self, spec: &$spec) -> String {
                $yaml(spec)
            }
        }
    )*};
}

provider_kinds! {
    /// Our provider state: `Machine.<id>.infraprovider.sidero.dev`, same type and namespace as the
    /// official provider so its state is found.
    ProviderMachine: "Machine", MachineSpec, machine_yaml;
    /// The leader lease the replicas of one provider ID share: `Lease.<id>.infraprovider.sidero.dev`,
    /// ID [`ProviderLease::ID`]. The official provider never reads it.
    ProviderLease: "Lease", LeaseSpec, lease_yaml;
}

impl ProviderLease {
    pub const ID: &'static str = "leader";
}

/// Field names are the Go provider's lower-cased ones.
fn machine_yaml(s: &MachineSpec) -> String {
    [
        ("uuid", s.uuid.clone()),
        ("schematic", s.schematic.clone()),
        ("talosversion", s.talos_version.clone()),
        ("volumeid", s.volume_id.clone()),
        ("node", s.node.clone()),
        ("volumeuploadtask", s.volume_upload_task.clone()),
        ("vmcreatetask", s.vm_create_task.clone()),
        ("vmstarttask", s.vm_start_task.clone()),
        ("vmid", s.vmid.to_string()),
        ("reservedvmid", s.reserved_vmid.to_string()),
        ("step", s.step.clone()),
        ("seedisovolume", s.seed_iso_volume.clone()),
        ("addresses", s.addresses.join(",")),
        ("lasterror", s.last_error.clone()),
    ]
    .into_iter()
    .map(|(k, v)| format!("{k}: {}\n", serde_json::Value::String(v)))
    .collect()
}

fn lease_yaml(s: &LeaseSpec) -> String {
    format!(
        "holder: {}\nhost: {}\npid: {}\nleasedurationms: {}\nacquiretimems: {}\nrenewtimems: {}\ntransitions: {}\n",
        serde_json::Value::String(s.holder.clone()),
        serde_json::Value::String(s.host.clone()),
        s.pid,
        s.lease_duration_ms,
        s.acquire_time_ms,
        s.renew_time_ms,
        s.transitions
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_machine_kind_carries_the_id() {
        let k = ProviderMachine::new("proxmox");
        assert_eq!(k.namespace(), "infra-provider:proxmox");
        assert_eq!(
            k.resource_type(),
            "Machine.proxmox.infraprovider.sidero.dev"
        );
        let yaml = k.yaml(&MachineSpec {
            node: "pve1".into(),
            vmid: 104,
            ..Default::default()
        });
        assert!(yaml.contains("node: \"pve1\"\n"));
        assert!(yaml.contains("vmid: \"104\"\n"));
        assert_eq!(
            provision_controller_name("proxmox"),
            "proxmox.ProvisionController"
        );
    }
}
