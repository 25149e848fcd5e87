//! The config compiled for the request path: everything a request needs, computed once per load
//! (resolved upstream addresses, key layouts, header values, metric handles), so that serving a
//! request only looks things up.

use crate::client::ClientIdentity;
use crate::config::{
    Allow, Allowance, Charge, Config, DenyResponse, DuplicateKeyHeader, EscapedSlashes, FailMode,
    HealthCheck, KeySource, Limit, MissingKey, Reserve, Route, UpstreamTimeouts,
};
use crate::headers::RouteHeaders;
use crate::key::KeyPlan;
use crate::limiter::{BucketParams, Kind};
use crate::metrics::{Metrics, RouteCounters};
use crate::peer;
use crate::route::RouteTable;
use crate::upstream::UpstreamPool;
use pingora::upstreams::peer::HttpPeer;
use prometheus::{IntCounter, IntGauge};
use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::time::Duration;

pub struct LimitPlan {
    pub key: Vec<KeySource>,
    pub on_missing_key: MissingKey,
    /// Evaluated and counted, never enforced (the limit's or its route's `shadow`).
    pub shadow: bool,
    pub params: BucketParams,
    /// The share one proxy enforces alone when the store fails (`on_redis_error: local`):
    /// divided by the fleet size, so the fleet together stays near the shared limit.
    pub local: BucketParams,
    /// A concurrency limit's `ratelimit_inflight` gauge.
    pub inflight: Option<IntGauge>,
    /// Where the response reports the usage to charge, if it does.
    pub charge: Option<Charge>,
    /// What a request reserves from its body beside the cost, if it does.
    pub reserve: Option<Reserve>,
    /// `ratelimit_usage_charged_total` and `ratelimit_usage_unreported_total`, when charged.
    pub usage: Option<(IntCounter, IntCounter)>,
}

pub struct RoutePlan {
    pub name: String,
    /// A limit refunds unused usage: tokens can come back through another proxy, so the deny
    /// cache, which assumes they only go, is not used for the route.
    pub refunds: bool,
    /// The request body is read before the decision: a limit reserves from it, or it may be
    /// rewritten (`stream_usage`).
    pub reads_body: bool,
    pub stream_usage: bool,
    pub upstreams: Arc<UpstreamPool>,
    /// What each upstream of the pool is sent requests with (scheme, TLS, timeouts), by index.
    pub peers: Vec<HttpPeer>,
    pub timeouts: UpstreamTimeouts,
    pub health_check: Option<HealthCheck>,
    pub on_redis_error: FailMode,
    pub allow: Allow,
    pub deny: DenyResponse,
    pub keys: KeyPlan,
    pub limits: Vec<LimitPlan>,
    /// Headers an enforced limit keys on and refuses to see twice (`on_duplicate_key_header:
    /// reject`): a client could rotate buckets in one value while the upstream reads another.
    pub single_headers: Vec<String>,
    /// The upstream gets the target as the client sent it, not its canonical form.
    pub preserve_raw_path: bool,
    pub headers: RouteHeaders,
    pub counters: RouteCounters,
}

impl RoutePlan {
    /// Whether any limit's key reads the client address: only then is it formatted per request.
    pub fn keys_on_client_ip(&self) -> bool {
        self.limits
            .iter()
            .any(|l| l.key.iter().any(KeySource::reads_client_ip))
    }
}

pub struct Plan {
    pub table: RouteTable,
    pub routes: Vec<RoutePlan>,
    pub client: ClientIdentity,
    pub path_escaped_slashes: EscapedSlashes,
}

#[derive(Debug, thiserror::Error)]
#[error("route \"{route}\": upstream {upstream} does not resolve: {reason}")]
pub struct PlanError {
    route: String,
    upstream: String,
    reason: String,
}

