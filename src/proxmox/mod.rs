//! Typed Proxmox VE client.
pub mod property;
