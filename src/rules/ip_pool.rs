//! Static IP pools: which address a machine's NIC gets, and what a pool's use is.
//!
//! A pool (`ipPools:` in the config file, read by `config::ip_pools`) is a CIDR, one or more ranges
//! of addresses inside it that the provider may hand out, and what a NIC on that network needs
//! besides its address (gateway, nameservers, optionally the bridge and VLAN tag). Provider data
//! names a pool per NIC (`ip_pool`, `additional_nics[].ip_pool`).
//!
//! The decision is [`allocate`]: the lowest address of the pool's ranges that is not taken. What is
//! taken is the caller's to gather (the provider states' allocations, kept in the in-process
//! `IpLedger` of the pipeline's ledgers, and the addresses running VMs report through their guest agent); the pipeline,
//! `validate` and the `pools` command all count with [`usage`].

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use crate::model::machine::IpAllocation;
use crate::proxmox::property::{BridgeName, VlanTag};
use crate::rules::provider_data::{Problem, ProviderData};

/// An address with a prefix length: a pool's network.
pub type Cidr = ipnet::IpNet;

/// Parses `10.10.0.0/24` or `fd00:10::/64`; the host bits must be zero.
pub fn parse_cidr(s: &str) -> Result<Cidr, String> {
    let (addr, prefix) = s.trim().split_once('/').ok_or_else(|| {
        format!("{s:?} is not a CIDR; write it as network/prefix, e.g. 10.10.0.0/24")
    })?;
    let network: IpAddr = addr
        .parse()
        .map_err(|_| format!("{addr:?} is not an IPv4 or IPv6 address"))?;
    let max = if network.is_ipv4() { 32 } else { 128 };
    let invalid = || format!("prefix length {prefix:?} must be a number from 0 to {max}");
    let prefix: u8 = prefix.parse().map_err(|_| invalid())?;
    let cidr = Cidr::new(network, prefix).map_err(|_| invalid())?;
    if cidr.trunc() != cidr {
        let base = cidr.trunc();
        return Err(format!("{s} has host bits set; the network is {base}"));
    }
    Ok(cidr)
}

/// Addresses `first` to `last`, both included, of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct AddressRange {
    pub first: IpAddr,
    pub last: IpAddr,
}

impl AddressRange {
    /// Parses `10.10.0.100-10.10.0.199` (or a single address).
    pub fn parse(s: &str) -> Result<Self, String> {
        let (a, b) = s.split_once('-').unwrap_or((s, s));
        let parse = |t: &str| {
            t.trim()
                .parse::<IpAddr>()
                .map_err(|_| format!("{:?} is not an IPv4 or IPv6 address", t.trim()))
        };
        let (first, last) = (parse(a)?, parse(b)?);
        if first.is_ipv4() != last.is_ipv4() {
            return Err(format!("{s:?} mixes IPv4 and IPv6"));
        }
        if first > last {
            return Err(format!("{s:?} ends before it starts; write first-last"));
        }
        Ok(Self { first, last })
    }

    /// (`IpAddr` orders every IPv4 address before every IPv6 one, so a range holds one family.)
    pub fn contains(&self, addr: IpAddr) -> bool {
        (self.first..=self.last).contains(&addr)
    }

    /// How many addresses (saturating: an IPv6 range may hold 2^128).
    pub fn size(&self) -> u128 {
        (number(self.last) - number(self.first)).saturating_add(1)
    }

    pub fn overlaps(&self, other: &AddressRange) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

impl fmt::Display for AddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// One named pool of the config file, checked (ranges inside the CIDR, of its family, not
/// overlapping each other).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpPool {
    pub name: String,
    pub cidr: Cidr,
    /// Sorted, disjoint.
    pub ranges: Vec<AddressRange>,
    pub gateway: Option<IpAddr>,
    pub nameservers: Vec<IpAddr>,
    /// The bridge a NIC on this pool goes on (over the class's), when the pool says.
    pub bridge: Option<BridgeName>,
    /// The VLAN tag of a NIC on this pool (over the class's), when the pool says.
    pub vlan: Option<VlanTag>,
}

impl IpPool {
    pub fn contains(&self, addr: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(addr))
    }

    /// How many addresses the pool hands out.
    pub fn size(&self) -> u128 {
        self.ranges
            .iter()
            .map(AddressRange::size)
            .fold(0, u128::saturating_add)
    }
}