impl Plan {
    /// Resolves upstreams (once: DNS is not consulted per request) and compiles every route.
    pub fn compile(config: &Config, metrics: &Metrics) -> Result<Plan, PlanError> {
        let prefix = config
            .redis
            .as_ref()
            .map_or("rl", |r| r.key_prefix.as_str());
        let fleet = config.redis.as_ref().map_or(1, |r| r.fleet_size);
        let routes = config
            .routes
            .iter()
            .map(|r| {
                let peers = r
                    .upstreams
                    .iter()
                    .map(|up| {
                        let fail = |reason: String| PlanError {
                            route: r.name.clone(),
                            upstream: up.to_string(),
                            reason,
                        };
                        (up.host.as_str(), up.port)
                            .to_socket_addrs()
                            .map_err(|e| fail(e.to_string()))?
                            .next()
                            .ok_or_else(|| fail("no address".into()))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let templates = r
                    .upstreams
                    .iter()
                    .zip(&peers)
                    .map(|(up, &addr)| {
                        peer::build(
                            addr,
                            &up.host,
                            up.scheme,
                            &r.upstream_tls,
                            r.upstream_timeouts,
                        )
                    })
                    .collect();
                Ok(RoutePlan {
                    name: r.name.clone(),
                    upstreams: Arc::new(UpstreamPool::new(peers)),
                    peers: templates,
                    timeouts: r.upstream_timeouts,
                    health_check: r.health_check.clone(),
                    on_redis_error: r.on_redis_error,
                    allow: r.allow.clone(),
                    deny: r.deny.clone(),
                    keys: KeyPlan::new(prefix, r),
                    limits: r
                        .limits
                        .iter()
                        .map(|l| {
                            let params = bucket_params(l, r.upstream_timeouts.read);
                            LimitPlan {
                                key: l.key.clone(),
                                on_missing_key: l.on_missing_key,
                                shadow: l.shadow || r.shadow,
                                params,
                                local: local_share(params, fleet),
                                inflight: params
                                    .is_lease()
                                    .then(|| metrics.inflight(&r.name, &l.name)),
                                charge: l.charge.clone(),
                                reserve: l.reserve.clone(),
                                usage: l.charge.as_ref().map(|_| metrics.usage(&r.name, &l.name)),
                            }
                        })
                        .collect(),
                    // A settled reservation gives back what was not used.
                    refunds: r.limits.iter().any(|l| {
                        l.reserve.is_some() || l.charge.as_ref().is_some_and(|c| c.refund_unused)
                    }),
                    reads_body: r.stream_usage || r.limits.iter().any(|l| l.reserve.is_some()),
                    stream_usage: r.stream_usage,
                    single_headers: single_headers(r),
                    preserve_raw_path: r.preserve_raw_path,
                    headers: RouteHeaders::new(r),
                    counters: metrics.route(&r.name),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Plan {
            table: RouteTable::new(&config.routes),
            routes,
            client: config.client.clone(),
            path_escaped_slashes: config.path_escaped_slashes,
        })
    }

    /// Whether any route needs the store to answer before it lets traffic through: `/readyz`
    /// only depends on Redis for those.
    pub fn needs_store(&self) -> bool {
        self.routes
            .iter()
            .any(|r| r.on_redis_error == FailMode::Closed && r.limits.iter().any(|l| !l.shadow))
    }
}

/// The headers that `route`'s enforced limits key on with `on_duplicate_key_header: reject`.
fn single_headers(route: &Route) -> Vec<String> {
    let mut names: Vec<String> = route
        .limits
        .iter()
        .filter(|l| !(l.shadow || route.shadow))
        .filter(|l| l.on_duplicate_key_header == DuplicateKeyHeader::Reject)
        .flat_map(|l| &l.key)
        .flat_map(KeySource::headers)
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The arithmetic's numbers for limit `l` of a route whose upstream read timeout is `read`.
pub fn bucket_params(l: &Limit, read: Duration) -> BucketParams {
    match l.allowance {
        Allowance::Bucket { capacity, refill } => BucketParams {
            capacity,
            scale: refill.scale(),
            num: refill.num(),
            cost: l.cost,
            kind: Kind::Bucket,
        },
        Allowance::Quota { amount, period } => BucketParams::quota(amount, period, l.cost),
        // A lease outlives the longest a request can wait on its upstream, plus a margin.
        Allowance::Concurrency { max, lease_ms } => BucketParams::leases(
            max,
            lease_ms.unwrap_or(read.as_millis() as u64 + LEASE_MARGIN_MS),
        ),
    }
}

/// How much longer than the route's read timeout a lease is held by default.
const LEASE_MARGIN_MS: u64 = 5_000;

/// One proxy's share of a limit: capacity and rate divided by `fleet` (the rate exactly, by
/// scaling a token up; a quota's amount, a concurrency), never below the cost of one request.
fn local_share(p: BucketParams, fleet: u64) -> BucketParams {
    BucketParams {
        capacity: (p.capacity / fleet).max(p.cost),
        scale: match p.kind {
            Kind::Bucket => p.scale * fleet,
            Kind::Quota(_) | Kind::Leases { .. } => p.scale,
        },
        ..p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_share_divides_capacity_and_rate() {
        let p = BucketParams {
            capacity: 100,
            scale: 100_000,
            num: 1,
            cost: 2,
            kind: Kind::Bucket,
        };
        let share = local_share(p, 4);
        assert_eq!(share.capacity, 25);
        // 10 tokens/s across the fleet: 2.5 tokens/s here.
        assert_eq!(share.scale / share.num, 400_000);
        assert_eq!(
            local_share(p, 100).capacity,
            2,
            "never below one request's cost"
        );
    }
}
