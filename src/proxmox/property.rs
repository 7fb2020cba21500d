//! The one place that builds Proxmox property strings (`net0`, `scsi0`, `hostpci0`, …).
//!
//! A property string is `key=value` pairs joined by commas; a user-supplied value containing `,` or `=`
//! could therefore add keys of its own (`vmbr0,firewall=0`), and `;` separates list items in `tags` and
//! `boot`. Every user-supplied part is a newtype here whose constructor checks it against the character
//! set Proxmox itself accepts, so a value that could smuggle a key never gets this far, and the error
//! says which setting was wrong. Rendering from the newtypes cannot fail.

use std::fmt;

/// A user-supplied part that Proxmox would not accept, or that could inject extra keys.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} is not valid: {expected}")]
pub struct PropertyError {
    /// What the value is (e.g. "network bridge"), for the message.
    pub what: &'static str,
    pub value: String,
    /// What Proxmox accepts.
    pub expected: &'static str,
}

fn invalid(what: &'static str, value: &str, expected: &'static str) -> PropertyError {
    PropertyError {
        what,
        value: value.to_string(),
        expected,
    }
}

/// Whether `s` has a length in `len` and only ASCII letters, digits and the characters of `extra`.
fn made_of(s: &str, len: std::ops::RangeInclusive<usize>, extra: &str) -> bool {
    len.contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
}

