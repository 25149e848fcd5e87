//! The Pingora glue: decide in `request_filter`, decorate in `response_filter`, count in
//! `logging`. What to decide, which headers, which metrics: all of that lives elsewhere.

use crate::answer;
use crate::canonical::{Refused, Rewrite};
use crate::clock::SystemClock;
use crate::config::{Charge, UsageSource};
use crate::gate::Gate;
use crate::head_room;
use crate::headers;
use crate::held::Held;
use crate::limiter::{Decision, Limiter};
use crate::metrics::{Metrics, Outcome};
use crate::plan::{Plan, RoutePlan};
use crate::relay;
use crate::reload::LivePlan;
use crate::usage::strip::StripUsage;
use crate::usage::{self, Reported};
use async_trait::async_trait;
use bytes::Bytes;
use http::{header, HeaderValue};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, SubrequestSpawner};
use pingora::upstreams::peer::Peer;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

mod decide;
mod forward;

use decide::{asking, canonical_of};
use forward::{
    forwarded_for, host_from_authority, single_content_length, X_FORWARDED_FOR, X_FORWARDED_HOST,
    X_FORWARDED_PROTO,
};

pub struct RateLimitProxy<L> {
    /// Starts a relay's inner leg (`relay`): Pingora hands one to the first request, kept here
    /// so that no other request pays for one.
    spawner: OnceLock<SubrequestSpawner>,
    plan: LivePlan,
    /// One for every worker's service: the fallback store and lease names are the process's.
    gate: Arc<Gate<L, SystemClock>>,
    metrics: Metrics,
}

