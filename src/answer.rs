//! The responses the proxy writes itself, in `request_filter`, where Pingora has no upstream
//! response to decorate: a refusal by the gate (the route's deny response, or a gRPC status), and
//! the 404 and 400 of requests no route takes.

use crate::gate::Verdict;
use crate::grpc;
use crate::head_room;
use crate::plan::RoutePlan;
use crate::refusal::{self, Refusal};
use bytes::Bytes;
use http::{header, HeaderName, HeaderValue};
use pingora::http::ResponseHeader;
use pingora::prelude::*;

/// Answers a request the gate did not let through: the route's deny response (with the rate-limit
/// headers when waiting will help), or 503 when the store failed on a route that fails closed. A
/// gRPC call gets the same as gRPC statuses instead.
pub async fn refusal(session: &mut Session, route: &RoutePlan, verdict: Verdict) -> Result<()> {
    // gRPC runs over HTTP/2; over HTTP/1.1 a 200 would only read as success to whatever is
    // between the two.
    if session.as_downstream().is_http2() && grpc::is_grpc(&session.req_header().headers) {
        return refusal_grpc(session, route, verdict).await;
    }
    match verdict {
        Verdict::Pass(..) => Ok(()),
        Verdict::Reject(_, decision, limits) => {
            let (extra, why) =
                route
                    .headers
                    .rejection(&decision, &limits, route.deny.status, &route.name);
            refuse(session, route, extra, &why).await
        }
        Verdict::MissingKey(i) => {
            let why = missing_key(route, i, route.deny.missing_key_status);
            // 401 asks for credentials (RFC 9110 §15.5.2): a bearer token's challenge, when the
            // limit reads one. Nothing about limits: waiting will not help.
            let mut extra = Vec::new();
            let bearer = route.limits[i].key.iter().any(|k| k.is_secret());
            if why.status == 401 && bearer {
                let mut challenge = b"Bearer realm=\"".to_vec();
                challenge.extend_from_slice(route.name.as_bytes());
                challenge.push(b'"');
                if let Ok(v) = HeaderValue::from_bytes(&challenge) {
                    extra.push((header::WWW_AUTHENTICATE, v));
                }
            }
            refuse(session, route, extra, &why).await
        }
        Verdict::Unavailable => {
            let body = "503 Service Unavailable: rate-limit store unavailable\n";
            respond(session, 503, "text/plain; charset=utf-8", Vec::new(), body).await
        }
    }
}

/// The refusal of a request whose limit `i` (`on_missing_key: deny`) found no key.
fn missing_key(route: &RoutePlan, i: usize, status: u16) -> Refusal<'_> {
    Refusal {
        status,
        route: &route.name,
        violated: vec![route.headers.limit_name(i)],
        wait: None,
    }
}

/// A gRPC call's refusal (HTTP/2 only): trailers-only, RESOURCE_EXHAUSTED for a limit (with the
/// rate-limit fields and `retry-after` as metadata), UNAUTHENTICATED for a missing key,
/// UNAVAILABLE for a store that failed closed.
async fn refusal_grpc(session: &mut Session, route: &RoutePlan, verdict: Verdict) -> Result<()> {
    let (code, extra, detail) = match verdict {
        Verdict::Pass(..) => return Ok(()),
        Verdict::Reject(_, decision, limits) => {
            let (extra, why) = route
                .headers
                .rejection(&decision, &limits, 200, &route.name);
            (
                grpc::RESOURCE_EXHAUSTED,
                extra,
                refusal::refusal_detail(&why),
            )
        }
        Verdict::MissingKey(i) => (
            grpc::UNAUTHENTICATED,
            Vec::new(),
            refusal::refusal_detail(&missing_key(route, i, 200)),
        ),
        Verdict::Unavailable => (
            grpc::UNAVAILABLE,
            Vec::new(),
            "rate-limit store unavailable".to_string(),
        ),
    };
    let resp = grpc::trailers_only(code, &detail, extra)?;
    // One HEADERS frame that ends the stream. Pingora's proxy session would send an empty DATA
    // frame to end it, which gRPC clients take for a broken response.
    let task = pingora::protocols::http::HttpTask::Header(Box::new(resp), true);
    session
        .as_downstream_mut()
        .response_duplex_vec(vec![task])
        .await?;
    Ok(())
}

/// Writes the route's deny response, with the headers its format adds.
async fn refuse(
    session: &mut Session,
    route: &RoutePlan,
    mut extra: Vec<(HeaderName, HeaderValue)>,
    why: &Refusal<'_>,
) -> Result<()> {
    refusal::format_headers(&route.deny.format, why, &mut extra);
    let (content_type, body) = refusal::refusal_body(&route.deny.format, why);
    respond(session, why.status, content_type, extra, body).await
}

/// Writes a complete response from `request_filter`, where Pingora has no upstream response to
/// decorate: the headers travel with it.
pub async fn respond(
    session: &mut Session,
    status: u16,
    content_type: &str,
    extra: Vec<(HeaderName, HeaderValue)>,
    body: impl Into<Bytes>,
) -> Result<()> {
    let body = body.into();
    let content_type =
        HeaderValue::from_str(content_type).or_err(InvalidHTTPHeader, "invalid content type")?;
    let mut resp = ResponseHeader::build_no_case(status, None)?;
    head_room::response(&mut resp, 2 + extra.len(), |map| {
        map.insert(header::CONTENT_TYPE, content_type);
        map.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        for (name, value) in extra {
            map.insert(name, value);
        }
    })?;
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}
