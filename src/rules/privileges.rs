//! Whether the Proxmox token holds more on `/` than the provider needs there.
//!
//! A privilege granted on `/` (with propagation, as `pveum acl modify /` grants it) reaches every
//! VM, storage, pool and node of the datacenter, not only the provider's: with `VM.Allocate` there
//! the token can delete any VM, and the provider's ownership checks become the only fence. On `/`
//! itself the provider needs only what is read or decided there: `Sys.Audit` (the cluster's name
//! from `/cluster/status`, the next-id range from `/cluster/options`, HA rules), and, when the
//! features are used, `Sys.Console` (HA resources and rules), `Sys.Modify` (tags under a restrictive
//! `user-tag-access`) and `Sys.AccessNetwork` (`download-url` probes). Everything else belongs on
//! the provider's pool, storages, nodes and SDN zones (docs/security.md).
//!
//! The privileges on `/` are read from `GET /access/permissions`, which pve-access-control
//! (src/PVE/RPCEnvironment.pm, `get_effective_permissions`) answers with the privileges effective
//! on each path, inherited ones included.

/// What the provider may hold on `/` without a warning.
pub const NEEDED_ON_ROOT: [&str; 4] = [
    "Sys.Audit",
    "Sys.Console",
    "Sys.Modify",
    "Sys.AccessNetwork",
];

/// The warning naming the privileges held on `/` beyond [`NEEDED_ON_ROOT`] (sorted), `None` when
/// there are none.
pub fn root_warning<'a>(held_on_root: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut excess: Vec<&str> = held_on_root.into_iter().collect();
    excess.retain(|p| !NEEDED_ON_ROOT.contains(p));
    excess.sort_unstable();
    excess.dedup();
    if excess.is_empty() {
        return None;
    }
    Some(format!(
        "the Proxmox token holds {} on `/`, which reaches every VM and storage of the datacenter, not only the provider's: grant them on the provider's pool, storages, nodes and SDN zones instead, with a privilege-separated token (see docs/security.md)",
        excess.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_system_reads_are_expected_on_the_root() {
        assert_eq!(root_warning(["Sys.Audit", "Sys.Console"]), None);
        assert_eq!(root_warning([]), None);
        let warning = root_warning(["VM.Allocate", "Sys.Audit", "Datastore.Allocate"]).unwrap();
        assert!(
            warning.contains("Datastore.Allocate, VM.Allocate on `/`"),
            "{warning}"
        );
    }
}
