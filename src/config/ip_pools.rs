//! `ipPools:`: named static IP pools that provider data refers to (`ip_pool: <name>`).
//!
//! ```yaml
//! ipPools:
//!   talos-net:
//!     cidr: 10.10.0.0/24
//!     range: 10.10.0.100-10.10.0.199        # or "a-b, c-d", or a list of ranges
//!     gateway: 10.10.0.1                    # optional; inside the cidr
//!     nameservers: [10.10.0.1]
//!     bridge: vmbr1                         # optional: NICs on this pool go on this bridge
//!     vlan: 20                              # optional: ... with this VLAN tag
//! ```
//!
//! Every problem names its pool and key (`ipPools.talos-net.range`); pools of one family may share a
//! network but never an address.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::read::{
    Expecting, Found, OneOrList, Section, child, kind, plain_name, string, value_type,
};
use crate::proxmox::property::{BridgeName, VlanTag};
use crate::rules::ip_pool::{AddressRange, Cidr, IpPool, find, parse_cidr};

/// `ipPools:` as written, by pool name.
pub(super) type Pools = BTreeMap<String, Section<PoolFile>>;

impl Expecting for Pools {
    const EXPECTING: &'static str = "a mapping of pool names to pools, e.g. `ipPools: {talos-net: {cidr: 10.10.0.0/24, range: 10.10.0.100-10.10.0.199}}`";
}

/// One pool as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PoolFile {
    cidr: Option<PoolCidr>,
    /// `a-b`, `"a-b, c-d"` or a list of ranges.
    range: Option<OneOrList<RangeText>>,
    gateway: Option<Address>,
    nameservers: Option<OneOrList<Address>>,
    /// NICs on this pool go on this bridge.
    bridge: Option<Bridge>,
    /// ... with this VLAN tag.
    vlan: Option<Vlan>,
}

impl Expecting for PoolFile {
    const EXPECTING: &'static str = "a mapping with `cidr` and `range`";
}

value_type!(PoolCidr(Cidr), |v| string(
    v,
    ": must be a string like 10.10.0.0/24",
    |s| parse_cidr(&s).map_err(|e| format!(": {e}"))
));

value_type!(
    /// A range as written; it is parsed against the pool's cidr.
    RangeText(String),
    |v| string(v, ": must be a string like 10.10.0.100-10.10.0.199", |s| Ok(s.trim().to_owned()))
);

impl Expecting for RangeText {
    const EXPECTING: &'static str =
        ": must be a range like 10.10.0.100-10.10.0.199, or a list of them";
}

value_type!(Address(IpAddr), |v| string(
    v,
    ": must be an address",
    |s| {
        s.trim()
            .parse()
            .map_err(|_| format!(": {s:?} is not an IPv4 or IPv6 address"))
    }
));

impl Expecting for Address {
    const EXPECTING: &'static str = ": must be a list of addresses, e.g. `[10.10.0.1]`";
}

value_type!(Bridge(BridgeName), |v| string(
    v,
    ": must be a bridge name like vmbr1",
    |s| BridgeName::parse(&s).map_err(|e| format!(": {e}"))
));

value_type!(Vlan(VlanTag), |v| match v {
    Value::Number(n) => n
        .as_u64()
        .and_then(|t| VlanTag::new(t).ok())
        .ok_or_else(|| format!(": {n} is not a VLAN tag (1 to 4094)")),
    other => Err(format!(
        ": must be a VLAN tag (1 to 4094), found {}",
        kind(&other)
    )),
});

/// The pools without problems; what is wrong goes to `found`.
pub(super) fn check(pools: Pools, found: &mut Found) -> Vec<IpPool> {
    let pools: Vec<IpPool> = pools
        .into_iter()
        .filter_map(|(name, pool)| pool.0.check(name, found))
        .collect();
    // Two pools handing out the same address would hand it out twice.
    for (i, a) in pools.iter().enumerate() {
        for b in &pools[i + 1..] {
            for ra in &a.ranges {
                if let Some(rb) = b.ranges.iter().find(|rb| rb.overlaps(ra)) {
                    found.problems.push(format!(
                        "`ipPools.{}.range` {ra} overlaps `ipPools.{}.range` {rb}: two pools must never hand out the same address",
                        a.name, b.name
                    ));
                }
            }
        }
    }
    pools
}

