//! A client connection as Pingora reads it after this proxy read the request's head (with its
//! deadlines; Pingora gets the head as its parse buffer): only as many bytes as the body has.
//!
//! Bytes past the body are the next request's (a pipelining client sends it without waiting).
//! They are held back, so Pingora neither takes them for body bytes nor, probing the connection
//! while the upstream answers, for a client that broke the protocol; the next request is read
//! from them in its turn. While bytes are held, reads still watch the socket, so a client that
//! closes is seen.
//!
//! A body's bytes must all arrive within `request_body_timeout` of the head (`body_clock`): past
//! it, a read fails, and the proxy answers 408.

use crate::body_clock::{self, ChunkedEnd};
use crate::h2_watch::{Cut, H2Watch};
use crate::head::Body;
use async_trait::async_trait;
use bytes::{Buf, BytesMut};
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, Ssl, Stream, UniqueID,
    UniqueIDType, ALPN,
};
use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// More held bytes than this (a client pipelining megabytes behind one request) is an error.
const MAX_HELD: usize = 1 << 20;

#[derive(Debug)]
pub struct ClientConn {
    inner: Stream,
    /// What may be read after the head: `None` is unbounded (chunked, tunnel).
    allowance: Option<u64>,
    /// Opened with HTTP/2's preface (h2c): said as ALPN would, so Pingora serves HTTP/2.
    h2: bool,
    /// Read from the socket but not Pingora's yet: the next request's bytes.
    held: BytesMut,
    /// How long a whole request body may take.
    request_body_timeout: Duration,
    /// While a body is being read: when it must have ended.
    deadline: Option<Pin<Box<Sleep>>>,
    /// A chunked body's end, found as it is read.
    chunked: Option<ChunkedEnd>,
    /// HTTP/2: each stream's request deadlines (`h2_watch`), and the timer of the next one.
    h2_watch: Option<(H2Watch, Pin<Box<Sleep>>)>,
}

impl ClientConn {
    /// `request_body_timeout`: how long each request body may take, whole.
    pub fn new(inner: Stream, request_body_timeout: Duration) -> ClientConn {
        ClientConn {
            inner,
            allowance: None,
            h2: false,
            held: BytesMut::new(),
            request_body_timeout,
            deadline: None,
            chunked: None,
            h2_watch: None,
        }
    }

    /// The connection is HTTP/2 from here on; `read` (its preface and what followed) is read
    /// again first. `watch` holds its streams' requests to their deadlines.
    pub fn speak_h2(&mut self, read: BytesMut, watch: H2Watch) {
        self.allowance = None;
        self.deadline = None;
        self.chunked = None;
        self.held = read;
        self.h2 = true;
        let far = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
        self.h2_watch = Some((watch, Box::pin(tokio::time::sleep_until(far))));
    }

    /// HTTP/2: cuts the requests past their deadlines (`h2_watch`); `Err` closes the
    /// connection. Then sets the timer for the next deadline.
    fn watch_streams(&mut self, cx: &mut Context<'_>) -> std::io::Result<()> {
        let Some((watch, timer)) = self.h2_watch.as_mut() else {
            return Ok(());
        };
        let now = tokio::time::Instant::now();
        match watch.cut(now) {
            None => {}
            Some(Cut::Close) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "an HTTP/2 request past its deadline, stalled mid-frame",
                ))
            }
            Some(Cut::Inject(frames)) => {
                let mut injected = BytesMut::from(&frames[..]);
                injected.extend_from_slice(&self.held);
                self.held = injected;
            }
        }
        if let Some(next) = watch.next_deadline() {
            if timer.deadline() != next {
                timer.as_mut().reset(next);
            }
            // Registers the wake-up; fired already, the next read cuts.
            if timer.as_mut().poll(cx).is_ready() {
                cx.waker().wake_by_ref();
            }
        }
        Ok(())
    }

    /// Bytes already read for the next head (pipelined behind the last request).
    pub fn take_held(&mut self) -> BytesMut {
        std::mem::take(&mut self.held)
    }

    /// The socket itself, for reading the next head.
    pub fn socket(&mut self) -> &mut Stream {
        &mut self.inner
    }

    /// The next request, whose head was read: after it, the body as `body` frames it; `rest` came
    /// after the head on the same reads.
    pub fn next_request(&mut self, body: Body, rest: BytesMut) {
        self.allowance = match body {
            Body::Length(n) => Some(n),
            Body::Chunked | Body::Tunnel => None,
        };
        self.chunked = (body == Body::Chunked).then(ChunkedEnd::default);
        // A tunnel's bytes are the upstream's conversation, not a body: no deadline.
        let timed = matches!(body, Body::Length(1..) | Body::Chunked);
        self.deadline = timed.then(|| Box::pin(tokio::time::sleep(self.request_body_timeout)));
        self.held = rest;
    }

    /// A body read past the deadline fails; `Some` is that failure.
    fn past_deadline(&mut self, cx: &mut Context<'_>) -> Option<std::io::Error> {
        let deadline = self.deadline.as_mut()?;
        deadline
            .as_mut()
            .poll(cx)
            .is_ready()
            .then(body_clock::expired)
    }

    /// `read` bytes of the body went to Pingora: the deadline ends with the body.
    fn body_read(&mut self, read: &[u8]) {
        let ended = match (&mut self.chunked, self.allowance) {
            (Some(chunks), _) => chunks.feed(read),
            (None, Some(left)) => left == 0,
            (None, None) => false,
        };
        if ended {
            self.deadline = None;
            self.chunked = None;
        }
    }
}

