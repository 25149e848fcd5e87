//! Requests charged by their usage go to the upstream through a relay, so that the answer is read
//! to its end whatever the client does.
//!
//! Pingora's proxy gives up on the upstream as soon as the client goes away, and with it the
//! usage the answer would have reported. So an admitted request whose route charges from the
//! response runs as a Pingora *subrequest*: the same phases of `RateLimitProxy` proxy it (its
//! inner leg: upstream, retries, timeouts, response headers, usage found and charged in its
//! `logging`), with a channel for its client. This module is the outer leg: it hands the request
//! (and its body) to the subrequest and its answer to the client; when the client is gone it keeps
//! taking the answer and dropping it, up to `DRAIN_CAP`, so that the inner leg reads it to its
//! end and charges what it reports.

use crate::canonical::Rewrite;
use crate::gate::Verdict;
use crate::held::Held;
use crate::limiter::Decision;
use crate::plan::Plan;
use bytes::Bytes;
use http::header;
use pingora::http::RequestHeader;
use pingora::prelude::*;
use pingora::protocols::http::v1::client::http_req_header_to_wire;
use pingora::protocols::http::{HttpTask, ServerSession};
use pingora::proxy::subrequest::{BodyMode, Ctx as SubrequestCtx};
use pingora::proxy::SubrequestSpawner;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The most of an answer read after its client went away, to find its usage: beyond it the
/// upstream is let go, and what was drawn up front stands.
pub const DRAIN_CAP: u64 = 64 << 20;

/// How often the outer leg looks whether the request's leases are due for renewal.
const RENEW_TICK: std::time::Duration = std::time::Duration::from_millis(250);

/// What the outer leg hands the inner one: everything the gate decided.
pub struct Relayed {
    pub plan: Arc<Plan>,
    pub route: usize,
    pub rewrite: Rewrite,
    pub held: Held,
    pub decision: Option<(Decision, Vec<usize>)>,
    /// The client's address and whether it came over TLS: the inner leg's session has neither.
    pub client: Option<IpAddr>,
    pub tls: bool,
    /// An HTTP/2 client asked for trailers (`te: trailers`, gRPC).
    pub te_trailers: bool,
    /// Set once the client is gone: the inner leg then stops at `DRAIN_CAP`.
    pub gone: Arc<AtomicBool>,
    /// The proxy asked the stream for its usage on the client's behalf (`usage::strip`).
    pub usage_asked: bool,
}

/// The subrequest's context carries one `Relayed`, taken by its `request_filter`.
type Slot = Mutex<Option<Relayed>>;

/// In the inner leg's `request_filter`: what the outer leg decided, once.
pub fn take(session: &mut Session) -> Option<Relayed> {
    let slot = session.subrequest_ctx.as_mut()?.user_ctx()?;
    slot.downcast_ref::<Slot>()?.lock().ok()?.take()
}

/// Whether the verdict lets the request through with something to settle from its answer, or
/// leases that must last as long as the upstream works on it (a client that resets must not
/// free its slot while the upstream still answers).
pub fn wanted(verdict: &Verdict, held: &Held) -> bool {
    matches!(verdict, Verdict::Pass(..)) && (held.owes(|_| true) || held.leases())
}

