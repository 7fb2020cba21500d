//! The NoCloud seed that hands a VM its join config: `user-data`, `meta-data`, `network-config` on an
//! ISO labelled `cidata`, uploaded to ISO storage and attached as a CD-ROM.
//!
//! We build the ISO ourselves (instead of Proxmox's cloud-init drive) so the seed is a plain file we
//! can name per request, find again, and delete on deprovision, and so its content is exactly the
//! Talos join config rather than a cloud-init user-data Proxmox generates.

use std::net::IpAddr;

use sha2::{Digest, Sha256};

use crate::proxmox::property::MacAddr;
use crate::secret::Secret;

/// Addresses for the VM's first NIC.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NetworkConfig {
    /// DHCP on every interface (what the official provider does).
    #[default]
    Dhcp,
    /// Static addresses on the NIC with this MAC (set the same MAC on `net0`).
    Static {
        mac: MacAddr,
        addresses: Vec<(IpAddr, u8)>,
        gateway: Option<IpAddr>,
        nameservers: Vec<IpAddr>,
    },
}

/// The three seed files. `user_data` holds the join token, so it stays secret.
#[derive(Debug, Clone)]
pub struct SeedFiles {
    pub user_data: Secret,
    pub meta_data: String,
    pub network_config: String,
}

/// Builds the seed files: user-data is the join config as is; meta-data carries the instance ID (the
/// SMBIOS UUID) and the request ID as hostname.
pub fn seed_files(
    join_config: &Secret,
    instance_id: uuid::Uuid,
    hostname: &str,
    network: &NetworkConfig,
) -> SeedFiles {
    let meta_data = format!(
        "instance-id: {}\nlocal-hostname: {}\nhostname: {}\n",
        quoted(&instance_id.hyphenated().to_string()),
        quoted(hostname),
        quoted(hostname)
    );
    SeedFiles {
        user_data: join_config.clone(),
        meta_data,
        network_config: network_config(network),
    }
}

/// `network-config` (version 1).
pub fn network_config(network: &NetworkConfig) -> String {
    match network {
        NetworkConfig::Dhcp => "version: 1\n".to_string(),
        NetworkConfig::Static {
            mac,
            addresses,
            gateway,
            nameservers,
        } => {
            let mut s = String::from("version: 1\nconfig:\n  - type: physical\n    name: eth0\n");
            s.push_str(&format!(
                "    mac_address: {}\n    subnets:\n",
                quoted(&mac.to_string().to_ascii_lowercase())
            ));
            for (i, (address, prefix)) in addresses.iter().enumerate() {
                let kind = if address.is_ipv6() {
                    "static6"
                } else {
                    "static"
                };
                s.push_str(&format!(
                    "      - type: {kind}\n        address: {}\n",
                    quoted(&format!("{address}/{prefix}"))
                ));
                if i == 0
                    && let Some(gw) = gateway
                {
                    s.push_str(&format!("        gateway: {}\n", quoted(&gw.to_string())));
                }
            }
            if !nameservers.is_empty() {
                s.push_str("  - type: nameserver\n    address:\n");
                for ns in nameservers {
                    s.push_str(&format!("      - {}\n", quoted(&ns.to_string())));
                }
            }
            s
        }
    }
}

fn quoted(s: &str) -> String {
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

/// The seed ISO's file name in ISO storage: `omni-seed-<request id>.iso`, with anything Proxmox would
/// not accept replaced; a short hash keeps two IDs that sanitize alike apart.
pub fn seed_iso_file_name(request_id: &str) -> String {
    let clean: String = request_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(100)
        .collect();
    let clean = clean.trim_start_matches('.');
    if clean == request_id && !clean.is_empty() {
        format!("omni-seed-{clean}.iso")
    } else {
        let digest = Sha256::digest(request_id.as_bytes());
        format!(
            "omni-seed-{clean}-{:02x}{:02x}{:02x}{:02x}.iso",
            digest[0], digest[1], digest[2], digest[3]
        )
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

    use super::SeedFiles;

    /// The volume label NoCloud looks for.
    pub const VOLUME_LABEL: &str = "cidata";

    #[derive(Debug, thiserror::Error)]
    #[error("cannot build the seed ISO: {0}")]
    pub struct SeedIsoError(String);

    /// Builds an ISO holding `files` (name, contents) at its root.
    pub fn build(files: &[(&str, &[u8])]) -> Result<Vec<u8>, SeedIsoError> {
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
        trim_to_volume(&mut image);
        Ok(image)
    }

    /// Cuts the buffer to the volume size recorded in the primary volume descriptor.
    fn trim_to_volume(image: &mut Vec<u8>) {
        const PVD: usize = 16 * 2048;
        if image.len() >= PVD + 88 && image[PVD] == 1 && &image[PVD + 1..PVD + 6] == b"CD001" {
            let blocks = u32::from_le_bytes([
                image[PVD + 80],
                image[PVD + 81],
                image[PVD + 82],
                image[PVD + 83],
            ]);
            let size = blocks as usize * 2048;
            if size > PVD && size <= image.len() {
                image.truncate(size);
            }
        }
    }

    /// The seed ISO for the three NoCloud files.
    pub fn build_seed(files: &SeedFiles) -> Result<Vec<u8>, SeedIsoError> {
        build(&[
            ("meta-data", files.meta_data.as_bytes()),
            ("network-config", files.network_config.as_bytes()),
            ("user-data", files.user_data.expose().as_bytes()),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn files() -> SeedFiles {
        seed_files(
            &Secret::new(
                "apiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: https://x?jointoken=v2%3Aabc\n",
            ),
            uuid::Uuid::parse_str("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0").unwrap(),
            "req-1",
            &NetworkConfig::Dhcp,
        )
    }

    #[test]
    fn meta_data_and_network_config() {
        let f = files();
        let meta = crate::yaml::from_str(&f.meta_data).unwrap();
        assert_eq!(meta["instance-id"], "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
        assert_eq!(meta["local-hostname"], "req-1");
        assert_eq!(meta["hostname"], "req-1");
        assert_eq!(f.network_config, "version: 1\n");
        assert!(!format!("{f:?}").contains("jointoken"));

        let mac = mac_for_request("req-1");
        let net = NetworkConfig::Static {
            mac,
            addresses: vec![
                ("10.0.0.5".parse().unwrap(), 24),
                ("fd00::5".parse().unwrap(), 64),
            ],
            gateway: Some("10.0.0.1".parse().unwrap()),
            nameservers: vec!["1.1.1.1".parse().unwrap()],
        };
        let v = crate::yaml::from_str(&network_config(&net)).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(
            v["config"][0]["mac_address"],
            mac.to_string().to_ascii_lowercase()
        );
        assert_eq!(v["config"][0]["subnets"][0]["address"], "10.0.0.5/24");
        assert_eq!(v["config"][0]["subnets"][0]["gateway"], "10.0.0.1");
        assert_eq!(v["config"][0]["subnets"][1]["type"], "static6");
        assert_eq!(v["config"][1]["address"][0], "1.1.1.1");
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
        let f = files();
        let image = seed_iso::build_seed(&f).unwrap();
        assert_eq!(image.len() % 2048, 0);
        // Primary volume descriptor: "CD001" and the volume label.
        let pvd = &image[16 * 2048..17 * 2048];
        assert_eq!(&pvd[1..6], b"CD001");
        assert!(pvd[40..72].starts_with(b"cidata"));
        // Contents are stored verbatim; names are in the Rock Ridge/Joliet records.
        for content in [
            f.meta_data.as_bytes(),
            f.network_config.as_bytes(),
            f.user_data.expose().as_bytes(),
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
