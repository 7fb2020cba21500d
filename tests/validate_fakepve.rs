//! The `validate` command (the real binary) and `check_defaults` against fakepve: a good machine class
//! passes, and each class of mistake is caught with the key to change and the node it concerns.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use omni_infra_provider_proxmox::config::ProviderConfig;
use omni_infra_provider_proxmox::proxmox::ProxmoxClient;
use omni_infra_provider_proxmox::validate::check_defaults;
use serde_json::{Value, json};
use testkit::fakepve::{FakePve, Login, Trust, three_node_scenario};

/// Three nodes; `fast-ssd` (VM disks) only on pve1 and pve2; `vmbr1` only on pve1 and pve2; one PCI
/// mapping `gpu` with a device on pve1.
fn scenario() -> Value {
    let mut s = three_node_scenario();
    s["storages"]["fast-ssd"] = json!({"type": "lvmthin", "content": "images", "active": 1,
                                       "vgname": "fast", "thinpool": "data", "nodes": "pve1,pve2"});
    s["bridges"] =
        json!({"pve1": ["vmbr0", "vmbr1"], "pve2": ["vmbr0", "vmbr1"], "pve3": ["vmbr0"]});
    s["mappings"] =
        json!({"pci": [{"id": "gpu", "map": ["node=pve1,path=0000:01:00.0"]}], "usb": []});
    s
}

fn start() -> FakePve {
    FakePve::start(scenario(), 0.0)
}

/// A config file for `fake` with `extra` (YAML: `defaults:`/`nodes:`) appended.
fn config(fake: &FakePve, name: &str, extra: &str) -> PathBuf {
    let path = fake.dir.path().join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!("{}{extra}", fake.config_yaml(Login::Token, Trust::CaFile)),
    )
    .unwrap();
    path
}

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Run {
    fn from(out: Output) -> Self {
        Self {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// The report line of a failed check for `key` on `node` (`-` for none).
    fn fail_line(&self, key: &str, node: &str) -> String {
        self.stdout
            .lines()
            .find(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 2 && cols[0] == "FAIL" && cols[1] == key && cols[2] == node
            })
            .unwrap_or_else(|| panic!("no FAIL line for {key} on {node}:\n{}", self.stdout))
            .to_string()
    }

    fn has_fail(&self, key: &str, node: &str) -> bool {
        self.stdout.lines().any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() > 2 && cols[0] == "FAIL" && cols[1] == key && cols[2] == node
        })
    }
}

fn validate(config: &Path, class: &str, output: &str) -> Run {
    Run::from(testkit::cli_output(
        &["validate", "--output", output, "-"],
        config,
        class,
    ))
}

const GOOD: &str =
    "cores: 2\nmemory: 2048\ndisk_size: 20\nstorage_selector: name == \"local-lvm\"\n";

