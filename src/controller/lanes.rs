//! How many requests talk to Proxmox at once: `--concurrency` per Proxmox node, not for the whole
//! cluster, so that a slow or unreachable node slows only the machines on it.
//!
//! A reconcile waits for a Proxmox answer most of its time. Were the limit one pool for all nodes, a
//! node answering in 5 s would soon hold every slot with requests waiting on it, and machines on
//! healthy nodes would queue behind them. So each node has its own lane of `--concurrency` slots,
//! and the work before a node is chosen (placement reads the cluster listing, which any node
//! answers) has one more. A request takes the lane of the node its state names (the node it was
//! placed on, where its VM is) and keeps its slot while it stays on that node; waiting for a slot
//! costs no slot anywhere else. Reading and writing Omni needs no slot: confirming a thousand
//! PROVISIONED machines after a restart is not held up by Proxmox at all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::pipeline::ledgers::entry;
use crate::proxmox::types::NodeName;

/// Where a request's Proxmox work goes: the node its state names, where everything on that node
/// happens (the VM, its seed ISO, its tasks); `None` before it has one, for placement, which reads
/// the cluster as a whole.
pub type Lane = Option<NodeName>;

/// The slots of every lane, made as lanes are first used.
pub struct Lanes {
    per_lane: usize,
    lanes: Mutex<HashMap<Lane, Arc<Semaphore>>>,
}

/// A slot in a lane, given back when dropped.
pub struct Slot {
    lane: Lane,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Lanes {
    /// `per_lane` slots in each lane (at least one).
    pub fn new(per_lane: usize) -> Lanes {
        Lanes {
            per_lane: per_lane.max(1),
            lanes: Mutex::default(),
        }
    }

    /// Waits for a slot in `lane`; first come, first served. `before_waiting` runs when no slot is
    /// free at once, before the wait.
    pub async fn enter(&self, lane: Lane, before_waiting: impl FnOnce()) -> Slot {
        let semaphore = (entry(&self.lanes).entry(lane.clone()))
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_lane)))
            .clone();
        Slot {
            lane,
            // The semaphores are never closed, so the acquire cannot fail; were it to, the request
            // would go ahead without a slot rather than stop.
            _permit: match semaphore.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    before_waiting();
                    semaphore.acquire_owned().await.ok()
                }
            },
        }
    }

    /// Moves `held` to `lane`: kept when it is there already, else given back first (a request
    /// never holds two slots, so two requests cannot wait on each other) and a slot in `lane` taken.
    pub async fn keep_or_enter(
        &self,
        held: &mut Option<Slot>,
        lane: Lane,
        before_waiting: impl FnOnce(),
    ) {
        if held.as_ref().is_some_and(|slot| slot.lane == lane) {
            return;
        }
        *held = None;
        *held = Some(self.enter(lane, before_waiting).await);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const PLACEMENT: Lane = None;

    fn node(name: &str) -> Lane {
        Some(NodeName::new(name).unwrap())
    }

    async fn enters_soon(lanes: &Lanes, lane: Lane) -> Option<Slot> {
        tokio::time::timeout(Duration::from_millis(50), lanes.enter(lane, || {}))
            .await
            .ok()
    }

    #[tokio::test]
    async fn a_node_with_every_slot_taken_does_not_hold_up_the_others() {
        let lanes = Lanes::new(2);
        let busy = [
            lanes.enter(node("pve1"), || {}).await,
            lanes.enter(node("pve1"), || {}).await,
        ];
        assert!(enters_soon(&lanes, node("pve1")).await.is_none());
        let other = enters_soon(&lanes, node("pve2")).await;
        assert!(other.is_some(), "pve2 waited for pve1's slots");
        assert!(enters_soon(&lanes, PLACEMENT).await.is_some());
        drop(busy);
        assert!(enters_soon(&lanes, node("pve1")).await.is_some());
    }

    #[tokio::test]
    async fn moving_to_another_lane_gives_the_slot_back_first() {
        let lanes = Lanes::new(1);
        let mut held = None;
        let mut waited = 0;
        lanes
            .keep_or_enter(&mut held, PLACEMENT, || waited += 1)
            .await;
        lanes
            .keep_or_enter(&mut held, PLACEMENT, || waited += 1)
            .await;
        assert_eq!(held.as_ref().map(|s| &s.lane), Some(&PLACEMENT));
        lanes
            .keep_or_enter(&mut held, node("pve1"), || waited += 1)
            .await;
        assert_eq!(waited, 0, "every slot was free");
        // The placement slot is free for the next request.
        assert!(enters_soon(&lanes, PLACEMENT).await.is_some());
        assert!(enters_soon(&lanes, node("pve1")).await.is_none());
    }

    #[tokio::test]
    async fn what_must_not_be_held_through_a_wait_is_let_go_before_it() {
        let lanes = Arc::new(Lanes::new(1));
        let busy = lanes.enter(node("pve1"), || {}).await;
        let waiting = {
            let lanes = lanes.clone();
            tokio::spawn(async move {
                let mut held = None;
                let mut listing = Some(vec![1, 2, 3]);
                lanes
                    .keep_or_enter(&mut held, node("pve1"), || listing = None)
                    .await;
                listing
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(busy);
        assert_eq!(waiting.await.unwrap(), None);
    }
}
