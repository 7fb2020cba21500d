//! What can go wrong talking to Proxmox, sorted by what the caller should do about it.
//!
//! The pipeline decides from the kind alone: `NotFound` is often success (deleting what is gone),
//! `Transient` is retried, `Unauthorized` is a configuration problem, `Api` carries Proxmox's own words
//! (including its per-parameter `errors`) for the user, and `TaskFailed` carries the tail of the task log,
//! which is where Proxmox explains why a clone or start failed.
//!
//! `status_error` turns an answer into its kind. Proxmox words its errors differently across
//! versions and handlers, so the message is taken from wherever this version put it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::types::Upid;

/// A result whose error, by default, is a [`ProxmoxError`].
pub type Result<T, E = ProxmoxError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum ProxmoxError {
    /// The VM, node, storage or volume does not exist (404, or PVE's 500 "does not exist" family).
    #[error("not found: {call}: {message}")]
    NotFound { call: Call, message: String },

    /// Credentials refused (401) even after a fresh login.
    #[error(
        "Proxmox refused the credentials: {call}: {message} (check proxmox.tokenID/tokenSecret or username/password/realm in the config file)"
    )]
    Unauthorized { call: Call, message: String },

    /// Logged in but not allowed (403): the token or user lacks a privilege.
    #[error(
        "permission denied: {call}: {message} (grant the provider's user or token the missing privilege on that path)"
    )]
    PermissionDenied { call: Call, message: String },

    /// Proxmox understood the request and said no (400 bad parameters, 500 with a reason, ...).
    #[error(
        "Proxmox rejected {call}: {status} {message}{}",
        field_list(field_errors)
    )]
    Api {
        call: Call,
        status: u16,
        message: String,
        field_errors: BTreeMap<String, String>,
    },

    /// The API could not be reached or was overloaded (connect error, timeout, 502/503/504, 595 node
    /// unreachable). Worth retrying later.
    #[error("Proxmox unreachable: {call}: {message}")]
    Transient {
        call: Call,
        status: Option<u16>,
        message: String,
        /// False when Proxmox provably did not act on the request (the connection failed before it was
        /// sent, or PVE refused it for a lock timeout before changing anything): then even a create is
        /// safe to send again.
        request_sent: bool,
    },

    /// A task ran and ended with an error.
    #[error(
        "Proxmox task {} on {} failed: {exit_status}{}",
        upid.task_type(),
        upid.node(),
        log_lines(log_tail)
    )]
    TaskFailed {
        upid: Upid,
        exit_status: String,
        log_tail: Vec<String>,
    },

    /// A task did not finish before our deadline (it may still be running on Proxmox).
    #[error("Proxmox task {upid} still running after {waited:?}")]
    TaskTimeout { upid: Upid, waited: Duration },

    /// The answer was not what the API documents.
    #[error("unexpected answer to {call}: {message}")]
    Decode { call: Call, message: String },

    /// The client could not be built (bad CA file, bad URL).
    #[error("{0}")]
    Setup(String),

    /// Not sent: this replica does not hold the leader lease (see [`crate::fence`]).
    #[error("{call}: {source}")]
    Fenced {
        call: Call,
        source: crate::fence::Fenced,
    },
}