#[test]
fn a_good_class_passes_and_a_file_argument_works_too() {
    let fake = start();
    let cfg = config(&fake, "plain", "");
    let run = validate(&cfg, GOOD, "table");
    assert!(run.ok, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("OK: no problems found"),
        "{}",
        run.stdout
    );
    for node in ["pve1", "pve2", "pve3"] {
        assert!(
            run.stdout.lines().any(|l| l.starts_with("ok")
                && l.contains("storage_selector")
                && l.contains(node)
                && l.contains("local-lvm")),
            "{}",
            run.stdout
        );
    }

    let file = fake.dir.path().join("class.yaml");
    std::fs::write(&file, GOOD).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_omni-infra-provider-proxmox"))
        .args(["validate", "--config-file"])
        .arg(&cfg)
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn node_mistakes_name_the_existing_nodes() {
    let mut fake = start();
    let cfg = config(&fake, "plain", "");

    let run = validate(&cfg, &format!("{GOOD}node: pve9\n"), "table");
    assert!(!run.ok);
    let line = run.fail_line("node", "-");
    assert!(line.contains("\"pve9\" does not exist"), "{line}");
    assert!(line.contains("pve1, pve2, pve3"), "{line}");
    assert!(run.stderr.contains("problem(s)"), "{}", run.stderr);

    let run = validate(
        &cfg,
        &format!("{GOOD}allowed_nodes: [pve1, pve7]\n"),
        "table",
    );
    assert!(!run.ok);
    assert!(run.fail_line("allowed_nodes[1]", "-").contains("pve7"));

    fake.control(json!({"op": "set_node_offline", "node": "pve2"}));
    let run = validate(&cfg, &format!("{GOOD}node: pve2\n"), "table");
    assert!(!run.ok);
    assert!(run.fail_line("node", "pve2").contains("offline"));

    // Spread: an offline candidate is a warning, not a failure.
    let run = validate(&cfg, GOOD, "table");
    assert!(run.ok, "{}", run.stdout);
    assert!(
        run.stdout
            .lines()
            .any(|l| l.starts_with("warn") && l.contains("pve2") && l.contains("offline")),
        "{}",
        run.stdout
    );
}

#[test]
fn storage_selectors_are_checked_node_by_node() {
    let fake = start();
    let cfg = config(&fake, "plain", "");

    // Matches on pve1 and pve2 only: pve3 fails with the reason for each of its storages.
    let class = "cores: 2\nmemory: 2048\ndisk_size: 20\nstorage_selector: name == \"fast-ssd\"\n";
    let run = validate(&cfg, class, "table");
    assert!(!run.ok);
    let line = run.fail_line("storage_selector", "pve3");
    assert!(
        line.contains("local-lvm: not selected by the selector"),
        "{line}"
    );
    assert!(line.contains("local: does not hold images"), "{line}");
    assert!(!run.has_fail("storage_selector", "pve1"), "{}", run.stdout);
    assert!(!run.has_fail("storage_selector", "pve2"), "{}", run.stdout);
    // Limiting the class to the nodes that have it fixes it.
    let run = validate(
        &cfg,
        &format!("{class}allowed_nodes: [pve1, pve2]\n"),
        "table",
    );
    assert!(run.ok, "{}", run.stdout);

    // Matches nowhere.
    let run = validate(
        &cfg,
        "cores: 2\nmemory: 2048\ndisk_size: 20\nstorage_selector: name == \"nope\"\n",
        "table",
    );
    for node in ["pve1", "pve2", "pve3"] {
        assert!(run.has_fail("storage_selector", node), "{}", run.stdout);
    }

    // Too big for every storage (fakepve storages have 100 GiB).
    let run = validate(
        &cfg,
        "cores: 2\nmemory: 2048\ndisk_size: 500\nstorage_selector: name == \"local-lvm\"\n",
        "table",
    );
    assert!(
        run.fail_line("storage_selector", "pve1")
            .contains("500 GiB needed")
    );

    // An additional disk's selector likewise.
    let run = validate(
        &cfg,
        &format!(
            "{GOOD}additional_disks:\n  - disk_size: 10\n    storage_selector: name == \"fast-ssd\"\n"
        ),
        "table",
    );
    assert!(
        run.has_fail("additional_disks[0].storage_selector", "pve3"),
        "{}",
        run.stdout
    );
    assert!(!run.has_fail("additional_disks[0].storage_selector", "pve1"));

    // A bare storage name is caught before the cluster is asked, with the fix.
    let run = validate(
        &cfg,
        "cores: 2\nmemory: 2048\ndisk_size: 20\nstorage_selector: local-lvm\n",
        "table",
    );
    assert!(!run.ok);
    let line = run.fail_line("storage_selector", "-");
    assert!(
        line.contains("bare name") && line.contains("name == \"local-lvm\""),
        "{line}"
    );
}

#[test]
fn per_node_overrides_from_the_config_are_applied() {
    let fake = start();
    let cfg = config(
        &fake,
        "overrides",
        "defaults:\n  storage_selector: name == \"fast-ssd\"\nnodes:\n  pve3:\n    storage_selector: name == \"local-lvm\"\n",
    );
    let class = "cores: 2\nmemory: 2048\ndisk_size: 20\n";
    let run = validate(&cfg, class, "table");
    assert!(run.ok, "{}", run.stdout);
    assert!(
        run.stdout.lines().any(|l| l.starts_with("ok")
            && l.contains("nodes.pve3.storage_selector")
            && l.contains("local-lvm")),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("defaults.storage_selector"),
        "{}",
        run.stdout
    );

    let cfg = config(
        &fake,
        "defaults-only",
        "defaults:\n  storage_selector: name == \"fast-ssd\"\n",
    );
    let run = validate(&cfg, class, "table");
    assert!(
        run.has_fail("defaults.storage_selector", "pve3"),
        "{}",
        run.stdout
    );
}

#[test]
fn bridges_templates_memory_and_mappings() {
    let fake = start();
    let cfg = config(&fake, "plain", "");

    let run = validate(&cfg, &format!("{GOOD}network_bridge: vmbr1\n"), "table");
    assert!(!run.ok);
    let line = run.fail_line("network_bridge", "pve3");
    assert!(
        line.contains("\"vmbr1\" does not exist on pve3") && line.contains("vmbr0"),
        "{line}"
    );
    assert!(!run.has_fail("network_bridge", "pve1"));

    let run = validate(
        &cfg,
        &format!("{GOOD}additional_nics:\n  - bridge: vmbr9\n    vlan: 20\n"),
        "table",
    );
    for node in ["pve1", "pve2", "pve3"] {
        assert!(
            run.has_fail("additional_nics[0].bridge", node),
            "{}",
            run.stdout
        );
    }

    // Clone: a good template, a missing one, a VM that is not a template.
    let clone = "cores: 2\nmemory: 2048\ndisk_size: 20\nstorage_selector: name == \"local-lvm\"\nboot: clone\nnode: pve1\n";
    let run = validate(&cfg, &format!("{clone}template: 9000\n"), "table");
    assert!(run.ok, "{}", run.stdout);
    let run = validate(&cfg, &format!("{clone}template: talos-template\n"), "table");
    assert!(run.ok, "{}", run.stdout);
    let run = validate(&cfg, &format!("{clone}template: 9999\n"), "table");
    let line = run.fail_line("template", "-");
    assert!(
        line.contains("not found") && line.contains("9000 (talos-template)"),
        "{line}"
    );
    let run = validate(&cfg, &format!("{clone}template: 100\n"), "table");
    assert!(run.fail_line("template", "-").contains("is not a template"));
    // Spread with a template on pve1 and local storage: the other nodes cannot clone it, so
    // placement leaves them out (a warning each) and every VM goes to pve1 (fine).
    let spread = clone.replace("node: pve1\n", "template: 9000\n");
    let run = validate(&cfg, &spread, "table");
    let left_out = |run: &Run, node: &str| {
        run.stdout.lines().any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() > 2 && cols[0] == "warn" && cols[1] == "template" && cols[2] == node
        })
    };
    assert!(
        run.ok && left_out(&run, "pve2") && !left_out(&run, "pve1"),
        "{}",
        run.stdout
    );
    // The template's own disk is on local-lvm: a shared target storage does not make it reachable.
    let shared = spread.replace("local-lvm", "shared-nfs");
    let run = validate(&cfg, &shared, "table");
    assert!(run.ok && left_out(&run, "pve3"), "{}", run.stdout);

    // fakepve nodes have 6 GiB free.
    let run = validate(
        &cfg,
        &GOOD.replace("memory: 2048", "memory: 65536"),
        "table",
    );
    let line = run.fail_line("memory", "-");
    assert!(
        line.contains("65536 MiB fits on no candidate node") && line.contains("pve1 6144 MiB"),
        "{line}"
    );

    let run = validate(
        &cfg,
        &format!("{GOOD}pci_devices:\n  - mapping: gpu\n"),
        "table",
    );
    assert!(
        run.has_fail("pci_devices[0].mapping", "pve2"),
        "{}",
        run.stdout
    );
    assert!(!run.has_fail("pci_devices[0].mapping", "pve1"));
    let run = validate(
        &cfg,
        &format!("{GOOD}node: pve1\npci_devices:\n  - mapping: nvidia\n"),
        "table",
    );
    assert!(
        run.fail_line("pci_devices[0].mapping", "pve1")
            .contains("existing: gpu")
    );
}

