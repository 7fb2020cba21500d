//! The operator's kit stays true to the binary: the Grafana dashboard and the Prometheus alert rules
//! in `deploy/` query only metrics `/metrics` serves, and the Kubernetes manifests in
//! `examples/kubernetes/` (and the Compose file beside them) use only flags and environment
//! variables the binary takes, and fit together (ports, mounts, Secret keys, the image's user).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use omni_infra_provider_proxmox::config::ProviderConfig;
use omni_infra_provider_proxmox::metrics::{self, Metrics};
use serde_json::Value;

fn repo(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(text: &str) -> Value {
    omni_infra_provider_proxmox::yaml::from_str(text).unwrap()
}

/// The documents of a multi-document YAML file.
fn documents(text: &str) -> Vec<Value> {
    text.split("\n---\n").map(yaml).collect()
}

/// Metrics after the provider did each thing once: a labelled family shows up in `/metrics` only
/// from its first observation on.
fn busy_metrics() -> Metrics {
    let m = Metrics::default();
    m.proxmox_request("GET", Some(200), Duration::from_millis(5));
    m.step("create_vm", Duration::from_millis(50));
    m.step_failure("start_vm");
    m.provision("success");
    m.deprovision("success");
    m.leftover("seed_iso");
    m.heartbeat(true, true);
    m
}

/// Every series name `/metrics` serves, from its `# TYPE` lines (a counter `x` is served as
/// `x_total`, a histogram as `x_bucket`, `x_sum` and `x_count`).
async fn served_series() -> BTreeSet<String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(metrics::serve(addr, Arc::new(busy_metrics()), async {
        let _ = stopped.await;
    }));
    let text = tokio::task::spawn_blocking(move || {
        for _ in 0..100 {
            if let Ok(mut s) = std::net::TcpStream::connect(addr) {
                s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
                    .unwrap();
                let mut text = String::new();
                s.read_to_string(&mut text).unwrap();
                return text;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("/metrics did not answer");
    })
    .await
    .unwrap();
    let _ = stop.send(());
    server.await.unwrap().unwrap();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (words.next(), words.next(), words.next(), words.next())
        {
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        }
    }
    assert!(names.len() > 5, "{text}");
    names
}

/// The provider's metric names a PromQL expression uses.
fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("omni_proxmox_"))
        .map(str::to_owned)
        .collect()
}

fn dashboard_exprs() -> Vec<String> {
    let dashboard: Value = serde_json::from_str(&repo("deploy/grafana-dashboard.json")).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect()
}

fn alert_rules() -> Vec<Value> {
    let rules = yaml(&repo("deploy/prometheus-alerts.yaml"));
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .collect()
}

#[tokio::test]
async fn dashboard_and_alerts_query_only_metrics_the_provider_serves() {
    let served = served_series().await;
    let mut exprs = dashboard_exprs();
    assert!(exprs.len() >= 10, "{exprs:?}");
    let rules = alert_rules();
    for rule in &rules {
        let name = rule["alert"].as_str().unwrap();
        assert!(rule["labels"]["severity"].is_string(), "{name}: severity");
        assert!(
            rule["annotations"]["summary"].is_string(),
            "{name}: summary"
        );
        exprs.push(rule["expr"].as_str().unwrap().to_owned());
    }
    let mut queried = BTreeSet::new();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "no provider metric in {expr:?}");
        queried.extend(names);
    }
    for name in &queried {
        assert!(
            served.contains(name),
            "{name} is queried but /metrics does not serve it; served: {served:?}"
        );
    }
    // What the issue asks the kit to watch.
    let alerts: BTreeSet<&str> = rules.iter().filter_map(|r| r["alert"].as_str()).collect();
    for alert in [
        "OmniProxmoxProviderDown",
        "OmniProxmoxRequestsStuck",
        "OmniProxmoxProvisionFailureRate",
        "OmniProxmoxProxmoxErrors",
    ] {
        assert!(alerts.contains(alert), "{alert} missing: {alerts:?}");
    }
}

/// Flags (`--x`) and environment variables the binary takes, from its own `--help`.
fn binary_interface() -> (BTreeSet<String>, BTreeSet<String>) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_omni-infra-provider-proxmox"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let mut flags = BTreeSet::new();
    let mut env = BTreeSet::from(["SIDERO_SERVICE_ACCOUNT_KEY".to_owned()]);
    for line in help.lines() {
        let line = line.trim_start();
        let line = line.strip_prefix("-h, ").unwrap_or(line);
        if let Some(flag) = line.strip_prefix("--") {
            flags.insert(flag.split([' ', ',']).next().unwrap().to_owned());
        }
        if let Some((_, rest)) = line.split_once("[env: ") {
            env.insert(rest.split(['=', ']']).next().unwrap().to_owned());
        }
    }
    assert!(
        flags.contains("config-file") && env.contains("OMNI_ENDPOINT"),
        "{help}"
    );
    (flags, env)
}

