//! Deciding a request in `request_filter` and acting on the decision: the gate asked about the
//! canonical request (with its body first, on a route that reserves from it or rewrites it), a
//! refusal answered, an admitted request sent on, through the relay when its answer is charged or
//! its leases must outlast its client.

use super::forward::X_FORWARDED_FOR;
use super::{RateLimitProxy, RequestCtx};
use crate::answer;
use crate::canonical::{self, Refused};
use crate::gate::{Asking, Verdict};
use crate::held::Held;
use crate::limiter::Limiter;
use crate::metrics::Closed;
use crate::plan::Plan;
use crate::relay::{self, Relayed};
use crate::usage;
use bytes::Bytes;
use http::header;
use pingora::http::RequestHeader;
use pingora::prelude::*;
use std::sync::Arc;

impl<L: Limiter> RateLimitProxy<L> {
    /// The status a client failure is answered with (0: the client is gone, nobody to answer),
    /// counted by its cause.
    pub(super) fn client_failure(&self, e: &Error) -> u16 {
        match e.etype() {
            // A request body not whole by `downstream.request_body_timeout_ms`.
            ErrorType::ReadError if crate::body_clock::is_expired(e) => {
                self.metrics.connection_closed(Closed::RequestBodyTimeout);
                408
            }
            // An HTTP/2 stream reset by this side: `h2_watch` cut it at a deadline (and counted
            // it), or `h2` found it malformed. Not the client's reset.
            ErrorType::ReadError if crate::h2_watch::reset_here(e) => 0,
            // The client is gone: nobody to answer.
            ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed => {
                self.metrics.connection_closed(Closed::ClientReset);
                0
            }
            // A request body stalled past `downstream.body_timeout_ms`.
            ErrorType::ReadTimedout => {
                self.metrics.connection_closed(Closed::BodyTimeout);
                408
            }
            _ => 400,
        }
    }

    /// Acts on the gate's verdict: a refusal is answered here; an admitted request goes on to
    /// the upstream, through the relay when its answer is to be charged (or its body was read).
    pub(super) async fn answer(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        verdict: Verdict,
        held: Held,
        body: Option<Bytes>,
    ) -> Result<bool> {
        ctx.outcome = Some(verdict.outcome());
        let relayed = relay::wanted(&verdict, &held) || body.is_some();
        match verdict {
            Verdict::Pass(_, decision) if relayed => {
                let (Some(plan), Some(index)) = (ctx.plan.clone(), ctx.route) else {
                    return Error::e_explain(ErrorType::InternalError, "no route chosen");
                };
                let relayed = Relayed {
                    plan,
                    route: index,
                    rewrite: std::mem::take(&mut ctx.rewrite),
                    held,
                    decision,
                    client: session
                        .client_addr()
                        .and_then(|a| a.as_inet())
                        .map(|a| a.ip()),
                    tls: session.digest().is_some_and(|d| d.ssl_digest.is_some()),
                    te_trailers: session.req_header().version == http::Version::HTTP_2
                        && session
                            .req_header()
                            .headers
                            .get(header::TE)
                            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers")),
                    gone: Arc::default(),
                    usage_asked: ctx.usage_asked,
                };
                let spawner = self.spawner.get().ok_or_else(|| {
                    Error::explain(ErrorType::InternalError, "no subrequest spawner")
                })?;
                let mut leases = relayed.held.lease_copy();
                let gate = self.gate.clone();
                let renew = move || {
                    if let Some(renewal) = gate.renewal(&mut leases) {
                        tokio::spawn(renewal);
                    }
                };
                if let Some(e) = relay::run(session, spawner, relayed, body, renew).await? {
                    // The client's body was cut short: answered as any client failure is.
                    log::debug!("relayed request's body cut short: {e}");
                    session.set_keepalive(None);
                    let code = self.client_failure(&e);
                    if code > 0 {
                        session.respond_error(code).await?;
                    }
                }
                Ok(true)
            }
            Verdict::Pass(_, decision) => {
                ctx.held = held;
                ctx.decision = decision;
                Ok(false)
            }
            refused => {
                ctx.held = held;
                let Some(route) = super::route_of(ctx) else {
                    return Error::e_explain(ErrorType::InternalError, "no route chosen");
                };
                answer::refusal(session, route, refused).await?;
                Ok(true)
            }
        }
    }

    /// A route that reads the request body before deciding (a limit reserves from it, or it may
    /// be rewritten): the body is read whole, up to `usage::request::MAX_BODY`, then decided on.
    pub(super) async fn decide_with_body(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<bool> {
        let (plan, index) = match (&ctx.plan, ctx.route) {
            (Some(plan), Some(index)) => (plan.clone(), index),
            _ => return Error::e_explain(ErrorType::InternalError, "no route chosen"),
        };
        let route = &plan.routes[index];
        let Some(body) = read_whole_body(session, usage::request::MAX_BODY).await? else {
            session.set_keepalive(None);
            let body = "413 Content Too Large: this route reads the request body whole, and it is too large\n";
            answer::respond(session, 413, "text/plain; charset=utf-8", Vec::new(), body).await?;
            return Ok(true);
        };
        let reserves = route.limits.iter().map(|l| l.reserve.as_ref());
        let reserved = match reserves.clone().any(|r| r.is_some()) {
            true => usage::request::reservations(reserves, &body),
            false => Vec::new(),
        };
        let asked = route
            .stream_usage
            .then(|| usage::request::ask_stream_usage(&body))
            .flatten();
        ctx.usage_asked = asked.is_some();
        let body = asked.map_or(body, Bytes::from);
        // The same head that was put in canonical form a moment ago.
        let request = canonical_of(session.req_header(), &plan)
            .map_err(|_| Error::explain(ErrorType::InternalError, "request no longer canonical"))?;
        let asking = asking(&plan, session, &request, &reserved);
        let (verdict, held) = self.gate.admit(route, &asking).await;
        self.answer(session, ctx, verdict, held, Some(body)).await
    }
}

/// The request head in canonical form (`canonical`), or why it has none.
pub(super) fn canonical_of<'a>(
    req: &'a RequestHeader,
    plan: &Plan,
) -> std::result::Result<canonical::Request<'a>, Refused> {
    // HTTP/2 names the host in `:authority`, which Pingora keeps in the URI.
    let pseudo = (req.version == http::Version::HTTP_2)
        .then(|| req.uri.authority().map(|a| a.as_str().as_bytes()))
        .flatten();
    canonical::request(
        req.method.as_str(),
        req.raw_path(),
        req.version,
        pseudo,
        &req.headers,
        plan.path_escaped_slashes,
    )
}

/// The request as the gate needs it: canonical, its client found.
pub(super) fn asking<'a>(
    plan: &'a Plan,
    session: &'a Session,
    request: &'a canonical::Request<'a>,
    reserved: &'a [u64],
) -> Asking<'a> {
    let req = session.req_header();
    let peer = session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip());
    let forwarded = req
        .headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .map(|v| v.as_bytes());
    Asking {
        client: peer.map(|p| plan.client.client(p, forwarded)),
        method: req.method.as_str(),
        path: &request.target.path,
        query: request.target.query,
        headers: &req.headers,
        reserved,
    }
}

/// The whole request body, or `None` when it is longer than `cap`.
async fn read_whole_body(session: &mut Session, cap: usize) -> Result<Option<Bytes>> {
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = session.read_request_body().await? {
        if body.len() + chunk.len() > cap {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body.freeze()))
}