#[test]
fn schema_errors_are_all_reported_at_once_and_json_has_a_stable_shape() {
    let fake = start();
    let cfg = config(&fake, "plain", "");
    let run = validate(
        &cfg,
        "cores: two\nmemorry: 2048\nstorage_selector: name == \"local-lvm\"\nvlan: 5000\n",
        "json",
    );
    assert!(!run.ok);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["ok"], json!(false));
    let findings = report["findings"].as_array().unwrap();
    let problem_keys: Vec<&str> = findings
        .iter()
        .filter(|f| f["outcome"] == "problem")
        .map(|f| f["key"].as_str().unwrap())
        .collect();
    for key in ["cores", "memory", "disk_size", "vlan"] {
        assert!(
            problem_keys.contains(&key),
            "{key} missing from {problem_keys:?}"
        );
    }
    // An unknown key is a warning (the official provider ignores it), with its suggestion; the
    // missing key it was meant to be points back at it.
    let warned = |key: &str| {
        findings
            .iter()
            .find(|f| f["outcome"] == "warning" && f["key"] == key)
            .and_then(|f| f["message"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        warned("memorry").contains("did you mean `memory`?"),
        "{findings:#?}"
    );
    assert!(
        findings.iter().any(|f| f["key"] == "memory"
            && f["message"]
                .as_str()
                .unwrap()
                .contains("`memorry` is set: did you mean `memory`?")),
        "{findings:#?}"
    );
    assert_eq!(report["problems"], json!(problem_keys.len()));
    assert!(
        findings
            .iter()
            .any(|f| f["outcome"] == "skipped" && f["key"] == "cluster")
    );
    for f in findings {
        let keys: Vec<&String> = f.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["key", "message", "node", "outcome"], "{f}");
    }

    let run = validate(&cfg, GOOD, "json");
    assert!(run.ok, "{}", run.stdout);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["ok"], json!(true));
    assert_eq!(report["problems"], json!(0));
    assert!(
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["key"] == "storage_selector"
                && f["node"] == "pve2"
                && f["outcome"] == "pass")
    );
    assert!(!run.stdout.contains(testkit::fakepve::TOKEN_SECRET));
}

