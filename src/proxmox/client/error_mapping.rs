//! Proxmox's answers turned into the error kind the caller acts on: what to fix, what to wait out,
//! what is safe to send again. Proxmox words its errors differently across versions and handlers,
//! so the message is taken from wherever this version put it.

use std::collections::BTreeMap;

use crate::proxmox::error::{Call, ProxmoxError};

#[derive(serde::Deserialize, Default)]
struct ErrorBody {
    message: Option<String>,
    errors: Option<BTreeMap<String, serde_json::Value>>,
}

pub(super) fn transport_error(call: &Call, e: &reqwest::Error) -> ProxmoxError {
    let message = crate::error_chain::render(e);
    if e.is_decode() {
        return ProxmoxError::Decode {
            call: call.clone(),
            message,
        };
    }
    ProxmoxError::Transient {
        call: call.clone(),
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
    use super::super::{Replay, may_retry};
    use super::*;

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
    fn lock_timeouts_are_transient_and_safe_to_resend() {
        let e = status_error(
            &call(),
            500,
            "",
            br#"{"data":null,"message":"can't lock file '/var/lock/qemu-server/lock-104.conf' - got timeout\n"}"#,
        );
        assert!(may_retry(&e, Replay::OnlyIfUnsent), "{e:?}");
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
