//! The Omni resources a provider reads and writes (§2), as typed kinds.
//!
//! A [`Kind`] ties a namespace and a type string to its spec message, so the state client can hand
//! out decoded specs and nobody spells `MachineRequestStatuses.omni.sidero.dev` twice. The provider's
//! own kinds ([`provider_machine`]) are made at run time, because their namespace and type carry
//! the provider ID.

use std::borrow::Cow;

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

/// What a spec message must be to travel in a [`Kind`]'s resources.
pub trait Spec: prost::Message + Default + Clone + PartialEq + Send + Sync + 'static {}
impl<S: prost::Message + Default + Clone + PartialEq + Send + Sync + 'static> Spec for S {}

/// A resource kind: where its resources live and the spec message `S` they carry.
#[derive(Debug, Clone)]
pub struct Kind<S> {
    pub namespace: Cow<'static, str>,
    pub resource_type: Cow<'static, str>,
    /// Best-effort YAML of the spec (§1.6). Omni regenerates it for its own types, so only kinds
    /// Omni does not know (the provider's own) have a writer.
    yaml: Option<fn(&S) -> String>,
}

impl<S> Kind<S> {
    /// One of Omni's kinds: `namespace` (of [`namespace`]) and type.
    pub const fn omni(namespace: &'static str, resource_type: &'static str) -> Self {
        Self {
            namespace: Cow::Borrowed(namespace),
            resource_type: Cow::Borrowed(resource_type),
            yaml: None,
        }
    }

    /// One of the provider's own kinds, named by the first `word` of its type. They live in the
    /// provider's namespace `infra-provider:<id>` with the type
    /// `<word>.<id>.infraprovider.sidero.dev`, where Omni lets a provider create any type with that
    /// suffix (`internal/backend/runtime/omni/infraprovider/state.go`, `checkNamespaceAndType`).
    /// Omni does not know these types, so it keeps our YAML verbatim for `omnictl get`.
    fn provider(word: &str, provider_id: &str, yaml: fn(&S) -> String) -> Self {
        Self {
            namespace: format!("{}{provider_id}", namespace::PROVIDER_PRIVATE_PREFIX).into(),
            resource_type: format!("{word}.{provider_id}.infraprovider.sidero.dev").into(),
            yaml: Some(yaml),
        }
    }

    pub fn yaml(&self, spec: &S) -> String {
        self.yaml.map(|write| write(spec)).unwrap_or_default()
    }
}

/// Declares Omni's kinds, one row each: name, namespace (of [`namespace`]), type, spec message (of
/// [`specs`], or the COSI meta spec).
macro_rules! omni_kinds {
    ($($(#[$doc:meta])* $name:ident: $ns:ident, $ty:literal, $spec:ident;)*) => {$(
        $(#[$doc])*
        pub const $name: Kind<$spec> = Kind::omni(namespace::$ns, $ty);
    )*};
}

omni_kinds! {
    /// What Omni wants provisioned. Read-only for providers except finalizers.
    MACHINE_REQUEST: INFRA_PROVIDER, "MachineRequests.omni.sidero.dev", MachineRequestSpec;
    /// Progress of one request as Omni shows it; ID = MachineRequest ID.
    MACHINE_REQUEST_STATUS: INFRA_PROVIDER, "MachineRequestStatuses.omni.sidero.dev",
        MachineRequestStatusSpec;
    /// Provider registration (name, icon, schema); ID = provider ID.
    INFRA_PROVIDER_STATUS: INFRA_PROVIDER, "InfraProviderStatuses.omni.sidero.dev",
        InfraProviderStatusSpec;
    /// Heartbeat; ID = provider ID; lost when Omni restarts.
    INFRA_PROVIDER_HEALTH_STATUS: INFRA_PROVIDER_EPHEMERAL,
        "InfraProviderHealthStatuses.omni.sidero.dev", InfraProviderHealthStatusSpec;
    /// A config patch the provider asks Omni to apply to a machine.
    CONFIG_PATCH_REQUEST: INFRA_PROVIDER, "ConfigPatchRequests.omni.sidero.dev", ConfigPatchSpec;
    /// Per-provider join token (Omni ≥ 1.0); ID = provider ID.
    PROVIDER_JOIN_CONFIG: INFRA_PROVIDER, "ProviderJoinConfigs.omni.sidero.dev",
        ProviderJoinConfigSpec;
    /// SideroLink endpoints (Omni ≥ 1.0); ID `siderolink-config`.
    SIDEROLINK_API_CONFIG: DEFAULT, "SiderolinkAPIConfigs.omni.sidero.dev", SiderolinkApiConfigSpec;
    /// Legacy join parameters (Omni < 1.0); ID `siderolink-config`.
    CONNECTION_PARAMS: DEFAULT, "ConnectionParams.omni.sidero.dev", ConnectionParamsSpec;
    /// Omni's features configuration; ID [`FEATURES_CONFIG_ID`]. Readable by any signed caller,
    /// infra providers included; it names the Image Factory Omni uses.
    FEATURES_CONFIG: DEFAULT, "FeaturesConfigs.omni.sidero.dev", FeaturesConfigSpec;
    /// A Talos version Omni offers; ID = the version without a leading `v`. Names the Image Factory
    /// that serves it when Omni has a secondary one.
    TALOS_VERSION: DEFAULT, "TalosVersions.omni.sidero.dev", TalosVersionSpec;
    /// COSI resource definitions; listing them tells which Omni features exist.
    RESOURCE_DEFINITION: META, "ResourceDefinitions.meta.cosi.dev", ResourceDefinitionSpec;
}

/// Our provider state: `Machine.<id>.infraprovider.sidero.dev`, same type and namespace as the
/// official provider so its state is found.
pub fn provider_machine(provider_id: &str) -> Kind<MachineSpec> {
    Kind::provider("Machine", provider_id, machine_yaml)
}

/// The leader lease the replicas of one provider ID share: `Lease.<id>.infraprovider.sidero.dev`,
/// ID [`LEASE_ID`]. The official provider never reads it.
pub fn provider_lease(provider_id: &str) -> Kind<LeaseSpec> {
    Kind::provider("Lease", provider_id, lease_yaml)
}

pub const LEASE_ID: &str = "leader";

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
        let k = provider_machine("proxmox");
        assert_eq!(k.namespace, "infra-provider:proxmox");
        assert_eq!(k.resource_type, "Machine.proxmox.infraprovider.sidero.dev");
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
