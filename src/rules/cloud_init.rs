//! The NoCloud seed that hands a VM its join config: `user-data`, `meta-data`, `network-config` on an
//! ISO labelled `cidata`, uploaded to ISO storage and attached as a CD-ROM.
//!
//! We build the ISO ourselves (instead of Proxmox's cloud-init drive) so the seed is a plain file we
//! can name per request, find again, and delete on deprovision, and so its content is exactly the
//! Talos join config rather than a cloud-init user-data Proxmox generates.

use std::net::IpAddr;

use sha2::{Digest, Sha256};

use crate::model::machine::IpAllocation;
use crate::proxmox::property::MacAddr;
use crate::rules::ip_pool::{self, IpPool};
use crate::rules::provider_data::Problem;

/// `meta-data`: the instance ID (the SMBIOS UUID) and the request ID as hostname.
pub fn meta_data(instance_id: uuid::Uuid, hostname: &str) -> String {
    let id = quoted(&instance_id.hyphenated().to_string());
    let host = quoted(hostname);
    format!("instance-id: {id}\nlocal-hostname: {host}\nhostname: {host}\n")
}

/// `network-config` (version 1), in the shape Talos reads it. Plain DHCP (as the official provider
/// does) when no NIC has a pool; with at least one static address (`allocations`), each of the
/// `nic_count` NICs as a `physical` entry matched by `mac_address` ([`mac_for_nic`]; its `name`
/// only when no link has that MAC), with a `static`/`static6` subnet (the address as
/// `address/prefix`, the pool's optional `gateway`) where an allocation is recorded and a `dhcp`
/// one elsewhere, then one `nameserver` entry with the pools' `address` list. A recorded allocation
/// whose pool is gone from the config is a problem under its key.
pub fn network_config(
    request_id: &str,
    nic_count: usize,
    allocations: &[IpAllocation],
    pools: &[IpPool],
) -> Result<String, Problem> {
    let mut s = String::from("version: 1\n");
    if allocations.is_empty() {
        return Ok(s);
    }
    s.push_str("config:\n");
    let mut nameservers: Vec<IpAddr> = Vec::new();
    for index in (0..=u8::MAX).take(nic_count) {
        s.push_str(&format!(
            "  - type: physical\n    name: {}\n    mac_address: {}\n    subnets:\n",
            quoted(&format!("eth{index}")),
            quoted(
                &mac_for_nic(request_id, index)
                    .to_string()
                    .to_ascii_lowercase()
            )
        ));
        let Some(a) = allocations.iter().find(|a| a.nic == index) else {
            s.push_str("      - type: dhcp\n");
            continue;
        };
        let pool = ip_pool::find(pools, &ip_pool::key_of(index), &a.pool)?;
        let kind = if a.address.is_ipv6() {
            "static6"
        } else {
            "static"
        };
        s.push_str(&format!(
            "      - type: {kind}\n        address: {}\n",
            quoted(&format!("{}/{}", a.address, pool.cidr.prefix_len()))
        ));
        if let Some(gw) = pool.gateway {
            s.push_str(&format!("        gateway: {}\n", quoted(&gw.to_string())));
        }
        for ns in &pool.nameservers {
            if !nameservers.contains(ns) {
                nameservers.push(*ns);
            }
        }
    }
    if !nameservers.is_empty() {
        s.push_str("  - type: nameserver\n    address:\n");
        for ns in nameservers {
            s.push_str(&format!("      - {}\n", quoted(&ns.to_string())));
        }
    }
    Ok(s)
}

