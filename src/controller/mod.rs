//! The provider's long-running duties towards Omni: registration, heartbeat, and reconciling
//! MachineRequests.
//!
//! How a request travels, and where each part lives:
//! - [`workqueue`] hands each key to one reconcile at a time, at the due time the last reconcile's
//!   [`workqueue::Action`] or the error policy set;
//! - [`lanes`] limits how many requests talk to each Proxmox node at once (`--concurrency`);
//! - [`runner`] is the loop (watches → queue → workers), which turns the watch into keys, and one
//!   reconcile of one key with the request the watch delivered: it dispatches it to
//!   [`provision::apply`], [`teardown::cleanup`] or [`teardown::orphan`];
//! - [`error_policy`] decides, from the kind of a failure, when to retry and what the status says;
//! - [`topology`] keeps each machine's Kubernetes zone/region labels (an Omni config patch) in step
//!   with the node its VM runs on;
//! - [`leader`] is the lease in Omni that lets one of any number of replicas do the work;
//! - [`progress`] is where progress goes (the status text); [`context`] holds the clients, the
//!   ledgers and the write caches ([`context::WriteCache`]) every reconcile shares, and a
//!   MachineRequest as the watch delivers it ([`context::Request`]).

pub mod context;
pub mod error_policy;
pub mod health;
pub mod housekeeping;
pub mod lanes;
pub mod leader;
pub mod outputs;
pub mod progress;
pub mod provision;
pub mod registration;
pub mod runner;
pub mod teardown;
pub mod topology;
mod workqueue;
