//! Active health checks: every route with a `health_check` has each of its upstreams asked
//! `GET <path>` at its interval; a 2xx or 3xx marks it up, anything else (or no answer within the
//! route's connect timeout) marks it down until the next probe. A probe goes out as requests do
//! (Pingora's connector, the route's peer): TLS verified for `https://`, HTTP/2 for `h2c://`.

use crate::plan::RoutePlan;
use crate::reload::LivePlan;
use async_trait::async_trait;
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::upstreams::peer::{HttpPeer, Peer};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Probes so far: each probe's own connection group (Pingora reuses connections by group).
static PROBES: AtomicU64 = AtomicU64::new(0);
/// Set in every probe's group, so none is a request's group (0, or a CA bundle's hash).
const PROBE_GROUP: u64 = 1 << 63;

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
        let connector = Arc::new(Connector::new(None));
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
                    probe_all(&connector, route, &check.path).await;
                }
            }
        }
    }
}

async fn probe_all(connector: &Arc<Connector>, route: &RoutePlan, path: &str) {
    let probes = route.peers.iter().map(|peer| {
        probe(
            connector.clone(),
            peer.clone(),
            path.to_string(),
            route.timeouts.connect,
        )
    });
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

async fn probe(connector: Arc<Connector>, peer: HttpPeer, path: String, timeout: Duration) -> bool {
    let exchange = async move {
        let mut request = RequestHeader::build("GET", path.as_bytes(), Some(3)).ok()?;
        let host = match peer.sni() {
            "" => peer.address().to_string(),
            name => name.to_string(),
        };
        request.insert_header("host", host).ok()?;
        request
            .insert_header("user-agent", "ratelimit-proxy-health")
            .ok()?;
        // A fresh connection each time, never returned to the pool: a probe checks connecting
        // (and the TLS handshake) too. One stream per HTTP/2 connection keeps Pingora from
        // sharing it with the next probe; a unique group keeps it from reusing a request's.
        let mut peer = peer;
        peer.options.max_h2_streams = 1;
        peer.group_key = PROBES.fetch_add(1, Ordering::Relaxed) | PROBE_GROUP;
        let (mut session, _) = connector.get_http_session(&peer).await.ok()?;
        session.write_request_header(Box::new(request)).await.ok()?;
        session.finish_request_body().await.ok()?;
        session.read_response_header().await.ok()?;
        let status = session.response_header()?.status;
        session.shutdown().await;
        Some(status.is_success() || status.is_redirection())
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}
