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

impl ProxmoxClient {
    /// `POST /nodes/{node}/qemu`: all options in one call. Returns the create task.
    pub async fn create_vm(&self, node: &NodeName, vmid: VmId, options: Options) -> Result<Upid> {
        let params = Params::new().with("vmid", vmid).extend(options);
        let path = ["nodes", node.as_str(), "qemu"];
        self.send(Method::POST, &path, params, Replay::OnlyIfUnsent)
            .await
    }

    /// `POST /nodes/{node}/qemu/{vmid}/clone` with parameters rendered by
    /// `rules::vm_config::clone_params`. Returns the clone task (it runs on `node`).
    pub async fn clone_vm_with(
        &self,
        node: &NodeName,
        template: VmId,
        params: Options,
    ) -> Result<Upid> {
        self.on_vm(Method::POST, (node, template), &["clone"], Params(params))
            .await
    }

    /// `GET /nodes/{node}/qemu/{vmid}/config` (current values, pending changes applied).
    pub async fn vm_config(&self, node: &NodeName, vmid: VmId) -> Result<VmConfig> {
        self.on_vm(Method::GET, (node, vmid), &["config"], Params::new())
            .await
    }

    /// `POST …/config`: asynchronous update, returns the task (use for changes that allocate disks).
    pub async fn update_vm_config_async(
        &self,
        node: &NodeName,
        vmid: VmId,
        options: Options,
    ) -> Result<Upid> {
        self.on_vm(Method::POST, (node, vmid), &["config"], Params(options))
            .await
    }

    /// `PUT …/config`: synchronous update of absolute values, so safe to replay.
    pub async fn update_vm_config(
        &self,
        node: &NodeName,
        vmid: VmId,
        options: Options,
    ) -> Result<()> {
        let answer = self.on_vm(Method::PUT, (node, vmid), &["config"], Params(options));
        answer.await.map(|_: serde_json::Value| ())
    }

    /// `PUT …/resize` to an absolute size such as `50G` (never shrinks; Proxmox refuses that).
    /// Proxmox 8+ answers with a task, older versions with nothing.
    pub async fn resize_disk(
        &self,
        node: &NodeName,
        vmid: VmId,
        disk: &str,
        size: &str,
    ) -> Result<Option<Upid>> {
        let params = Params::new().with("disk", disk).with("size", size);
        self.on_vm(Method::PUT, (node, vmid), &["resize"], params)
            .await
    }

    /// `POST …/status/start`.
    pub async fn start_vm(&self, node: &NodeName, vmid: VmId) -> Result<Upid> {
        self.on_vm(
            Method::POST,
            (node, vmid),
            &["status", "start"],
            Params::new(),
        )
        .await
    }

    /// `POST …/status/shutdown`: ACPI (or guest agent) shutdown; with `force_stop` Proxmox stops the VM
    /// when `timeout` seconds pass.
    pub async fn shutdown_vm(
        &self,
        node: &NodeName,
        vmid: VmId,
        timeout_secs: u32,
        force_stop: bool,
    ) -> Result<Upid> {
        let params = Params::new()
            .with("timeout", timeout_secs)
            .with("forceStop", u8::from(force_stop));
        self.on_vm(Method::POST, (node, vmid), &["status", "shutdown"], params)
            .await
    }

    /// `POST …/status/stop`: immediate power-off.
    pub async fn stop_vm(&self, node: &NodeName, vmid: VmId) -> Result<Upid> {
        self.on_vm(
            Method::POST,
            (node, vmid),
            &["status", "stop"],
            Params::new(),
        )
        .await
    }

    /// `DELETE /nodes/{node}/qemu/{vmid}` with `purge` (the VMID leaves backup jobs, replication,
    /// HA and pools too) and, if asked, `destroy-unreferenced-disks` (disks of the VMID that are
    /// not in its config). Returns the destroy task.
    pub async fn delete_vm(
        &self,
        node: &NodeName,
        vmid: VmId,
        destroy_unreferenced_disks: bool,
    ) -> Result<Upid> {
        let unreferenced = destroy_unreferenced_disks.then_some(1);
        let params = Params::new().with("purge", 1);
        let params = params.with_opt("destroy-unreferenced-disks", unreferenced);
        self.on_vm(Method::DELETE, (node, vmid), &[], params).await
    }

    /// `GET …/agent/network-get-interfaces`. Fails (500) while the guest agent is not running yet.
    pub async fn agent_network_interfaces(
        &self,
        node: &NodeName,
        vmid: VmId,
    ) -> Result<AgentInterfaces> {
        let path = ["agent", "network-get-interfaces"];
        self.on_vm(Method::GET, (node, vmid), &path, Params::new())
            .await
    }

    /// A call on `/nodes/{node}/qemu/{vmid}/<rest>`. Reads and `PUT`s (absolute values) are sent
    /// again after any transient failure; creates, clones, power changes and deletes only when
    /// they never left.
    async fn on_vm<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        (node, vmid): (&NodeName, VmId),
        rest: &[&str],
        params: Params,
    ) -> Result<T> {
        let id = vmid.to_string();
        let path = [&["nodes", node.as_str(), "qemu", &id], rest].concat();
        let replay = match method {
            Method::GET | Method::PUT => Replay::Safe,
            _ => Replay::OnlyIfUnsent,
        };
        self.send(method, &path, params, replay).await
    }
}
