//! The real `ratelimit-proxy` binary, on a config written to a temp dir. On failure it says
//! exactly what ran: the command, the config, and the proxy's stderr.

use super::http::{self, Response};
use super::{free_port, wait_for};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tempfile::TempDir;

pub const BIN: &str = env!("CARGO_BIN_EXE_ratelimit-proxy");

/// The binary `Proxy` runs: `BIN`, or `RATELIMIT_PROXY_BIN` when set, so that an attack test can
/// be run against an earlier build to show that it failed there.
fn bin() -> String {
    std::env::var("RATELIMIT_PROXY_BIN").unwrap_or_else(|_| BIN.to_string())
}

/// `ratelimit-proxy --config <config> --check`, run to its end.
pub fn check(config: impl AsRef<std::path::Path>) -> std::process::Output {
    Command::new(BIN)
        .arg("--config")
        .arg(config.as_ref())
        .arg("--check")
        .output()
        .expect("run ratelimit-proxy --check")
}

pub struct Proxy {
    child: Option<Child>,
    dir: TempDir,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    config: String,
    /// Where this instance hands its listeners over on an upgrade.
    upgrade_sock: PathBuf,
    /// Extra environment for the process.
    env: Vec<(String, String)>,
    /// `ulimit -n` for the process alone.
    fd_limit: Option<u64>,
}

impl Proxy {
    /// Starts the proxy on `yaml`, where `{listen}` and `{admin}` become fresh loopback addresses.
    pub fn start(yaml: &str) -> Proxy {
        Proxy::start_with_env(yaml, &[])
    }

    /// `start`, with these variables in the proxy's environment.
    pub fn start_with_env(yaml: &str, env: &[(&str, &str)]) -> Proxy {
        Proxy::start_with(yaml, env, None)
    }

    /// `start`, the process limited to `fds` open files (`ulimit -n`, soft and hard).
    pub fn start_with_fd_limit(yaml: &str, fds: u64) -> Proxy {
        Proxy::start_with(yaml, &[], Some(fds))
    }

    fn start_with(yaml: &str, env: &[(&str, &str)], fd_limit: Option<u64>) -> Proxy {
        let mut last = String::new();
        // A free port can be taken between our probe and the proxy's bind: try fresh ones.
        for _ in 0..3 {
            let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let config = yaml
                .replace("{listen}", &addr.to_string())
                .replace("{admin}", &admin.to_string());
            let dir = tempfile::tempdir().expect("temp dir");
            let upgrade_sock = dir.path().join("upgrade.sock");
            let mut proxy = Proxy {
                child: None,
                dir,
                addr,
                admin,
                config,
                upgrade_sock,
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                fd_limit,
            };
            match proxy.spawn(false) {
                Ok(()) => return proxy,
                Err(why) => last = why,
            }
        }
        panic!("the proxy did not start:\n{last}");
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("routes.yaml")
    }

    fn stderr_path(&self) -> PathBuf {
        self.dir.path().join("stderr.log")
    }

