//! Client connections: how many, how long each may take, and the head of each request read here
//! before Pingora parses it.
//!
//! Pingora times a request head out per read (one byte a minute keeps a head open forever), keeps
//! an HTTP/1.1 connection alive without limit, and has no cap on connections. So each connection
//! passes through here: over `max_connections` it is closed at accept; each head must arrive
//! whole within `header_timeout` (from the connection's start for its first request, from its
//! first byte after that), a kept-alive connection may idle for `idle_timeout`, and each body
//! read waits at most `body_timeout`. Pingora then parses a head that is already in memory.

use crate::canonical::Refused;
use crate::client_conn::ClientConn;
use crate::config::Downstream;
use crate::h2_watch::H2Watch;
use crate::handshake::Handshakes;
use crate::head;
use crate::inflight::{Admitted, InFlight};
use crate::metrics::{Closed, Metrics};
use crate::shed::{Waiter, Waiting};
use async_trait::async_trait;
use bytes::BytesMut;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::{Stream, ALPN};
use pingora::server::ShutdownWatch;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// Pingora's own limit on a request head.
const MAX_HEAD: usize = 1 << 20;
/// What a head is read into at first, as Pingora does: most heads fit.
const HEAD_BUFFER: usize = 4096;

/// HTTP/2's connection preface (RFC 9113 §3.4): what a client sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Its first line and the blank line after it, which read like a whole HTTP/1.1 head.
const H2_PREFACE_HEAD: &[u8] = b"PRI * HTTP/2.0\r\n\r\n";

pub struct Connections<A> {
    app: Arc<A>,
    limits: Downstream,
    /// Listeners (`h2c: true`) where a connection may open with HTTP/2's preface.
    h2c: Vec<SocketAddr>,
    open: Arc<Semaphore>,
    /// Requests in flight, HTTP/2 streams included (`inflight`); `None` for the admin listener.
    in_flight: Option<Arc<InFlight>>,
    /// TLS connections under way, which took their place under the cap before their handshake.
    handshakes: Option<Arc<Handshakes>>,
    /// `None` for the admin listener: its connections are not the clients' the metrics describe.
    metrics: Option<Metrics>,
    /// The admin listener's connections waiting for a head: at the cap, the oldest is shed for a
    /// newcomer (`shed`), so a flood of idle connections cannot turn health probes away.
    waiting: Option<Arc<Waiting>>,
    /// Header lines the answers written here carry besides their own (the admin's security
    /// headers).
    extra_headers: String,
}

/// How long a newcomer waits for the place of the connection it shed.
const SHED_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Connections the admin listener keeps at most: a few scrapers and health checks need it.
pub const ADMIN_CONNECTIONS: usize = 256;

impl<A> Connections<A> {
    /// The proxy listeners' clients, counted in the metrics.
    pub fn new(app: A, limits: Downstream, metrics: Metrics) -> Connections<A> {
        Connections::with(app, limits, Some(metrics))
    }

    /// The admin listener: the same deadlines, [`ADMIN_CONNECTIONS`] of which the oldest waiting
    /// for a head is shed for a newcomer, not counted; `extra_headers` on the answers written here.
    pub fn admin(app: A, limits: Downstream, extra_headers: String) -> Connections<A> {
        let limits = Downstream {
            max_connections: ADMIN_CONNECTIONS,
            ..limits
        };
        Connections {
            waiting: Some(Arc::default()),
            extra_headers,
            ..Connections::with(app, limits, None)
        }
    }

    fn with(app: A, limits: Downstream, metrics: Option<Metrics>) -> Connections<A> {
        Connections {
            app: Arc::new(app),
            open: Arc::new(Semaphore::new(limits.max_connections)),
            in_flight: metrics
                .clone()
                .map(|m| Arc::new(InFlight::new(limits.max_requests_in_flight, m))),
            limits,
            h2c: Vec::new(),
            handshakes: None,
            metrics,
            waiting: None,
            extra_headers: String::new(),
        }
    }

