//! Requests in flight, per process: a budget every request takes a place in (HTTP/2 streams one
//! each), answered 503 with `Retry-After` beyond it.
//!
//! `max_connections` counts connections, but an HTTP/2 connection holds up to
//! `max_concurrent_streams` requests, each with an upstream connection (a file descriptor) of
//! its own: 4 connections × 100 stalled bodies held 400 upstream connections and ran the process
//! out of descriptors. So each request takes a place here before it is proxied. A connection's
//! first request may take any free place; its further HTTP/2 streams only one in the first half
//! of the budget, so a few multiplexing clients cannot take every place from new ones (an
//! HTTP/1.1 client has one request in flight at a time, and is never a "further" one).

use crate::metrics::{Metrics, OpenConnection, Shed};
use async_trait::async_trait;
use bytes::Bytes;
use pingora::apps::{HttpServerApp, HttpServerOptions, ReusedHttpStream};
use pingora::http::ResponseHeader;
use pingora::protocols::http::v2::server::H2Options;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What a shed request is told to wait: the places free up as fast as requests finish.
const RETRY_AFTER_SECONDS: u64 = 1;

/// The process's budget of requests in flight.
pub struct InFlight {
    places: Arc<Semaphore>,
    max: usize,
    metrics: Metrics,
}

/// A place in the budget, held while the request is served.
pub struct Place {
    _permit: OwnedSemaphorePermit,
    _gauge: OpenConnection,
}

impl InFlight {
    pub fn new(max: usize, metrics: Metrics) -> InFlight {
        InFlight {
            places: Arc::new(Semaphore::new(max)),
            max,
            metrics,
        }
    }

    /// A place for a request; `further`: its connection already has one in flight, and may
    /// only take a place while more than half the budget is free.
    pub fn admit(&self, further: bool) -> Option<Place> {
        if further && self.places.available_permits() <= self.max / 2 {
            return None;
        }
        let permit = self.places.clone().try_acquire_owned().ok()?;
        Some(Place {
            _permit: permit,
            _gauge: self.metrics.request_in_flight(),
        })
    }

    /// Answers a request the budget has no place for: 503, `Retry-After`, counted. The body is
    /// not read: an HTTP/1.1 connection is closed after it, an HTTP/2 stream ended.
    pub async fn shed(&self, session: &mut ServerSession) {
        self.metrics.shed(Shed::MaxRequestsInFlight);
        let text = "503 Service Unavailable: the proxy is serving as many requests as it may; retry shortly\n";
        let Ok(mut head) = ResponseHeader::build(503, Some(4)) else {
            return;
        };
        let fields = [
            ("content-type", "text/plain; charset=utf-8".to_string()),
            ("content-length", text.len().to_string()),
            ("retry-after", RETRY_AFTER_SECONDS.to_string()),
        ];
        for (name, value) in fields {
            if head.insert_header(name, value).is_err() {
                return;
            }
        }
        if !session.is_http2() {
            let _ = head.insert_header("connection", "close");
            session.set_keepalive(None);
        }
        let written = async {
            session.write_response_header(Box::new(head)).await?;
            session
                .write_response_body(Bytes::from_static(text.as_bytes()), true)
                .await?;
            session.finish_body().await
        };
        if let Err(e) = written.await {
            log::debug!("could not send the 503 of a shed request: {e}");
        }
    }
}

/// One client connection's requests, each admitted by the budget before `app` serves it. Made
/// per connection, so that it knows how many of the connection's streams are in flight.
pub struct Admitted<A> {
    app: Arc<A>,
    /// `None` on the admin listener, which has no budget of its own but its connection cap.
    budget: Option<Arc<InFlight>>,
    in_flight: AtomicUsize,
}

impl<A> Admitted<A> {
    pub fn new(app: Arc<A>, budget: Option<Arc<InFlight>>) -> Admitted<A> {
        Admitted {
            app,
            budget,
            in_flight: AtomicUsize::new(0),
        }
    }
}

/// Takes one of the connection's requests off its count when it ends, however it ends.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl<A> HttpServerApp for Admitted<A>
where
    A: HttpServerApp + Send + Sync + 'static,
{
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        let Some(budget) = &self.budget else {
            return self.app.process_new_http(session, shutdown).await;
        };
        let further = self.in_flight.fetch_add(1, Ordering::Relaxed) > 0;
        let _counted = Counted(&self.in_flight);
        let Some(_place) = budget.admit(further) else {
            budget.shed(&mut session).await;
            return None;
        };
        self.app.process_new_http(session, shutdown).await
    }

    fn h2_options(&self) -> Option<H2Options> {
        self.app.h2_options()
    }

    fn server_options(&self) -> Option<&HttpServerOptions> {
        self.app.server_options()
    }

    async fn http_cleanup(&self) {
        self.app.http_cleanup().await
    }
}
