//! The Pingora glue: decide in `request_filter`, decorate in `response_filter`, count in
//! `logging`. What to decide, which headers, which metrics: all of that lives elsewhere.

use crate::clock::{Clock, SystemClock};
use crate::config::{FailMode, KeySource};
use crate::deny_cache::DenyCache;
use crate::headers;
use crate::key::Identity;
use crate::limiter::memory::MemoryLimiter;
use crate::limiter::{Bucket, BucketParams, Decision, Limiter};
use crate::metrics::Outcome;
use crate::plan::{Plan, RoutePlan};
use crate::reload::LivePlan;
use async_trait::async_trait;
use bytes::Bytes;
use http::header;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use std::sync::Arc;

pub struct RateLimitProxy<L> {
    plan: LivePlan,
    limiter: Arc<L>,
    /// Only in front of a shared store: the in-memory store answers as fast as the cache would.
    deny_cache: Option<DenyCache>,
    /// Decides for `on_redis_error: local` routes while the store fails.
    fallback: MemoryLimiter<SystemClock>,
}

impl<L> RateLimitProxy<L> {
    pub fn new(
        plan: LivePlan,
        limiter: Arc<L>,
        deny_cache: Option<DenyCache>,
        fallback: MemoryLimiter<SystemClock>,
    ) -> Self {
        RateLimitProxy {
            plan,
            limiter,
            deny_cache,
            fallback,
        }
    }
}

/// What one request carries from phase to phase.
#[derive(Default)]
pub struct RequestCtx {
    /// The plan this request started under: a reload mid-request does not move it to another
    /// route table.
    plan: Option<Arc<Plan>>,
    route: Option<usize>,
    outcome: Option<Outcome>,
    /// Kept for `response_filter` when the request was allowed.
    decision: Option<Decision>,
}

/// How a request was decided, before anything is written.
enum Verdict {
    /// Proxy it, with headers when the state is known.
    Pass(Outcome, Option<Decision>),
    /// Answer 429 with this decision's headers.
    Reject(Outcome, Decision),
    /// Answer 503: the store failed and the route fails closed.
    Unavailable,
}

impl<L: Limiter> RateLimitProxy<L> {
    async fn decide(&self, route: &RoutePlan, keys: &[String]) -> Verdict {
        if let Some(cache) = &self.deny_cache {
            if let Some(d) = cache.lookup(keys, &route.params, SystemClock.now_us()) {
                route.counters.deny_cache_hit();
                return Verdict::Reject(Outcome::Rejected, d);
            }
        }
        match self.limiter.check(&buckets(keys, &route.params)).await {
            Ok(d) if d.allowed => Verdict::Pass(Outcome::Allowed, Some(d)),
            Ok(d) => {
                if let Some(cache) = &self.deny_cache {
                    cache.remember(keys, &route.params, &d, SystemClock.now_us());
                }
                Verdict::Reject(Outcome::Rejected, d)
            }
            Err(e) => {
                // Per-request detail stays at debug: an outage would otherwise flood the log, and
                // the error counter and the breaker's warning already say it is happening.
                log::debug!("route {}: rate-limit store failed: {e}", route.name);
                match route.on_redis_error {
                    FailMode::Open => Verdict::Pass(Outcome::FailOpen, None),
                    FailMode::Closed => Verdict::Unavailable,
                    FailMode::Local => {
                        match self.fallback.decide(&buckets(keys, &route.local_params)) {
                            Ok(d) if d.allowed => Verdict::Pass(Outcome::LocalFallback, Some(d)),
                            Ok(d) => Verdict::Reject(Outcome::LocalRejected, d),
                            Err(_) => Verdict::Pass(Outcome::FailOpen, None),
                        }
                    }
                }
            }
        }
    }
}

fn buckets<'a>(keys: &'a [String], params: &[BucketParams]) -> Vec<Bucket<'a>> {
    keys.iter()
        .zip(params)
        .map(|(key, params)| Bucket {
            key,
            params: *params,
        })
        .collect()
}