impl PoolFile {
    fn check(self, name: String, found: &mut Found) -> Option<IpPool> {
        let at = child("ipPools", &name);
        let before = found.problems.len();
        if !plain_name(&name) {
            found.problems.push(format!(
                "`{at}`: a pool name is 1 to 63 letters, digits, '-' or '_', starting with a letter or digit"
            ));
        }
        let refused = |key: &str| found.failed.contains(&format!("{at}.{key}"));
        let (cidr_refused, range_refused) = (refused("cidr"), refused("range"));
        let mut problem = |key: &str, message: String| {
            found.problems.push(format!("`{at}.{key}`: {message}"));
        };
        let cidr = self.cidr.map(|c| c.0);
        if cidr.is_none() && !cidr_refused {
            problem(
                "cidr",
                "is missing: the pool's network, e.g. `cidr: 10.10.0.0/24`".into(),
            );
        }
        let ranges = match self.range {
            None if range_refused => Vec::new(),
            range => ranges(range, cidr, &mut problem),
        };
        let gateway = self.gateway.map(|g| g.0);
        if let (Some(g), Some(c)) = (gateway, cidr)
            && !c.contains(&g)
        {
            problem(
                "gateway",
                format!(
                    "{g} is outside the pool's cidr {c}: a NIC on this pool could not reach it"
                ),
            );
        }
        if found.problems.len() > before {
            return None;
        }
        let nameservers = match self.nameservers {
            None => Vec::new(),
            Some(OneOrList::One(a)) => vec![a.0],
            Some(OneOrList::List(all)) => all.into_iter().map(|a| a.0).collect(),
        };
        Some(IpPool {
            name,
            cidr: cidr?,
            ranges,
            gateway,
            nameservers,
            bridge: self.bridge.map(|b| b.0),
            vlan: self.vlan.map(|v| v.0),
        })
    }
}

/// The pool's ranges, each inside the cidr, on no network or broadcast address, overlapping none
/// of the others.
fn ranges(
    written: Option<OneOrList<RangeText>>,
    cidr: Option<Cidr>,
    problem: &mut impl FnMut(&str, String),
) -> Vec<AddressRange> {
    let mut texts: Vec<String> = match written {
        None => Vec::new(),
        Some(OneOrList::One(t)) => t.0.split(',').map(|t| t.trim().to_owned()).collect(),
        Some(OneOrList::List(all)) => all.into_iter().map(|t| t.0).collect(),
    };
    texts.retain(|t| !t.is_empty());
    if texts.is_empty() {
        problem(
            "range",
            "is empty: give the addresses the provider may hand out, e.g. `range: 10.10.0.100-10.10.0.199`".into(),
        );
    }
    let mut ranges: Vec<AddressRange> = Vec::new();
    for text in &texts {
        let Ok(r) = AddressRange::parse(text).map_err(|e| problem("range", e)) else {
            continue;
        };
        if let Some(c) = cidr {
            if !c.contains(&r.first) || !c.contains(&r.last) {
                problem("range", format!("{r} is outside the pool's cidr {c}"));
                continue;
            }
            if let Some(edge) = network_or_broadcast(&c, &r) {
                problem(
                    "range",
                    format!("{r} includes {edge}, which no host can have in {c}"),
                );
                continue;
            }
        }
        if let Some(other) = ranges.iter().find(|o| o.overlaps(&r)) {
            problem("range", format!("{r} overlaps {other}"));
            continue;
        }
        ranges.push(r);
    }
    ranges.sort();
    ranges
}