/// The name types, one entry each: the doc, the type, what it is and what Proxmox accepts (for the
/// message), and the check.
macro_rules! name_types {
    ($($(#[$doc:meta])* $name:ident, $what:literal, $expected:literal, $check:expr;)+) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(try_from = "String")]
        pub struct $name(String);

        impl TryFrom<String> for $name {
            type Error = PropertyError;
            fn try_from(value: String) -> Result<Self, PropertyError> {
                Self::new(value)
            }
        }

        impl $name {
            pub fn new(value: impl Into<String>) -> Result<Self, PropertyError> {
                let value = value.into();
                let check: fn(&str) -> bool = $check;
                if check(&value) { Ok(Self(value)) } else { Err(invalid($what, &value, $expected)) }
            }

            /// A name the provider itself chooses (a default), which needs no check.
            pub fn known(value: &'static str) -> Self {
                Self(value.to_owned())
            }

            /// [`Self::new`] for a borrowed string.
            pub fn parse(value: &str) -> Result<Self, PropertyError> {
                Self::new(value)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    )+};
}

name_types! {
    /// A storage ID (`pve-storage-id`): `local-lvm`, `ceph_pool.1`.
    StorageId,
    "storage",
    "a letter, then letters, digits, '-', '_' or '.', ending in a letter or digit (e.g. local-lvm)",
    |s| made_of(s, 2..=64, "-_.")
        && s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric());

    /// A Linux bridge name (`pve-bridge-id`), at most 15 characters like every interface name.
    BridgeName,
    "network bridge",
    "1 to 15 letters, digits, '-', '_' or '.' (e.g. vmbr0)",
    |s| made_of(s, 1..=15, "-_.");

    /// A resource-mapping ID (`pve-configid`) for PCI or USB passthrough.
    MappingId,
    "resource mapping",
    "a letter, then letters, digits, '-' or '_' (e.g. nvidia-gpu-1)",
    |s| made_of(s, 2..=128, "-_") && s.starts_with(|c: char| c.is_ascii_alphabetic());

    /// A mediated-device type (`mdev`), e.g. `nvidia-180` or `i915-GVTg_V5_4`.
    MdevType,
    "mediated device type",
    "letters, digits, '-', '_' or '.' (e.g. nvidia-180)",
    |s| made_of(s, 1..=128, "-_.");

    /// A VM tag (`pve-tag`).
    Tag,
    "tag",
    "a letter, digit or '_', then letters, digits, '_', '-', '+' or '.' (e.g. talos)",
    |s| made_of(s, 1..=128, "_-+.") && s.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');

    /// A resource pool ID (`pve-poolid`; `/` separates nested pools).
    PoolId,
    "pool",
    "letters, digits, '-', '_' or '.', with '/' between nested pools (e.g. omni)",
    |s| made_of(s, 1..=64, "-_./") && !s.starts_with('/') && !s.ends_with('/') && !s.contains("//");

    /// A CPU model (`cpu` option's `cputype`): a built-in model or `custom-<name>`.
    CpuType,
    "CPU type",
    "a CPU model name made of letters, digits, '-', '_', '.' or '+' (e.g. x86-64-v2-AES or host)",
    |s| made_of(s, 1..=64, "-_.+");

    /// A cluster node name (`pve-node`): a DNS label.
    NodeName,
    "node",
    "a host name: letters, digits and '-', not starting or ending with '-' (e.g. pve1)",
    |s| made_of(s, 1..=63, "-") && !s.starts_with('-') && !s.ends_with('-');

    /// The file part of a volume in ISO storage (`<storage>:iso/<file>`).
    IsoFileName,
    "ISO file name",
    "letters, digits, '-', '_', '.' or '+', ending in .iso",
    |s| made_of(s, 5..=200, "-_.+") && s.ends_with(".iso") && !s.starts_with('.');

    /// The file part of a disk image in `import` storage (`<storage>:import/<file>`). pve-storage
    /// src/PVE/API2/Storage/Status.pm `download_url` takes for `import` content only names of
    /// `[a-zA-Z0-9-.+=_]` ending in `.ova`, `.qcow2`, `.raw` or `.vmdk` (Storage.pm
    /// `UPLOAD_IMPORT_EXT_RE_1`, case-sensitive); of those, a disk can be made from all but `.ova`.
    /// `=` is refused here although pve-storage takes it: the name goes into `import-from=<volume>`,
    /// and the provider's own names (a SHA-256 and an extension) never need one.
    ImportFileName,
    "disk image file name",
    "letters, digits, '-', '_', '.' or '+', ending in .qcow2, .raw or .vmdk",
    |s| made_of(s, 0..=200, "-_.+")
        && !s.starts_with('.')
        && [".qcow2", ".raw", ".vmdk"].iter().any(|ext| s.len() > ext.len() && s.ends_with(ext));

    /// `vga`: the display type (no options), one of [`Vga::TYPES`].
    Vga,
    "display type",
    "one of cirrus, none, qxl, qxl2-4, serial0-3, std, virtio, virtio-gl, vmware",
    |s| Vga::TYPES.contains(&s);
}

/// A file in a storage's directory of one content type: `<storage>:<dir>/<file>` (pve-storage
/// Plugin.pm `parse_volname`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Volume<F> {
    pub storage: StorageId,
    pub file: F,
}

/// A disk image in `import` storage: `local:import/talos.qcow2`.
pub type ImportVolume = Volume<ImportFileName>;
/// A volume in ISO storage: `local:iso/talos.iso`.
pub type IsoVolume = Volume<IsoFileName>;

/// The file names of one content type's directory.
pub trait VolumeFile: fmt::Display + TryFrom<String, Error = PropertyError> {
    /// The directory, what the volume is and an example, for the message.
    const DIR: &str;
    const WHAT: &str;
    const EXPECTED: &str;
}

impl VolumeFile for ImportFileName {
    const DIR: &str = "import";
    const WHAT: &str = "import volume";
    const EXPECTED: &str = "<storage>:import/<file>.qcow2 (e.g. local:import/talos.qcow2)";
}

impl VolumeFile for IsoFileName {
    const DIR: &str = "iso";
    const WHAT: &str = "ISO volume";
    const EXPECTED: &str = "<storage>:iso/<file>.iso (e.g. local:iso/talos.iso)";
}

impl<F: VolumeFile> Volume<F> {
    /// Parses a volume ID as Proxmox reports it (`local:iso/x.iso`).
    pub fn parse(volid: &str) -> Result<Self, PropertyError> {
        let wrong = || invalid(F::WHAT, volid, F::EXPECTED);
        let (storage, rest) = volid.split_once(':').ok_or_else(wrong)?;
        let file = rest.strip_prefix(F::DIR).and_then(|r| r.strip_prefix('/'));
        let file = file.ok_or_else(wrong)?;
        let storage = StorageId::new(storage)?;
        let file = F::try_from(file.to_owned())?;
        Ok(Self { storage, file })
    }
}

impl<F: VolumeFile> fmt::Display for Volume<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}/{}", self.storage, F::DIR, self.file)
    }
}