/// A pool with no address left.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pool {pool} has no free address: {in_use} of {size} in use")]
pub struct PoolFull {
    pub pool: String,
    pub in_use: u128,
    pub size: u128,
}

/// `taken`, with the pool's gateway when it lies inside a range: it is never handed out.
fn with_gateway(pool: &IpPool, taken: &BTreeSet<IpAddr>) -> BTreeSet<IpAddr> {
    let gateway = pool.gateway.filter(|g| pool.contains(*g));
    taken.iter().copied().chain(gateway).collect()
}

/// How many of the pool's addresses are in `taken`, and how many it has.
/// A gateway inside a range counts as in use: it is never handed out.
pub fn usage(pool: &IpPool, taken: &BTreeSet<IpAddr>) -> (u128, u128) {
    let taken = with_gateway(pool, taken);
    let in_use = taken.iter().filter(|a| pool.contains(**a)).count() as u128;
    (in_use, pool.size())
}

/// The decision: the lowest address of the pool's ranges not in `taken`.
///
/// Each range is walked from its first address over the taken ones only, so a pool of any size
/// costs at most one step per taken address.
pub fn allocate(pool: &IpPool, taken: &BTreeSet<IpAddr>) -> Result<IpAddr, PoolFull> {
    let taken = with_gateway(pool, taken);
    for range in &pool.ranges {
        // The taken addresses of the range come in order: the first gap is the answer.
        let mut candidate = Some(number(range.first));
        for t in taken.range(range.first..=range.last) {
            if candidate != Some(number(*t)) {
                break;
            }
            candidate = candidate.and_then(|c| c.checked_add(1));
        }
        if let Some(c) = candidate.filter(|c| *c <= number(range.last)) {
            return Ok(from_number(range.first, c));
        }
    }
    let (in_use, size) = usage(pool, &taken);
    Err(PoolFull {
        pool: pool.name.clone(),
        in_use,
        size,
    })
}

/// The pool named `name`, or a problem under `key` naming the pools there are.
pub fn find<'a>(pools: &'a [IpPool], key: &str, name: &str) -> Result<&'a IpPool, Problem> {
    pools.iter().find(|p| p.name == name).ok_or_else(|| {
        let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
        let known = if names.is_empty() {
            "the config file defines no pools; add one under `ipPools:`".to_string()
        } else {
            format!(
                "the config file's `ipPools:` has {}{}",
                names.join(", "),
                crate::did_you_mean::hint(name, &names)
            )
        };
        Problem {
            key: key.to_owned(),
            message: format!("no IP pool named {name:?}: {known}"),
        }
    })
}

/// Where a NIC's pool is named in provider data.
pub fn key_of(nic: u8) -> String {
    match nic {
        0 => "ip_pool".into(),
        _ => format!("additional_nics[{}].ip_pool", nic - 1),
    }
}

/// The pools the provider data asks for, by NIC: `(0, ip_pool)`, `(n, additional_nics[n-1].ip_pool)`.
pub fn wanted(data: &ProviderData) -> Vec<(u8, &str)> {
    let first = data.ip_pool.as_deref().map(|p| (0, p));
    let more = (1..=u8::MAX).zip(&data.additional_nics);
    let more = more.filter_map(|(nic, n)| Some((nic, n.ip_pool.as_deref()?)));
    first.into_iter().chain(more).collect()
}

/// Checks that every pool the provider data names exists, and puts each NIC on its pool's bridge and
/// VLAN when the pool names them: a pool's addresses only work on its network.
pub fn apply_networks(data: &mut ProviderData, pools: &[IpPool]) -> Result<(), Vec<Problem>> {
    let mut problems = Vec::new();
    let keys = &mut data.keys;
    let first = (
        keys.ip_pool.as_deref(),
        &mut keys.network_bridge,
        &mut keys.vlan,
    );
    let more = keys.additional_nics.iter_mut();
    let more = more.map(|n| (n.ip_pool.as_deref(), &mut n.bridge, &mut n.vlan));
    for (nic, (name, bridge, vlan)) in (0..=u8::MAX).zip(std::iter::once(first).chain(more)) {
        let Some(name) = name else { continue };
        match find(pools, &key_of(nic), name) {
            Ok(pool) => {
                if let Some(pool_bridge) = &pool.bridge {
                    *bridge = pool_bridge.clone();
                }
                *vlan = pool.vlan.or(*vlan);
            }
            Err(p) => problems.push(p),
        }
    }
    problems.is_empty().then_some(()).ok_or(problems)
}