    /// The same clients served by another worker's `app`: one budget of open connections for
    /// all.
    pub fn sharing<B>(&self, app: B) -> Connections<B> {
        Connections {
            app: Arc::new(app),
            limits: self.limits,
            h2c: self.h2c.clone(),
            open: self.open.clone(),
            in_flight: self.in_flight.clone(),
            handshakes: self.handshakes.clone(),
            metrics: self.metrics.clone(),
            waiting: self.waiting.clone(),
            extra_headers: self.extra_headers.clone(),
        }
    }

    /// How many client connections are open now.
    pub fn open_count(&self) -> crate::drain::OpenCount {
        let open = self.open.clone();
        let max = self.limits.max_connections;
        Arc::new(move || max.saturating_sub(open.available_permits()))
    }

    /// The TLS listeners' pre-handshake gate (`handshake`): TLS connections take their place
    /// under the cap at accept, and have their handshake cut at `header_timeout`. `None` for the
    /// admin listener (cleartext).
    pub fn tls_gate(&mut self) -> Option<crate::handshake::Gate> {
        let metrics = self.metrics.clone()?;
        let handshakes = self.handshakes.get_or_insert_with(|| {
            Handshakes::new(self.open.clone(), self.limits.header_timeout, metrics)
        });
        Some(crate::handshake::Gate(handshakes.clone()))
    }

    /// Cleartext HTTP/2 with prior knowledge is accepted on these listeners too.
    pub fn with_h2c(mut self, listeners: Vec<SocketAddr>) -> Connections<A> {
        self.h2c = listeners;
        self
    }

    /// Whether `stream` came in through an `h2c` listener.
    fn accepts_h2c(&self, stream: &Stream) -> bool {
        if self.h2c.is_empty() {
            return false;
        }
        let local = stream
            .get_socket_digest()
            .and_then(|d| d.local_addr().and_then(|a| a.as_inet().copied()));
        local.is_some_and(|local| {
            self.h2c.iter().any(|l| {
                // 0.0.0.0 takes IPv4 only; [::] may take both (dual stack).
                let any = l.ip().is_unspecified() && (l.is_ipv6() || local.is_ipv4());
                l.port() == local.port() && (any || l.ip() == local.ip())
            })
        })
    }

    fn count(&self, why: Closed) {
        if let Some(m) = &self.metrics {
            m.connection_closed(why);
        }
    }
}

/// What a connection opened with.
enum Head {
    /// An HTTP/1.x request head, whole.
    Http1(BytesMut),
    /// HTTP/2's preface on an `h2c` listener, and whatever came with it.
    Http2(BytesMut),
}

/// How reading a head ended, when it did not yield one.
enum NoHead {
    /// The client closed (or reset) between requests: nothing to say.
    Gone,
    /// Closed mid-head, or the socket failed.
    Reset,
    /// A kept-alive connection sent nothing for `idle_timeout`.
    Idle,
    /// The head did not arrive whole in time; `true` when some of it had.
    Slow(bool),
    TooLarge,
    Refused(Refused),
    /// An HTTP/2 connection that did not open with HTTP/2's preface.
    NotHttp2,
    ShuttingDown,
    /// Shed for a newcomer at the cap (the admin listener).
    Shed,
}