/// A JSON string literal, which is also a valid YAML double-quoted scalar.
pub(super) fn quoted(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// A deterministic, locally administered MAC for a request (stable across retries, so a DHCP
/// reservation or a static network config keeps matching).
pub fn mac_for_request(request_id: &str) -> MacAddr {
    let digest = Sha256::digest(request_id.as_bytes());
    let mut b = [0u8; 6];
    b.copy_from_slice(&digest[..6]);
    b[0] = (b[0] & 0b1111_1100) | 0b0000_0010;
    MacAddr(b)
}

/// A deterministic MAC per NIC of a request: net0 keeps [`mac_for_request`]'s, the others differ by
/// their index. Set on every NIC once one has a static address, so the seed's network-config can
/// name each NIC by its MAC.
pub fn mac_for_nic(request_id: &str, nic: u8) -> MacAddr {
    match nic {
        0 => mac_for_request(request_id),
        _ => mac_for_request(&format!("{request_id}#net{nic}")),
    }
}

/// The seed ISO's file name in ISO storage: `omni-seed-<request id>.iso`, with anything Proxmox would
/// not accept replaced; a short hash keeps two IDs that sanitize alike apart.
pub fn seed_iso_file_name(request_id: &str) -> String {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let clean = request_id.chars().map(|c| if allowed(c) { c } else { '-' });
    let clean: String = clean.take(100).collect();
    let clean = clean.trim_start_matches('.');
    if clean == request_id && !clean.is_empty() {
        format!("omni-seed-{clean}.iso")
    } else {
        let digest = Sha256::digest(request_id.as_bytes());
        let tag: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        format!("omni-seed-{clean}-{tag}.iso")
    }
}

pub mod seed_iso {
    //! The `cidata` ISO image (ISO 9660 with Rock Ridge and Joliet, so the lowercase, hyphenated names
    //! survive whichever extension the reader uses).

    use std::io::Cursor;
    use std::sync::Arc;

    use hadris_iso::read::PathSeparator;
    use hadris_iso::write::options::{CreationFeatures, IsoFormatOptions};
    use hadris_iso::write::{File as IsoFile, InputFiles, IsoImageWriter};

    use super::meta_data;
    use crate::secret::Secret;

    /// The volume label NoCloud looks for.
    pub const VOLUME_LABEL: &str = "cidata";

    #[derive(Debug, thiserror::Error)]
    #[error("cannot build the seed ISO: {0}")]
    pub struct SeedIsoError(String);

    /// The seed ISO with the three NoCloud files at its root: `user-data` is the join config as is
    /// (it holds the join token, so it is exposed only here), `meta-data` and `network-config`
    /// (the text of [`super::network_config`]) say who the machine is and how its NICs get their
    /// addresses.
    pub fn build_seed(
        join_config: &Secret,
        instance_id: uuid::Uuid,
        hostname: &str,
        network_config: &str,
    ) -> Result<Vec<u8>, SeedIsoError> {
        let meta = meta_data(instance_id, hostname);
        let files: [(&str, &[u8]); 3] = [
            ("meta-data", meta.as_bytes()),
            ("network-config", network_config.as_bytes()),
            ("user-data", join_config.expose().as_bytes()),
        ];
        let input = InputFiles {
            path_separator: PathSeparator::ForwardSlash,
            files: files
                .iter()
                .map(|(name, contents)| IsoFile::File {
                    name: Arc::new((*name).to_string()),
                    contents: contents.to_vec(),
                })
                .collect(),
        };
        let options = IsoFormatOptions {
            volume_name: VOLUME_LABEL.to_string(),
            system_id: None,
            volume_set_id: None,
            publisher_id: None,
            preparer_id: None,
            application_id: None,
            sector_size: 2048,
            features: CreationFeatures::extensions(),
            path_separator: PathSeparator::ForwardSlash,
            strict_charset: false,
        };
        let payload: usize = files.iter().map(|(_, c)| c.len()).sum();
        let mut cursor = Cursor::new(vec![0u8; 256 * 1024 + payload * 2]);
        IsoImageWriter::create(&mut cursor, input, options)
            .map_err(|e| SeedIsoError(format!("{e:?}")))?;
        let mut image = cursor.into_inner();
        // Cut to the volume size recorded in the primary volume descriptor.
        const PVD: usize = 16 * 2048;
        if image.len() >= PVD + 88 && image[PVD] == 1 && &image[PVD + 1..PVD + 6] == b"CD001" {
            let blocks =
                u32::from_le_bytes(image[PVD + 80..PVD + 84].try_into().unwrap_or_default());
            let size = blocks as usize * 2048;
            if size > PVD && size <= image.len() {
                image.truncate(size);
            }
        }
        Ok(image)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const JOIN_CONFIG: &str =
        "apiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: https://x?jointoken=v2%3Aabc\n";

    fn instance_id() -> uuid::Uuid {
        uuid::Uuid::parse_str("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0").unwrap()
    }

    #[test]
    fn meta_data_and_network_config() {
        let meta = crate::yaml::from_str(&meta_data(instance_id(), "req-1")).unwrap();
        assert_eq!(meta["instance-id"], "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
        assert_eq!(meta["local-hostname"], "req-1");
        assert_eq!(meta["hostname"], "req-1");
        let dhcp = network_config("req-1", 3, &[], &[]).unwrap();
        assert_eq!(dhcp, "version: 1\n");

        // The shape pinned here is what Talos reads (siderolabs/talos
        // internal/app/machined/pkg/runtime/v1alpha1/platform/nocloud/metadata.go,
        // applyNetworkConfigV1): a `physical` entry is matched to a link by `mac_address`, compared
        // case-insensitively with the link's permanent or hardware address, with `name` as the
        // fallback; `static` and `static6` subnets take `address` as a prefix (or address plus
        // `netmask`) and an optional `gateway` that becomes a default route on that link; `dhcp`
        // starts DHCPv4 on it; a `nameserver` entry's `address` list sets the resolvers.
        let (mut v4, v6) = (pool("v4", "10.0.0.0/24"), pool("v6", "fd00::/64"));
        v4.gateway = "10.0.0.1".parse().ok();
        v4.nameservers = vec!["1.1.1.1".parse().unwrap()];
        let v6 = IpPool {
            nameservers: vec!["1.1.1.1".parse().unwrap(), "2001:db8::53".parse().unwrap()],
            ..v6
        };
        let allocations = [
            allocation(0, "v4", "10.0.0.5"),
            allocation(1, "v6", "fd00::5"),
        ];
        let pools = [v4.clone(), v6];
        let text = network_config("req-1", 3, &allocations, &pools).unwrap();
        assert_eq!(
            text,
            "version: 1\nconfig:\n  - type: physical\n    name: \"eth0\"\n    mac_address: \"96:56:bd:fa:12:ea\"\n    subnets:\n      - type: static\n        address: \"10.0.0.5/24\"\n        gateway: \"10.0.0.1\"\n  - type: physical\n    name: \"eth1\"\n    mac_address: \"ca:51:a6:8f:87:99\"\n    subnets:\n      - type: static6\n        address: \"fd00::5/64\"\n  - type: physical\n    name: \"eth2\"\n    mac_address: \"92:f8:87:84:c2:83\"\n    subnets:\n      - type: dhcp\n  - type: nameserver\n    address:\n      - \"1.1.1.1\"\n      - \"2001:db8::53\"\n"
        );
        let v = crate::yaml::from_str(&text).unwrap();
        let mac = |nic| mac_for_nic("req-1", nic).to_string().to_ascii_lowercase();
        assert_eq!(v["config"][0]["mac_address"], mac(0));
        assert_eq!(v["config"][1]["mac_address"], mac(1));
        assert_eq!(v["config"][2]["subnets"][0]["type"], "dhcp");
        assert_eq!(v["config"][3]["address"][1], "2001:db8::53");
        let empty = network_config("req-1", 0, &allocations, &pools).unwrap();
        assert_eq!(empty, "version: 1\nconfig:\n");
        v4.nameservers.clear();
        let one = network_config("req-1", 1, &allocations[..1], &[v4]).unwrap();
        assert_eq!(
            one,
            "version: 1\nconfig:\n  - type: physical\n    name: \"eth0\"\n    mac_address: \"96:56:bd:fa:12:ea\"\n    subnets:\n      - type: static\n        address: \"10.0.0.5/24\"\n        gateway: \"10.0.0.1\"\n"
        );
        // The pool was removed from the config since: named, with its key.
        let gone = network_config("req-1", 2, &allocations, &pools[..1]).unwrap_err();
        assert_eq!(gone.key, "additional_nics[0].ip_pool");
    }

    fn pool(name: &str, cidr: &str) -> IpPool {
        IpPool {
            name: name.into(),
            cidr: ip_pool::parse_cidr(cidr).unwrap(),
            ranges: Vec::new(),
            gateway: None,
            nameservers: Vec::new(),
            bridge: None,
            vlan: None,
        }
    }

    fn allocation(nic: u8, pool: &str, address: &str) -> IpAllocation {
        let (pool, address) = (pool.into(), address.parse().unwrap());
        IpAllocation { nic, pool, address }
    }

    #[test]
    fn every_nic_but_the_first_has_a_mac_of_its_own() {
        assert_eq!(mac_for_nic("r", 0), mac_for_request("r"));
        assert_ne!(mac_for_nic("r", 1), mac_for_nic("r", 0));
        assert_ne!(mac_for_nic("r", 1), mac_for_nic("r", 2));
    }

    #[test]
    fn deterministic_names_and_macs() {
        assert_eq!(seed_iso_file_name("req-1"), "omni-seed-req-1.iso");
        let odd = seed_iso_file_name("a/b c");
        assert!(odd.starts_with("omni-seed-a-b-c-") && odd.ends_with(".iso"));
        assert_ne!(seed_iso_file_name("a/b"), seed_iso_file_name("a b"));
        assert_eq!(mac_for_request("x"), mac_for_request("x"));
        assert_ne!(mac_for_request("x"), mac_for_request("y"));
        assert_eq!(mac_for_request("x").0[0] & 0b11, 0b10);
    }

    #[test]
    fn seed_iso_round_trip() {
        let secret = crate::secret::Secret::new(JOIN_CONFIG);
        let image = seed_iso::build_seed(&secret, instance_id(), "req-1", "version: 1\n").unwrap();
        assert_eq!(image.len() % 2048, 0);
        // Primary volume descriptor: "CD001" and the volume label.
        let pvd = &image[16 * 2048..17 * 2048];
        assert_eq!(&pvd[1..6], b"CD001");
        assert!(pvd[40..72].starts_with(b"cidata"));
        // Contents are stored verbatim; names are in the Rock Ridge/Joliet records.
        for content in [
            meta_data(instance_id(), "req-1").as_bytes(),
            b"version: 1\n",
            JOIN_CONFIG.as_bytes(),
        ] {
            assert!(image.windows(content.len()).any(|w| w == content));
        }
        let joliet_name: Vec<u8> = "network-config"
            .encode_utf16()
            .flat_map(u16::to_be_bytes)
            .collect();
        assert!(
            image
                .windows(joliet_name.len())
                .any(|w| w == joliet_name.as_slice())
        );
        assert!(image.windows(9).any(|w| w == b"user-data"));

        // blkid, when present, agrees on label and type.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seed.iso");
        std::fs::write(&path, &image).unwrap();
        if let Ok(out) = std::process::Command::new("blkid")
            .arg("-p")
            .arg(&path)
            .output()
            && out.status.success()
        {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("LABEL=\"cidata\""), "{text}");
            assert!(text.contains("TYPE=\"iso9660\""), "{text}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
        #[test]
        fn file_names_are_valid_proxmox_iso_names(id in "\\PC{0,120}") {
            let name = seed_iso_file_name(&id);
            prop_assert!(crate::proxmox::property::IsoFileName::new(name.clone()).is_ok(), "{}", name);
        }
    }
}
