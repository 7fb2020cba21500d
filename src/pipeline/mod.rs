//! The provisioning pipeline: the steps and the pure decisions they are glued from.
//!
//! Everything in here that decides something (placement, validation, rendering) is a pure function
//! so it can be tested without Proxmox or Omni; the steps that call the clients live beside them.
pub mod cloud_init;
pub mod deprovision;
pub mod placement;
pub mod provider_data;
pub mod schematic;
pub mod storage_selector;
pub mod vm_config;
