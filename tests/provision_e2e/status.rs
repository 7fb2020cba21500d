//! What the user reads: bad provider data, warnings, failures that stay visible until they heal, and
//! how few writes it takes.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_provider_data_fails_with_every_problem_and_creates_nothing() {
    let mut h = Harness::start("").await;
    let before = h
        .pve
        .control(json!({"op": "vms"}))
        .as_array()
        .unwrap()
        .len();
    h.request(
        "bad-1",
        "bad",
        "cores: 0\nmemory: 1024\ndisk_sise: 10\nstorage_selector: local-lvm\n",
    );
    let status = h.wait_stage("bad-1", Stage::Failed).await;
    let error = status.spec.error;
    for needle in [
        "cores",
        "memory",
        "disk_sise",
        "did you mean `disk_size`",
        "storage_selector",
        "name == \"local-lvm\"",
    ] {
        assert!(error.contains(needle), "missing {needle:?} in: {error}");
    }
    let after = h
        .pve
        .control(json!({"op": "vms"}))
        .as_array()
        .unwrap()
        .len();
    assert_eq!(before, after, "nothing was created");
    assert!(
        h.pve.requests().iter().all(|(m, _)| m == "GET"),
        "no write reached Proxmox"
    );
    h.stop_controller().await;
}

/// Every status text the request `id` shows, in order, until the returned task is aborted.
fn record_statuses(
    h: &Harness,
    id: &'static str,
) -> (
    Arc<std::sync::Mutex<Vec<String>>>,
    tokio::task::JoinHandle<()>,
) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let recorder = {
        let seen = seen.clone();
        let state = h.omni.state.clone();
        tokio::spawn(async move {
            loop {
                state
                    .wait_for(Duration::from_millis(200), |s| {
                        if let Some(st) = s.get(&MACHINE_REQUEST_STATUS, id) {
                            let mut seen = seen.lock().unwrap();
                            if seen.last() != Some(&st.spec.status) {
                                seen.push(st.spec.status.clone());
                            }
                        }
                        false
                    })
                    .await;
            }
        })
    };
    (seen, recorder)
}