#[async_trait]
impl<A> ServerApp for Connections<A>
where
    A: HttpServerApp + Send + Sync + 'static,
{
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let started = Instant::now();
        // A TLS connection took its place before its handshake (`handshake`).
        let claimed = match (&self.handshakes, stream.get_ssl_digest()) {
            (Some(handshakes), Some(_)) => stream
                .get_socket_digest()
                .and_then(|d| d.socket_cookie().ok())
                .and_then(|cookie| handshakes.claim(cookie)),
            _ => None,
        };
        let place = match claimed {
            Some(place) => Some(place),
            None => self.place().await,
        };
        let Some(_permit) = place else {
            // Dropping the stream closes it: no fd or task is held for a client over the cap.
            self.count(Closed::MaxConnections);
            return None;
        };
        let _open = self.metrics.as_ref().map(Metrics::connection_open);
        let alpn_h2 = matches!(stream.selected_alpn_proto(), Some(ALPN::H2));
        let h2c = !alpn_h2 && self.accepts_h2c(&stream);
        let mut conn = Box::new(ClientConn::new(stream, self.limits.request_body_timeout));
        // Each request takes a place in the process's budget of requests in flight.
        let app = Arc::new(Admitted::new(self.app.clone(), self.in_flight.clone()));
        if alpn_h2 {
            // HTTP/2 negotiated by ALPN on a TLS listener.
            return self
                .serve_h2(&app, conn, BytesMut::with_capacity(64), started, shutdown)
                .await;
        }
        let mut settings = None;
        let mut first = true;
        loop {
            let head = match self
                .read_head(&mut conn, first, first && h2c, started, shutdown)
                .await
            {
                Ok(Head::Http1(head)) => head,
                Ok(Head::Http2(read)) => {
                    return self.serve_h2(&app, conn, read, started, shutdown).await
                }
                Err(end) => {
                    self.close(&mut conn, end).await;
                    return None;
                }
            };
            let mut session = ServerSession::new_http1(conn);
            // Pingora parses the head from this buffer without reading the socket again.
            session.set_pipelined_prefix(head);
            match settings.take() {
                Some(previous) => {
                    pingora::apps::HttpPersistentSettings::apply_to_session(previous, &mut session)
                }
                None => {
                    // Any timeout: it only says "reuse"; the next head is read here, not by
                    // Pingora. Pingora counts the reuses left down from this.
                    session.set_keepalive(Some(self.limits.idle_timeout.as_secs().max(1)));
                    session.set_keepalive_reuses_remaining(Some(
                        self.limits.max_requests_per_connection - 1,
                    ));
                }
            }
            if *shutdown.borrow() {
                session.set_keepalive(None);
            }
            session.set_read_timeout(Some(self.limits.body_timeout));
            let reused = app.process_new_http(session, shutdown).await?;
            let (stream, next) = reused.consume();
            conn = stream.into_any().downcast::<ClientConn>().ok()?;
            settings = next;
            first = false;
        }
    }

    async fn cleanup(&self) {
        self.app.http_cleanup().await
    }
}

impl<A> Connections<A>
where
    A: HttpServerApp + Send + Sync + 'static,
{
    /// Serves an HTTP/2 connection with Pingora's own HTTP/2 server, which frames each request
    /// itself; the connection still holds its place under the cap. Its preface must arrive whole
    /// within `header_timeout` first: Pingora's handshake has no deadline, and its idle timeout
    /// starts only after it, so half a preface would hold the place for ever.
    async fn serve_h2(
        &self,
        app: &Arc<Admitted<A>>,
        mut conn: Box<ClientConn>,
        read: BytesMut,
        started: Instant,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        match self.read_preface(&mut conn, read, started, shutdown).await {
            Ok(read) => {
                // Pingora's HTTP/2 server reads the preface again from what was read here.
                let watch = H2Watch::new(
                    self.limits.body_timeout,
                    self.limits.request_body_timeout,
                    self.metrics.clone(),
                );
                conn.speak_h2(read, watch);
                ServerApp::process_new(app, conn, shutdown).await
            }
            Err(end) => {
                self.close(&mut conn, end).await;
                None
            }
        }
    }
}

impl<A> Connections<A> {
    /// A place under the cap: free, or (on the admin listener) the one of the connection that has
    /// waited longest for its head, shed for this one.
    async fn place(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if let Ok(permit) = self.open.clone().try_acquire_owned() {
            return Some(permit);
        }
        let waiting = self.waiting.as_ref()?;
        if !waiting.shed_oldest() {
            return None;
        }
        let freed = self.open.clone().acquire_owned();
        tokio::time::timeout(SHED_WAIT, freed).await.ok()?.ok()
    }

