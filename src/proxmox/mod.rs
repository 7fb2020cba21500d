//! Typed Proxmox VE client.
//!
//! [`ProxmoxClient`] is the transport (auth, TLS, retries, errors); the API areas add their calls to it
//! in their own modules: [`cluster`] (version, `/cluster/resources`, next VMID, quorum, privileges),
//! [`storage`], [`vms`], [`tasks`]. Responses are typed in [`types`], tolerant of Proxmox's loose JSON.

pub mod client;
pub mod cluster;
pub mod error;
pub mod ha;
pub mod listing;
pub mod property;
pub mod storage;
pub mod tasks;
pub mod types;
pub mod vms;

pub use client::{ProxmoxClient, RetryPolicy};
pub use error::ProxmoxError;
