//! The decisions, as pure functions over [`crate::model`] values: the pipeline acts on them, and
//! `validate` and the health check render them, so all three answer "which node" and "which storage"
//! the same way.
//!
//! - "Which node": [`placement::pick`], built on the per-node rule [`placement::node_verdict`].
//! - "Which storage": [`storage::choose`], for boot disks, additional disks and ISO images.
pub mod placement;
pub mod storage;
