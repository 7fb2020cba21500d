//! Step 6, `discover_ip`: the addresses the guest reports through the QEMU guest agent.
//!
//! Talos takes a while to boot and start the agent, so this step asks once per reconcile and requeues
//! in between instead of holding a worker. The start time is recorded so the timeout holds across
//! restarts. `ip_discovery_timeout: 0` turns the step off.
//!
//! A machine with static addresses from IP pools is done only when the guest reports every one of
//! them: that confirms the seed's network-config took, where a DHCP lease would prove nothing.

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::context::StepContext;
use super::error::StepError;
use super::step::StepOutcome;
use crate::proxmox::types::AgentInterfaces;

pub async fn run(ctx: &mut StepContext<'_>) -> Result<StepOutcome, StepError> {
    let (ref node, vmid) = ctx.made()?;
    let timeout = ctx.data.ip_discovery_timeout;
    if timeout.is_zero() || !ctx.state.addresses.is_empty() {
        return Ok(StepOutcome::Done);
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let started = *ctx.state.ip_discovery_started.get_or_insert(now);
    let waited = Duration::from_secs(now.saturating_sub(started).max(0) as u64);
    let pve = &ctx.services.pve;
    let answer = pve.vm(node, vmid).agent_network_interfaces().await;
    let why = match answer {
        Ok(interfaces) => {
            let addresses = usable_addresses(&interfaces);
            let missing = missing_static(&ctx.state.ip_allocations, &addresses);
            if !addresses.is_empty() && missing.is_empty() {
                tracing::info!(request = %ctx.request.id, %vmid, %node, ?addresses, "guest reported its addresses");
                ctx.state.addresses = addresses;
                return Ok(StepOutcome::Done);
            }
            if addresses.is_empty() {
                "the guest agent reports no usable address yet".to_string()
            } else {
                format!(
                    "the guest reports {} but not its static address {} yet",
                    addresses.join(", "),
                    missing.join(", ")
                )
            }
        }
        Err(e) if e.is_transient() => format!("cannot ask the guest agent: {e}"),
        // 500 "QEMU guest agent is not running" while Talos boots.
        Err(crate::proxmox::ProxmoxError::Api { message, .. }) => {
            format!("waiting for the guest agent ({})", message.trim())
        }
        Err(e) => {
            return Err(StepError::proxmox(format!(
                "asking the guest agent of VM {vmid} on {node}"
            ))(e));
        }
    };
    if waited >= timeout {
        return Err(StepError::Cluster(format!(
            "VM {vmid} on {node} reported no usable IP address within {}s ({why}); check that the VM boots, \
             gets an address (DHCP on its bridge/VLAN, or the static one of its IP pool) and that the qemu-guest-agent \
             extension is in its image, or set ip_discovery_timeout: 0 to skip this check",
            timeout.as_secs()
        )));
    }
    let left = timeout - waited;
    Ok(StepOutcome::Requeue {
        after: ctx.services.agent_poll.min(left),
        why: format!("{why}; {}s left", left.as_secs()),
    })
}

/// Pure: the recorded static addresses the guest does not report (compared as addresses, so the
/// agent's spelling of an IPv6 address does not matter).
pub fn missing_static(
    allocations: &[crate::model::machine::IpAllocation],
    reported: &[String],
) -> Vec<String> {
    let reported: Vec<IpAddr> = reported.iter().filter_map(|a| a.parse().ok()).collect();
    allocations
        .iter()
        .filter(|a| !reported.contains(&a.address))
        .map(|a| a.address.to_string())
        .collect()
}

/// Pure: global and private addresses, without loopback, link-local and unspecified ones.
pub fn usable_addresses(interfaces: &AgentInterfaces) -> Vec<String> {
    let usable = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local() && !v4.is_unspecified(),
        IpAddr::V6(v6) => {
            !v6.is_loopback() && !v6.is_unspecified() && (v6.segments()[0] & 0xffc0) != 0xfe80
        }
    };
    let mut out: Vec<String> = Vec::new();
    for a in interfaces.result.iter().flat_map(|i| &i.ip_addresses) {
        if a.ip_address.parse().is_ok_and(usable) && !out.contains(&a.ip_address) {
            out.push(a.ip_address.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_usable_addresses() {
        let i: AgentInterfaces = serde_json::from_str(
            r#"{"result":[
              {"name":"lo","ip-addresses":[{"ip-address":"127.0.0.1"},{"ip-address":"::1"}]},
              {"name":"eth0","ip-addresses":[{"ip-address":"fe80::1"},{"ip-address":"169.254.3.4"},
                {"ip-address":"10.0.0.5"},{"ip-address":"2001:db8::5"},{"ip-address":"bogus"}]}
            ]}"#,
        )
        .unwrap();
        assert_eq!(usable_addresses(&i), ["10.0.0.5", "2001:db8::5"]);
        let allocated = |a: &str| crate::model::machine::IpAllocation {
            nic: 0,
            pool: "p".into(),
            address: a.parse().unwrap(),
        };
        let reported = usable_addresses(&i);
        assert!(missing_static(&[allocated("2001:db8:0::5")], &reported).is_empty());
        assert_eq!(
            missing_static(&[allocated("10.0.0.6")], &reported),
            ["10.0.0.6"]
        );
    }
}
