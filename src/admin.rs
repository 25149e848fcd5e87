//! The admin listener: `/metrics`, `/healthz`, `/readyz`, and the admin API (`/v1/…`, answered
//! by `console`). A separate address, so the proxy listener never exposes them to clients.

use crate::limiter::Limiter;
use crate::metrics;
use crate::reload::{LivePlan, Reloader};
use async_trait::async_trait;
use http::{header, Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use prometheus::Registry;
use std::sync::Arc;

pub struct Admin<L> {
    registry: Registry,
    limiter: Arc<L>,
    /// Read per `/readyz`: whether a route fails closed can change with a reload.
    plan: LivePlan,
    /// The running config and its last reload, for `/v1/routes`.
    reloader: Arc<Reloader>,
}

impl<L> Admin<L> {
    pub fn new(
        registry: Registry,
        limiter: Arc<L>,
        plan: LivePlan,
        reloader: Arc<Reloader>,
    ) -> Self {
        Admin {
            registry,
            limiter,
            plan,
            reloader,
        }
    }
}

impl<L: Limiter> Admin<L> {
    /// Ready when the store answers, or when no route needs it to (every limited route fails
    /// open, or there is nothing to limit): then the store is not asked at all.
    async fn readiness(&self) -> Result<(), crate::limiter::LimiterError> {
        if self.plan.load().needs_store() {
            self.limiter.ping().await
        } else {
            Ok(())
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
            "/v1/routes" => {
                let (config, hash, last) = self.reloader.snapshot();
                let body = crate::console::routes(&config, &hash, &last);
                (StatusCode::OK, "application/json", format!("{body:#}\n"))
            }
            "/readyz" => match self.readiness().await {
                Ok(()) => (StatusCode::OK, "text/plain", "ready\n".to_string()),
                Err(e) => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!("not ready: rate-limit store: {e}\n"),
                ),
            },
            _ => (
                StatusCode::NOT_FOUND,
                "text/plain",
                "not found: try /metrics, /healthz, /readyz or /v1/routes\n".to_string(),
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