impl ProxmoxError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transient { .. } | Self::TaskTimeout { .. })
    }

    /// Proxmox refuses a create or clone whose VMID is taken with "VM 104 already exists" (sometimes
    /// inside the task, sometimes as the HTTP answer). A clone onto a VMID another node holds passes
    /// the API's early check (it looks only at the source node's config directory) and fails inside
    /// its task, when the cluster file system refuses the new config file: "close (rename) atomic
    /// file '/etc/pve/nodes/pve1/qemu-server/104.conf' failed: File exists".
    pub fn is_vmid_taken(&self) -> bool {
        self.says(|t| {
            t.contains("already exists") || (t.contains(".conf'") && t.contains("File exists"))
        })
    }

    /// A create or start found `volid` missing from its storage: pve-storage `Plugin.pm`
    /// `activate_volume` dies with "volume '<volid>' does not exist", qemu-server's `create_disks`
    /// (for a volume without a size) with "volume <volid> does not exist".
    pub fn is_volume_missing(&self, volid: &str) -> bool {
        let quoted = format!("volume '{volid}' does not exist");
        let bare = format!("volume {volid} does not exist");
        self.says(|t| t.contains(&quoted) || t.contains(&bare))
    }

    /// `download-url` found the file already in storage: its task refuses to replace it (pve-common
    /// Tools.pm, download_file_from_url). The file being there is what the caller wanted.
    pub fn is_file_already_present(&self) -> bool {
        matches!(self, Self::TaskFailed { .. })
            && self.says(|l| l.contains("refusing to override existing file"))
    }

    /// pveproxy could not reach the node the call was for (595/596: the node is offline or cut off):
    /// the call may work once the node is back, which can take minutes or hours.
    pub fn is_node_unreachable(&self) -> bool {
        matches!(
            self,
            Self::Transient {
                status: Some(595 | 596),
                ..
            }
        )
    }

    /// The guest holds a lock (pve-guest-common AbstractConfig.pm `check_lock`: "VM is locked
    /// (clone)"): another operation on it is still running, or one died and left the lock for a human
    /// to clear with `qm unlock`.
    pub fn is_guest_locked(&self) -> bool {
        self.says(|t| t.contains("is locked ("))
    }

    /// A storage the call needs is not active on its node (pve-storage `activate_storage`: "storage
    /// 'x' is not online"), e.g. an NFS server that is down.
    pub fn is_storage_offline(&self) -> bool {
        self.says(|t| t.contains("storage '") && t.contains("is not online"))
    }

    /// A create or clone into `pool` refused because the pool is gone: pve-access-control
    /// src/PVE/RPCEnvironment.pm `check_pool_exist` raises a permission error (403 "Permission check
    /// failed (pool '<pool>' does not exist)"), which qemu-server's `create_vm` and `clone_vm` call
    /// before anything is made.
    pub fn is_pool_missing(&self, pool: &str) -> bool {
        let wanted = format!("pool '{pool}' does not exist");
        match self {
            Self::PermissionDenied { message, .. } => message.contains(&wanted),
            _ => self.says(|t| t.contains(&wanted)),
        }
    }

    /// A rule write refused on PVE 9 while HA groups are left from PVE 8 (pve-ha-manager
    /// src/PVE/API2/HA/Rules.pm `create_rule`/`update_rule`: "cannot create ha rule: ha groups
    /// have not been migrated yet").
    pub fn is_ha_groups_unmigrated(&self) -> bool {
        self.says(|t| t.contains("ha groups have not been migrated yet"))
    }

    /// The cluster has lost quorum and /etc/pve is read-only: pve-cluster src/PVE/Cluster.pm
    /// `check_cfs_quorum` ("cluster not ready - no quorum?", what create, start and clone check
    /// first) and `$cfs_lock` ("cfs-lock '<id>' error: no quorum!"). Nothing was changed; it heals
    /// when enough nodes are back.
    pub fn is_no_quorum(&self) -> bool {
        self.says(|t| {
            t.contains("cluster not ready - no quorum?") || t.contains("error: no quorum!")
        })
    }

    /// A start refused because the VM runs already (qemu-server `vm_start`: "VM 104 already
    /// running"), which is what a start sent again after a lost answer meets.
    pub fn is_already_running(&self) -> bool {
        self.says(|t| t.contains("already running"))
    }

    /// pve-ha-manager src/PVE/API2/HA/Rules.pm, `create_rule`: "HA rule '<rule>' already defined".
    pub fn is_ha_rule_defined(&self) -> bool {
        matches!(self, Self::Api { message, .. } if message.contains("already defined"))
    }

    /// pve-common src/PVE/Tools.pm, `assert_if_modified`: "detected modified configuration - file
    /// changed by other user? Try again."
    pub fn is_ha_rules_changed(&self) -> bool {
        matches!(self, Self::Api { message, .. } if message.contains("detected modified configuration"))
    }

    /// Proxmox's own words (the answer's message, or a task's exit status and log tail) say `what`.
    fn says(&self, what: impl Fn(&str) -> bool) -> bool {
        match self {
            Self::Api { message, .. } => what(message),
            Self::TaskFailed {
                exit_status,
                log_tail,
                ..
            } => what(exit_status) || log_tail.iter().any(|l| what(l)),
            _ => false,
        }
    }
}

/// Which API call failed, for error messages: `POST /nodes/pve1/qemu`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub method: &'static str,
    pub path: String,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

