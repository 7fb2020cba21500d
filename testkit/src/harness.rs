//! The provider in-process against the in-memory Omni (real gRPC) and fakepve (real HTTPS): the
//! harness for end-to-end tests of provisioning and teardown.

use std::sync::Arc;
use std::time::Duration;

use omni_infra_provider_proxmox::config::ProviderConfig;
use omni_infra_provider_proxmox::controller::context::Context;
use omni_infra_provider_proxmox::controller::housekeeping;
use omni_infra_provider_proxmox::controller::runner::{self, Controller};
use omni_infra_provider_proxmox::omni::join::JoinMode;
use omni_infra_provider_proxmox::omni::proto::specs::{
    MachineRequestSpec, MachineRequestStatusSpec, machine_request_status_spec::Stage,
};
use omni_infra_provider_proxmox::omni::resources::{
    MACHINE_REQUEST, MACHINE_REQUEST_STATUS, provider_machine,
};
use omni_infra_provider_proxmox::omni::state::Typed;
use omni_infra_provider_proxmox::pipeline::step::Services;
use omni_infra_provider_proxmox::proxmox::ProxmoxClient;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::fakepve::{FakePve, Login, Trust, three_node_scenario};
use crate::omni as omni_support;

pub const PROVIDER: &str = "proxmox";
pub const WAIT: Duration = Duration::from_secs(60);

pub struct Harness {
    pub pve: FakePve,
    pub omni: omni_support::Omni,
    stop: Option<watch::Sender<bool>>,
    running: Option<tokio::task::JoinHandle<()>>,
    pub config: ProviderConfig,
    /// The running controller's metrics (replaced at each `start_controller`).
    pub metrics: Arc<omni_infra_provider_proxmox::metrics::Metrics>,
    /// Run the topology-label loop beside the controller, this often (off unless a test asks: it
    /// adds Proxmox and Omni reads that request-counting tests do not expect).
    pub topology_every: Option<Duration>,
    topology: Option<tokio::task::JoinHandle<()>>,
    /// Requests worked on at once per Proxmox node (`--concurrency`), from the next
    /// `start_controller` on.
    pub concurrency: usize,
    /// The running controller's services (clients, ledgers), replaced at each `start_controller`.
    pub services: Option<Arc<Services>>,
    /// The Image Factory boot images come from, and the credentials of factories that need them,
    /// from the next `start_controller` on.
    pub image_factory_url: String,
    pub factory_auth: omni_infra_provider_proxmox::pipeline::image_factory::FactoryAuth,
}

impl Harness {
    pub async fn start(extra_config: &str) -> Harness {
        Self::start_with(three_node_scenario(), extra_config).await
    }

    /// Like [`Harness::start`] with a scenario of one's own (see the launcher for its keys).
    pub async fn start_with(scenario: Value, extra_config: &str) -> Harness {
        Self::start_scaled(scenario, 0.0, extra_config).await
    }

    /// Like [`Harness::start_with`] with fakepve's `time_scale` (real seconds per Proxmox second; 0:
    /// every task done before its request returns, and no latency).
    pub async fn start_scaled(scenario: Value, time_scale: f64, extra_config: &str) -> Harness {
        let pve = FakePve::start(scenario, time_scale);
        let omni = omni_support::Omni::start_with_controllers(PROVIDER, omni_support::DRAIN).await;
        let config = ProviderConfig::parse(&format!(
            "{}{extra_config}",
            pve.config_yaml(Login::Token, Trust::CaFile)
        ))
        .unwrap();
        let mut h = Harness {
            pve,
            omni,
            stop: None,
            running: None,
            config,
            metrics: Default::default(),
            topology_every: None,
            topology: None,
            concurrency: omni_infra_provider_proxmox::controller::context::DEFAULT_CONCURRENCY,
            services: None,
            image_factory_url: "https://factory.talos.dev".into(),
            factory_auth: Default::default(),
        };
        h.start_controller();
        h
    }

    pub fn start_controller(&mut self) {
        self.metrics = Default::default();
        let context = self.context();
        self.services = Some(context.services.clone());
        let controller = Controller::with_shutdown_grace(runner::SHUTDOWN_GRACE);
        let (tx, rx) = watch::channel(false);
        if let Some(every) = self.topology_every {
            self.topology = Some(tokio::spawn(housekeeping::run(
                context.clone(),
                every,
                rx.clone(),
            )));
        }
        self.running = Some(tokio::spawn(controller.run(context, rx)));
        self.stop = Some(tx);
    }

