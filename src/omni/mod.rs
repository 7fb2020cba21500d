//! Everything that speaks to Omni: request signing, the connection, the typed COSI State client,
//! the typed resources a provider touches, and the management (schematic) call. The in-memory Omni
//! that serves the same wire protocol for tests, the demo and local development is the `testkit`
//! crate's.
//!
//! The wire contract is written down in `docs/omni-protocol.md`; section numbers in comments
//! (§1.4, §6.2, ...) point there.

pub mod auth;
pub mod client;
pub mod codec;
pub mod join;
pub mod management;
pub mod resources;
pub mod state;
pub mod transport;

/// Generated protobuf and gRPC code, one module per proto package.
pub mod proto {
    pub mod cosi {
        pub mod resource {
            tonic::include_proto!("cosi.resource");
            pub mod meta {
                tonic::include_proto!("cosi.resource.meta");
            }
        }
    }
    /// Omni spec messages (proto package `specs`).
    pub mod specs {
        tonic::include_proto!("specs");
    }
    pub mod management {
        tonic::include_proto!("management");
    }
    /// Our provider state spec (proto package `provider`).
    pub mod provider {
        tonic::include_proto!("provider");
    }
}
