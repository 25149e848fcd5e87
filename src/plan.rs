//! The config compiled for the request path: everything a request needs, computed once per load
//! (resolved upstream addresses, key layouts, header values, metric handles), so that serving a
//! request only looks things up.

use crate::config::{Config, FailMode, KeySource};
use crate::headers::RouteHeaders;
use crate::key::KeyPlan;
use crate::limiter::BucketParams;
use crate::metrics::{Metrics, RouteCounters};
use crate::route::RouteTable;
use std::net::{SocketAddr, ToSocketAddrs};

pub struct RoutePlan {
    pub name: String,
    pub peer: SocketAddr,
    pub on_redis_error: FailMode,
    pub keys: KeyPlan,
    pub sources: Vec<KeySource>,
    pub params: Vec<BucketParams>,
    /// The limits one proxy enforces alone when the store fails (`on_redis_error: local`): each
    /// divided by the fleet size, so the fleet together stays near the shared limit.
    pub local_params: Vec<BucketParams>,
    pub headers: RouteHeaders,
    pub counters: RouteCounters,
}

pub struct Plan {
    pub table: RouteTable,
    pub routes: Vec<RoutePlan>,
}

#[derive(Debug, thiserror::Error)]
#[error("route \"{route}\": upstream {host}:{port} does not resolve: {reason}")]
pub struct PlanError {
    route: String,
    host: String,
    port: u16,
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
                let up = &r.upstream;
                let fail = |reason: String| PlanError {
                    route: r.name.clone(),
                    host: up.host.clone(),
                    port: up.port,
                    reason,
                };
                let peer = (up.host.as_str(), up.port)
                    .to_socket_addrs()
                    .map_err(|e| fail(e.to_string()))?
                    .next()
                    .ok_or_else(|| fail("no address".into()))?;
                Ok(RoutePlan {
                    name: r.name.clone(),
                    peer,
                    on_redis_error: r.on_redis_error,
                    keys: KeyPlan::new(prefix, r),
                    sources: r.limits.iter().map(|l| l.key.clone()).collect(),
                    params: r.limits.iter().map(BucketParams::from).collect(),
                    local_params: r
                        .limits
                        .iter()
                        .map(|l| local_share(BucketParams::from(l), fleet))
                        .collect(),
                    headers: RouteHeaders::new(r),
                    counters: metrics.route(&r.name),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Plan {
            table: RouteTable::new(&config.routes),
            routes,
        })
    }

    /// Whether any route needs the store to answer before it lets traffic through: `/readyz`
    /// only depends on Redis for those.
    pub fn needs_store(&self) -> bool {
        self.routes
            .iter()
            .any(|r| r.on_redis_error == FailMode::Closed && !r.params.is_empty())
    }
}

/// One proxy's share of a limit: capacity and rate divided by `fleet` (the rate exactly, by
/// scaling a token up), never below the cost of one request.
fn local_share(p: BucketParams, fleet: u64) -> BucketParams {
    BucketParams {
        capacity: (p.capacity / fleet).max(p.cost),
        scale: p.scale * fleet,
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
