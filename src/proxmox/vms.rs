//! VM calls: create, clone, configure, power, delete, guest agent.
//!
//! Every call names the node explicitly; callers find the node through `/cluster/resources` first, so a
//! VM migrated since we created it is addressed where it is now.

use reqwest::Method;

use super::client::{Params, ProxmoxClient, Replay};
use super::error::Result;
use super::types::{AgentInterfaces, NodeName, Upid, VmConfig, VmId};

/// Options of a VM as `(key, value)` pairs, rendered by `rules::vm_config`.
type Options = Vec<(String, String)>;

/// One VM where it is now: the calls on `/nodes/{node}/qemu/{vmid}`.
#[derive(Clone, Copy)]
pub struct Vm<'a> {
    pve: &'a ProxmoxClient,
    node: &'a NodeName,
    vmid: VmId,
}

impl ProxmoxClient {
    /// The VM `vmid` on `node`.
    pub fn vm<'a>(&'a self, node: &'a NodeName, vmid: VmId) -> Vm<'a> {
        let pve = self;
        Vm { pve, node, vmid }
    }
}

impl Vm<'_> {
    /// `POST /nodes/{node}/qemu`: all options in one call. Returns the create task.
    pub async fn create(self, options: Options) -> Result<Upid> {
        let params = Params::new().with("vmid", self.vmid).extend(options);
        let path = ["nodes", self.node.as_str(), "qemu"];
        let replay = Replay::OnlyIfUnsent;
        self.pve.send(Method::POST, &path, params, replay).await
    }

    /// `POST …/clone` of this template with parameters rendered by
    /// `rules::vm_config::clone_params`. Returns the clone task (it runs on this node).
    pub async fn clone_with(self, params: Options) -> Result<Upid> {
        self.call(Method::POST, &["clone"], Params(params)).await
    }

    /// `GET …/config` (current values, pending changes applied).
    pub async fn config(self) -> Result<VmConfig> {
        self.call(Method::GET, &["config"], Params::new()).await
    }

    /// `POST …/config`: asynchronous update, returns the task (use for changes that allocate disks).
    pub async fn update_config_async(self, options: Options) -> Result<Upid> {
        self.call(Method::POST, &["config"], Params(options)).await
    }

    /// `PUT …/config`: synchronous update of absolute values, so safe to replay.
    pub async fn update_config(self, options: Options) -> Result<()> {
        let answer = self.call(Method::PUT, &["config"], Params(options));
        answer.await.map(|_: serde_json::Value| ())
    }

    /// `PUT …/resize` to an absolute size such as `50G` (never shrinks; Proxmox refuses that).
    /// Proxmox 8+ answers with a task, older versions with nothing.
    pub async fn resize_disk(self, disk: &str, size: &str) -> Result<Option<Upid>> {
        let params = Params::new().with("disk", disk).with("size", size);
        self.call(Method::PUT, &["resize"], params).await
    }

    /// `POST …/status/start`.
    pub async fn start(self) -> Result<Upid> {
        self.call(Method::POST, &["status", "start"], Params::new())
            .await
    }

    /// `POST …/status/shutdown`: ACPI (or guest agent) shutdown; Proxmox stops the VM when
    /// `timeout` seconds pass.
    pub async fn shutdown(self, timeout_secs: u32) -> Result<Upid> {
        let params = Params::new()
            .with("timeout", timeout_secs)
            .with("forceStop", 1);
        self.call(Method::POST, &["status", "shutdown"], params)
            .await
    }

    /// `POST …/status/stop`: immediate power-off.
    pub async fn stop(self) -> Result<Upid> {
        self.call(Method::POST, &["status", "stop"], Params::new())
            .await
    }

    /// `DELETE /nodes/{node}/qemu/{vmid}` with `purge` (the VMID leaves backup jobs, replication,
    /// HA and pools too) and, if asked, `destroy-unreferenced-disks` (disks of the VMID that are
    /// not in its config). Returns the destroy task.
    pub async fn delete(self, destroy_unreferenced_disks: bool) -> Result<Upid> {
        let unreferenced = destroy_unreferenced_disks.then_some(1);
        let params = Params::new().with("purge", 1);
        let params = params.with_opt("destroy-unreferenced-disks", unreferenced);
        self.call(Method::DELETE, &[], params).await
    }

    /// `GET …/agent/network-get-interfaces`. Fails (500) while the guest agent is not running yet.
    pub async fn agent_network_interfaces(self) -> Result<AgentInterfaces> {
        let path = ["agent", "network-get-interfaces"];
        self.call(Method::GET, &path, Params::new()).await
    }

    /// A call on `/nodes/{node}/qemu/{vmid}/<rest>`. Reads and `PUT`s (absolute values) are sent
    /// again after any transient failure; creates, clones, power changes and deletes only when
    /// they never left.
    async fn call<T: serde::de::DeserializeOwned>(
        self,
        method: Method,
        rest: &[&str],
        params: Params,
    ) -> Result<T> {
        let id = self.vmid.to_string();
        let path = [&["nodes", self.node.as_str(), "qemu", &id], rest].concat();
        let replay = match method {
            Method::GET | Method::PUT => Replay::Safe,
            _ => Replay::OnlyIfUnsent,
        };
        self.pve.send(method, &path, params, replay).await
    }
}