#[tokio::test]
async fn check_defaults_reports_only_what_defaults_set() {
    let fake = start();
    let base = fake.config_yaml(Login::Token, Trust::CaFile);
    let check = |extra: &str| {
        let config = ProviderConfig::parse(&format!("{base}{extra}")).unwrap();
        async move {
            let pve = ProxmoxClient::new(&config.proxmox).unwrap();
            check_defaults(&pve, &config).await
        }
    };
    assert_eq!(check("").await, None);
    // Only some keys: what is missing is not a problem.
    assert_eq!(
        check("defaults:\n  cores: 2\n  network_bridge: vmbr0\n").await,
        None
    );
    assert_eq!(
        check("defaults:\n  storage_selector: name == \"local-lvm\"\n  memory: 2048\n").await,
        None
    );

    let text = check("defaults:\n  storage_selector: name == \"fast-ssd\"\n")
        .await
        .expect("fast-ssd is missing on pve3");
    assert!(
        text.contains("defaults.storage_selector (on pve3)"),
        "{text}"
    );
    assert!(!text.contains("pve1"), "{text}");

    let text = check("defaults:\n  network_bridge: vmbr1\n")
        .await
        .expect("vmbr1 is missing on pve3");
    assert!(text.contains("defaults.network_bridge (on pve3)"), "{text}");

    let text = check("nodes:\n  pve2:\n    network_bridge: vmbr7\n")
        .await
        .expect("vmbr7 is missing on pve2");
    assert!(
        text.contains("nodes.pve2.network_bridge (on pve2)"),
        "{text}"
    );

    let text = check("defaults:\n  node: pve9\n")
        .await
        .expect("pve9 is unknown");
    assert!(
        text.contains("defaults.node") && text.contains("pve1, pve2, pve3"),
        "{text}"
    );
    assert!(text.len() < 600, "{text}");
}

// The examples under `examples/` are documentation users copy; these keep them valid.

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples")
}

#[test]
fn example_config_loads_and_its_overrides_are_valid() {
    let text = std::fs::read_to_string(examples_dir().join("config.yaml")).unwrap();
    let config = ProviderConfig::parse(&text).unwrap_or_else(|e| panic!("{e:?}"));
    let problems = config.layers.check().problems;
    assert!(problems.is_empty(), "{problems:?}");
    assert!(!config.defaults.is_empty() && !config.nodes.is_empty());
}