fn assert_flags_known(
    args: &[Value],
    flags: &BTreeSet<String>,
    file: &str,
) -> Vec<(String, String)> {
    args.iter()
        .map(|a| {
            let arg = a.as_str().unwrap();
            let (flag, value) = arg
                .strip_prefix("--")
                .unwrap_or_else(|| panic!("{file}: {arg:?} is not a --flag"))
                .split_once('=')
                .unwrap_or((arg, ""));
            assert!(
                flags.contains(flag),
                "{file}: the binary has no --{flag}: {flags:?}"
            );
            (flag.to_owned(), value.to_owned())
        })
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in examples/kubernetes"))
}

/// The config file and the CA it names are Secret items mounted where the flags point.
fn assert_config_mounted(config_path: &str, container: &Value, pod: &Value, secret: &Value) {
    let (dir, file) = config_path.rsplit_once('/').unwrap();
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == dir)
        .unwrap_or_else(|| panic!("nothing mounted at {dir}"));
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(volume["secret"]["secretName"], secret["metadata"]["name"]);
    let items: Vec<&str> = volume["secret"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["path"].as_str().unwrap())
        .collect();
    assert!(items.contains(&file), "{items:?}");
    let config_text = secret["stringData"][file].as_str().unwrap();
    let config =
        ProviderConfig::parse(config_text).unwrap_or_else(|e| panic!("the Secret's {file}: {e:?}"));
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    let ca = yaml(config_text)["proxmox"]["caFile"]
        .as_str()
        .expect("caFile")
        .to_owned();
    let (ca_dir, ca_file) = ca.rsplit_once('/').unwrap();
    assert_eq!(ca_dir, dir);
    assert!(items.contains(&ca_file) && secret["stringData"][ca_file].is_string());
}

/// With a read-only root file system, the leader-election claim file (by default in the temporary
/// directory) must be on a writable volume.
fn assert_claim_file_writable(path: &str, container: &Value, pod: &Value) {
    assert_eq!(
        container["securityContext"]["readOnlyRootFilesystem"], true,
        "the manifest is meant to run read-only"
    );
    let dir = path.rsplit_once('/').unwrap().0;
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == dir)
        .unwrap_or_else(|| panic!("nothing writable mounted at {dir}"));
    assert_ne!(mount["readOnly"], true);
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert!(volume["emptyDir"].is_object(), "{volume}");
}

/// The listen port is the container's `metrics` port, the probes' and the Service's target; the
/// ServiceMonitor scrapes the Service's port of that name.
fn assert_metrics_wired(listen: &str, deployment: &Value, service: &Value, monitor: &Value) {
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let port: u64 = listen.rsplit_once(':').unwrap().1.parse().unwrap();
    let ports = container["ports"].as_array().unwrap();
    assert!(
        ports
            .iter()
            .any(|p| p["name"] == "metrics" && p["containerPort"] == port)
    );
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    // Every healthy replica is ready, a standby too (its look at the lease is its word from Omni;
    // `replicas_e2e` checks that standbys answer 200), so a rollout of several replicas goes on.
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], "metrics");
    let service_port = &service["spec"]["ports"][0];
    assert_eq!(service_port["targetPort"], "metrics");
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service_port["name"]
    );
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["template"]["metadata"]["labels"]
    );
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"],
        service["metadata"]["labels"]
    );
}

#[test]
fn kubernetes_manifests_fit_the_binary_and_each_other() {
    let (flags, env) = binary_interface();
    let docs: Vec<Value> = ["deployment.yaml", "secret.yaml", "service.yaml"]
        .iter()
        .flat_map(|f| documents(&repo(&format!("examples/kubernetes/{f}"))))
        .collect();
    let deployment = of_kind(&docs, "Deployment");
    let secret = of_kind(&docs, "Secret");
    let service = of_kind(&docs, "Service");
    let monitor = of_kind(&docs, "ServiceMonitor");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];

    let args = assert_flags_known(
        container["args"].as_array().unwrap(),
        &flags,
        "deployment.yaml",
    );
    let arg = |name: &str| {
        args.iter()
            .find(|(f, _)| f == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("deployment.yaml lacks --{name}"))
    };
    for var in container["env"].as_array().unwrap() {
        let name = var["name"].as_str().unwrap();
        assert!(
            env.contains(name),
            "deployment.yaml: the binary reads no {name}: {env:?}"
        );
        if let Some(key) = var["valueFrom"]["secretKeyRef"]["key"].as_str() {
            assert!(secret["stringData"][key].is_string(), "Secret lacks {key}");
        }
    }

    assert_config_mounted(&arg("config-file"), container, pod, secret);
    assert_claim_file_writable(&arg("leader-elect-claim-file"), container, pod);
    assert_metrics_wired(&arg("metrics-listen"), deployment, service, monitor);
    // The image's user (Dockerfile `USER`).
    let dockerfile = repo("Dockerfile");
    let user = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .unwrap()
        .split(':')
        .next()
        .unwrap()
        .parse::<u64>()
        .unwrap();
    assert_eq!(pod["securityContext"]["runAsUser"], user);
}

#[test]
fn compose_file_uses_only_flags_the_binary_takes() {
    let (flags, _) = binary_interface();
    let compose = yaml(&repo("examples/docker-compose.yaml"));
    let service = &compose["services"]["proxmox-provider"];
    let args = assert_flags_known(
        service["command"].as_array().unwrap(),
        &flags,
        "docker-compose.yaml",
    );
    assert!(args.iter().any(|(f, _)| f == "config-file"));
}
