//! Static IP pools end to end: the in-memory Omni, fakepve (whose guests report the static addresses
//! their seed's network-config gives them, as Talos applies them) and the provider, in process or as
//! the real binary killed with SIGKILL.

use std::collections::BTreeSet;
use std::process::{Child, Stdio};
use std::time::Duration;

use omni_infra_provider_proxmox::omni::proto::provider::{IpAllocation, MachineSpec};
use omni_infra_provider_proxmox::omni::proto::specs::machine_request_status_spec::Stage;
use omni_infra_provider_proxmox::omni::resources::{
    MACHINE_REQUEST, MACHINE_REQUEST_STATUS, provider_machine,
};
use omni_infra_provider_proxmox::omni::state::Typed;
use omni_infra_provider_proxmox::rules::cloud_init::mac_for_nic;
use serde_json::{Value, json};
use testkit::fakepve::{FakePve, Login, Trust, three_node_scenario};
use testkit::harness::{Harness, PROVIDER};

const POOLS: &str = "ipPools:\n  talos-net:\n    cidr: 10.10.0.0/24\n    range: 10.10.0.100-10.10.0.119\n    gateway: 10.10.0.1\n    nameservers: [10.10.0.1]\n  tiny:\n    cidr: 10.20.0.0/24\n    range: 10.20.0.10-10.20.0.11\n    gateway: 10.20.0.1\n  v6:\n    cidr: fd00:10::/64\n    range: fd00:10::100-fd00:10::1ff\n    gateway: fd00:10::1\n    nameservers: [fd00:10::1]\n  tagged:\n    cidr: 10.30.0.0/24\n    range: 10.30.0.10-10.30.0.20\n    gateway: 10.30.0.1\n    bridge: vmbr0\n    vlan: 30\n";
const CLASS: &str =
    "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'storageType == \"lvmthin\"'\n";
/// A request waiting on a full pool is looked at again as soon as the provider frees an address,
/// not at its next retry (which by then is 40 s or more away): this is ample.
const HEAL: Duration = Duration::from_secs(10);

fn class(pool: &str) -> String {
    format!("{CLASS}ip_pool: {pool}\n")
}

fn machine(h: &Harness, id: &str) -> Option<Typed<MachineSpec>> {
    h.omni.state.get(&provider_machine(PROVIDER), id)
}