/// Proxies the admitted request through the inner leg and answers the client with what it says.
/// `body`: the request body when it was read whole before the decision (then it is sent as it
/// is, with its length); otherwise the client's body is streamed on. Returns the error that cut
/// the client's body short (a deadline, a reset) when nothing was answered yet: the caller
/// answers it as it answers any client failure.
pub async fn run(
    session: &mut Session,
    spawner: &SubrequestSpawner,
    relayed: Relayed,
    body: Option<Bytes>,
    mut renew: impl FnMut(),
) -> Result<Option<Box<Error>>> {
    let streamed = body.is_none() && !session.as_downstream_mut().is_body_empty();
    let wire = inner_head(
        session.req_header(),
        body.as_ref().map(Bytes::len),
        streamed,
    )?;
    let mut head = ServerSession::new_http1(Box::new(std::io::Cursor::new(wire)));
    head.read_request().await?;
    let gone = relayed.gone.clone();
    let leases = relayed.held.leases();
    let has_body = body.is_some() || streamed;
    let sub = SubrequestCtx::builder()
        .body_mode(match has_body {
            true => BodyMode::ExpectBody,
            false => BodyMode::NoBody,
        })
        .user_ctx(Box::new(Slot::new(Some(relayed))))
        .build();
    let (prepared, mut handle) = spawner.create_subrequest(&head, sub);
    let inner = tokio::spawn(prepared.run());

    // The request body, as a task waiting for room in the channel; then the answer, as it comes.
    let mut pending = body.map(|b| HttpTask::Body(Some(b), true));
    let mut request_done = !streamed;
    let mut answered = false;
    let mut body_failed: Option<Box<Error>> = None;
    // Leases are kept alive while the request waits on its upstream too, not only while a body
    // moves (`renew` renews them when a third of their life has passed).
    // A request without leases keeps no timer.
    let mut tick = leases.then(|| {
        let mut tick = tokio::time::interval(RENEW_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick
    });
    loop {
        tokio::select! {
            Some(_) = async { Some(tick.as_mut()?.tick().await) }, if tick.is_some() => renew(),
            task = handle.rx.recv() => {
                let Some(task) = task else { break };
                let done = matches!(task, HttpTask::Done | HttpTask::Failed(_));
                // Only what reaches the client counts as its answer.
                if !gone.load(Ordering::Relaxed) {
                    let head = matches!(task, HttpTask::Header(..));
                    match session.write_response_tasks(vec![task]).await {
                        Ok(_) => answered |= head,
                        Err(e) => {
                            log::debug!("client gone, the answer is read on for its usage: {e}");
                            gone.store(true, Ordering::Relaxed);
                        }
                    }
                }
                if done {
                    break;
                }
            }
            permit = handle.tx.reserve(), if pending.is_some() => {
                match permit {
                    Ok(permit) => permit.send(pending.take().expect("a task")),
                    // The inner leg stopped reading (it failed): its answer says why.
                    Err(_) => pending = None,
                }
            }
            read = session.read_request_body(), if pending.is_none() && !request_done => {
                pending = Some(match read {
                    Ok(Some(b)) => HttpTask::Body(Some(b), false),
                    Ok(None) => {
                        request_done = true;
                        HttpTask::Body(None, true)
                    }
                    // A body cut short must not reach the upstream as a whole one; the inner
                    // leg's answer to it is not the client's (it is told why below).
                    Err(e) => {
                        request_done = true;
                        gone.store(true, Ordering::Relaxed);
                        body_failed = Some(e);
                        HttpTask::Failed(Error::explain(
                            ReadError,
                            "the client's request body was cut short",
                        ))
                    }
                });
            }
        }
    }
    // The charge is settled in the inner leg's `logging`: the client's next request on this
    // connection is read only after it.
    if let Err(e) = inner.await {
        log::warn!("relayed request ended abnormally: {e}");
    }
    if answered {
        return Ok(None);
    }
    if body_failed.is_none() && !gone.load(Ordering::Relaxed) {
        session.respond_error(502).await?;
    }
    Ok(body_failed)
}

/// The request head the inner leg reads, as HTTP/1.1: the client's method, target and headers,
/// framed for the body it will be given (`length` when whole, chunked when `streamed` without a
/// length the client stated).
fn inner_head(req: &RequestHeader, length: Option<usize>, streamed: bool) -> Result<Vec<u8>> {
    let mut head = RequestHeader::build(req.method.clone(), req.raw_path(), None)?;
    let stated = req
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    for (name, value) in req.headers.iter() {
        // Hop-by-hop fields are this connection's, and the framing is set below.
        if matches!(
            *name,
            header::CONTENT_LENGTH
                | header::TRANSFER_ENCODING
                | header::CONNECTION
                | header::EXPECT
                | header::UPGRADE
        ) || name.as_str() == "keep-alive"
            || name.as_str() == "proxy-connection"
        {
            continue;
        }
        head.append_header(name.clone(), value.clone())?;
    }
    match (length, streamed, stated) {
        (Some(n), _, _) => head.insert_header(header::CONTENT_LENGTH, n)?,
        (None, true, Some(n)) => head.insert_header(header::CONTENT_LENGTH, n)?,
        (None, true, None) => head.insert_header(header::TRANSFER_ENCODING, "chunked")?,
        (None, false, _) => {}
    }
    http_req_header_to_wire(&head)
        .map(|w| w.to_vec())
        .ok_or_else(|| Error::explain(InternalError, "request head not writable"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(wire: &[u8]) -> String {
        String::from_utf8(wire.to_vec()).unwrap()
    }

    #[test]
    fn the_inner_head_is_framed_for_the_body_it_gets() {
        let mut req = RequestHeader::build("POST", b"/v1/chat/completions?x=1", None).unwrap();
        req.insert_header("host", "api.example").unwrap();
        req.insert_header("content-length", "10").unwrap();
        req.insert_header("connection", "keep-alive").unwrap();
        req.insert_header("authorization", "Bearer sk").unwrap();
        let w = parsed(&inner_head(&req, Some(52), false).unwrap());
        assert!(
            w.starts_with("POST /v1/chat/completions?x=1 HTTP/1.1\r\n"),
            "{w}"
        );
        assert!(
            w.contains("content-length: 52\r\n") || w.contains("Content-Length: 52\r\n"),
            "{w}"
        );
        assert!(!w.to_ascii_lowercase().contains("connection"), "{w}");
        assert!(w.contains("Bearer sk"), "{w}");
        let w = parsed(&inner_head(&req, None, true).unwrap()).to_ascii_lowercase();
        assert!(w.contains("content-length: 10\r\n"), "{w}");
        req.remove_header("content-length");
        let w = parsed(&inner_head(&req, None, true).unwrap()).to_ascii_lowercase();
        assert!(w.contains("transfer-encoding: chunked\r\n"), "{w}");
        let w = parsed(&inner_head(&req, None, false).unwrap()).to_ascii_lowercase();
        assert!(
            !w.contains("transfer-encoding") && !w.contains("content-length"),
            "{w}"
        );
    }
}