#[test]
fn example_machine_classes_pass_the_schema_alone_and_with_the_example_config() {
    use omni_infra_provider_proxmox::rules::provider_data::{ConfigLayers, describe};
    let config = ProviderConfig::parse(
        &std::fs::read_to_string(examples_dir().join("config.yaml")).unwrap(),
    )
    .unwrap();
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(examples_dir().join("machine-classes")).unwrap() {
        let path = entry.unwrap().path();
        let yaml = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if let Err(problems) = ConfigLayers::default().resolve(&yaml, None) {
            panic!("{name}: {}", describe(&problems));
        }
        for node in config.nodes.keys() {
            match config.layers.resolve(&yaml, Some(node)) {
                Err(problems) => panic!("{name} on {node}: {}", describe(&problems)),
                // Every IP pool a class names is one of the example config's.
                Ok(mut data) => {
                    if let Err(problems) =
                        omni_infra_provider_proxmox::rules::ip_pool::apply_networks(
                            &mut data,
                            &config.ip_pools,
                        )
                    {
                        panic!("{name}: {}", describe(&problems));
                    }
                }
            }
        }
        seen.push(name);
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "clone-from-template.yaml",
            "control-plane-ha.yaml",
            "extra-disk.yaml",
            "pinned-node.yaml",
            "spread-set.yaml",
            "static-ip.yaml",
            "vlan.yaml"
        ]
    );
}

#[test]
fn example_pinned_class_passes_validate_against_fakepve() {
    let fake = start();
    let cfg = config(&fake, "plain", "");
    let class =
        std::fs::read_to_string(examples_dir().join("machine-classes/pinned-node.yaml")).unwrap();
    let run = validate(
        &cfg,
        &class.replace("memory: 8192", "memory: 4096"),
        "table",
    );
    assert!(run.ok, "{}", run.stdout);
    let clone =
        std::fs::read_to_string(examples_dir().join("machine-classes/clone-from-template.yaml"))
            .unwrap();
    let run = validate(&cfg, &clone, "table");
    assert!(run.ok, "{}", run.stdout);
}

/// A token granted its role on `/` (the simplest grant) reaches every VM and storage of the
/// datacenter: `validate` warns and names what is held there; granted on the provider's own paths,
/// with only `Sys.Audit` left on `/`, it does not.
#[test]
fn a_token_holding_more_than_it_needs_on_the_root_is_warned_about() {
    let mut fake = start();
    let cfg = config(&fake, "reach", "");
    let role = testkit::fakepve::readme_role();
    fake.control(json!({"op": "set_acl", "who": testkit::fakepve::TOKEN_ID,
        "entries": [["/", role]]}));
    let run = validate(&cfg, GOOD, "table");
    assert!(
        run.ok,
        "a warning, not a problem: {}\n{}",
        run.stdout, run.stderr
    );
    assert!(
        run.stdout.contains("VM.Allocate") && run.stdout.contains("on `/`"),
        "{}",
        run.stdout
    );

    let role = testkit::fakepve::readme_role();
    let elsewhere: Vec<String> = role.into_iter().filter(|p| p != "Sys.Audit").collect();
    fake.control(json!({"op": "set_acl", "who": testkit::fakepve::TOKEN_ID,
        "entries": [["/", ["Sys.Audit"]], ["/vms", elsewhere], ["/storage", elsewhere],
                    ["/nodes", elsewhere], ["/pool", elsewhere], ["/sdn", elsewhere]]}));
    let run = validate(&cfg, GOOD, "table");
    assert!(!run.stdout.contains("on `/`"), "{}", run.stdout);
}

/// `validate` holds a class to the config's `policy:` as provisioning does.
#[test]
fn validate_refuses_what_the_policy_does_not_allow() {
    let fake = start();
    let cfg = config(&fake, "policy", "policy:\n  bridges: [vmbr0]\n");
    let run = validate(&cfg, &format!("{GOOD}network_bridge: vmbr1\n"), "table");
    assert!(!run.ok, "{}", run.stdout);
    assert!(
        run.stdout.contains("network_bridge") && run.stdout.contains("policy"),
        "{}",
        run.stdout
    );
    assert!(validate(&cfg, GOOD, "table").ok);
}
