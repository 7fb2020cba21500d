//! The sandbox of `make sandbox` (examples/sandbox.rs): a fake Proxmox VE 9 cluster shaped so that
//! every file in `examples/` fits it, and `examples/config.yaml` pointed at it. The test
//! `tests/sandbox.rs` validates every example machine class against it with the real binary.
//!
//! What the examples name, and where the sandbox has it: nodes pve1–pve4 with 16 CPUs
//! and 64 GiB each (`config.yaml`'s `nodes:` names pve3 and pve4; `spread-set.yaml` wants 16 GiB); `local-lvm` (LVM-thin, 2 TiB on each node: `extra-disk.yaml` wants more
//! than 250 GiB free, `spread-set.yaml` more than 200 GiB); `local-zfs` on pve3 (`nodes.pve3` in
//! `config.yaml`); `shared-nfs` (shared NFS, holding the template, for
//! `clone-from-template.yaml`); `ceph-vm` (Ceph RBD, shared, for `control-plane-ha.yaml`);
//! bridges vmbr0 and vmbr1 on every node; the template `talos-template`.

use serde_json::{Value, json};

use crate::fakepve::{TOKEN_ID, TOKEN_SECRET, readme_role};

const GIB: u64 = 1024 * 1024 * 1024;
const TIB: u64 = 1024 * GIB;

/// The sandbox cluster, as a fakepve launcher scenario.
pub fn scenario() -> Value {
    let nodes = ["pve1", "pve2", "pve3", "pve4"];
    json!({
        "nodes": nodes.iter()
            .map(|n| json!({"name": n, "maxcpu": 16, "maxmem": 64 * GIB}))
            .collect::<Vec<_>>(),
        "cluster_name": "sandbox",
        "guests": [
            {"vmid": 9000, "name": "talos-template", "node": "pve1", "template": true,
             "config": {"memory": 2048, "cores": 2, "agent": "1", "scsihw": "virtio-scsi-single",
                        "scsi0": "shared-nfs:9000/base-9000-disk-0.qcow2,size=8G",
                        "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0"}}
        ],
        "storages": {
            "local-lvm": {"avail": 2 * TIB},
            "local-zfs": {"type": "zfspool", "pool": "rpool/data", "content": "images,rootdir",
                          "nodes": "pve3", "active": 1, "avail": 2 * TIB},
            "shared-nfs": {"type": "nfs", "content": "images,iso", "shared": 1, "active": 1,
                           "server": "192.0.2.1", "export": "/export", "path": "/mnt/pve/shared-nfs",
                           "avail": 4 * TIB},
            "ceph-vm": {"type": "rbd", "content": "images", "shared": 1, "active": 1,
                        "pool": "vm", "avail": 4 * TIB}
        },
        "bridges": nodes.iter().map(|n| (n.to_string(), json!(["vmbr0", "vmbr1"])))
            .collect::<serde_json::Map<_, _>>(),
        "tokens": {TOKEN_ID: TOKEN_SECRET},
        // The token as the README grants it: the role where the provider works, only the
        // system reads on `/` (so `validate` has no reach to warn about).
        "acl": {TOKEN_ID: least_privilege()},
        "agent_default": true
    })
}

/// The README's role on the subtrees the provider uses, `Sys.Audit` and `Sys.Console` (HA) on `/`.
fn least_privilege() -> Value {
    let role = readme_role();
    let mut entries = vec![json!(["/", ["Sys.Audit", "Sys.Console"]])];
    for path in ["/vms", "/storage", "/nodes", "/pool", "/sdn"] {
        entries.push(json!([path, role]));
    }
    entries.push(json!(["/mapping", ["Mapping.Use", "Mapping.Audit"]]));
    Value::Array(entries)
}

/// `examples/config.yaml` with its Proxmox connection pointed at the sandbox (`url`, the token,
/// `caFile`); everything else, comments included, as it is. Fails naming the line it cannot find,
/// so a change to the example that the sandbox does not follow is caught.
pub fn config_yaml(example: &str, url: &str, ca_file: &str) -> Result<String, String> {
    let replacements = [
        ("url:", format!("\"{url}/api2/json\"")),
        ("tokenID:", format!("\"{TOKEN_ID}\"")),
        ("tokenSecret:", format!("\"{TOKEN_SECRET}\"")),
        ("caFile:", format!("\"{ca_file}\"")),
    ];
    let mut out = String::with_capacity(example.len());
    let mut found = [false; 4];
    for line in example.lines() {
        let key = line.trim_start();
        let indent = &line[..line.len() - key.len()];
        match replacements
            .iter()
            .position(|(k, _)| indent == "  " && key.starts_with(k))
        {
            Some(i) => {
                found[i] = true;
                out.push_str(&format!(
                    "{indent}{} {}\n",
                    replacements[i].0, replacements[i].1
                ));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    match found.iter().position(|f| !f) {
        Some(i) => Err(format!(
            "examples/config.yaml has no `proxmox.{}` line to point at the sandbox",
            replacements[i].0.trim_end_matches(':')
        )),
        None => Ok(out),
    }
}
