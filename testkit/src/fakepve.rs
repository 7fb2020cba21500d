//! Runs fakepve (the fake Proxmox VE API, installed by `scripts/setup-test-env.sh` into `.venv`) through
//! our test-only launcher `tests/fakepve/launcher.py`, on 127.0.0.1 with a free port and a certificate
//! from a private test CA.
//!
//! A test that needs fakepve and cannot find it fails, saying how to install it: a test that skips
//! itself passes without testing anything.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{Value, json};

use crate::certs::TestPki;

pub const TOKEN_ID: &str = "omni@pve!provider";
pub const TOKEN_SECRET: &str = "token-secret-7f3a";
pub const USER: &str = "root@pam";
pub const PASSWORD: &str = "fake-password-91c2";

pub struct FakePve {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// `https://127.0.0.1:PORT`
    pub url: String,
    pub pki: TestPki,
    pub dir: tempfile::TempDir,
}

/// How the provider logs in, for [`FakePve::config_yaml`].
#[derive(Debug, Clone, Copy)]
pub enum Login {
    Token,
    Password,
}

/// How the provider trusts the server certificate, for [`FakePve::config_yaml`].
#[derive(Debug, Clone, Copy)]
pub enum Trust {
    CaFile,
    InsecureSkipVerify,
}

/// The Python that has fakepve: `FAKEPVE_PYTHON`, or the repository's `.venv`.
fn python() -> Result<PathBuf, String> {
    let candidate = std::env::var_os("FAKEPVE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join(".venv/bin/python"));
    let ok = Command::new(&candidate)
        .args(["-c", "import fakepve"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(candidate)
    } else {
        Err(format!(
            "fakepve is not installed ({} cannot import it): run `scripts/setup-test-env.sh` \
             (or `make setup`), which creates .venv, or set FAKEPVE_PYTHON",
            candidate.display()
        ))
    }
}

/// The privileges of `pveum role add OmniProvider --privs "…"` as the README documents them (PVE 9).
pub fn readme_role() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let line = readme
        .lines()
        .find(|l| l.contains("pveum role add OmniProvider"))
        .expect("README documents `pveum role add OmniProvider`");
    let privs = line
        .split("--privs")
        .nth(1)
        .and_then(|rest| rest.split('"').nth(1))
        .expect("--privs \"…\"");
    privs.split(',').map(|p| p.trim().to_owned()).collect()
}

/// Three nodes, a Talos template on pve1, one foreign VM on pve2, and storages as a small real cluster
/// has them: `local` (ISO, per node), `local-lvm` (VM disks, per node), `shared-nfs` (both, shared).
pub fn three_node_scenario() -> Value {
    json!({
        "nodes": [{"name": "pve1"}, {"name": "pve2"}, {"name": "pve3"}],
        "guests": [
            {"vmid": 9000, "name": "talos-template", "node": "pve1", "template": true,
             "config": {"memory": 2048, "cores": 2, "agent": "1", "scsihw": "virtio-scsi-single",
                        "scsi0": "local-lvm:base-9000-disk-0,size=8G", "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0"}},
            {"vmid": 100, "name": "someone-elses-vm", "node": "pve2", "status": "running",
             "config": {"memory": 1024, "cores": 1}}
        ],
        "storages": {
            "shared-nfs": {"type": "nfs", "content": "images,iso", "shared": 1, "active": 1,
                           "server": "192.0.2.1", "export": "/export", "path": "/mnt/pve/shared-nfs"}
        },
        "tokens": {TOKEN_ID: TOKEN_SECRET},
        "agent_default": true
    })
}

impl FakePve {
    /// Starts fakepve with `scenario` (see the launcher for its keys); a test fails when fakepve is
    /// not installed, naming the script that installs it.
    pub fn start(scenario: Value, time_scale: f64) -> FakePve {
        Self::try_start(scenario, time_scale).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`FakePve::start`] for the examples, which report a missing fakepve as an error.
    pub fn try_start(mut scenario: Value, time_scale: f64) -> Result<FakePve, String> {
        let python = python()?;
        let dir = tempfile::tempdir().unwrap();
        let pki = TestPki::create(dir.path());
        let obj = scenario.as_object_mut().unwrap();
        obj.insert("host".into(), json!("127.0.0.1"));
        obj.insert("port".into(), json!(0));
        obj.insert("user".into(), json!(USER));
        obj.insert("password".into(), json!(PASSWORD));
        obj.insert("time_scale".into(), json!(time_scale));
        obj.insert("cert".into(), json!(pki.chain_pem));
        obj.insert("key".into(), json!(pki.key_pem));
        let scenario_path = dir.path().join("scenario.json");
        std::fs::write(&scenario_path, scenario.to_string()).unwrap();
        let launcher = crate::repo_root().join("tests/fakepve/launcher.py");
        let mut child = Command::new(python)
            .arg(launcher)
            .arg(&scenario_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cannot start the fakepve launcher");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("fakepve listening on ")
            .unwrap_or_else(|| panic!("unexpected first line from fakepve: {line:?}"))
            .to_owned();
        Ok(FakePve {
            child,
            stdin,
            stdout,
            url,
            pki,
            dir,
        })
    }

    /// The launcher's process ID (fakepve runs in it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a control command to the launcher and returns its result.
    pub fn control(&mut self, cmd: Value) -> Value {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let answer: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("bad answer {line:?} to {cmd}: {e}"));
        assert_eq!(
            answer["ok"],
            json!(true),
            "fakepve control {cmd} failed: {answer}"
        );
        answer["result"].clone()
    }

    /// Sends one API request as a client other than ours would (the API token, `params` as a form
    /// body, or the query string for `GET` and `DELETE`), and returns the HTTP status and the JSON
    /// answer: for requests our client never sends.
    pub async fn raw(&self, method: &str, path: &str, params: &[(&str, &str)]) -> (u16, Value) {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&self.pki.ca_pem).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .build()
            .unwrap();
        let url = format!("{}/api2/json{path}", self.url);
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = client.request(method.clone(), url).header(
            "Authorization",
            format!("PVEAPIToken={TOKEN_ID}={TOKEN_SECRET}"),
        );
        request = if method == reqwest::Method::GET || method == reqwest::Method::DELETE {
            request.query(params)
        } else {
            request.form(params)
        };
        let answer = request.send().await.unwrap();
        let status = answer.status().as_u16();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    /// The VM as fakepve holds it (`null` when it does not exist).
    pub fn vm(&mut self, vmid: u32) -> Value {
        self.control(json!({"op": "vm", "vmid": vmid}))
    }

    /// Requests fakepve has seen, as (method, path).
    pub fn requests(&mut self) -> Vec<(String, String)> {
        serde_json::from_value(self.control(json!({"op": "requests"}))).unwrap()
    }

    /// How many `method` requests whose path ends with `suffix` fakepve has answered.
    pub fn count(&mut self, method: &str, suffix: &str) -> usize {
        self.requests()
            .iter()
            .filter(|(m, p)| m == method && p.ends_with(suffix))
            .count()
    }

    /// A provider config file for this fakepve (API token, its CA trusted) with `extra` appended,
    /// in its directory.
    pub fn config_file(&self, extra: &str) -> std::path::PathBuf {
        let path = self.dir.path().join("provider-config.yaml");
        std::fs::write(
            &path,
            format!("{}{extra}", self.config_yaml(Login::Token, Trust::CaFile)),
        )
        .unwrap();
        path
    }

    /// A provider config file's text for this fakepve.
    pub fn config_yaml(&self, login: Login, trust: Trust) -> String {
        let mut text = format!("proxmox:\n  url: \"{}/api2/json\"\n", self.url);
        match login {
            Login::Token => text.push_str(&format!(
                "  tokenID: \"{TOKEN_ID}\"\n  tokenSecret: \"{TOKEN_SECRET}\"\n"
            )),
            Login::Password => {
                let (user, realm) = USER.split_once('@').unwrap();
                text.push_str(&format!(
                    "  username: \"{user}\"\n  password: \"{PASSWORD}\"\n  realm: \"{realm}\"\n"
                ))
            }
        }
        match trust {
            Trust::CaFile => {
                text.push_str(&format!("  caFile: \"{}\"\n", self.pki.ca_pem.display()))
            }
            Trust::InsecureSkipVerify => text.push_str("  insecureSkipVerify: true\n"),
        }
        text
    }

    /// Writes [`FakePve::config_yaml`] to a file in the temp dir and returns its path.
    pub fn write_config(&self, login: Login, trust: Trust) -> PathBuf {
        let path = self
            .dir
            .path()
            .join(format!("config-{login:?}-{trust:?}.yaml"));
        std::fs::write(&path, self.config_yaml(login, trust)).unwrap();
        path
    }

    /// Connection settings for the Rust client.
    pub fn settings(
        &self,
        login: Login,
        trust: Trust,
    ) -> omni_infra_provider_proxmox::config::ProxmoxSettings {
        omni_infra_provider_proxmox::config::ProviderConfig::parse(&self.config_yaml(login, trust))
            .unwrap()
            .proxmox
    }
}

impl Drop for FakePve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