    /// A controller context as `start_controller` makes one (its clients, fresh ledgers, the
    /// current `metrics`).
    pub fn context(&self) -> Arc<Context> {
        let client = self.omni.client(PROVIDER);
        let services = Arc::new(Services {
            provider_id: PROVIDER.into(),
            pve: ProxmoxClient::new(&self.config.proxmox).unwrap(),
            management: client.management.clone(),
            config: self.config.clone(),
            ledgers: Default::default(),
            image_factory_url: self.image_factory_url.clone(),
            factory_http: omni_infra_provider_proxmox::pipeline::image_factory::http_client()
                .unwrap(),
            factory_auth: self.factory_auth.clone(),
            agent_poll: Duration::from_millis(50),
            metrics: self.metrics.clone(),
        });
        Arc::new(
            Context::new(services, client.state.clone(), JoinMode::V2)
                .with_concurrency(self.concurrency),
        )
    }

    /// Restarts the controller with the topology-label loop running every `every`.
    pub async fn run_topology(&mut self, every: Duration) {
        self.stop_controller().await;
        self.topology_every = Some(every);
        self.start_controller();
    }

    pub async fn stop_controller(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(true);
        }
        if let Some(h) = self.running.take() {
            h.await.unwrap();
        }
        if let Some(h) = self.topology.take() {
            h.await.unwrap();
        }
    }

    pub fn request(&self, id: &str, set: &str, provider_data: &str) {
        let spec = MachineRequestSpec {
            talos_version: "v1.11.3".into(),
            extensions: vec!["siderolabs/iscsi-tools".into()],
            provider_data: provider_data.into(),
            ..Default::default()
        };
        self.omni
            .state
            .create_machine_request(id, PROVIDER, set, &spec);
    }

    pub fn status(&self, id: &str) -> Option<Typed<MachineRequestStatusSpec>> {
        self.omni.state.get(&MACHINE_REQUEST_STATUS, id)
    }

    pub async fn wait_stage(&self, id: &str, stage: Stage) -> Typed<MachineRequestStatusSpec> {
        let ok = self
            .omni
            .state
            .wait_for(WAIT, |s| {
                s.get(&MACHINE_REQUEST_STATUS, id)
                    .is_some_and(|st| st.spec.stage == stage as i32)
            })
            .await;
        let status = self.status(id);
        assert!(ok, "{id} did not reach {stage:?}; status: {status:?}");
        status.unwrap()
    }

    /// Waits until Omni could delete the request (our finalizer gone) and deletes it, as Omni does.
    pub async fn wait_released(&self, id: &str) {
        let state = self.omni.state.clone();
        let released = self
            .omni
            .state
            .wait_for(WAIT, |s| {
                s.collect_torn_down(&MACHINE_REQUEST);
                s.get(&MACHINE_REQUEST, id).is_none()
            })
            .await;
        let status = state.get(&MACHINE_REQUEST_STATUS, id);
        assert!(released, "{id} was not released; status: {status:?}");
        assert!(
            state.get(&MACHINE_REQUEST_STATUS, id).is_none(),
            "status destroyed"
        );
        assert!(
            state.get(&provider_machine(PROVIDER), id).is_none(),
            "provider state destroyed"
        );
    }

    /// Waits until fakepve no longer holds VM `vmid`.
    pub async fn wait_vm_deleted(&mut self, vmid: u32, timeout: Duration) {
        let pve = &mut self.pve;
        crate::until(timeout, &format!("VM {vmid} to be deleted"), || {
            pve.vm(vmid).is_null()
        })
        .await
    }

    /// The VMs fakepve holds for request `id` (by name).
    pub fn vms_named(&mut self, id: &str) -> Vec<Value> {
        let vms = self.pve.control(json!({"op": "vms"}));
        vms.as_array()
            .unwrap()
            .iter()
            .filter(|vm| vm["name"] == json!(id))
            .cloned()
            .collect()
    }

    pub fn machine_state(
        &self,
        id: &str,
    ) -> Typed<omni_infra_provider_proxmox::omni::proto::provider::MachineSpec> {
        self.omni
            .state
            .get(&provider_machine(PROVIDER), id)
            .unwrap()
    }
}
