//! Placements decided and not yet visible as VMs in the listing.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::entry;
use crate::rules::placement::{
    Placement, PlacementError, PlacementRequest, Reservation, Reservations,
};

/// The nodes requests in flight were placed on, until the listing shows their VMs.
#[derive(Default)]
pub struct Placements {
    reservations: Mutex<Reservations>,
    /// When a reservation was last dropped: a listing sent before then may lack the VM it stood
    /// for, so it is not shared with a reconcile starting after it.
    dropped: Mutex<Option<Instant>>,
}

impl Placements {
    /// Places a request with the reservations of requests in flight counted, and reserves the
    /// chosen node for it under the same lock: two requests placed at once cannot both take the last
    /// room on a node.
    pub fn place(
        &self,
        r: &PlacementRequest,
        decide: impl FnOnce(&Reservations) -> Result<Placement, PlacementError>,
    ) -> Result<Placement, PlacementError> {
        let mut reservations = entry(&self.reservations);
        let placement = decide(&reservations)?;
        let reservation = Reservation {
            node: placement.node.clone(),
            set_id: r.set_id.map(str::to_string),
            memory_bytes: r.memory_bytes(),
            vcpus: r.data.vcpus(),
        };
        reservations.reserve(r.request_id, reservation);
        Ok(placement)
    }

    pub fn reserve(&self, request_id: &str, reservation: Reservation) {
        entry(&self.reservations).reserve(request_id, reservation);
    }

    /// Requests of `set` other than `request_id` placed by this process whose VMs the listing may
    /// not show yet.
    pub fn in_set(&self, set: &str, request_id: &str) -> Vec<String> {
        entry(&self.reservations).in_set(set, request_id)
    }

    /// The request's VM is visible now (or never will be): it counts through the listing again.
    pub fn release(&self, request_id: &str) {
        if entry(&self.reservations).release(request_id).is_some() {
            *entry(&self.dropped) = Some(Instant::now());
        }
    }

    /// How long ago a reservation was last dropped.
    pub fn since_dropped(&self) -> Option<Duration> {
        entry(&self.dropped).map(|at| at.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxmox::property::{NodeName, StorageId};
    use crate::rules::provider_data::ConfigLayers;

    #[test]
    fn a_placement_is_reserved_under_the_lock_it_was_decided_with() {
        let placements = Placements::default();
        let node_selectors = Default::default();
        let yaml = "cores: 2\nmemory: 2048\ndisk_size: 10\nstorage_selector: 'true'";
        let mut data = ConfigLayers::default().resolve(yaml, None).unwrap();
        data.keys.memory_mb = 1024;
        let request = |request_id: &'static str, set_id| PlacementRequest {
            request_id,
            data: &data,
            node_selectors: &node_selectors,
            set_id,
            limits: Default::default(),
            clone: None,
        };
        let place = |id: &'static str| {
            placements.place(&request(id, Some("set")), |reservations| {
                // What the next decision sees already holds every earlier one.
                let node = format!("pve{}", reservations.in_set("set", "").len() + 1);
                Ok(Placement {
                    node: NodeName::new(node).unwrap(),
                    storage: StorageId::new("local-lvm").unwrap(),
                    reason: crate::rules::placement::PlacementReason::Pinned,
                    template: None,
                })
            })
        };
        assert_eq!(
            place("a").map(|p| p.node.to_string()).ok().as_deref(),
            Some("pve1")
        );
        assert_eq!(
            place("b").map(|p| p.node.to_string()).ok().as_deref(),
            Some("pve2")
        );
        let _ = placements.place(&request("c", None), |r| {
            assert_eq!(r.get("b").map(|r| r.node.as_str()), Some("pve2"));
            assert_eq!(r.get("b").map(|r| r.memory_bytes), Some(1024 * 1024 * 1024));
            Ok(Placement {
                node: NodeName::new("pve3").unwrap(),
                storage: StorageId::new("local-lvm").unwrap(),
                reason: crate::rules::placement::PlacementReason::Pinned,
                template: None,
            })
        });
    }
}
