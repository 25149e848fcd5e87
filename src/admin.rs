//! The admin listener: `/metrics`, `/healthz`, `/readyz`. A separate address, so the proxy
//! listener never exposes them to clients.

use crate::limiter::Limiter;
use crate::metrics;
use async_trait::async_trait;
use http::{header, Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use prometheus::Registry;
use std::sync::Arc;

pub struct Admin<L> {
    registry: Registry,
    limiter: Arc<L>,
    /// Some route fails closed: then the proxy is not ready while the store is unreachable.
    needs_store: bool,
}

impl<L> Admin<L> {
    pub fn new(registry: Registry, limiter: Arc<L>, needs_store: bool) -> Self {
        Admin {
            registry,
            limiter,
            needs_store,
        }
    }
}

#[async_trait]
impl<L: Limiter> ServeHttp for Admin<L> {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let path = session.req_header().uri.path().to_string();
        let (status, content_type, body) = match path.as_str() {
            "/metrics" => (
                StatusCode::OK,
                "text/plain; version=0.0.4",
                metrics::render(&self.registry),
            ),
            "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
            "/readyz" => match (self.needs_store, self.limiter.ping().await) {
                (true, Err(e)) => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!("not ready: rate-limit store: {e}\n"),
                ),
                _ => (StatusCode::OK, "text/plain", "ready\n".to_string()),
            },
            _ => (
                StatusCode::NOT_FOUND,
                "text/plain",
                "not found: try /metrics, /healthz or /readyz\n".to_string(),
            ),
        };
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, content_type)
            .header(header::CONTENT_LENGTH, body.len())
            .body(body.into_bytes())
            .unwrap_or_default()
    }
}
