//! A redis-server of the test's own, on a unix socket in a temp dir (no port to collide on), with
//! nothing persisted. Killed on drop; its log is printed when the test failed.

use super::wait_for;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tempfile::TempDir;

pub struct RedisServer {
    child: Option<Child>,
    dir: TempDir,
    /// Extra arguments, reused by `restart`.
    args: Vec<String>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    pub fn start_with(args: &[&str]) -> RedisServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut server = RedisServer {
            child: None,
            dir,
            args: args.iter().map(|s| s.to_string()).collect(),
        };
        server.spawn();
        server
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(self.socket())
            .args(["--save", "", "--appendonly", "no", "--logfile"])
            .arg(self.log())
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server (is it installed? .ci/run installs it)");
        self.child = Some(child);
        wait_for(
            "redis-server to answer PING",
            Duration::from_secs(10),
            || {
                if let Some(status) = self
                    .child
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten())
                {
                    panic!(
                        "redis-server exited with {status}; log:\n{}",
                        self.log_text()
                    );
                }
                self.connection()
                    .ok()
                    .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c).ok())
            },
        );
    }

    /// The URL the proxy's config uses.
    pub fn url(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    /// A connection as the default user, authenticated when `--requirepass` was given.
    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let password = self
            .args
            .iter()
            .position(|a| a == "--requirepass")
            .map(|i| &self.args[i + 1]);
        let url = match password {
            Some(p) => format!("{}?pass={p}", self.url()),
            None => self.url(),
        };
        redis::Client::open(url)?.get_connection()
    }

    /// Runs one command; panics with Redis's answer when it fails.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut c = self.connection().expect("connect to the test redis");
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut c)
            .unwrap_or_else(|e| panic!("redis {args:?}: {e}"))
    }

    /// `calls` per command from one INFO commandstats snapshot (`config|resetstat` style names).
    pub fn commandstats(&self) -> std::collections::BTreeMap<String, u64> {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(":calls="))
            .filter_map(|(name, rest)| {
                Some((name.to_string(), rest.split(',').next()?.parse().ok()?))
            })
            .collect()
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(self.socket());
    }

    /// Kill, then a fresh, empty server on the same socket (as after a crash without persistence).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP: the socket stays open and nothing answers, so calls time out instead of failing.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// What waits for this server (while paused: calls and connections sent to it), from the
    /// receive queues of its sockets: bytes on its connections, connections on its listener.
    pub fn waiting(&self) -> u64 {
        let pid = self.child.as_ref().expect("redis-server is running").id();
        let out = Command::new("ss")
            .args(["-xanpH"])
            .output()
            .expect("ss (iproute2)");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(&format!("pid={pid},")))
            .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok())
            .sum()
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self
            .child
            .as_ref()
            .expect("redis is running")
            .id()
            .to_string();
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .map(|s| s.success());
        assert!(matches!(ok, Ok(true)), "kill {sig} {pid}");
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_else(|e| format!("(no log: {e})"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A paused server would not die of SIGKILL any slower, but make sure.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- redis-server log ({}) ---\n{}",
                self.dir.path().display(),
                self.log_text()
            );
        }
        self.kill();
    }
}

/// What concurrency limits run on top of `PROXY_ACL`: their leases are sorted sets.
pub const LEASE_ACL: [&str; 6] = [
    "+zadd",
    "+zrem",
    "+zremrangebyscore",
    "+zcard",
    "+zscore",
    "+zcount",
];

/// Every command the proxy runs (its own and its scripts'), as ACL rules: a least-privilege user
/// for the tests that need one.
pub const PROXY_ACL: [&str; 15] = [
    "+evalsha",
    "+script|load",
    "+ping",
    "+hmget",
    "+hset",
    "+pexpire",
    "+mget",
    "+get",
    "+set",
    "+type",
    "+time",
    "+exists",
    "+del",
    "+pttl",
    "+info",
];
