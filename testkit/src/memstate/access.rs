//! Omni's access rules for infra-provider callers (§2.4): which namespaces and types a provider's
//! identity may read or write, which labels it sees, and what it may change of read-only types.
//! They are enforced here so a provider that only works against a lenient Omni fails in tests.

use tonic::Status;

use super::INFRA_PROVIDER;
use super::store::{Store, md};
use omni_infra_provider_proxmox::omni::proto::cosi::resource as pb;
use omni_infra_provider_proxmox::omni::resources::{
    PHASE_RUNNING, PHASE_TEARING_DOWN, label, namespace,
};

/// Who is calling, as established by the signature.
#[derive(Clone, Debug)]
pub(super) struct Caller {
    pub(super) provider_id: String,
}

/// Resource types providers may only read (and change finalizers of).
pub(super) const READ_ONLY_FOR_PROVIDERS: &[&str] = &[
    "MachineRequests.omni.sidero.dev",
    "InfraMachineRegistrations.omni.sidero.dev",
    "ProviderJoinConfigs.omni.sidero.dev",
    "InfraMachines.omni.sidero.dev",
    "BMCConfigs.omni.sidero.dev",
];
/// The types Omni manages for infra providers in the shared namespaces (Omni's
/// internal/backend/runtime/omni/infraprovider/state.go, getResourceConfig); any other type there is
/// refused, as Omni's general access filter refuses types it does not list. ConfigPatchRequests are
/// readable and writable, label-checked like the rest of the shared namespace.
const SHARED_TYPES: &[&str] = &[
    "MachineRequests.omni.sidero.dev",
    "MachineRequestStatuses.omni.sidero.dev",
    "InfraMachineRegistrations.omni.sidero.dev",
    "ProviderJoinConfigs.omni.sidero.dev",
    "InfraMachines.omni.sidero.dev",
    "InfraMachineStatuses.omni.sidero.dev",
    "InfraProviderStatuses.omni.sidero.dev",
    "InfraProviderHealthStatuses.omni.sidero.dev",
    "InfraProviders.omni.sidero.dev",
    "ConfigPatchRequests.omni.sidero.dev",
    "BMCConfigs.omni.sidero.dev",
];
/// Types whose ID must be the provider ID.
const CHECK_ID_TYPES: &[&str] = &[
    "InfraProviderStatuses.omni.sidero.dev",
    "InfraProviderHealthStatuses.omni.sidero.dev",
    "InfraProviders.omni.sidero.dev",
];
/// Types a provider may read outside the provider namespaces.
const READABLE_ELSEWHERE: &[&str] = &[
    "SiderolinkAPIConfigs.omni.sidero.dev",
    "ConnectionParams.omni.sidero.dev",
    "Machines.omni.sidero.dev",
    "ResourceDefinitions.meta.cosi.dev",
    "Namespaces.meta.cosi.dev",
    "FeaturesConfigs.omni.sidero.dev",
    "TalosVersions.omni.sidero.dev",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    Read,
    Write,
}

/// How a namespace is treated for a provider caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scope {
    /// `infra-provider` / `infra-provider-ephemeral`: label-filtered and label-forced.
    Shared,
    /// `infra-provider:<own id>`: no label checks.
    Private,
    /// Anything else: read-only allow-list.
    Other,
}