/// ` (field: what is wrong; …)`, or nothing.
fn field_list(errors: &BTreeMap<String, String>) -> String {
    let list: Vec<String> = errors
        .iter()
        .map(|(f, m)| format!("{f}: {}", m.trim()))
        .collect();
    let text = (!list.is_empty()).then(|| format!(" ({})", list.join("; ")));
    text.unwrap_or_default()
}

/// `; task log: <line> | <line>…`, or nothing.
fn log_lines(lines: &[String]) -> String {
    let text = (!lines.is_empty()).then(|| format!("; task log: {}", lines.join(" | ")));
    text.unwrap_or_default()
}

#[derive(serde::Deserialize, Default)]
struct ErrorBody {
    message: Option<String>,
    errors: Option<BTreeMap<String, serde_json::Value>>,
}

pub(super) fn transport_error(call: &Call, e: &reqwest::Error) -> ProxmoxError {
    let (call, message) = (call.clone(), crate::error_chain::render(e));
    if e.is_decode() {
        return ProxmoxError::Decode { call, message };
    }
    ProxmoxError::Transient {
        call,
        status: None,
        message,
        request_sent: !e.is_connect(),
    }
}

/// The HTTP reason phrase as Proxmox sent it. PVE puts its error message there; PVE 8 before
/// pve-http-server's fix #6503 (January 2025) put it *only* there, answering `{"data":null}`.
pub(super) fn reason_phrase(response: &reqwest::Response) -> String {
    response
        .extensions()
        .get::<hyper::ext::ReasonPhrase>()
        .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned())
        .or_else(|| response.status().canonical_reason().map(str::to_owned))
        .unwrap_or_default()
}

/// Maps a non-2xx answer to the error kind the caller acts on.
pub(super) fn status_error(call: &Call, status: u16, reason: &str, body: &[u8]) -> ProxmoxError {
    let parsed: Option<ErrorBody> = serde_json::from_slice(body).ok();
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    // A JSON body without `message` (old PVE 8) has its text in the reason phrase; so has an empty
    // or HTML answer.
    let plain = parsed.is_none() && !text.is_empty() && !text.starts_with('<') && text.len() <= 300;
    let parsed = parsed.unwrap_or_default();
    let message = parsed.message.map(|m| m.trim().to_owned());
    let message = message.filter(|m| !m.is_empty());
    let message = message.unwrap_or_else(|| if plain { text } else { reason.trim() }.to_owned());
    let call = call.clone();
    match status {
        401 => ProxmoxError::Unauthorized { call, message },
        403 => {
            let hint = unnamed_privilege(&call, &message).map(|hint| format!(" ({hint})"));
            let message = message + &hint.unwrap_or_default();
            ProxmoxError::PermissionDenied { call, message }
        }
        404 => ProxmoxError::NotFound { call, message },
        // 595/596: pveproxy could not reach the node (offline, network) — the node may come back.
        code @ (408 | 429 | 502 | 503 | 504 | 595 | 596) => ProxmoxError::Transient {
            call,
            status: Some(code),
            message,
            request_sent: true,
        },
        500 if is_missing(&message) => ProxmoxError::NotFound { call, message },
        // Another worker held the guest's or storage's lock past PVE's wait (`lock_file` dies with
        // "got timeout" before the handler changed anything): nothing happened, so sending it again
        // is safe even for a create, and mature clients do exactly that.
        500 if is_lock_timeout(&message) => ProxmoxError::Transient {
            call,
            status: Some(500),
            message,
            request_sent: false,
        },
        code => ProxmoxError::Api {
            call,
            status: code,
            message,
            field_errors: parsed
                .errors
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| {
                    let text = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    (k, text.trim().to_owned())
                })
                .collect(),
        },
    }
}