/// The official provider unmarshals provider data with a plain YAML unmarshal (omni
/// client/pkg/infra/provision/context.go, `UnmarshalProviderData`), so a class with a key it does not
/// know provisions there. It must here too, and the user sees in Omni what was ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_key_provisions_with_a_warning_in_the_status() {
    let mut h = Harness::start("").await;
    let (seen, recorder) = record_statuses(&h, "warn-1");
    h.request("warn-1", "warn", &format!("{PINNED_PVE2}disk_sise: 10\n"));
    let status = h.wait_stage("warn-1", Stage::Provisioned).await;
    recorder.abort();
    assert!(status.spec.error.is_empty(), "{}", status.spec.error);
    let seen = seen.lock().unwrap().clone();
    let warning = "disk_sise: is not a known key and is ignored (did you mean `disk_size`?)";
    let running: Vec<&String> = seen
        .iter()
        .filter(|s| s.starts_with("Running step"))
        .collect();
    assert!(!running.is_empty(), "{seen:#?}");
    // The step stays readable in front; the warning follows it.
    for text in &running {
        assert!(text.contains(warning), "{text}");
    }
    assert!(
        running
            .iter()
            .any(|s| s.starts_with("Running step 3/6 create_vm: creating VM")),
        "{seen:#?}"
    );
    assert_eq!(h.vms_named("warn-1").len(), 1);
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_strict_an_unknown_key_fails_the_request() {
    let mut h = Harness::start("strict: true\n").await;
    h.request(
        "strict-1",
        "strict",
        &format!("{PINNED_PVE2}disk_sise: 10\n"),
    );
    let status = h.wait_stage("strict-1", Stage::Failed).await;
    for needle in ["disk_sise", "did you mean `disk_size`", "strict: true"] {
        assert!(
            status.spec.error.contains(needle),
            "missing {needle:?} in: {}",
            status.spec.error
        );
    }
    assert!(h.vms_named("strict-1").is_empty());
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_template_is_a_clear_error() {
    let mut h = Harness::start("").await;
    h.request(
        "clone-missing",
        "clones",
        "cores: 1\nmemory: 2048\ndisk_size: 5\nstorage_selector: 'true'\nboot: clone\ntemplate: talos-v9\n",
    );
    let status = h.wait_stage("clone-missing", Stage::Failed).await;
    assert!(
        status.spec.error.contains("template talos-v9 not found")
            && status.spec.error.contains("9000 (talos-template)"),
        "{}",
        status.spec.error
    );
    assert!(h.vms_named("clone-missing").is_empty());
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_show_each_step_and_a_failure_stays_visible_until_it_heals() {
    let mut h = Harness::start("").await;
    // Record every status text Omni sees.
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let recorder = {
        let seen = seen.clone();
        let state = h.omni.state.clone();
        tokio::spawn(async move {
            loop {
                state
                    .wait_for(Duration::from_millis(200), |s| {
                        if let Some(st) = s.get(&MACHINE_REQUEST_STATUS, "steps-1") {
                            let mut seen = seen.lock().unwrap();
                            if seen.last() != Some(&st.spec.status) {
                                seen.push(st.spec.status.clone());
                            }
                        }
                        false
                    })
                    .await;
            }
        })
    };
    h.pve.control(
        json!({"op": "fail", "method": "POST", "suffix": "/status/start",
                         "status": 500, "message": "start refused by test", "times": 1}),
    );
    h.request("steps-1", "steps", PINNED_PVE2);
    let failed = h.wait_stage("steps-1", Stage::Failed).await;
    assert!(
        failed.spec.error.contains("start refused by test"),
        "{}",
        failed.spec.error
    );
    assert!(
        failed.spec.error.contains("starting VM"),
        "{}",
        failed.spec.error
    );
    h.wait_stage("steps-1", Stage::Provisioned).await;
    recorder.abort();
    // The dashboard's "failures by step" and the failure-rate alert read these.
    let metrics = h.metrics.encode();
    for line in [
        r#"omni_proxmox_step_failures_total{step="start_vm"} 1"#,
        r#"omni_proxmox_provisions_total{outcome="failure"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    let seen = seen.lock().unwrap().clone();
    for step in [
        "Running step 1/6 pick_node",
        "Running step 2/6 prepare_image",
        "Running step 3/6 create_vm",
        "Running step 4/6 configure_vm",
        "Running step 5/6 start_vm",
        "Running step 6/6 discover_ip",
    ] {
        assert!(
            seen.iter().any(|s| s.starts_with(step)),
            "{step} never shown: {seen:#?}"
        );
    }
    assert!(
        seen.iter()
            .any(|s| s.contains("creating VM") && s.contains("on pve2")),
        "{seen:#?}"
    );
    assert_eq!(h.vms_named("steps-1").len(), 1);
    h.stop_controller().await;
}

/// Omni calls made between two snapshots of [`MemState::typed_calls`], `(method, type) -> count`.
fn calls_since(
    before: &BTreeMap<(String, String), u64>,
    after: &BTreeMap<(String, String), u64>,
) -> BTreeMap<(String, String), u64> {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Status and provider-state writes (Create and Update) among `calls`.
fn writes(calls: &BTreeMap<(String, String), u64>) -> (u64, u64) {
    let status_type = MACHINE_REQUEST_STATUS.resource_type;
    let state_type = provider_machine(testkit::harness::PROVIDER).resource_type;
    let of = |ty: &str| -> u64 {
        calls
            .iter()
            .filter(|((method, t), _)| t == ty && (method == "Create" || method == "Update"))
            .map(|(_, n)| n)
            .sum()
    };
    (of(&status_type), of(&state_type))
}

/// One machine from its request to PROVISIONED (the image already on the node, its set's pool
/// made) writes its status and its provider state at most 12 times in all, and still shows every
/// step: each of the six appears in some version of the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_machine_costs_at_most_twelve_status_and_state_writes_and_shows_every_step() {
    let mut h = Harness::start("").await;
    // The first of the set downloads the image and makes the pool: two more lines, one more record.
    let before = h.omni.state.typed_calls();
    h.request("writes-0", "writes", PINNED_PVE2);
    h.wait_stage("writes-0", Stage::Provisioned).await;
    let first = calls_since(&before, &h.omni.state.typed_calls());
    let (status, state) = writes(&first);
    eprintln!("first machine: {status} status + {state} provider-state writes");
    assert!(status + state <= 15, "{first:#?}");

    let before = h.omni.state.typed_calls();
    h.request("writes-1", "writes", PINNED_PVE2);
    h.wait_stage("writes-1", Stage::Provisioned).await;
    let calls = calls_since(&before, &h.omni.state.typed_calls());
    let (status_writes, state_writes) = writes(&calls);
    eprintln!("Omni calls for one machine: {calls:#?}");
    let history: Vec<String> = h
        .omni
        .state
        .history(&MACHINE_REQUEST_STATUS, "writes-1")
        .into_iter()
        .map(|s| s.spec.status)
        .collect();
    eprintln!("status history: {history:#?}");
    for step in [
        "Running step 1/6 pick_node",
        "Running step 2/6 prepare_image",
        "Running step 3/6 create_vm",
        "Running step 4/6 configure_vm",
        "Running step 5/6 start_vm",
        "Running step 6/6 discover_ip",
    ] {
        assert!(
            history.iter().any(|s| s.starts_with(step)),
            "{step} never shown: {history:#?}"
        );
    }
    assert!(
        status_writes + state_writes <= 12,
        "{status_writes} status writes + {state_writes} provider-state writes: {calls:#?}\nstatus history: {history:#?}"
    );
    // The VM is linked and labelled all the same.
    let status = h.status("writes-1").unwrap();
    assert!(!status.spec.id.is_empty());
    assert!(status.metadata.labels.contains_key(label::INFRA_ID));
    h.stop_controller().await;
}