/// A new disk made from a disk image: `<storage>:0,import-from=<volume>,<options>`. qemu-server
/// src/PVE/API2/Qemu.pm `$check_drive_param` refuses any size but `0` with `import-from`; the disk
/// takes the image's virtual size and is grown afterwards.
pub fn imported_disk(storage: &StorageId, source: &ImportVolume, options: DiskOptions) -> String {
    format!("{storage}:0,import-from={source}{}", options.render())
}

/// A VLAN tag, 1 to 4094 (0 means "untagged" and is represented by `None` where a VLAN is optional).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VlanTag(u16);

impl VlanTag {
    pub fn new(tag: u64) -> Result<Self, PropertyError> {
        let valid = u16::try_from(tag).ok().filter(|t| (1..=4094).contains(t));
        let expected = "1 to 4094 (or 0 for untagged)";
        valid
            .map(Self)
            .ok_or_else(|| invalid("VLAN tag", &tag.to_string(), expected))
    }

    /// `0` means untagged.
    pub fn optional(tag: u64) -> Result<Option<Self>, PropertyError> {
        (tag != 0).then(|| Self::new(tag)).transpose()
    }

    pub fn get(self) -> u16 {
        self.0
    }
}

/// A unicast MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02X}:{b:02X}:{c:02X}:{d:02X}:{e:02X}:{g:02X}")
    }
}

/// A device slot in the VM config, which is also the option key (`scsi0`, `ide2`, `net1`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Slot {
    Scsi(u8),
    Ide(u8),
    Net(u8),
    HostPci(u8),
    Usb(u8),
}

impl Slot {
    /// The option key's prefix, the index and the highest index Proxmox has.
    fn parts(self) -> (&'static str, u8, u8) {
        match self {
            Slot::Scsi(i) => ("scsi", i, 30),
            Slot::Ide(i) => ("ide", i, 3),
            Slot::Net(i) => ("net", i, 31),
            Slot::HostPci(i) => ("hostpci", i, 15),
            Slot::Usb(i) => ("usb", i, 14),
        }
    }

    /// The slot, if its index is within Proxmox's limits.
    pub fn checked(self) -> Option<Self> {
        let (_, index, max) = self.parts();
        (index <= max).then_some(self)
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (prefix, index, _) = self.parts();
        write!(f, "{prefix}{index}")
    }
}

/// `,<key>=<value>` when there is a value.
fn opt(key: &str, value: Option<impl fmt::Display>) -> String {
    value.map(|v| format!(",{key}={v}")).unwrap_or_default()
}

/// `netN`, a virtio NIC: `virtio[=<mac>],bridge=<bridge>,firewall=<0|1>[,tag=<vlan>]`.
pub fn nic(
    bridge: &BridgeName,
    firewall: bool,
    vlan: Option<VlanTag>,
    mac: Option<MacAddr>,
) -> String {
    let mac = mac.map(|mac| format!("={mac}")).unwrap_or_default();
    let tag = opt("tag", vlan.map(VlanTag::get));
    format!(
        "virtio{mac},bridge={bridge},firewall={}{tag}",
        u8::from(firewall)
    )
}

/// An enum whose every value is one word (of Proxmox's, or of provider data's): one table gives
/// the Rust name, the word (`as_str`, serde's name, and the schema's where the enum also derives
/// `JsonSchema`) and the list of every value (`ALL`).
macro_rules! str_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant),+
        }

        impl $name {
            /// Every word, in the order declared.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text),+
                }
            }
        }
    };
}
pub(crate) use str_enum;

