//! The typed provider data the pipeline works from: the keys that take effect, every default
//! filled in.

use std::ops::{Deref, DerefMut};

use super::Problem;
use super::keys::{HaSettings, Keys};
use crate::proxmox::property::DiskOptions;
use crate::rules::storage_selector::StorageSelector;

impl HaSettings {
    /// Whether the VM joins any HA rule: keys Proxmox VE 8 has no API for.
    pub fn uses_rules(&self) -> bool {
        !self.rules.is_empty()
            || !self.node_affinity_nodes.is_empty()
            || self.resource_affinity.is_some()
    }
}

/// Validated provider data: the merged [`Keys`] (read through `Deref`), and the required storage
/// selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderData {
    pub keys: Keys,
    pub storage_selector: StorageSelector,
    /// Keys that were ignored (unknown ones, each with a suggestion when one is close): not fatal, as
    /// with the official provider, but shown in the machine's status, the log and `validate`.
    pub warnings: Vec<Problem>,
}

impl Deref for ProviderData {
    type Target = Keys;

    fn deref(&self) -> &Keys {
        &self.keys
    }
}

impl DerefMut for ProviderData {
    fn deref_mut(&mut self) -> &mut Keys {
        &mut self.keys
    }
}

impl ProviderData {
    /// The VM's vCPUs (cores per socket times sockets), as placement counts them against a node.
    pub fn vcpus(&self) -> u64 {
        u64::from(self.cores).saturating_mul(u64::from(self.sockets.max(1)))
    }

    /// Disk space the VM needs on its main storage: boot disk plus additional disks, in GB.
    pub fn total_disk_gb(&self) -> u64 {
        self.disk_size_gb.saturating_add(
            self.additional_disks
                .iter()
                .map(|d| d.size_gb)
                .fold(0, u64::saturating_add),
        )
    }

    /// The boot disk's options.
    pub fn disk(&self) -> DiskOptions {
        DiskOptions {
            ssd: self.disk_ssd,
            discard: self.disk_discard,
            iothread: self.disk_iothread,
            cache: self.disk_cache,
            aio: self.disk_aio,
        }
    }
}
