//! The decisions, as pure functions over [`crate::model`] values: the pipeline acts on them, and
//! `validate` and the health check render them, so all three answer "which node" and "which storage"
//! the same way. Nothing here talks to Proxmox or Omni.
//!
//! - "Which node": [`placement::pick`], built on the per-node rule [`placement::node_verdict`].
//! - "Which storage": [`storage::choose`], for boot disks, additional disks and downloaded images,
//!   with [`storage_selector`] evaluating the user's CEL expressions.
//! - What a machine class says: [`provider_data`] (one declaration per key; schema, layering and
//!   every problem at once).
//! - What the VM gets: [`vm_config`] (the Proxmox parameters), [`cloud_init`] (the NoCloud seed),
//!   [`schematic`] (the Image Factory schematic).
//! - "Which address": [`ip_pool::allocate`], the lowest free address of a static IP pool.
pub mod cloud_init;
pub mod ha;
pub mod ip_pool;
pub mod placement;
pub mod provider_data;
pub mod schematic;
pub mod storage;
pub mod storage_selector;
pub mod vm_config;
pub mod vmid;

/// `text` for a message: whole when it has at most `max` characters, else its first `shown` ones.
pub fn shortened(text: &str, max: usize, shown: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let start: String = text.chars().take(shown).collect();
    format!("{start}…")
}