/// The pools `defaults:` and `nodes:` name (`ip_pool`, `additional_nics[].ip_pool`) must exist: a
/// name that does not would fail every request that gets it, so it fails the start instead.
pub(super) fn check_references(
    defaults: &Map<String, Value>,
    nodes: &Map<String, Value>,
    pools: &[IpPool],
    found: &mut Found,
) {
    let defaults = Value::Object(defaults.clone());
    let nodes = nodes.iter().map(|(n, v)| (format!("nodes.{n}"), v));
    for (prefix, layer) in std::iter::once(("defaults".into(), &defaults)).chain(nodes) {
        let nics = layer["additional_nics"].as_array().into_iter().flatten();
        let nics = nics
            .enumerate()
            .map(|(i, n)| (format!(".additional_nics[{i}]"), n));
        for (at, holder) in std::iter::once((String::new(), layer)).chain(nics) {
            if let Some(name) = holder["ip_pool"].as_str()
                && let Err(p) = find(pools, &format!("{prefix}{at}.ip_pool"), name)
            {
                found.problems.push(format!("`{}`: {}", p.key, p.message));
            }
        }
    }
}

/// An IPv4 range that includes its network's own address or its broadcast address (networks of
/// /31 and /32 have neither).
fn network_or_broadcast(cidr: &Cidr, range: &AddressRange) -> Option<String> {
    let Cidr::V4(net) = cidr else { return None };
    if net.prefix_len() >= 31 {
        return None;
    }
    let edges = [("network", net.network()), ("broadcast", net.broadcast())];
    let (what, address) = edges
        .into_iter()
        .find(|(_, a)| range.contains(IpAddr::V4(*a)))?;
    Some(format!("the {what} address {address}"))
}

#[cfg(test)]
mod tests {
    use super::super::{ParseError, ProviderConfig};

    const BASE: &str =
        "proxmox:\n  url: https://pve:8006\n  tokenID: omni@pve!p\n  tokenSecret: abc\n";

    fn problems(pools: &str) -> String {
        match ProviderConfig::parse(&format!("{BASE}{pools}")) {
            Err(ParseError::Invalid(p)) => p.join("\n"),
            other => panic!("expected problems, got {other:?}"),
        }
    }

    #[test]
    fn the_issue_example_loads() {
        let c = ProviderConfig::parse(&format!(
            "{BASE}ipPools:\n  talos-net:\n    cidr: 10.10.0.0/24\n    range: 10.10.0.100-10.10.0.199\n    gateway: 10.10.0.1\n    nameservers: [10.10.0.1]\n  v6:\n    cidr: fd00:10::/64\n    range: [fd00:10::100-fd00:10::1ff, fd00:10::a]\n    bridge: vmbr1\n    vlan: 20\n  split:\n    cidr: 10.20.0.0/24\n    range: 10.20.0.10-10.20.0.19, 10.20.0.30-10.20.0.39\n"
        ))
        .unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert_eq!(c.ip_pools.len(), 3);
        let net = c.ip_pools.iter().find(|p| p.name == "talos-net").unwrap();
        assert_eq!(net.size(), 100);
        assert_eq!(net.gateway.unwrap().to_string(), "10.10.0.1");
        assert_eq!(net.nameservers.len(), 1);
        let v6 = c.ip_pools.iter().find(|p| p.name == "v6").unwrap();
        assert_eq!(v6.size(), 257);
        assert_eq!(v6.ranges[0].to_string(), "fd00:10::a");
        assert_eq!(v6.bridge.as_ref().unwrap().to_string(), "vmbr1");
        let split = c.ip_pools.iter().find(|p| p.name == "split").unwrap();
        assert_eq!(split.size(), 20);
    }

    #[test]
    fn every_problem_names_the_pool_and_key() {
        let all = problems(
            "ipPools:\n  a:\n    cidr: 10.10.0.0/24\n    range: 10.10.1.5-10.10.1.9\n    gateway: 10.9.0.1\n  b:\n    cidr: 10.10.0.5/24\n    range: ''\n  c:\n    range: 10.0.0.1-10.0.0.x\n  d:\n    cidr: 10.30.0.0/24\n    range: 10.30.0.0-10.30.0.10\n    nameservers: [dns]\n    vlan: 5000\n",
        );
        for wanted in [
            "`ipPools.a.range`: 10.10.1.5-10.10.1.9 is outside the pool's cidr 10.10.0.0/24",
            "`ipPools.a.gateway`: 10.9.0.1 is outside the pool's cidr 10.10.0.0/24",
            "`ipPools.b.cidr`: 10.10.0.5/24 has host bits set; the network is 10.10.0.0/24",
            "`ipPools.b.range`: is empty",
            "`ipPools.c.cidr`: is missing",
            "`ipPools.c.range`: \"10.0.0.x\" is not an IPv4 or IPv6 address",
            "`ipPools.d.range`: 10.30.0.0-10.30.0.10 includes the network address 10.30.0.0",
            "`ipPools.d.nameservers[0]`: \"dns\" is not an IPv4 or IPv6 address",
            "`ipPools.d.vlan`: 5000 is not a VLAN tag",
        ] {
            assert!(all.contains(wanted), "missing {wanted:?} in\n{all}");
        }
    }

