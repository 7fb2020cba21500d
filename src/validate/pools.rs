//! The static IP pools a class names (`ip_pool`, `additional_nics[].ip_pool`): each must exist in the
//! config file and have a free address.
//!
//! `validate` reads Proxmox only, not Omni, so "free" counts what the cluster shows: the addresses the
//! guest agents of running VMs report (machines on the pool report theirs once booted). A machine
//! still provisioning holds its address in Omni only; the `pools` command counts those too.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::report::{Finding, Outcome};
use crate::rules::ip_pool::{self, IpPool};
use crate::rules::provider_data::ProviderData;

/// Pure: one finding per NIC that names a pool, given the addresses in use.
pub fn check_pools(
    data: &ProviderData,
    pools: &[IpPool],
    in_use: &BTreeSet<IpAddr>,
) -> Vec<Finding> {
    ip_pool::wanted(data)
        .into_iter()
        .map(|(nic, name)| {
            let key = ip_pool::key_of(nic);
            let pool = match ip_pool::find(pools, &key, name) {
                Ok(p) => p,
                Err(p) => return Outcome::Problem.finding(p.key, p.message),
            };
            match ip_pool::allocate(pool, in_use) {
                Ok(next) => {
                    let (used, size) = ip_pool::usage(pool, in_use);
                    Outcome::Pass.finding(
                        key,
                        format!(
                            "pool {name} ({}): {} of {size} free, next {next} (counting addresses running VMs report; `pools` also counts machines still provisioning)",
                            pool.cidr,
                            size - used
                        ),
                    )
                }
                Err(full) => Outcome::Problem.finding(
                    key,
                    format!("{full}: widen its `range` in the config file or remove a machine on it"),
                ),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::provider_data::ConfigLayers;

    fn data(yaml: &str) -> ProviderData {
        ConfigLayers::default()
            .resolve(
                &format!("cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'true'\n{yaml}"),
                None,
            )
            .unwrap()
    }

    fn pools() -> Vec<IpPool> {
        crate::config::ProviderConfig::parse(
            "proxmox:\n  url: https://pve:8006\n  tokenID: a@pve!b\n  tokenSecret: c\nipPools:\n  two:\n    cidr: 10.0.0.0/24\n    range: 10.0.0.10-10.0.0.11\n",
        )
        .unwrap()
        .ip_pools
    }

    #[test]
    fn a_pool_must_exist_and_have_room() {
        let d = data("ip_pool: two\nadditional_nics:\n  - bridge: vmbr1\n    ip_pool: tow\n");
        let none = BTreeSet::new();
        let f = check_pools(&d, &pools(), &none);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].outcome, Outcome::Pass);
        assert!(
            f[0].message.contains("2 of 2 free, next 10.0.0.10"),
            "{}",
            f[0].message
        );
        assert_eq!(f[1].outcome, Outcome::Problem);
        assert_eq!(f[1].key, "additional_nics[0].ip_pool");
        assert!(
            f[1].message.contains("did you mean `two`"),
            "{}",
            f[1].message
        );

        let full: BTreeSet<IpAddr> = ["10.0.0.10", "10.0.0.11"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let f = check_pools(&data("ip_pool: two\n"), &pools(), &full);
        assert_eq!(f[0].outcome, Outcome::Problem);
        assert!(
            f[0].message
                .contains("pool two has no free address: 2 of 2 in use"),
            "{}",
            f[0].message
        );
        assert!(check_pools(&data(""), &pools(), &full).is_empty());
    }
}
