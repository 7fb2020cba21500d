//! What the provider knows about the world, as plain values built once from the API's answers.
//!
//! The rules (`crate::rules`) decide on these values, never on raw API listings, so the pipeline, the
//! `validate` command and the health check all see the cluster the same way.
pub mod cluster;
pub mod identity;
pub mod machine;
pub mod template;
pub mod vm;

pub use crate::proxmox::listing::Listing;
pub use cluster::{ClusterSnapshot, GIB, MIB, NodeSnapshot, StorageSnapshot};
pub use machine::MachineState;
pub use template::TemplateFacts;