str_enum!(
    /// `disk_cache`.
    DiskCache {
        None = "none",
        Writethrough = "writethrough",
        Writeback = "writeback",
        Directsync = "directsync",
        Unsafe = "unsafe",
    }
);

str_enum!(
    /// `disk_aio`.
    DiskAio {
        Native = "native",
        Threads = "threads",
        IoUring = "io_uring",
    }
);

/// Per-disk performance options shared by the boot disk and additional disks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskOptions {
    pub ssd: bool,
    pub discard: bool,
    pub iothread: bool,
    pub cache: Option<DiskCache>,
    pub aio: Option<DiskAio>,
}

impl DiskOptions {
    /// `[,cache=…][,aio=…][,iothread=1][,discard=on][,ssd=1]`
    fn render(&self) -> String {
        [
            opt("cache", self.cache.map(DiskCache::as_str)),
            opt("aio", self.aio.map(DiskAio::as_str)),
            opt("iothread", self.iothread.then_some(1)),
            opt("discard", self.discard.then_some("on")),
            opt("ssd", self.ssd.then_some(1)),
        ]
        .concat()
    }
}

/// A disk to allocate on create: `<storage>:<size GiB>[,cache=…][,aio=…][,iothread=1][,discard=on][,ssd=1]`.
pub fn new_disk(storage: &StorageId, size_gb: u64, options: DiskOptions) -> String {
    format!("{storage}:{size_gb}{}", options.render())
}

/// Options for a disk that already exists (a cloned template's disk): `<volume>,<options>`.
/// The volume ID comes from Proxmox's own config, so it is checked for separators only.
pub fn existing_disk(volume: &str, options: DiskOptions) -> Result<String, PropertyError> {
    let expected = "<storage>:<volume name> (e.g. local-lvm:vm-104-disk-0)";
    if !(volume.contains(':') && made_of(volume, 1..=usize::MAX, "-_.:/+")) {
        return Err(invalid("disk volume", volume, expected));
    }
    Ok(format!("{volume}{}", options.render()))
}

/// `ideN` as a CD-ROM drive holding `volume`.
pub fn cdrom(volume: &IsoVolume) -> String {
    format!("{volume},media=cdrom")
}

/// `efidisk0`: 4 MiB OVMF vars without pre-enrolled Microsoft keys (Talos brings its own).
pub fn efi_disk(storage: &StorageId) -> String {
    format!("{storage}:1,efitype=4m,pre-enrolled-keys=0")
}

/// `hostpciN` through a resource mapping, as an item of provider data's `pci_devices:` asks for it
/// (the doc comments are what Omni shows for its keys).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(description = "")]
pub struct HostPci {
    /// PCI resource mapping ID, e.g. nvidia-gpu-1.
    pub mapping: MappingId,
    /// Mediated device type, e.g. nvidia-180.
    pub mdev: Option<MdevType>,
    /// Attach as PCIe (needs machine_type q35).
    #[serde(default)]
    pub pcie: bool,
    /// Use as the primary GPU (x-vga=1).
    #[serde(default)]
    pub primary_gpu: bool,
    /// Expose the device ROM (Proxmox default on).
    // As upstream, only `true` is written (`rombar=1`); false leaves Proxmox's default.
    #[serde(default)]
    pub rombar: bool,
}

impl HostPci {
    pub fn render(&self) -> String {
        let options = [
            opt("mdev", self.mdev.as_ref()),
            opt("pcie", self.pcie.then_some(1)),
            opt("rombar", self.rombar.then_some(1)),
            opt("x-vga", self.primary_gpu.then_some(1)),
        ];
        format!("mapping={}{}", self.mapping, options.concat())
    }
}

/// `usbN` through a resource mapping, as an item of provider data's `usb_devices:` asks for it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(description = "")]
pub struct Usb {
    /// USB resource mapping ID.
    #[schemars(length(min = 1))]
    pub mapping: MappingId,
    /// Attach to the USB 3 controller.
    #[serde(default)]
    pub usb3: bool,
}