/// What to do about a refusal whose text does not say it: qemu-server's create_vm ends its VM.Allocate
/// check with a bare "Permission check failed", so does any failed "or" of privileges (download-url's
/// network access), and a tag refusal names Sys.Modify but not the datacenter option that decides it.
fn unnamed_privilege(call: &Call, message: &str) -> Option<&'static str> {
    // pve-guest-common GuestHelpers.pm, assert_tag_permissions: "(/, Sys.Modify for modifying tag 'x')".
    if message.contains("modifying tag") {
        return Some(
            "the datacenter's user-tag-access (Datacenter > Options > User Tag Access) does not let this \
             token set that tag, or it is a registered tag: allow it there, or grant Sys.Modify on /",
        );
    }
    if message.contains(',') || message.contains("does not exist") {
        // "Permission check failed (/path, Privilege)" or "(pool 'x' does not exist)": PVE named it
        return None;
    }
    let segments: Vec<&str> = call.path.trim_matches('/').split('/').collect();
    match (call.method, segments.as_slice()) {
        ("POST", ["nodes", _, "qemu"]) => {
            Some("creating a VM needs VM.Allocate on /vms/<vmid> or on the pool it goes to")
        }
        ("POST", ["nodes", _, "storage", _, "download-url"]) => Some(
            "download-url needs Sys.AccessNetwork on /nodes/<node>, or Sys.Audit and Sys.Modify on /",
        ),
        ("POST", ["nodes", _, "qemu", _, "clone"]) => Some(
            "cloning needs VM.Clone on the template and VM.Allocate on the new VMID or its pool",
        ),
        _ => None,
    }
}

/// A lock not obtained in time, before the handler changed anything:
/// - pve-common Tools.pm `lock_file_full` / `run_with_timeout`: "can't lock file '…' - got timeout";
/// - pve-cluster src/PVE/Cluster.pm `$cfs_lock`, a cluster-wide pmxcfs lock (user.cfg for pools,
///   the HA domain, a storage) another node held past its 10 s: "cfs-lock '<id>' error: got lock
///   request timeout", often behind the caller's prefix ("create pool failed: …"). Its other
///   timeout, "'<id>'-locked command timed out - aborting", comes after the work began: not this.
fn is_lock_timeout(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    (m.contains("got timeout") && (m.contains("lock") || m.contains("can't")))
        || (m.contains("cfs-lock '") && m.contains("got lock request timeout"))
}

