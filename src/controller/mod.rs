//! The reconcile loop: watch MachineRequests, queue them, run the pipeline, write statuses.
pub mod workqueue;