impl Usb {
    pub fn render(&self) -> String {
        let usb3 = opt("usb3", self.usb3.then_some(1));
        format!("mapping={}{usb3}", self.mapping)
    }
}

/// `tags`: `;`-separated, deduplicated, in the order given.
pub fn tags(tags: &[Tag]) -> String {
    let mut seen = std::collections::BTreeSet::new();
    tags.iter()
        .filter(|t| seen.insert(t.as_str().to_ascii_lowercase()))
        .map(Tag::as_str)
        .collect::<Vec<_>>()
        .join(";")
}

/// `boot`: `order=<slot>;<slot>…`.
pub fn boot_order(slots: &[Slot]) -> String {
    let slots: Vec<String> = slots.iter().map(Slot::to_string).collect();
    format!("order={}", slots.join(";"))
}

/// `hugepages`: the page size in MiB, which is how Proxmox names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hugepages {
    TwoMb = 2,
    OneGb = 1024,
}

impl Hugepages {
    pub fn render(self) -> String {
        (self as u16).to_string()
    }
}

impl Vga {
    /// The display adapters qemu-server accepts for `vga: type=` (also the provider-data schema enum).
    pub const TYPES: &'static [&'static str] = &[
        "cirrus",
        "none",
        "qxl",
        "qxl2",
        "qxl3",
        "qxl4",
        "serial0",
        "serial1",
        "serial2",
        "serial3",
        "std",
        "virtio",
        "virtio-gl",
        "vmware",
    ];
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Splits a property string the way Proxmox does and returns its keys (the first item may be a
    /// bare default-key value).
    fn keys(s: &str) -> Vec<String> {
        s.split(',')
            .map(|kv| {
                kv.split_once('=')
                    .map_or("<default>", |(k, _)| k)
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn renders_every_property() {
        let vmbr0 = BridgeName::new("vmbr0").unwrap();
        let mac = Some(MacAddr([0xbc, 0x24, 0x11, 0, 0, 1]));
        assert_eq!(
            nic(&vmbr0, true, VlanTag::optional(10).unwrap(), mac),
            "virtio=BC:24:11:00:00:01,bridge=vmbr0,firewall=1,tag=10"
        );
        let vmbr1 = BridgeName::new("vmbr1").unwrap();
        assert_eq!(
            nic(&vmbr1, false, None, None),
            "virtio,bridge=vmbr1,firewall=0"
        );

        let options = DiskOptions {
            ssd: true,
            discard: true,
            iothread: true,
            cache: Some(DiskCache::Writeback),
            aio: Some(DiskAio::IoUring),
        };
        let local_lvm = StorageId::new("local-lvm").unwrap();
        assert_eq!(
            new_disk(&local_lvm, 20, options),
            "local-lvm:20,cache=writeback,aio=io_uring,iothread=1,discard=on,ssd=1"
        );
        let ceph = StorageId::new("ceph").unwrap();
        assert_eq!(new_disk(&ceph, 5, DiskOptions::default()), "ceph:5");
        let existing = existing_disk(
            "local-lvm:vm-104-disk-0",
            DiskOptions {
                ssd: true,
                ..Default::default()
            },
        );
        assert_eq!(existing.unwrap(), "local-lvm:vm-104-disk-0,ssd=1");

        let iso = IsoVolume::parse("local:iso/talos-1.iso").unwrap();
        assert_eq!(cdrom(&iso), "local:iso/talos-1.iso,media=cdrom");
        assert_eq!(
            efi_disk(&StorageId::new("local-lvm").unwrap()),
            "local-lvm:1,efitype=4m,pre-enrolled-keys=0"
        );

        let pci = HostPci {
            mapping: MappingId::new("nvidia-gpu-1").unwrap(),
            mdev: Some(MdevType::new("nvidia-180").unwrap()),
            pcie: true,
            rombar: true,
            primary_gpu: true,
        };
        assert_eq!(
            pci.render(),
            "mapping=nvidia-gpu-1,mdev=nvidia-180,pcie=1,rombar=1,x-vga=1"
        );
        let usb = Usb {
            mapping: MappingId::new("rtl-sdr").unwrap(),
            usb3: true,
        };
        assert_eq!(usb.render(), "mapping=rtl-sdr,usb3=1");
        let t = |s: &str| Tag::new(s).unwrap();
        assert_eq!(
            tags(&[t("machine-request.set1"), t("talos"), t("TALOS")]),
            "machine-request.set1;talos"
        );
        assert_eq!(
            crate::proxmox::types::split_list("a;b,c d"),
            vec!["a", "b", "c", "d"]
        );
        assert_eq!(
            boot_order(&[Slot::Scsi(0), Slot::Ide(2), Slot::Net(0)]),
            "order=scsi0;ide2;net0"
        );
        assert_eq!(Hugepages::TwoMb.render(), "2");
        assert_eq!(Hugepages::OneGb.render(), "1024");
        assert_eq!(Vga::new("serial0").unwrap().as_str(), "serial0");
        assert!(Vga::new("std,memory=4").is_err());
        assert_eq!(Slot::HostPci(16).checked(), None);
        assert_eq!(Slot::Usb(3).to_string(), "usb3");
    }

    #[test]
    fn rejects_smuggled_keys_and_names_the_setting() {
        let err = BridgeName::new("vmbr0,firewall=0").unwrap_err();
        assert_eq!(err.what, "network bridge");
        assert!(err.to_string().contains("vmbr0,firewall=0"));
        assert!(StorageId::new("local;x").is_err());
        assert!(StorageId::new("1local").is_err());
        assert!(Tag::new("a;b").is_err());
        assert!(Tag::new("-a").is_err());
        assert!(PoolId::new("pool=x").is_err());
        assert!(MappingId::new("gpu\n").is_err());
        assert!(CpuType::new("host,flags=+aes").is_err());
        assert!(IsoVolume::parse("local:iso/x.iso,media=disk").is_err());
        assert!(IsoVolume::parse("local:images/x.iso").is_err());
        assert!(VlanTag::new(4095).is_err());
        assert!(existing_disk("local-lvm:vm-1,ssd=1", DiskOptions::default()).is_err());
    }

    fn arb_options() -> impl Strategy<Value = DiskOptions> {
        (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(ssd, discard, iothread)| {
            DiskOptions {
                ssd,
                discard,
                iothread,
                cache: Some(DiskCache::None),
                aio: Some(DiskAio::Native),
            }
        })
    }

    proptest! {
        #[test]
        fn arbitrary_names_never_yield_extra_keys(s in "\\PC{0,24}|[a-z0-9,=;_.+-]{0,16}", vlan in 0u64..5000, opts in arb_options()) {
            if let Ok(bridge) = BridgeName::new(s.clone()) {
                let vlan = VlanTag::optional(vlan).ok().flatten();
                let nic = nic(&bridge, true, vlan, None);
                let mut expected = vec!["<default>", "bridge", "firewall"];
                if vlan.is_some() { expected.push("tag"); }
                prop_assert_eq!(keys(&nic), expected);
            }
            if let Ok(storage) = StorageId::new(s.clone()) {
                let rendered = new_disk(&storage, 1, opts);
                prop_assert_eq!(rendered.matches(',').count(), keys(&rendered).len() - 1);
                prop_assert!(keys(&rendered).iter().all(|k| ["<default>", "cache", "aio", "iothread", "discard", "ssd"].contains(&k.as_str())));
                prop_assert_eq!(rendered.split(',').next().unwrap().matches(':').count(), 1);
            }
            if let Ok(mapping) = MappingId::new(s.clone()) {
                prop_assert_eq!(keys(&Usb { mapping: mapping.clone(), usb3: false }.render()), vec!["mapping"]);
                let pci = HostPci { mapping, mdev: MdevType::new(s.clone()).ok(), pcie: false, rombar: false, primary_gpu: false };
                let k = keys(&pci.render());
                prop_assert!(k.len() <= 2 && k[0] == "mapping");
            }
            if let Ok(tag) = Tag::new(s.clone()) {
                let rendered = tags(&[tag.clone(), tag]);
                prop_assert!(!rendered.contains(';') && !rendered.contains(',') && !rendered.contains('='));
            }
            for ok in [PoolId::new(s.clone()).is_ok(), CpuType::new(s.clone()).is_ok(), NodeName::new(s.clone()).is_ok(),
                       IsoFileName::new(s.clone()).is_ok(), MdevType::new(s.clone()).is_ok()] {
                if ok {
                    prop_assert!(!s.contains([',', '=', ';', '\n', ' ', '\r', '\t', '\0']));
                }
            }
            if let Ok(volume) = IsoVolume::parse(&s) {
                prop_assert_eq!(keys(&cdrom(&volume)), vec!["<default>", "media"]);
            }
            let _ = Vga::new(&s);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any value with a separator in it is refused by every constructor, and the error names
        /// the setting and quotes the value.
        #[test]
        fn separators_are_refused_naming_the_setting(
            before in "[a-z0-9]{0,6}",
            sep in prop::sample::select(vec![",", "=", ";", "\n", "\r", " ", "\0"]),
            after in "[a-z0-9]{0,6}",
        ) {
            let s = format!("{before}{sep}{after}");
            let results = [
                StorageId::new(s.clone()).err(),
                BridgeName::new(s.clone()).err(),
                MappingId::new(s.clone()).err(),
                MdevType::new(s.clone()).err(),
                Tag::new(s.clone()).err(),
                PoolId::new(s.clone()).err(),
                CpuType::new(s.clone()).err(),
                NodeName::new(s.clone()).err(),
                IsoFileName::new(format!("{s}.iso")).err(),
                IsoVolume::parse(&format!("local:iso/{s}.iso")).err(),
                IsoVolume::parse(&format!("{s}:iso/a.iso")).err(),
                ImportVolume::parse(&format!("{s}:import/a.qcow2")).err(),
                existing_disk(&format!("local:{s}"), DiskOptions::default()).err(),
                Vga::new(&s).err(),
            ];
            for (i, e) in results.iter().enumerate() {
                let e = e.as_ref();
                prop_assert!(e.is_some(), "constructor {i} accepted {s:?}");
                let e = e.unwrap();
                prop_assert!(!e.what.is_empty() && e.value.contains(&s), "{e:?}");
                prop_assert!(e.to_string().starts_with(e.what), "{e}");
            }
            let file = format!("{s}.qcow2");
            prop_assert!(ImportFileName::new(file).is_err());
        }

        /// The disk, EFI and import builders: only their own keys, whatever the accepted names.
        #[test]
        fn disk_builders_carry_only_their_keys(
            storage in "[a-zA-Z][a-zA-Z0-9_.=,-]{0,10}[a-zA-Z0-9]",
            file in "[a-zA-Z0-9_.+=,-]{1,12}",
            volume in "[a-zA-Z0-9_.:/+=,-]{1,20}",
            opts in arb_options(),
        ) {
            let options = ["<default>", "cache", "aio", "iothread", "discard", "ssd"];
            if let Ok(storage) = StorageId::new(storage) {
                let efi = efi_disk(&storage);
                prop_assert_eq!(keys(&efi), vec!["<default>", "efitype", "pre-enrolled-keys"]);
                if let Ok(source) = ImportVolume::parse(&format!("{storage}:import/{file}.qcow2")) {
                    let rendered = imported_disk(&storage, &source, opts);
                    let k = keys(&rendered);
                    prop_assert_eq!(&k[..2], &["<default>", "import-from"]);
                    prop_assert!(k[2..].iter().all(|k| options.contains(&k.as_str())), "{}", rendered);
                    prop_assert!(!rendered.contains('\n'));
                }
            }
            if let Ok(rendered) = existing_disk(&volume, opts) {
                prop_assert!(keys(&rendered).iter().all(|k| options.contains(&k.as_str())), "{}", rendered);
                prop_assert!(!volume.contains([',', '=']));
            }
        }
    }
}