    /// Reads HTTP/2's preface whole (after `read`, what was read already) by the first head's
    /// deadline.
    async fn read_preface(
        &self,
        conn: &mut ClientConn,
        mut buf: BytesMut,
        started: Instant,
        shutdown: &ShutdownWatch,
    ) -> Result<BytesMut, NoHead> {
        let deadline = started + self.limits.header_timeout;
        let mut shutdown = shutdown.clone();
        let waiter = self.waiting.as_ref().map(Waiting::enter);
        while buf.len() < H2_PREFACE.len() {
            match read_until(conn, &mut buf, deadline, &mut shutdown, waiter.as_ref()).await? {
                // No HTTP/1.1 408 for an HTTP/2 client: closed, counted as a slow head.
                Err(_) => return Err(NoHead::Slow(false)),
                Ok(Ok(0)) | Ok(Err(_)) if buf.is_empty() => return Err(NoHead::Gone),
                Ok(Ok(0)) | Ok(Err(_)) => return Err(NoHead::Reset),
                Ok(Ok(_)) => {}
            }
        }
        if !buf.starts_with(H2_PREFACE) {
            return Err(NoHead::NotHttp2);
        }
        Ok(buf)
    }

    /// Reads the next request head within its deadlines; `conn` is told how long the body after
    /// it is. With `h2c`, HTTP/2's preface is taken as well as a head.
    async fn read_head(
        &self,
        conn: &mut ClientConn,
        first: bool,
        h2c: bool,
        started: Instant,
        shutdown: &ShutdownWatch,
    ) -> Result<Head, NoHead> {
        let mut buf = conn.take_held();
        if buf.is_empty() {
            buf = BytesMut::with_capacity(HEAD_BUFFER);
        }
        // The first head is due `header_timeout` after the connection opened; a later one after
        // its first byte, which a kept-alive connection may wait `idle_timeout` for.
        let mut deadline = match (first, buf.is_empty()) {
            (true, _) => Some(started + self.limits.header_timeout),
            (false, false) => Some(Instant::now() + self.limits.header_timeout),
            (false, true) => None,
        };
        let idle_until = Instant::now() + self.limits.idle_timeout;
        let mut shutdown = shutdown.clone();
        let waiter = self.waiting.as_ref().map(Waiting::enter);
        let mut from = 0;
        loop {
            if let Some(end) = head::end(&buf, from) {
                if h2c && buf.starts_with(H2_PREFACE_HEAD) {
                    return Ok(Head::Http2(buf));
                }
                // Most heads come alone: no split, which would share the buffer (an allocation).
                let rest = if end < buf.len() {
                    buf.split_off(end)
                } else {
                    BytesMut::new()
                };
                let body = head::inspect(&buf).map_err(NoHead::Refused)?;
                conn.next_request(body, rest);
                return Ok(Head::Http1(buf));
            }
            if buf.len() > MAX_HEAD {
                return Err(NoHead::TooLarge);
            }
            from = head::resume_at(&buf);
            let until = deadline.unwrap_or(idle_until);
            match read_until(conn, &mut buf, until, &mut shutdown, waiter.as_ref()).await? {
                Err(_) if deadline.is_none() => return Err(NoHead::Idle),
                Err(_) => {
                    return Err(NoHead::Slow(
                        !buf.iter().all(|b| matches!(b, b'\r' | b'\n')),
                    ))
                }
                Ok(Ok(0)) | Ok(Err(_)) if buf.is_empty() => return Err(NoHead::Gone),
                Ok(Ok(0)) | Ok(Err(_)) => return Err(NoHead::Reset),
                Ok(Ok(_)) => {
                    if deadline.is_none() {
                        deadline = Some(Instant::now() + self.limits.header_timeout);
                    }
                }
            }
        }
    }

    /// Ends a connection that yielded no head: counted, answered where HTTP has an answer.
    async fn close(&self, conn: &mut ClientConn, end: NoHead) {
        let answer: Option<(&str, &str)> = match end {
            NoHead::Gone | NoHead::ShuttingDown | NoHead::Shed => None,
            NoHead::NotHttp2 => {
                log::debug!("closed an HTTP/2 connection that did not open with the preface");
                None
            }
            NoHead::Reset => {
                self.count(Closed::ClientReset);
                None
            }
            NoHead::Idle => {
                self.count(Closed::IdleTimeout);
                None
            }
            NoHead::Slow(started) => {
                self.count(Closed::HeaderTimeout);
                started.then_some(("408 Request Timeout", "the request head took too long"))
            }
            NoHead::TooLarge => Some((
                "431 Request Header Fields Too Large",
                "the request head is larger than 1 MiB",
            )),
            NoHead::Refused(why) => {
                if let Some(m) = &self.metrics {
                    m.refused(why);
                }
                log::debug!("refused a request: {}", why.explain());
                Some(("400 Bad Request", why.explain()))
            }
        };
        let socket = conn.socket();
        if let Some((status, text)) = answer {
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n{text}\n",
                text.len() + 1,
                self.extra_headers
            );
            let write = async {
                socket.write_all(response.as_bytes()).await?;
                socket.flush().await
            };
            // A client that does not read its answer does not hold the connection.
            let _ = tokio::time::timeout(self.limits.header_timeout, write).await;
        }
        let _ = tokio::time::timeout(
            self.limits.header_timeout,
            pingora::protocols::Shutdown::shutdown(&mut **socket),
        )
        .await;
    }
}