/// `(nic, pool, address)` of every allocation the provider state of `id` records.
fn allocations(h: &Harness, id: &str) -> Vec<(u32, String, String)> {
    machine(h, id)
        .map(|m| {
            m.spec
                .ip_allocations
                .iter()
                .map(|a| (a.nic, a.pool.clone(), a.address.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The one VM of request `id`.
fn vm_of(h: &mut Harness, id: &str) -> Value {
    let vms = h.vms_named(id);
    assert_eq!(vms.len(), 1, "{id}: exactly one VM, got {vms:?}");
    vms[0].clone()
}

/// The network-config of the seed attached to `vm`, as its guest reads it.
fn seed_network_config(h: &mut Harness, vm: &Value) -> String {
    h.pve
        .control(json!({"op": "seed_network_config", "vmid": vm["vmid"]}))
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The MAC Proxmox holds for `netN` of `vm`.
fn nic_mac(vm: &Value, n: u8) -> String {
    let value = vm["config"][format!("net{n}")].as_str().unwrap_or_default();
    value
        .split(',')
        .next()
        .and_then(|model| model.split_once('='))
        .map(|(_, mac)| mac.to_ascii_lowercase())
        .unwrap_or_default()
}

/// Runs a subcommand of the binary with the Omni flags and `--output json`; its JSON answer.
fn cli_json(h: &Harness, dir: &std::path::Path, command: &str) -> Value {
    let config = dir.join("cli-config.yaml");
    std::fs::write(
        &config,
        format!("{}{POOLS}", h.pve.config_yaml(Login::Token, Trust::CaFile)),
    )
    .unwrap();
    let out = h
        .omni
        .provider_command()
        .args([
            command,
            "--output",
            "json",
            "--omni-api-endpoint",
            &h.omni.url(),
        ])
        .arg("--config-file")
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The provider binary, killed with SIGKILL when dropped.
struct Provider(Child);

impl Provider {
    fn spawn(h: &Harness, dir: &std::path::Path, round: usize) -> Provider {
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            format!("{}{POOLS}", h.pve.config_yaml(Login::Token, Trust::CaFile)),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join(format!("provider-{round}.log"))).unwrap();
        let child = h
            .omni
            .provider_command()
            .arg("--config-file")
            .arg(&config)
            .args(["--omni-api-endpoint", &h.omni.url(), "--concurrency", "8"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Provider(child)
    }

    /// SIGKILL: no shutdown, nothing flushed, every in-memory ledger lost.
    fn kill(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Requests whose provider state records an allocation.
fn allocated(state: &testkit::memstate::MemState, ids: &[String]) -> usize {
    ids.iter()
        .filter(|id| {
            state
                .get(&provider_machine(PROVIDER), id)
                .is_some_and(|m| !m.spec.ip_allocations.is_empty())
        })
        .count()
}

/// Twenty requests at once from a pool of exactly twenty addresses, the provider SIGKILLed three
/// times while they are being allocated: every request ends with one VM and one address, no two
/// alike (a lost allocation would leave the pool short and the last request failing; a duplicate
/// would show as two equal addresses), each written into its own VM's seed for its own MAC and
/// confirmed by its guest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_requests_get_twenty_distinct_addresses_through_sigkills() {
    // Nodes with room for twenty VMs.
    let mut scenario = three_node_scenario();
    for node in scenario["nodes"].as_array_mut().unwrap() {
        node["maxmem"] = json!(64u64 << 30);
        node["maxcpu"] = json!(32);
    }
    let mut h = Harness::start_with(scenario, POOLS).await;
    // The real binary does the work here, so it can be killed for real.
    h.stop_controller().await;
    let dir = tempfile::tempdir().unwrap();
    let mut provider = Provider::spawn(&h, dir.path(), 0);
    let ids: Vec<String> = (0..20).map(|i| format!("pooled-{i:02}")).collect();
    for id in &ids {
        h.request(id, "pooled", &class("talos-net"));
    }
    for (round, threshold) in [(1, 2), (2, 8), (3, 14)] {
        h.omni
            .state
            .wait_for(Duration::from_secs(120), |s| {
                allocated(s, &ids) >= threshold
            })
            .await;
        provider.kill();
        provider = Provider::spawn(&h, dir.path(), round);
    }
    for id in &ids {
        let st = h
            .omni
            .state
            .wait_for(Duration::from_secs(120), |s| {
                s.get(&MACHINE_REQUEST_STATUS, id)
                    .is_some_and(|st| st.spec.stage == Stage::Provisioned as i32)
            })
            .await;
        let logs: Vec<String> = (0..4)
            .map(|r| {
                std::fs::read_to_string(dir.path().join(format!("provider-{r}.log")))
                    .unwrap_or_default()
            })
            .collect();
        assert!(
            st,
            "{id} not provisioned: {:?}\nlast provider log:\n{}",
            h.status(id),
            logs.last().unwrap()
        );
    }
    provider.kill();

    let mut seen = BTreeSet::new();
    for id in &ids {
        let held = allocations(&h, id);
        assert_eq!(held.len(), 1, "{id}: {held:?}");
        let (nic, pool, address) = held[0].clone();
        assert_eq!((nic, pool.as_str()), (0, "talos-net"));
        assert!(seen.insert(address.clone()), "{address} handed out twice");
        let vm = vm_of(&mut h, id);
        let mac = mac_for_nic(id, 0).to_string().to_ascii_lowercase();
        assert_eq!(
            nic_mac(&vm, 0),
            mac,
            "{id}: net0 has the MAC the seed names"
        );
        let seed = seed_network_config(&mut h, &vm);
        assert!(
            seed.contains(&format!("mac_address: \"{mac}\"")),
            "{id}: {seed}"
        );
        assert!(
            seed.contains(&format!("address: \"{address}/24\"")),
            "{id}: {seed}"
        );
        assert!(seed.contains("gateway: \"10.10.0.1\""), "{id}: {seed}");
        // discover_ip confirmed it: the guest reported exactly what the seed gave it.
        let reported = machine(&h, id).unwrap().spec.addresses;
        assert!(reported.contains(&address), "{id}: {reported:?}");
    }
    let whole_range: BTreeSet<String> = (100..120).map(|i| format!("10.10.0.{i}")).collect();
    assert_eq!(seen, whole_range, "every address of the pool, once");
}

/// A pool of two: the third machine fails readably and nothing is created for it; tearing one
/// machine down releases its address (only once its VM is gone) and the third one heals by itself
/// with exactly that address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_fails_readably_and_heals_when_a_machine_is_torn_down() {
    let mut h = Harness::start(POOLS).await;
    for id in ["tiny-a", "tiny-b"] {
        h.request(id, "tiny", &class("tiny"));
    }
    for id in ["tiny-a", "tiny-b"] {
        h.wait_stage(id, Stage::Provisioned).await;
    }
    h.request("tiny-c", "tiny", &class("tiny"));
    let failed = h.wait_stage("tiny-c", Stage::Failed).await;
    assert!(
        failed
            .spec
            .error
            .contains("pool tiny has no free address: 2 of 2 in use"),
        "{:?}",
        failed.spec
    );
    assert!(
        failed.spec.status.contains("IP pool full"),
        "{:?}",
        failed.spec
    );
    assert!(
        h.vms_named("tiny-c").is_empty(),
        "nothing created without an address"
    );
    assert!(allocations(&h, "tiny-c").is_empty());
    // `pools` counts the same way, from the provider states; `orphans` has no allocation to list.
    let dir = tempfile::tempdir().unwrap();
    let pools = cli_json(&h, dir.path(), "pools");
    let tiny = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "tiny")
        .unwrap()
        .clone();
    assert_eq!(
        (
            tiny["size"].as_u64(),
            tiny["in_use"].as_u64(),
            tiny["free"].as_u64()
        ),
        (Some(2), Some(2), Some(0)),
        "{tiny}"
    );
    let holders: BTreeSet<&str> = tiny["held"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["request"].as_str())
        .collect();
    assert_eq!(holders, BTreeSet::from(["tiny-a", "tiny-b"]));
    let orphans = cli_json(&h, dir.path(), "orphans");
    assert_eq!(orphans["ip_allocations"], json!([]), "{orphans}");

    let freed = allocations(&h, "tiny-a")[0].2.clone();
    let vmid = vm_of(&mut h, "tiny-a")["vmid"].as_u64().unwrap();
    // While the VM cannot be deleted, its address stays taken: tiny-c keeps failing through its
    // retries (5 s, then 10 s, 20 s apart) and gets nothing.
    h.pve.control(
        json!({"op": "fail", "method": "DELETE", "suffix": format!("/qemu/{vmid}"),
        "status": 500, "message": "storage busy"}),
    );
    assert!(h.omni.state.teardown(&MACHINE_REQUEST, "tiny-a"));
    tokio::time::sleep(Duration::from_secs(22)).await;
    assert!(!h.pve.vm(vmid as u32).is_null(), "the VM is still there");
    assert!(
        allocations(&h, "tiny-c").is_empty(),
        "no address before the VM is gone"
    );
    assert_eq!(h.status("tiny-c").unwrap().spec.stage, Stage::Failed as i32);
    h.pve.control(json!({"op": "clear_failures"}));
    h.wait_released("tiny-a").await;
    assert!(
        h.pve.vm(vmid as u32).is_null(),
        "VM deleted before its address is free"
    );

    let healed = h
        .omni
        .state
        .wait_for(HEAL, |s| {
            s.get(&MACHINE_REQUEST_STATUS, "tiny-c")
                .is_some_and(|st| st.spec.stage == Stage::Provisioned as i32)
        })
        .await;
    assert!(healed, "tiny-c did not heal: {:?}", h.status("tiny-c"));
    assert_eq!(allocations(&h, "tiny-c")[0].2, freed);
    assert!(h.status("tiny-c").unwrap().spec.error.is_empty());
    h.stop_controller().await;

    // A provider state whose request is gone (the provider not running to clean it up): `orphans`
    // and `pools` name its allocation.
    let ghost = MachineSpec {
        ip_allocations: vec![IpAllocation {
            nic: 0,
            pool: "talos-net".into(),
            address: "10.10.0.105".into(),
        }],
        ..MachineSpec::default()
    };
    h.omni.state.put(
        &provider_machine(PROVIDER),
        "ghost-1",
        &ghost,
        Default::default(),
    );
    let orphans = cli_json(&h, dir.path(), "orphans");
    assert_eq!(
        orphans["ip_allocations"],
        json!([{"address": "10.10.0.105", "request": "ghost-1", "nic": "net0"}]),
        "{orphans}"
    );
    let pools = cli_json(&h, dir.path(), "pools");
    assert_eq!(
        pools["left_over"]["gone_requests"][0]["request"], "ghost-1",
        "{pools}"
    );
}

/// An IPv6 pool on net0 and an IPv4 pool on an additional NIC: each NIC gets its own address and
/// MAC, the seed gives `static6` and `static` subnets, the guest reports both, and a teardown hands
/// both back to the next machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_and_a_second_nic_get_their_own_pools_and_teardown_releases_them() {
    let mut h = Harness::start(POOLS).await;
    let data = format!(
        "{}additional_nics:\n  - bridge: vmbr0\n    ip_pool: talos-net\n",
        class("v6")
    );
    h.request("dual-1", "dual", &data);
    h.wait_stage("dual-1", Stage::Provisioned).await;
    let held = allocations(&h, "dual-1");
    assert_eq!(
        held,
        [
            (0, "v6".to_string(), "fd00:10::100".to_string()),
            (1, "talos-net".to_string(), "10.10.0.100".to_string())
        ]
    );
    let vm = vm_of(&mut h, "dual-1");
    for n in [0, 1] {
        assert_eq!(
            nic_mac(&vm, n),
            mac_for_nic("dual-1", n).to_string().to_ascii_lowercase()
        );
    }
    let seed = seed_network_config(&mut h, &vm);
    assert!(
        seed.contains("type: static6") && seed.contains("address: \"fd00:10::100/64\""),
        "{seed}"
    );
    assert!(seed.contains("address: \"10.10.0.100/24\""), "{seed}");
    assert!(
        seed.contains("- \"fd00:10::1\"") && seed.contains("- \"10.10.0.1\""),
        "{seed}"
    );
    let reported = machine(&h, "dual-1").unwrap().spec.addresses;
    assert!(
        reported.contains(&"fd00:10::100".to_string())
            && reported.contains(&"10.10.0.100".to_string()),
        "{reported:?}"
    );

    assert!(h.omni.state.teardown(&MACHINE_REQUEST, "dual-1"));
    h.wait_released("dual-1").await;
    h.request("dual-2", "dual", &data);
    h.wait_stage("dual-2", Stage::Provisioned).await;
    let again: Vec<String> = allocations(&h, "dual-2").into_iter().map(|a| a.2).collect();
    assert_eq!(
        again,
        ["fd00:10::100", "10.10.0.100"],
        "released with the state"
    );
    h.stop_controller().await;
}

/// A pool the config does not define is refused before anything is created, naming the key and the
/// pools there are; an address a running VM's guest agent reports is never handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_pools_are_refused_and_addresses_in_use_are_skipped() {
    let mut h = Harness::start(POOLS).await;
    h.request("nopool", "bad", &class("talos-nte"));
    let failed = h.wait_stage("nopool", Stage::Failed).await;
    let error = failed.spec.error;
    assert!(
        error.contains("ip_pool: no IP pool named \"talos-nte\"") && error.contains("talos-net"),
        "{error}"
    );
    assert!(error.contains("did you mean `talos-net`"), "{error}");
    assert!(h.vms_named("nopool").is_empty());

    // Someone's VM took 10.10.0.100 by hand; its guest agent says so.
    h.pve.control(
        json!({"op": "add_vm", "vmid": 150, "name": "by-hand", "node": "pve3",
        "status": "running", "config": {"memory": 1024, "cores": 1, "agent": "1"}}),
    );
    h.pve.control(json!({"op": "set_agent", "vmid": 150, "interfaces": [
        {"name": "eth0", "hardware-address": "bc:24:11:00:01:50",
         "ip-addresses": [{"ip-address": "10.10.0.100", "ip-address-type": "ipv4", "prefix": 24}]}]}));
    h.request("skip-1", "skip", &class("talos-net"));
    h.wait_stage("skip-1", Stage::Provisioned).await;
    assert_eq!(allocations(&h, "skip-1")[0].2, "10.10.0.101");
    h.stop_controller().await;
}

/// `boot: clone`: the clone's NIC gets the MAC the seed names (over the template's), and the pool's
/// bridge and VLAN tag over the class's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_gets_the_seeds_mac_and_the_pools_vlan() {
    let mut h = Harness::start(POOLS).await;
    h.request(
        "cloned-1",
        "cloned",
        "cores: 2\nmemory: 2048\ndisk_size: 16\nstorage_selector: 'name == \"local-lvm\"'\nnode: pve1\nboot: clone\ntemplate: 9000\nvlan: 7\nip_pool: tagged\n",
    );
    h.wait_stage("cloned-1", Stage::Provisioned).await;
    let vm = vm_of(&mut h, "cloned-1");
    let mac = mac_for_nic("cloned-1", 0).to_string().to_ascii_lowercase();
    assert_eq!(nic_mac(&vm, 0), mac, "{vm}");
    let net0 = vm["config"]["net0"].as_str().unwrap();
    assert!(
        net0.contains("bridge=vmbr0") && net0.contains("tag=30"),
        "{net0}"
    );
    let seed = seed_network_config(&mut h, &vm);
    assert!(seed.contains("address: \"10.30.0.10/24\""), "{seed}");
    assert!(seed.contains(&format!("mac_address: \"{mac}\"")), "{seed}");
    let reported = machine(&h, "cloned-1").unwrap().spec.addresses;
    assert!(reported.contains(&"10.30.0.10".to_string()), "{reported:?}");
    h.stop_controller().await;
}

/// `validate CLASS` with the binary, the class on stdin: (exit ok, stdout).
fn validate(config: &std::path::Path, class: &str) -> (bool, String) {
    testkit::cli(&["validate", "--output", "table", "-"], config, class)
}

/// `validate` checks that the pool a class names exists and has a free address, counting what the
/// running VMs' guest agents report.
#[test]
fn validate_checks_that_the_pool_exists_and_has_room() {
    let mut pve = FakePve::start(three_node_scenario(), 0.0);
    let config = pve.dir.path().join("pools.yaml");
    std::fs::write(
        &config,
        format!("{}{POOLS}", pve.config_yaml(Login::Token, Trust::CaFile)),
    )
    .unwrap();
    let by_hand = |pve: &mut FakePve, vmid: u32, address: &str| {
        pve.control(json!({"op": "add_vm", "vmid": vmid, "name": format!("by-hand-{vmid}"),
            "node": "pve3", "status": "running", "config": {"memory": 1024, "cores": 1, "agent": "1"}}));
        pve.control(json!({"op": "set_agent", "vmid": vmid, "interfaces": [
            {"name": "eth0", "hardware-address": "bc:24:11:00:02:00",
             "ip-addresses": [{"ip-address": address, "ip-address-type": "ipv4", "prefix": 24}]}]}));
    };
    by_hand(&mut pve, 160, "10.20.0.10");
    let (ok, out) = validate(&config, &class("tiny"));
    assert!(ok, "{out}");
    assert!(out.contains("1 of 2 free, next 10.20.0.11"), "{out}");

    by_hand(&mut pve, 161, "10.20.0.11");
    let (ok, out) = validate(&config, &class("tiny"));
    assert!(!ok, "{out}");
    assert!(
        out.contains("pool tiny has no free address: 2 of 2 in use"),
        "{out}"
    );

    let (ok, out) = validate(&config, &class("tinny"));
    assert!(!ok, "{out}");
    assert!(
        out.contains("no IP pool named \"tinny\"") && out.contains("did you mean `tiny`"),
        "{out}"
    );
}