    /// Starts the process; with `upgrade`, it takes the sockets over from a running instance
    /// instead of binding them, so health is not waited for here.
    fn spawn(&mut self, upgrade: bool) -> Result<(), String> {
        std::fs::write(self.config_path(), &self.config).expect("write config");
        let stderr = std::fs::File::create(self.stderr_path()).expect("stderr file");
        let mut cmd = match self.fd_limit {
            Some(n) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(bin());
                sh
            }
            None => Command::new(bin()),
        };
        cmd.arg("--config")
            .arg(self.config_path())
            .arg("--upgrade-sock")
            .arg(&self.upgrade_sock);
        if upgrade {
            cmd.arg("--upgrade");
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let child = cmd
            .env("RUST_LOG", "info,ratelimit_proxy=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("spawn {BIN}: {e}"))?;
        self.child = Some(child);
        if upgrade {
            return Ok(());
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(format!("exited with {status}\n{}", self.report()));
            }
            let admin_up = http::send_raw(
                self.admin,
                b"GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            )
            .is_ok_and(|r| r.status == 200);
            if admin_up && TcpStream::connect(self.addr).is_ok() {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(format!("not healthy within 20 s\n{}", self.report()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What a failure message needs: the command, the config and stderr.
    pub fn report(&self) -> String {
        format!(
            "command: {BIN} --config {}\n--- config ---\n{}\n--- stderr ---\n{}",
            self.config_path().display(),
            self.config,
            std::fs::read_to_string(self.stderr_path()).unwrap_or_default()
        )
    }

    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        http::get(self.addr, path, headers)
    }

    /// A GET on the admin port, by its own address (the Host it answers).
    pub fn admin_get(&self, path: &str) -> Response {
        self.admin_request("GET", path, &[])
    }

    /// Any request on the admin port, by its own address.
    pub fn admin_request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
        http::request_to(self.admin, &self.admin.to_string(), method, path, headers)
    }

    /// The value of one series, e.g. `ratelimit_decisions_total{decision="allowed",route="api"}`;
    /// 0 when absent.
    pub fn metric(&self, series: &str) -> f64 {
        let text = self.admin_get("/metrics").body;
        text.lines()
            .find_map(|l| {
                l.strip_prefix(series)
                    .and_then(|rest| rest.strip_prefix(' '))
            })
            .map_or(0.0, |v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("metric {series}: {v:?}"))
            })
    }

    /// `ratelimit_decisions_total` of one route and decision.
    pub fn decisions(&self, route: &str, decision: &str) -> u64 {
        self.metric(&format!(
            "ratelimit_decisions_total{{decision=\"{decision}\",route=\"{route}\"}}"
        )) as u64
    }

    /// Sends SIGTERM and waits for the exit, at most `limit`.
    pub fn terminate(&mut self, limit: Duration) -> std::process::ExitStatus {
        self.signal("-TERM");
        self.wait_exit(limit)
    }

    /// Waits for the process to exit, at most `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("running");
        wait_for("the proxy to exit", limit, || {
            child.try_wait().ok().flatten()
        })
    }

    /// The process's id, e.g. to read its memory in `/proc/<pid>/status`.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// `kill <sig> <pid>`, e.g. `-HUP`.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok = Command::new("kill").args([sig, &pid]).status();
        assert!(ok.is_ok_and(|s| s.success()), "kill {sig} {pid}");
    }

    /// Everything the proxy logged so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr_path()).unwrap_or_default()
    }

    /// Replaces the config file on disk, as an operator's edit would.
    pub fn rewrite_config(&mut self, yaml: &str) {
        self.config = yaml
            .replace("{listen}", &self.addr.to_string())
            .replace("{admin}", &self.admin.to_string());
        // Write next to it and rename: the file is never seen half-written.
        let tmp = self.dir.path().join("routes.yaml.new");
        std::fs::write(&tmp, &self.config).expect("write config");
        std::fs::rename(&tmp, self.config_path()).expect("replace config");
    }

    /// Starts a second instance of the same config that takes this one's listeners over once this
    /// one gets SIGQUIT (Pingora's zero-downtime upgrade). Returns when the new instance waits for
    /// the sockets.
    pub fn start_upgrade(&self) -> Proxy {
        let mut next = Proxy {
            child: None,
            dir: tempfile::tempdir().expect("temp dir"),
            addr: self.addr,
            admin: self.admin,
            config: self.config.clone(),
            upgrade_sock: self.upgrade_sock.clone(),
            env: self.env.clone(),
            fd_limit: self.fd_limit,
        };
        next.spawn(true)
            .unwrap_or_else(|e| panic!("upgrade instance: {e}"));
        let sock = self.upgrade_sock.clone();
        wait_for(
            "the new instance to listen for the sockets",
            Duration::from_secs(20),
            || sock.exists().then_some(()),
        );
        next
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- proxy ---\n{}", self.report());
        }
    }
}