impl AsyncRead for ClientConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if let Some(expired) = this.past_deadline(cx) {
            return Poll::Ready(Err(expired));
        }
        if this.h2_watch.is_some() {
            return this.poll_read_h2(cx, buf);
        }
        let allowed = this
            .allowance
            .map_or(usize::MAX, |a| usize::try_from(a).unwrap_or(usize::MAX));
        if allowed > 0 {
            let before = buf.filled().len();
            let n = if !this.held.is_empty() {
                let n = this.held.len().min(buf.remaining()).min(allowed);
                buf.put_slice(&this.held[..n]);
                this.held.advance(n);
                n
            } else {
                let room = buf.remaining().min(allowed);
                let mut limited = buf.take(room);
                match Pin::new(&mut this.inner).poll_read(cx, &mut limited) {
                    Poll::Ready(Ok(())) => {}
                    other => return other,
                }
                let n = limited.filled().len();
                // SAFETY: the inner read initialized the first `n` bytes of `buf`'s unfilled part,
                // which `limited` borrowed.
                unsafe { buf.assume_init(n) };
                buf.advance(n);
                n
            };
            if let Some(a) = this.allowance.as_mut() {
                *a -= n as u64;
            }
            if this.deadline.is_some() {
                this.body_read(&buf.filled()[before..before + n]);
            }
            return Poll::Ready(Ok(()));
        }
        // The body is complete: whatever comes now belongs to the next request. Keep it, and
        // answer like an idle socket: pending while the client is there, end of file once gone.
        let mut scratch = [MaybeUninit::<u8>::uninit(); 4096];
        loop {
            let mut read = ReadBuf::uninit(&mut scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if read.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {
                    if this.held.len() + read.filled().len() > MAX_HELD {
                        return Poll::Ready(Err(std::io::Error::other(
                            "more than 1 MiB pipelined behind one request",
                        )));
                    }
                    this.held.extend_from_slice(read.filled());
                }
                other => return other,
            }
        }
    }
}

impl ClientConn {
    /// A read of an HTTP/2 connection: frames injected to cut a stream first, then the client's
    /// bytes, each seen by the watch.
    fn poll_read_h2(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Err(e) = self.watch_streams(cx) {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        if !self.held.is_empty() {
            let n = self.held.len().min(buf.remaining());
            buf.put_slice(&self.held[..n]);
            self.held.advance(n);
        } else {
            match Pin::new(&mut self.inner).poll_read(cx, buf) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
        }
        // Injected bytes are seen too: they are whole frames, and keep the count of frames
        // aligned with what `h2` reads.
        if let Some((watch, _)) = self.h2_watch.as_mut() {
            watch.client_sent(&buf.filled()[before..], tokio::time::Instant::now());
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ClientConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let (Poll::Ready(Ok(n)), Some((watch, _))) = (&written, this.h2_watch.as_mut()) {
            watch.server_sent(&buf[..*n]);
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let (Poll::Ready(Ok(n)), Some((watch, _))) = (&written, this.h2_watch.as_mut()) {
            let mut left = *n;
            for b in bufs {
                let take = left.min(b.len());
                watch.server_sent(&b[..take]);
                left -= take;
                if left == 0 {
                    break;
                }
            }
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for ClientConn {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for ClientConn {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for ClientConn {
    fn get_ssl(&self) -> Option<&pingora::protocols::tls::TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        if self.h2 {
            return Some(ALPN::H2);
        }
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for ClientConn {
    fn get_timing_digest(&self) -> Vec<Option<pingora::protocols::TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> std::time::Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> std::time::Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for ClientConn {
    fn get_proxy_digest(&self) -> Option<Arc<pingora::protocols::raw_connect::ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: pingora::protocols::raw_connect::ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for ClientConn {
    fn get_socket_digest(&self) -> Option<Arc<pingora::protocols::SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: pingora::protocols::SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for ClientConn {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}