/// Proxmox reports missing objects as 500 with one of these texts.
fn is_missing(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("does not exist")
        || m.contains("no such ha rule")
        || m.contains("no such vm")
        || m.contains("no such node")
        || (m.contains("hostname lookup") && m.contains("failed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task_failed(exit_status: &str) -> ProxmoxError {
        ProxmoxError::TaskFailed {
            upid: Upid::parse("UPID:pve2:1:2:3:qmstart:104:root@pam:").unwrap(),
            exit_status: exit_status.into(),
            log_tail: vec![format!("TASK ERROR: {exit_status}")],
        }
    }

    fn api(status: u16, message: &str) -> ProxmoxError {
        ProxmoxError::Api {
            call: Call {
                method: "POST",
                path: "/nodes/pve2/qemu/104/status/start".into(),
            },
            status,
            message: message.into(),
            field_errors: BTreeMap::new(),
        }
    }

    #[test]
    fn what_proxmox_says_is_recognised_in_answers_and_tasks() {
        assert!(task_failed("VM 104 already running").is_already_running());
        assert!(api(500, "VM 104 already running").is_already_running());
        assert!(!task_failed("start failed: no memory").is_already_running());
        assert!(api(500, "VM is locked (clone)").is_guest_locked());
        assert!(task_failed("VM is locked (backup)").is_guest_locked());
        assert!(task_failed("storage 'nfs' is not online").is_storage_offline());
        assert!(!api(500, "storage 'nfs' does not exist").is_storage_offline());
        let unreachable = |status| ProxmoxError::Transient {
            call: Call {
                method: "GET",
                path: "/nodes/pve3/qemu".into(),
            },
            status: Some(status),
            message: "No route to host".into(),
            request_sent: true,
        };
        assert!(unreachable(595).is_node_unreachable());
        assert!(!unreachable(503).is_node_unreachable());
    }

    #[test]
    fn messages_carry_what_the_user_needs() {
        let e = ProxmoxError::Api {
            call: Call {
                method: "POST",
                path: "/nodes/pve1/qemu".into(),
            },
            status: 400,
            message: "Parameter verification failed.".into(),
            field_errors: [("net0".to_string(), "invalid format\n".to_string())].into(),
        };
        assert_eq!(
            e.to_string(),
            "Proxmox rejected POST /nodes/pve1/qemu: 400 Parameter verification failed. (net0: invalid format)"
        );
        let t = ProxmoxError::TaskFailed {
            upid: Upid::parse("UPID:pve2:1:2:3:qmstart:104:root@pam:").unwrap(),
            exit_status: "start failed".into(),
            log_tail: vec!["kvm: no memory".into(), "TASK ERROR: start failed".into()],
        };
        assert!(t.to_string().contains(
            "qmstart on pve2 failed: start failed; task log: kvm: no memory | TASK ERROR"
        ));
    }

    fn call() -> Call {
        Call {
            method: "GET",
            path: "/x".into(),
        }
    }

    #[test]
    fn status_mapping() {
        let e = status_error(
            &call(),
            500,
            "",
            br#"{"data":null,"message":"Configuration file 'nodes/pve1/qemu-server/9999.conf' does not exist\n"}"#,
        );
        assert!(e.is_not_found(), "{e}");
        let e = status_error(&call(), 595, "No route to host", b"");
        assert!(e.is_transient(), "{e}");
        assert!(e.to_string().contains("No route to host"));
        let e = status_error(
            &call(),
            400,
            "Parameter verification failed.",
            br#"{"data":null,"message":"Parameter verification failed.\n","errors":{"vmid":"invalid"}}"#,
        );
        assert!(
            matches!(&e, ProxmoxError::Api { status: 400, field_errors, .. } if field_errors["vmid"] == "invalid")
        );
        let e = status_error(&call(), 401, "authentication failure", b"");
        assert!(
            matches!(e, ProxmoxError::Unauthorized { ref message, .. } if message == "authentication failure")
        );
    }

    /// pve-access-control src/PVE/RPCEnvironment.pm `check_pool_exist`: a missing pool is a
    /// permission error that names what is wrong; no privilege hint.
    #[test]
    fn a_missing_pool_is_named_without_a_privilege_hint() {
        let e = status_error(
            &Call {
                method: "POST",
                path: "/nodes/pve1/qemu".into(),
            },
            403,
            "",
            br#"{"data":null,"message":"Permission check failed (pool 'workers' does not exist)\n"}"#,
        );
        assert!(e.is_pool_missing("workers"), "{e:?}");
        assert!(!e.is_pool_missing("work"), "{e:?}");
        assert!(!e.to_string().contains("VM.Allocate"), "{e}");
    }

    #[test]
    fn a_cluster_lock_request_timeout_is_transient_and_nothing_happened() {
        let e = status_error(
            &Call {
                method: "POST",
                path: "/pools".into(),
            },
            500,
            "",
            br#"{"data":null,"message":"create pool failed: cfs-lock 'file-user_cfg' error: got lock request timeout\n"}"#,
        );
        assert!(
            matches!(
                &e,
                ProxmoxError::Transient {
                    request_sent: false,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = status_error(
            &call(),
            500,
            "",
            br#"{"data":null,"message":"'file-user_cfg'-locked command timed out - aborting\n"}"#,
        );
        assert!(!e.is_transient(), "{e:?}");
    }

    #[test]
    fn old_pve8_error_text_comes_from_the_reason_phrase() {
        // PVE 8 before pve-http-server's fix #6503: `{"data":null}` and the text in the status line.
        let e = status_error(
            &Call {
                method: "POST",
                path: "/pools".into(),
            },
            500,
            "pool 'workers' already exists",
            br#"{"data":null}"#,
        );
        assert!(
            matches!(&e, ProxmoxError::Api { message, .. } if message == "pool 'workers' already exists"),
            "{e:?}"
        );
        let e = status_error(
            &call(),
            500,
            "Configuration file 'nodes/pve1/qemu-server/9.conf' does not exist",
            br#"{"data":null}"#,
        );
        assert!(e.is_not_found(), "{e:?}");
    }

    #[test]
    fn refusals_that_do_not_name_the_privilege_get_it_named() {
        let create = Call {
            method: "POST",
            path: "/nodes/pve1/qemu".into(),
        };
        let e = status_error(
            &create,
            403,
            "",
            br#"{"data":null,"message":"Permission check failed\n"}"#,
        );
        assert!(e.to_string().contains("VM.Allocate"), "{e}");
        let e = status_error(
            &create,
            403,
            "",
            br#"{"data":null,"message":"Permission check failed (/, Sys.Modify for modifying tag 'talos')\n"}"#,
        );
        assert!(e.to_string().contains("user-tag-access"), "{e}");
        let e = status_error(
            &create,
            403,
            "",
            br#"{"data":null,"message":"Permission check failed (/storage/local, Datastore.AllocateSpace)\n"}"#,
        );
        assert!(!e.to_string().contains("VM.Allocate"), "{e}");
    }
}