/// One read of the client into `buf`, given up at `until` (`Err(_)` inside: timed out), at
/// shutdown, or when `waiter` is shed. Pingora's timeout, not tokio's: it makes a timer only if the read has to wait, and
/// shares coarse ones instead of waking the runtime's timer driver for each (strace counted 0.3
/// more futex calls per request with tokio's).
async fn read_until(
    conn: &mut ClientConn,
    buf: &mut BytesMut,
    until: Instant,
    shutdown: &mut ShutdownWatch,
    waiter: Option<&Waiter>,
) -> Result<Result<std::io::Result<usize>, pingora::time::Elapsed>, NoHead> {
    let left = until.saturating_duration_since(Instant::now());
    let shed = async {
        match waiter {
            Some(w) => w.shed.notified().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        _ = shutdown.changed() => Err(NoHead::ShuttingDown),
        _ = shed => Err(NoHead::Shed),
        read = pingora::time::timeout(left, conn.socket().read_buf(buf)) => Ok(read),
    }
}

/// Descriptors kept for everything but client and upstream connections: listeners, the admin
/// port's connections, Redis, health checks, the log.
pub const FD_RESERVE: u64 = 100;

/// Makes room for `limits` in the file-descriptor limit: each client connection is one, each
/// request in flight may hold an upstream connection too, and `FD_RESERVE` are kept for the
/// rest; at the limit new connections fail at accept (Pingora then pauses accepting for a
/// second) and Redis and the admin port could find none. The soft limit is raised as far as
/// the hard one allows (as Go's runtime does). Where it is still too low, the requests in flight
/// (then, if need be, the connections) are lowered to fit, so that the reserve stays free; the
/// warning says so.
pub fn fit_to_fds(limits: Downstream) -> (Downstream, Option<String>) {
    let needed = fds_needed(&limits);
    let Some(have) = raise_fd_limit(needed) else {
        return (limits, None);
    };
    if have >= needed {
        return (limits, None);
    }
    let room = have.saturating_sub(FD_RESERVE).max(2);
    let connections = (limits.max_connections as u64).min(room - 1);
    let in_flight = (limits.max_requests_in_flight as u64).min(room - connections);
    let fitted = Downstream {
        max_connections: connections as usize,
        max_requests_in_flight: in_flight as usize,
        ..limits
    };
    let warning = format!(
        "downstream.max_connections is {}, which may need {needed} file descriptors (a client \
         connection each, an upstream connection for each of {} requests in flight, and {} to \
         spare), but the limit is {have} (ulimit -n): serving at most {connections} connections \
         and {in_flight} requests in flight; raise the limit, or lower max_connections",
        limits.max_connections, limits.max_requests_in_flight, FD_RESERVE
    );
    (fitted, Some(warning))
}

/// Raises the soft limit on open files up to `needed` (at most the hard limit); what it is then.
fn raise_fd_limit(needed: u64) -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur < needed {
        let raised = libc::rlimit {
            rlim_cur: needed.min(limit.rlim_max),
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given; raising the soft limit up to the hard
        // one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = raised.rlim_cur;
        }
    }
    Some(limit.rlim_cur)
}

/// File descriptors `limits` may need: a client connection each, an upstream connection per
/// request in flight, and `FD_RESERVE` for listeners, Redis and the rest.
pub fn fds_needed(limits: &Downstream) -> u64 {
    limits.max_connections as u64 + limits.max_requests_in_flight as u64 + FD_RESERVE
}
