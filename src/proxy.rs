//! The Pingora glue: decide in `request_filter`, decorate in `response_filter`, count in
//! `logging`. What to decide, which headers, which metrics: all of that lives elsewhere.

use crate::config::{FailMode, KeySource};
use crate::headers;
use crate::key::Identity;
use crate::limiter::{Bucket, Decision, Limiter};
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
}

impl<L> RateLimitProxy<L> {
    pub fn new(plan: LivePlan, limiter: Arc<L>) -> Self {
        RateLimitProxy { plan, limiter }
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
            respond(
                session,
                404,
                Vec::new(),
                "404 Not Found: no route matches this request\n",
            )
            .await?;
            return Ok(true);
        };
        ctx.route = Some(index);
        let plan = &*ctx.plan.insert(plan);
        let route = &plan.routes[index];
        if route.params.is_empty() {
            return Ok(false);
        }

        let keys = build_keys(session, route);
        let buckets: Vec<Bucket<'_>> = keys
            .iter()
            .zip(&route.params)
            .map(|(key, params)| Bucket {
                key,
                params: *params,
            })
            .collect();
        match self.limiter.check(&buckets).await {
            Ok(decision) if decision.allowed => {
                ctx.outcome = Some(Outcome::Allowed);
                ctx.decision = Some(decision);
                Ok(false)
            }
            Ok(decision) => {
                ctx.outcome = Some(Outcome::Rejected);
                let mut extra = Vec::with_capacity(6);
                route
                    .headers
                    .each(&decision, |name, value| extra.push((name, value)));
                let limit = decision
                    .binding()
                    .map_or("", |i| route.headers.limit_name(i));
                let body = headers::rejection_body(
                    &route.name,
                    limit,
                    headers::retry_after_secs(&decision),
                );
                respond(session, 429, extra, body).await?;
                Ok(true)
            }
            Err(e) => {
                // Per-request detail stays at debug: an outage would otherwise flood the log, and
                // the error counter already says it is happening.
                log::debug!("route {}: rate-limit store failed: {e}", route.name);
                match route.on_redis_error {
                    FailMode::Open => {
                        ctx.outcome = Some(Outcome::FailOpen);
                        Ok(false)
                    }
                    FailMode::Closed => {
                        ctx.outcome = Some(Outcome::FailClosed);
                        respond(
                            session,
                            503,
                            Vec::new(),
                            "503 Service Unavailable: rate-limit store unavailable\n",
                        )
                        .await?;
                        Ok(true)
                    }
                }
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