    #[test]
    fn overlapping_pools_and_ranges_are_refused() {
        let all = problems(
            "ipPools:\n  a:\n    cidr: 10.10.0.0/24\n    range: 10.10.0.100-10.10.0.150\n  b:\n    cidr: 10.10.0.0/24\n    range: 10.10.0.140-10.10.0.199\n  c:\n    cidr: 10.20.0.0/24\n    range: [10.20.0.140-10.20.0.199, 10.20.0.190-10.20.0.195]\n",
        );
        assert!(
            all.contains(
                "`ipPools.c.range`: 10.20.0.190-10.20.0.195 overlaps 10.20.0.140-10.20.0.199"
            ),
            "{all}"
        );
        assert!(
            all.contains("`ipPools.a.range` 10.10.0.100-10.10.0.150 overlaps `ipPools.b.range` 10.10.0.140-10.10.0.199"),
            "{all}"
        );
        // Same network, disjoint ranges: fine.
        ProviderConfig::parse(&format!(
            "{BASE}ipPools:\n  a:\n    cidr: 10.10.0.0/24\n    range: 10.10.0.100-10.10.0.149\n  b:\n    cidr: 10.10.0.0/24\n    range: 10.10.0.150-10.10.0.199\n"
        ))
        .unwrap();
    }

    #[test]
    fn pools_named_in_defaults_and_nodes_must_exist() {
        let all = problems(
            "ipPools:\n  talos-net:\n    cidr: 10.10.0.0/24\n    range: 10.10.0.100-10.10.0.199\ndefaults:\n  ip_pool: talos-nt\nnodes:\n  pve2:\n    additional_nics:\n      - bridge: vmbr1\n        ip_pool: storage\n",
        );
        assert!(
            all.contains("`defaults.ip_pool`: no IP pool named \"talos-nt\"")
                && all.contains("did you mean `talos-net`"),
            "{all}"
        );
        assert!(
            all.contains("`nodes.pve2.additional_nics[0].ip_pool`: no IP pool named \"storage\""),
            "{all}"
        );
        ProviderConfig::parse(&format!(
            "{BASE}ipPools:\n  talos-net:\n    cidr: 10.10.0.0/24\n    range: 10.10.0.100\ndefaults:\n  ip_pool: talos-net\n"
        ))
        .unwrap();
    }

    #[test]
    fn gateway_inside_a_range_and_unknown_keys() {
        let c = ProviderConfig::parse(&format!(
            "{BASE}ipPools:\n  a:\n    cidr: 10.10.0.0/24\n    range: 10.10.0.1-10.10.0.10\n    gateway: 10.10.0.1\n    gatway: 10.10.0.1\n"
        ))
        .unwrap();
        assert_eq!(
            c.warnings,
            ["unknown key `ipPools.a.gatway` is ignored (did you mean `gateway`?)"]
        );
        assert!(problems("ipPools: [a]\n").contains("`ipPools` must be a mapping"));
        assert!(problems("ipPools:\n  a: 3\n").contains("`ipPools.a` must be a mapping"));
        assert!(
            problems("ipPools:\n  -bad:\n    cidr: 10.0.0.0/8\n    range: 10.0.0.1\n")
                .contains("`ipPools.\"-bad\"`: a pool name")
        );
        // Names that would make key paths ending in '.' are quoted.
        for (name, shown) in [(".", "`ipPools.\".\"`"), ("a.", "`ipPools.\"a.\"`")] {
            let all = problems(&format!("ipPools:\n  \"{name}\": {{}}\n"));
            assert!(all.contains(&format!("{shown}: a pool name")), "{all}");
        }
    }
}