/// One address held by one machine, for reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Holding {
    pub address: IpAddr,
    pub request: String,
    /// `net0`, `net1`, …
    pub nic: String,
}

/// A pool's use, as the `pools` command and `validate` show it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PoolUse {
    pub name: String,
    pub cidr: String,
    pub ranges: Vec<String>,
    /// Saturating at `u64::MAX` for huge IPv6 ranges.
    pub size: u64,
    pub in_use: u64,
    pub free: u64,
    /// Addresses held by a provider state, by machine request.
    pub held: Vec<Holding>,
    /// Addresses running VMs report through their guest agent that no provider state holds.
    pub reported_by_vms: Vec<IpAddr>,
}

/// Allocations whose machine request is gone (its provider state is left over), or that name a pool
/// the config no longer has.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LeftOver {
    pub gone_requests: Vec<Holding>,
    pub unknown_pools: Vec<(String, Holding)>,
}

/// The use of every pool: `states` are every provider state's allocations by request, `reported`
/// the addresses running VMs' guest agents report, `live` the machine requests that exist.
pub fn report(
    pools: &[IpPool],
    states: &[(String, Vec<IpAllocation>)],
    reported: &BTreeSet<IpAddr>,
    live: &BTreeSet<String>,
) -> (Vec<PoolUse>, LeftOver) {
    let holding = |request: &str, a: &IpAllocation| Holding {
        address: a.address,
        request: request.to_owned(),
        nic: format!("net{}", a.nic),
    };
    let all = || {
        states
            .iter()
            .flat_map(|(r, list)| list.iter().map(move |a| (r, a)))
    };
    let mut left = LeftOver::default();
    for (request, a) in all() {
        if !live.contains(request) {
            left.gone_requests.push(holding(request, a));
        }
        if !pools.iter().any(|p| p.name == a.pool) {
            left.unknown_pools
                .push((a.pool.clone(), holding(request, a)));
        }
    }
    let uses = pools
        .iter()
        .map(|pool| {
            let held: Vec<Holding> = all()
                .filter(|(_, a)| a.pool == pool.name)
                .map(|(r, a)| holding(r, a))
                .collect();
            let mut taken: BTreeSet<IpAddr> = held.iter().map(|h| h.address).collect();
            let reported_by_vms: Vec<IpAddr> = reported
                .iter()
                .filter(|a| pool.contains(**a) && !taken.contains(a))
                .copied()
                .collect();
            taken.extend(reported_by_vms.iter().copied());
            let (in_use, size) = usage(pool, &taken);
            let clamp = |n: u128| u64::try_from(n).unwrap_or(u64::MAX);
            PoolUse {
                name: pool.name.clone(),
                cidr: pool.cidr.to_string(),
                ranges: pool.ranges.iter().map(ToString::to_string).collect(),
                size: clamp(size),
                in_use: clamp(in_use),
                free: clamp(size.saturating_sub(in_use)),
                held,
                reported_by_vms,
            }
        })
        .collect();
    (uses, left)
}

