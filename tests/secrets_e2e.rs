//! The real binary, at debug log level, provisioning and tearing down a machine: neither the Omni
//! key, nor the Proxmox token secret or password, nor the join token ever reaches its output.

use std::process::Command;
use std::time::Duration;

use omni_infra_provider_proxmox::omni::proto::specs::{
    MachineRequestSpec, machine_request_status_spec::Stage,
};
use omni_infra_provider_proxmox::omni::resources::{
    MACHINE_REQUEST, MACHINE_REQUEST_STATUS, PROVIDER_JOIN_CONFIG,
};
use testkit::fakepve::{FakePve, Login, PASSWORD, TOKEN_SECRET, Trust, three_node_scenario};

const WAIT: Duration = Duration::from_secs(60);

async fn run_and_collect_output(login: Login) -> (String, Vec<String>) {
    let pve = FakePve::start(three_node_scenario(), 0.0);
    let omni = testkit::omni::Omni::start("proxmox").await;
    let key = omni.state.register_provider("proxmox").unwrap();
    let join_token = omni
        .state
        .get(&PROVIDER_JOIN_CONFIG, "proxmox")
        .unwrap()
        .spec
        .join_token;
    let config = pve.write_config(login, Trust::CaFile);
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("provider.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = omni
        .provider_command()
        .arg("--config-file")
        .arg(&config)
        .args(["--log-level", "debug", "--health-interval", "200ms"])
        .env("OMNI_SERVICE_ACCOUNT_KEY", key.expose())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let spec = MachineRequestSpec {
        talos_version: "v1.11.3".into(),
        provider_data: "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'true'\n".into(),
        ..Default::default()
    };
    omni.state
        .create_machine_request("secret-check", "proxmox", "s", &spec);
    let provisioned = omni
        .state
        .wait_for(WAIT, |s| {
            s.get(&MACHINE_REQUEST_STATUS, "secret-check")
                .is_some_and(|st| st.spec.stage == Stage::Provisioned as i32)
        })
        .await;
    omni.state.teardown(&MACHINE_REQUEST, "secret-check");
    let released = omni
        .state
        .wait_for(WAIT, |s| {
            s.collect_torn_down(&MACHINE_REQUEST);
            s.get(&MACHINE_REQUEST, "secret-check").is_none()
        })
        .await;
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    let output = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        provisioned && released,
        "the run did not complete:\n{output}"
    );
    assert!(status.success(), "exit {status:?}:\n{output}");
    let secrets = vec![
        key.expose().to_owned(),
        "PRIVATE KEY".to_owned(),
        TOKEN_SECRET.to_owned(),
        PASSWORD.to_owned(),
        join_token,
    ];
    (output, secrets)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_the_logs_with_token_login() {
    let (output, secrets) = run_and_collect_output(Login::Token).await;
    assert!(output.contains("secret-check"), "the run was logged");
    for secret in secrets {
        assert!(!output.contains(&secret), "a secret leaked into the logs");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_the_logs_with_password_login() {
    let (output, secrets) = run_and_collect_output(Login::Password).await;
    assert!(
        output.contains("logging in to Proxmox"),
        "the login was logged"
    );
    for secret in secrets {
        assert!(!output.contains(&secret), "a secret leaked into the logs");
    }
}