#[async_trait]
impl<L: Limiter> ProxyHttp for RateLimitProxy<L> {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let req = session.req_header();
        let host = req
            .uri
            .host()
            .or_else(|| req.headers.get(header::HOST).and_then(|h| h.to_str().ok()));
        let plan = self.plan.load_full();
        let Some(index) = plan.table.find(host, req.method.as_str(), req.uri.path()) else {
            let body = "404 Not Found: no route matches this request\n";
            respond(session, 404, Vec::new(), body).await?;
            return Ok(true);
        };
        ctx.route = Some(index);
        let plan = &*ctx.plan.insert(plan);
        let route = &plan.routes[index];
        if route.params.is_empty() {
            return Ok(false);
        }

        let keys = build_keys(session, route);
        match self.decide(route, &keys).await {
            Verdict::Pass(outcome, decision) => {
                ctx.outcome = Some(outcome);
                ctx.decision = decision;
                Ok(false)
            }
            Verdict::Reject(outcome, decision) => {
                ctx.outcome = Some(outcome);
                let mut extra = Vec::with_capacity(6);
                route
                    .headers
                    .each(&decision, |name, value| extra.push((name, value)));
                let limit = decision
                    .binding()
                    .map_or("", |i| route.headers.limit_name(i));
                let retry = headers::retry_after_secs(&decision);
                let body = headers::rejection_body(&route.name, limit, retry);
                respond(session, 429, extra, body).await?;
                Ok(true)
            }
            Verdict::Unavailable => {
                ctx.outcome = Some(Outcome::FailClosed);
                let body = "503 Service Unavailable: rate-limit store unavailable\n";
                respond(session, 503, Vec::new(), body).await?;
                Ok(true)
            }
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let route = route_of(ctx)
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no route chosen"))?;
        Ok(Box::new(HttpPeer::new(route.peer, false, String::new())))
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let (Some(decision), Some(route)) = (&ctx.decision, route_of(ctx)) {
            route.headers.each(decision, |name, value| {
                // Only fails for an invalid header name, and ours are constants.
                let _ = upstream_response.insert_header(name, value);
            });
        }
        Ok(())
    }

    async fn logging(&self, _session: &mut Session, _e: Option<&Error>, ctx: &mut RequestCtx) {
        if let (Some(route), Some(outcome)) = (route_of(ctx), ctx.outcome) {
            route.counters.count(outcome);
        }
    }
}

fn route_of(ctx: &RequestCtx) -> Option<&RoutePlan> {
    ctx.plan.as_ref()?.routes.get(ctx.route?)
}

/// The store key of every limit of `route` for this request.
fn build_keys(session: &Session, route: &RoutePlan) -> Vec<String> {
    let ip = session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip().to_canonical().to_string());
    let headers = &session.req_header().headers;
    route
        .sources
        .iter()
        .enumerate()
        .map(|(i, source)| {
            let id = match source {
                KeySource::ClientIp => ip
                    .as_deref()
                    .map_or(Identity::Missing, |ip| Identity::Value(ip.as_bytes())),
                KeySource::Header(name) => headers
                    .get(name.as_str())
                    .map_or(Identity::Missing, |v| Identity::Value(v.as_bytes())),
                KeySource::Route => Identity::Route,
            };
            route.keys.key(i, id)
        })
        .collect()
}

/// Writes a complete response from `request_filter`, where Pingora has no upstream response to
/// decorate: the headers travel with it.
async fn respond(
    session: &mut Session,
    status: u16,
    extra: Vec<(http::HeaderName, http::HeaderValue)>,
    body: impl Into<Bytes>,
) -> Result<()> {
    let body = body.into();
    let mut resp = ResponseHeader::build(status, Some(4 + extra.len()))?;
    resp.insert_header(header::CONTENT_TYPE, "text/plain; charset=utf-8")?;
    resp.insert_header(header::CONTENT_LENGTH, body.len())?;
    for (name, value) in extra {
        resp.insert_header(name, value)?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}
