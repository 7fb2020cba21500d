//! Omni infrastructure provider for Proxmox VE: turns Omni MachineRequests into Talos VMs.
//!
//! A map of the crate, in the order a request travels (details in `docs/architecture.md`):
//!
//! - [`omni`]: everything that speaks Omni (signing, the State client and its watch, join configs,
//!   schematics). The in-memory Omni the tests and the demo run against is the `testkit` crate's.
//! - [`controller`]: the long-running duties. [`controller::runner`] drives the watch, the queue and
//!   the workers, and dispatches a key to apply, cleanup or orphan; "what after this error" is
//!   [`controller::error_policy`].
//! - [`pipeline`]: the provisioning steps (one module each, [`pipeline::step`] for what they share)
//!   and [`pipeline::deprovision`].
//! - [`model`]: the world as plain values ([`model::ClusterSnapshot`], built once per listing; the
//!   typed provider state [`model::MachineState`], the one conversion to and from the protobuf), and
//!   "is this VM ours" ([`model::identity::judge_listing`], then [`model::identity::judge_config`]
//!   when the listing cannot say; [`pipeline::identify`] fetches the config) for adoption, teardown
//!   and `orphans` alike.
//! - [`rules`]: the pure decisions the pipeline, `validate` and the health check share: "which node"
//!   ([`rules::placement::pick`]), "which storage" ([`rules::storage::choose`]), what a machine class
//!   says ([`rules::provider_data`]) and what the VM gets ([`rules::vm_config`],
//!   [`rules::cloud_init`], [`rules::schematic`]).
//! - [`proxmox`]: the typed Proxmox VE client; errors sorted by what the caller does next.
//! - [`validate`]: the `validate` command and the `defaults` health check, rendering `rules` verdicts.
//! - [`cli`]: one module per subcommand; nothing below it imports from it.
//!
//! Layers, bottom up (`tests/layers.rs` holds every module to them): `proxmox`/`omni`, `model`,
//! `rules`, `config`, `pipeline`, `validate`, `controller`, `cli`.
pub mod cli;
pub mod config;
pub mod contain;
pub mod controller;
pub mod did_you_mean;
pub mod error_chain;
pub mod fence;
pub mod metrics;
pub mod model;
pub mod omni;
pub mod pipeline;
pub mod proxmox;
pub mod rules;
pub mod secret;
pub mod table;
pub mod telemetry;
pub mod tls;
pub mod validate;
pub mod yaml;
