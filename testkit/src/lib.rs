//! Test doubles and the shared test harness of `omni-infra-provider-proxmox`, kept out of the
//! shipped binary: the in-memory Omni ([`memstate`]) with Omni's signature check ([`verify`]), the
//! fakepve glue ([`fakepve`], [`certs`]), the in-process provider against both ([`harness`]), the
//! sandbox cluster ([`sandbox`]), and one [`eventually`]. The `dev-omni` binary serves [`memstate`]
//! for local development.
//!
//! The provider crate depends on this one only as a dev-dependency (its integration tests and
//! examples); this crate depends on the provider crate for the resource kinds, the protobuf types and
//! the codec.

pub mod junk;
pub mod memstate;
pub mod verify;
