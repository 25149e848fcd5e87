//! Active health checks: every route with a `health_check` has each of its upstreams asked
//! `GET <path>` at its interval; a 2xx or 3xx marks it up, anything else (or no answer within the
//! route's connect timeout) marks it down until the next probe.

use crate::plan::RoutePlan;
use crate::reload::LivePlan;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How often the checker looks for routes whose interval has come round.
const TICK: Duration = Duration::from_millis(100);

pub struct HealthChecker {
    plan: LivePlan,
}

impl HealthChecker {
    pub fn new(plan: LivePlan) -> HealthChecker {
        HealthChecker { plan }
    }
}

#[async_trait]
impl BackgroundService for HealthChecker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut last: HashMap<String, Instant> = HashMap::new();
        let mut ticker = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = ticker.tick() => {}
            }
            // The plan of this tick: a reload replaces routes (and their pools) whole.
            let plan = self.plan.load_full();
            for route in &plan.routes {
                let Some(check) = &route.health_check else {
                    continue;
                };
                let due = last
                    .get(&route.name)
                    .is_none_or(|t| t.elapsed() >= check.interval);
                if due {
                    last.insert(route.name.clone(), Instant::now());
                    probe_all(route, &check.path).await;
                }
            }
        }
    }
}

async fn probe_all(route: &RoutePlan, path: &str) {
    let probes = route
        .upstreams
        .peers()
        .iter()
        .map(|&addr| probe(addr, path.to_string(), route.timeouts.connect));
    for (i, healthy) in futures_join_all(probes).await.into_iter().enumerate() {
        let peer = route.upstreams.peers()[i];
        if healthy {
            if route.upstreams.mark_up(i) {
                log::info!(
                    "route {}: upstream {peer} passed its health check: up",
                    route.name
                );
            }
        } else if route.upstreams.mark_down_for(i, Duration::from_secs(3600)) {
            // Down until the next probe can say otherwise.
            log::warn!(
                "route {}: upstream {peer} failed its health check: down",
                route.name
            );
        }
    }
}

/// Runs the probes concurrently, one task each, so one slow upstream delays none of the others.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<bool>
where
    F: std::future::Future<Output = bool> + Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.unwrap_or(false));
    }
    out
}

async fn probe(addr: SocketAddr, path: String, timeout: Duration) -> bool {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nUser-Agent: ratelimit-proxy-health\r\n\r\n");
    let exchange = async move {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 16];
        let n = stream.read(&mut head).await.ok()?;
        // "HTTP/1.1 200 ..." — the status's first digit is the 10th byte.
        let status = head.get(..n)?.get(9).copied()?;
        Some(status == b'2' || status == b'3')
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}
