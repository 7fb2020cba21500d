//! Omni infrastructure provider for Proxmox VE: turns Omni MachineRequests into Talos VMs.
//!
//! Layout follows the data flow: [`omni`] speaks to Omni, [`controller`] reconciles requests,
//! [`pipeline`] holds the provisioning steps and their pure decision functions, [`proxmox`] is the typed
//! Proxmox VE client, and [`cli`] holds one module per subcommand.
//!
//! - [`model`]: the cluster snapshot, built once from `/cluster/resources`.
//! - [`rules`]: "which node" ([`rules::placement::pick`]) and "which storage" ([`rules::storage::choose`]).
pub mod cli;
pub mod config;
pub mod controller;
pub mod did_you_mean;
pub mod error_chain;
pub mod metrics;
pub mod model;
pub mod omni;
pub mod pipeline;
pub mod proxmox;
pub mod rules;
pub mod secret;
pub mod telemetry;
pub mod tls;
pub mod validate;
pub mod yaml;