impl Caller {
    pub(super) fn scope(
        &self,
        store: &Store,
        ns: &str,
        ty: &str,
        access: Access,
    ) -> Result<Scope, Status> {
        let scope = if ns == namespace::INFRA_PROVIDER || ns == namespace::INFRA_PROVIDER_EPHEMERAL
        {
            if !SHARED_TYPES.contains(&ty) {
                return Err(Status::permission_denied("no access is permitted"));
            }
            Scope::Shared
        } else if let Some(other) = ns.strip_prefix(namespace::PROVIDER_PRIVATE_PREFIX) {
            if other != self.provider_id {
                return Err(Status::permission_denied(format!(
                    "namespace {ns:?} not allowed"
                )));
            }
            let suffix = format!(".{}.infraprovider.sidero.dev", self.provider_id);
            if !ty.ends_with(&suffix) {
                return Err(Status::invalid_argument(format!(
                    "resource type {ty:?} must end with {suffix:?} in namespace {ns:?}"
                )));
            }
            Scope::Private
        } else {
            if !READABLE_ELSEWHERE.contains(&ty) {
                return Err(Status::permission_denied("no access is permitted"));
            }
            if access == Access::Write {
                return Err(Status::permission_denied("only read access is permitted"));
            }
            return Ok(Scope::Other);
        };
        let registered = (
            namespace::INFRA_PROVIDER.to_owned(),
            INFRA_PROVIDER.resource_type.to_string(),
            self.provider_id.clone(),
        );
        if !store.resources.contains_key(&registered) {
            return Err(Status::permission_denied(format!(
                "infra provider with name {:?} is not registered in the system",
                self.provider_id
            )));
        }
        Ok(scope)
    }

    pub(super) fn check_id(&self, ty: &str, id: &str) -> Result<(), Status> {
        if CHECK_ID_TYPES.contains(&ty) && id != self.provider_id {
            return Err(Status::invalid_argument(format!(
                "resource ID {id:?} must match the infra provider ID {:?}",
                self.provider_id
            )));
        }
        Ok(())
    }

    /// Shared namespaces only show resources labelled with the caller's ID.
    pub(super) fn visible(&self, scope: Scope, r: &pb::Resource) -> bool {
        scope != Scope::Shared
            || md(r).labels.get(label::INFRA_PROVIDER_ID) == Some(&self.provider_id)
    }
}

/// `metadata`/`spec` present, phase valid (the COSI server's parser, answered as `Unknown`).
pub(super) fn validate_resource(r: &pb::Resource) -> Result<(), Status> {
    let m = r
        .metadata
        .as_ref()
        .ok_or_else(|| Status::unknown("metadata is missing"))?;
    if r.spec.is_none() {
        return Err(Status::unknown("spec is missing"));
    }
    if m.phase != PHASE_RUNNING && m.phase != PHASE_TEARING_DOWN {
        return Err(Status::unknown(format!("unknown phase {:?}", m.phase)));
    }
    if m.version != "undefined" && m.version.parse::<u64>().is_err() {
        return Err(Status::unknown(format!("invalid version {:?}", m.version)));
    }
    Ok(())
}

/// Read-only types: everything but version and finalizers (and `updated`) must be unchanged,
/// spec compared as bytes (stricter than Omni's decoded comparison; same for echoed bytes).
pub(super) fn only_finalizers_changed(stored: &pb::Resource, new: &pb::Resource) -> bool {
    let strip = |r: &pb::Resource| {
        let mut r = r.clone();
        if let Some(m) = r.metadata.as_mut() {
            m.version.clear();
            m.finalizers.clear();
            m.updated = None;
            m.created = None;
        }
        if let Some(s) = r.spec.as_mut() {
            s.yaml_spec.clear();
        }
        r
    };
    strip(stored) == strip(new)
}

#[cfg(test)]
mod tests {
    use super::super::watch::tombstone;
    use super::*;

    #[test]
    fn read_only_update_may_only_touch_finalizers() {
        let r = tombstone("infra-provider", "MachineRequests.omni.sidero.dev", "r1");
        let mut f = r.clone();
        f.metadata.as_mut().unwrap().finalizers.push("x".into());
        f.metadata.as_mut().unwrap().version = "7".into();
        assert!(only_finalizers_changed(&r, &f));
        let mut s = r.clone();
        s.spec.as_mut().unwrap().proto_spec = vec![10, 1, b'v'];
        assert!(!only_finalizers_changed(&r, &s));
        let mut l = r.clone();
        l.metadata
            .as_mut()
            .unwrap()
            .labels
            .insert("k".into(), "v".into());
        assert!(!only_finalizers_changed(&r, &l));
    }
}