fn number(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address of `like`'s family numbered `n` (which fits, being inside a range of that family).
fn from_number(like: IpAddr, n: u128) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(u32::try_from(n).unwrap_or(u32::MAX).into()),
        IpAddr::V6(_) => IpAddr::V6(n.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pool(cidr: &str, ranges: &[&str]) -> IpPool {
        let mut ranges: Vec<AddressRange> = ranges
            .iter()
            .map(|r| AddressRange::parse(r).unwrap())
            .collect();
        ranges.sort();
        IpPool {
            name: "talos-net".into(),
            cidr: parse_cidr(cidr).unwrap(),
            ranges,
            gateway: None,
            nameservers: vec![],
            bridge: None,
            vlan: None,
        }
    }

    fn set(addrs: &[&str]) -> BTreeSet<IpAddr> {
        addrs.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn cidrs_parse_and_refuse_host_bits() {
        let c = parse_cidr("10.10.0.0/24").unwrap();
        assert!(c.contains(&"10.10.0.255".parse::<IpAddr>().unwrap()));
        assert!(!c.contains(&"10.10.1.0".parse::<IpAddr>().unwrap()));
        assert!(!c.contains(&"::1".parse::<IpAddr>().unwrap()));
        assert!(
            parse_cidr("0.0.0.0/0")
                .unwrap()
                .contains(&"255.1.2.3".parse::<IpAddr>().unwrap())
        );
        assert!(
            parse_cidr("fd00::/64")
                .unwrap()
                .contains(&"fd00::ffff".parse::<IpAddr>().unwrap())
        );
        assert!(
            parse_cidr("::/0")
                .unwrap()
                .contains(&"fd00::1".parse::<IpAddr>().unwrap())
        );
        assert_eq!(
            parse_cidr("10.10.0.5/24").unwrap_err(),
            "10.10.0.5/24 has host bits set; the network is 10.10.0.0/24"
        );
        assert!(parse_cidr("10.10.0.0/33").unwrap_err().contains("0 to 32"));
        assert!(
            parse_cidr("10.10.0.0")
                .unwrap_err()
                .contains("network/prefix")
        );
        assert!(
            parse_cidr("10.10.0/24")
                .unwrap_err()
                .contains("not an IPv4")
        );
    }

    #[test]
    fn lowest_free_address_first_and_over_several_ranges() {
        let p = pool("10.10.0.0/24", &["10.10.0.100-10.10.0.101", "10.10.0.50"]);
        assert_eq!(p.size(), 3);
        assert_eq!(allocate(&p, &set(&[])).unwrap().to_string(), "10.10.0.50");
        assert_eq!(
            allocate(&p, &set(&["10.10.0.50"])).unwrap().to_string(),
            "10.10.0.100"
        );
        assert_eq!(
            allocate(
                &p,
                &set(&["10.10.0.50", "10.10.0.100", "10.9.0.1", "fd00::1"])
            )
            .unwrap()
            .to_string(),
            "10.10.0.101"
        );
        let full = allocate(
            &p,
            &set(&["10.10.0.50", "10.10.0.100", "10.10.0.101", "10.10.0.7"]),
        )
        .unwrap_err();
        assert_eq!(
            full.to_string(),
            "pool talos-net has no free address: 3 of 3 in use"
        );
        // A gateway inside a range is never handed out, and counts as in use.
        let mut gw = p.clone();
        gw.gateway = "10.10.0.50".parse().ok();
        assert_eq!(allocate(&gw, &set(&[])).unwrap().to_string(), "10.10.0.100");
        assert_eq!(usage(&gw, &set(&["10.10.0.100"])), (2, 3));
    }

    #[test]
    fn the_issue_wording_for_a_full_pool_of_a_hundred() {
        let p = pool("10.10.0.0/24", &["10.10.0.100-10.10.0.199"]);
        let taken: BTreeSet<IpAddr> = (100..=199)
            .map(|i| format!("10.10.0.{i}").parse().unwrap())
            .collect();
        assert_eq!(
            allocate(&p, &taken).unwrap_err().to_string(),
            "pool talos-net has no free address: 100 of 100 in use"
        );
    }

    #[test]
    fn ipv6_pools_and_the_last_address() {
        let p = pool("fd00:10::/64", &["fd00:10::10-fd00:10::12"]);
        assert_eq!(allocate(&p, &set(&[])).unwrap().to_string(), "fd00:10::10");
        assert_eq!(
            allocate(&p, &set(&["fd00:10::10", "fd00:10::11"]))
                .unwrap()
                .to_string(),
            "fd00:10::12"
        );
        let all = pool(
            "::/0",
            &["ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"],
        );
        assert_eq!(
            allocate(&all, &set(&["ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"]))
                .unwrap()
                .to_string(),
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
        );
        assert!(
            allocate(
                &all,
                &set(&[
                    "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe",
                    "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
                ])
            )
            .is_err()
        );
        let big = pool(
            "fd00::/8",
            &["fd00::-fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"],
        );
        assert_eq!(big.size(), 1u128 << 120);
    }

    #[test]
    fn an_unknown_pool_names_the_key_and_the_pools() {
        let pools = [pool("10.10.0.0/24", &["10.10.0.1"])];
        let p = find(&pools, "additional_nics[0].ip_pool", "talos-nte").unwrap_err();
        assert_eq!(p.key, "additional_nics[0].ip_pool");
        assert!(
            p.message.contains("no IP pool named \"talos-nte\""),
            "{}",
            p.message
        );
        assert!(p.message.contains("talos-net"), "{}", p.message);
        let none = find(&[], "ip_pool", "x").unwrap_err();
        assert!(
            none.message.contains("defines no pools"),
            "{}",
            none.message
        );
    }

    #[test]
    fn the_report_counts_states_and_running_vms_and_finds_left_overs() {
        let mut p = pool("10.10.0.0/24", &["10.10.0.100-10.10.0.103"]);
        p.gateway = "10.10.0.1".parse().ok();
        let a = |nic, pool: &str, addr: &str| IpAllocation {
            nic,
            pool: pool.into(),
            address: addr.parse().unwrap(),
        };
        let states = vec![
            ("live-1".to_string(), vec![a(0, "talos-net", "10.10.0.100")]),
            ("gone-1".to_string(), vec![a(1, "talos-net", "10.10.0.101")]),
            ("live-2".to_string(), vec![a(0, "old-pool", "10.99.0.1")]),
        ];
        let live: BTreeSet<String> = ["live-1".to_string(), "live-2".to_string()].into();
        let (uses, left) = report(
            &[p],
            &states,
            &set(&["10.10.0.101", "10.10.0.102", "10.0.0.9"]),
            &live,
        );
        assert_eq!(uses.len(), 1);
        assert_eq!((uses[0].size, uses[0].in_use, uses[0].free), (4, 3, 1));
        assert_eq!(uses[0].held.len(), 2);
        assert_eq!(
            uses[0].reported_by_vms,
            ["10.10.0.102".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(left.gone_requests.len(), 1);
        assert_eq!(left.gone_requests[0].request, "gone-1");
        assert_eq!(left.gone_requests[0].nic, "net1");
        assert_eq!(left.unknown_pools[0].0, "old-pool");
    }

    fn v4_pool() -> impl Strategy<Value = IpPool> {
        // Up to three disjoint ranges inside 10.20.0.0/16.
        prop::collection::btree_set(0u32..4000, 1..7).prop_map(|cuts| {
            let cuts: Vec<u32> = cuts.into_iter().collect();
            let ranges: Vec<String> = cuts
                .chunks(2)
                .map(|c| {
                    let a = 0x0a14_0000 + c[0] * 2;
                    let b = 0x0a14_0000 + c.get(1).copied().unwrap_or(c[0]) * 2;
                    format!(
                        "{}-{}",
                        std::net::Ipv4Addr::from(a),
                        std::net::Ipv4Addr::from(b)
                    )
                })
                .collect();
            let refs: Vec<&str> = ranges.iter().map(String::as_str).collect();
            pool("10.20.0.0/16", &refs)
        })
    }

    proptest! {
        /// Whatever is taken (inside the pool or not), an allocation is inside the pool's ranges,
        /// not taken, and the lowest such address; a refusal means every address is taken.
        #[test]
        fn allocation_never_returns_a_taken_or_outside_address(
            p in v4_pool(),
            taken in prop::collection::btree_set(0x0a13_fff0u32..0x0a14_2000, 0..300),
        ) {
            let taken: BTreeSet<IpAddr> = taken.into_iter().map(|n| IpAddr::V4(n.into())).collect();
            match allocate(&p, &taken) {
                Ok(a) => {
                    prop_assert!(p.contains(a) && p.cidr.contains(&a));
                    prop_assert!(!taken.contains(&a));
                    let lower_free = p.ranges.iter().any(|r| {
                        (number(r.first)..number(a).min(number(r.last) + 1))
                            .any(|n| !taken.contains(&from_number(a, n)))
                    });
                    prop_assert!(!lower_free, "{a} is not the lowest free address");
                }
                Err(full) => {
                    prop_assert_eq!(full.in_use, full.size);
                    prop_assert_eq!(full.size, p.size());
                }
            }
        }
    }
}