impl<L> RateLimitProxy<L> {
    pub fn new(plan: LivePlan, gate: Arc<Gate<L, SystemClock>>, metrics: Metrics) -> Self {
        RateLimitProxy {
            spawner: OnceLock::new(),
            plan,
            gate,
            metrics,
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
    /// Kept for `response_filter` when the request was allowed, with the route's index of each
    /// of its limits.
    decision: Option<(Decision, Vec<usize>)>,
    /// The upstream of the route's pool this attempt went to.
    upstream: Option<usize>,
    /// What the upstream is told that the client spelled differently.
    rewrite: Rewrite,
    /// Concurrency leases, held until `logging` (whatever ended the request), and usage to
    /// charge from the response.
    held: Held,
    /// What the response reported of its usage so far.
    reported: Reported,
    /// Set in a relay's inner leg (`relay`): the outer leg decided and counts.
    inner: Option<Inner>,
    /// The proxy asked the stream for its usage (`stream_usage`), which the client did not.
    usage_asked: bool,
    /// Takes that usage chunk out of the stream the client gets.
    strip: Option<StripUsage>,
}

/// What a relay's inner leg knows of the client, whose connection it does not have.
struct Inner {
    client: Option<IpAddr>,
    tls: bool,
    /// The client asked for trailers over HTTP/2 (gRPC): the inner leg's HTTP/1.1 head loses
    /// `te: trailers` on its way to an HTTP/2 upstream, which it must then be told again.
    te_trailers: bool,
    gone: Arc<AtomicBool>,
}

#[async_trait]
impl<L: Limiter> ProxyHttp for RateLimitProxy<L> {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    fn allow_spawning_subrequest(&self, _session: &Session, _ctx: &RequestCtx) -> bool {
        self.spawner.get().is_none()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        if let Some(spawner) = session.subrequest_spawner.take() {
            let _ = self.spawner.set(spawner);
        }
        if let Some(relayed) = relay::take(session) {
            ctx.plan = Some(relayed.plan);
            ctx.route = Some(relayed.route);
            ctx.rewrite = relayed.rewrite;
            ctx.held = relayed.held;
            ctx.decision = relayed.decision;
            ctx.inner = Some(Inner {
                client: relayed.client,
                tls: relayed.tls,
                te_trailers: relayed.te_trailers,
                gone: relayed.gone,
            });
            ctx.usage_asked = relayed.usage_asked;
            return Ok(false);
        }
        let plan = self.plan.load_full();
        if session.req_header().version == http::Version::HTTP_2 {
            host_from_authority(session.req_header_mut())?;
        }
        let req = session.req_header();
        let request = match canonical_of(req, &plan) {
            Ok(request) => request,
            Err(why) => return self.refuse_malformed(session, why).await,
        };
        let host = request.host.as_ref().map(|h| &*h.name);
        let path = &*request.target.path;
        let Some(index) = plan.table.find(host, req.method.as_str(), path) else {
            let body = "404 Not Found: no route matches this request\n";
            answer::respond(session, 404, "text/plain; charset=utf-8", Vec::new(), body).await?;
            return Ok(true);
        };
        let route = &plan.routes[index];
        let repeated = |name: &String| req.headers.get_all(name.as_str()).iter().nth(1).is_some();
        if route.single_headers.iter().any(repeated) {
            return self
                .refuse_malformed(session, Refused::DuplicateKeyHeader)
                .await;
        }
        ctx.rewrite = request.rewrite(route.preserve_raw_path);
        ctx.route = Some(index);
        let plan = &*ctx.plan.insert(plan);
        let route = &plan.routes[index];
        if route.limits.is_empty() {
            return Ok(false);
        }
        if route.reads_body {
            // The head's borrows end here: the body is read, then the head looked at again.
            return self.decide_with_body(session, ctx).await;
        }
        let asking = asking(plan, session, &request, &[]);
        let (verdict, held) = self.gate.admit(route, &asking).await;
        self.answer(session, ctx, verdict, held, None).await
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let route = route_of(ctx)
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no route chosen"))?;
        let (i, _) = route.upstreams.pick();
        let peer = route
            .peers
            .get(i)
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no such upstream"))?
            .clone();
        ctx.upstream = Some(i);
        Ok(Box::new(peer))
    }

    /// Tells the upstream who asked, the way proxies do: the client address appended to
    /// `X-Forwarded-For`, and the scheme and host the client used, unless a trusted proxy in front
    /// already said so. `Host` itself goes through unchanged.
    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let peer = match &ctx.inner {
            Some(inner) => inner.client.map(|ip| ip.to_canonical()),
            None => session
                .client_addr()
                .and_then(|a| a.as_inet())
                .map(|a| a.ip().to_canonical()),
        };
        let trusted = match (peer, &ctx.plan) {
            (Some(ip), Some(plan)) => plan.client.is_trusted(ip),
            _ => false,
        };
        let sent = &upstream_request.headers;
        let forwarded = peer.map(|ip| {
            let prior = sent.get(&X_FORWARDED_FOR).map(HeaderValue::as_bytes);
            forwarded_for(prior, ip)
        });
        let proto = (!trusted || !sent.contains_key(&X_FORWARDED_PROTO)).then(|| {
            let tls = match &ctx.inner {
                Some(inner) => inner.tls,
                None => session.digest().is_some_and(|d| d.ssl_digest.is_some()),
            };
            HeaderValue::from_static(if tls { "https" } else { "http" })
        });
        // The host the upstream is told (`Host` as rewritten, or the target's authority).
        let forwarded_host =
            (!trusted || !sent.contains_key(&X_FORWARDED_HOST)).then(|| match &ctx.rewrite.host {
                Some(host) => HeaderValue::from_str(host).ok(),
                None => sent.get(header::HOST).cloned().or_else(|| {
                    upstream_request
                        .uri
                        .host()
                        .and_then(|h| HeaderValue::from_str(h).ok())
                }),
            });
        head_room::request(upstream_request, 3, |headers| {
            if let Some(v) = forwarded {
                headers.insert(X_FORWARDED_FOR.clone(), v);
            }
            if let Some(v) = proto {
                headers.insert(X_FORWARDED_PROTO.clone(), v);
            }
            match forwarded_host {
                Some(Some(v)) => {
                    headers.insert(X_FORWARDED_HOST.clone(), v);
                }
                Some(None) => {
                    headers.remove(&X_FORWARDED_HOST);
                }
                None => {}
            }
        })?;
        if let Some(target) = &ctx.rewrite.target {
            upstream_request.set_raw_path(target)?;
        }
        if let Some(host) = ctx.rewrite.host.take() {
            upstream_request.insert_header(header::HOST, host)?;
        }
        single_content_length(upstream_request)?;
        if ctx.inner.as_ref().is_some_and(|i| i.te_trailers)
            && upstream_request.version == http::Version::HTTP_2
        {
            upstream_request.insert_header(header::TE, "trailers")?;
        }
        if ctx
            .held
            .owes(|c| c.reads(|s| matches!(s, UsageSource::Json(_) | UsageSource::Sse(_))))
        {
            // A compressed or partial body hides the usage it reports: the client may not choose.
            usage::plain_body(upstream_request)?;
        }
        Ok(())
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        if let (Some(route), Some(i)) = (route_of(ctx), ctx.upstream) {
            if route.upstreams.mark_down(i) {
                // Once per change, not once per request that finds it down.
                log::warn!(
                    "route {}: upstream {} is down for 10 s: {e}",
                    route.name,
                    peer.address()
                );
            }
            // Nothing reached the upstream: another one may take the request.
            if route.upstreams.has_other_up(i) {
                e.set_retry(true);
            }
        }
        e
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        _ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let code = match e.etype() {
            ErrorType::HTTPStatus(code) => *code,
            ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout
                if e.esource() == &ErrorSource::Upstream =>
            {
                504
            }
            _ => match e.esource() {
                ErrorSource::Upstream => 502,
                ErrorSource::Downstream => self.client_failure(e),
                ErrorSource::Internal | ErrorSource::Unset => 500,
            },
        };
        if code > 0 {
            if let Err(err) = session.respond_error(code).await {
                log::debug!("could not send the {code} response: {err}");
            }
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    /// Clients that go away and upstreams that fail are counted (`ratelimit_connections_closed_total`,
    /// `ratelimit_responses_total`) and an upstream's fall is logged once; a line per request at
    /// error level would let any client fill the log.
    fn suppress_error_log(&self, _session: &Session, _ctx: &RequestCtx, e: &Error) -> bool {
        match e.esource() {
            ErrorSource::Downstream | ErrorSource::Upstream => {
                log::debug!("request failed: {e}");
                true
            }
            ErrorSource::Internal | ErrorSource::Unset => false,
        }
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        // An informational response (100 Continue, 103 Early Hints) is not the answer: its
        // headers say nothing of the usage, and the final response follows.
        if upstream_response.status.is_informational() {
            return Ok(());
        }
        // Usage reported in a header is charged before the headers go out, so they tell the
        // balance after this response.
        if ctx.held.owes(Charge::at_head) {
            let resp = &*upstream_response;
            let after = self
                .gate
                .settle(&mut ctx.held, |s| usage::at_head(resp, s))
                .await;
            if let Some((decision, limits)) = &mut ctx.decision {
                decision.update(limits, &after);
            }
        }
        ctx.reported.head(&ctx.held, upstream_response);
        if ctx.usage_asked && usage::strip::applies(upstream_response) {
            ctx.strip = Some(StripUsage::default());
        }
        if let (Some((decision, limits)), Some(route)) = (&ctx.decision, route_of(ctx)) {
            head_room::response(upstream_response, headers::MOST, |map| {
                route.headers.each(decision, limits, |name, value| {
                    map.insert(name, value);
                });
            })?;
        }
        Ok(())
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<std::time::Duration>> {
        ctx.reported.body(body.as_ref(), end_of_stream);
        if let Some(strip) = ctx
            .strip
            .as_mut()
            .filter(|_| body.is_some() || end_of_stream)
        {
            let chunk = body.as_deref().unwrap_or_default();
            *body = Some(strip.filter(chunk, end_of_stream));
        }
        if let Some(inner) = &ctx.inner {
            if inner.gone.load(Ordering::Relaxed) && ctx.reported.body_bytes > relay::DRAIN_CAP {
                return Error::e_explain(
                    ErrorType::ReadError,
                    "client gone, and the answer is past the relay's cap: its usage is not read",
                );
            }
        }
        self.keep_leases(ctx);
        Ok(None)
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        _body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        self.keep_leases(ctx);
        Ok(())
    }

    fn upstream_response_trailer_filter(
        &self,
        _session: &mut Session,
        trailers: &mut http::HeaderMap,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.reported.trailers(&ctx.held, trailers);
        Ok(())
    }

    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut RequestCtx) {
        // After the response: the client has it, and a next request on this connection is read
        // only once this returns, so it meets the charge.
        if ctx.held.owes(|_| true) {
            let reported = &mut ctx.reported;
            self.gate
                .settle(&mut ctx.held, |c| Some(reported.used(c)))
                .await;
        }
        if ctx.held.leases() {
            self.gate.release(&mut ctx.held).await;
        }
        // A relay's inner leg: the outer leg counts the request and its answer.
        if ctx.inner.is_some() {
            return;
        }
        let Some(route) = route_of(ctx) else { return };
        if let Some(outcome) = ctx.outcome {
            route.counters.count(outcome);
        }
        if let Some(resp) = session.response_written() {
            route.counters.response(resp.status.as_u16());
        }
    }
}

fn route_of(ctx: &RequestCtx) -> Option<&RoutePlan> {
    ctx.plan.as_ref()?.routes.get(ctx.route?)
}

impl<L: Limiter> RateLimitProxy<L> {
    /// A request whose body is still moving is in flight: its leases are renewed when due, in
    /// the background (a stream may outlast `lease_ms`).
    fn keep_leases(&self, ctx: &mut RequestCtx) {
        if ctx.held.leases() {
            if let Some(renewal) = self.gate.renewal(&mut ctx.held) {
                tokio::spawn(renewal);
            }
        }
    }
}

/// A request that cannot be put in canonical form, or that repeats a header its limit keys on:
/// 400, counted by reason, and the connection closed (its framing may not be what it seems).
impl<L> RateLimitProxy<L> {
    async fn refuse_malformed(&self, session: &mut Session, why: Refused) -> Result<bool> {
        self.metrics.refused(why);
        log::debug!("refused a request: {}", why.explain());
        session.set_keepalive(None);
        let body = format!("400 Bad Request: {}\n", why.explain());
        answer::respond(session, 400, "text/plain; charset=utf-8", Vec::new(), body).await?;
        Ok(true)
    }
}
