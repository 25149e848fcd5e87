//! The admin listener: `/metrics`, `/healthz`, `/readyz`, and the admin API (`/v1/…`, answered
//! by `console`). A separate address, so the proxy listener never exposes them to clients; `guard`
//! keeps it for operators (Host check, security headers, the store calls it may make at once).

mod guard;

pub use guard::{security_header_lines, HostCheck};
use guard::{security_headers, StoreCalls};

use crate::console;
use crate::deny_cache::DenyCache;
use crate::limiter::Limiter;
use crate::metrics::{self, Metrics};
use crate::reload::{LivePlan, Reloader};
use crate::tls::Resolvers;
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
    /// The running config and its last reload, for `/v1/routes` and `/v1/buckets`.
    reloader: Arc<Reloader>,
    /// What a reset forgets on this proxy too (with Redis).
    deny_cache: Option<Arc<DenyCache>>,
    /// Mutating calls need it as `Authorization: Bearer …`; without one they are refused.
    token: Option<String>,
    metrics: Metrics,
    resolvers: Resolvers,
    hosts: HostCheck,
    store_calls: StoreCalls,
}

/// What the admin listener is given besides the store.
pub struct AdminParts {
    pub registry: Registry,
    pub metrics: Metrics,
    pub resolvers: Resolvers,
    pub plan: LivePlan,
    pub reloader: Arc<Reloader>,
    pub deny_cache: Option<Arc<DenyCache>>,
    pub token: Option<String>,
    pub hosts: HostCheck,
}

impl<L> Admin<L> {
    pub fn new(limiter: Arc<L>, parts: AdminParts) -> Self {
        Admin {
            registry: parts.registry,
            limiter,
            plan: parts.plan,
            reloader: parts.reloader,
            deny_cache: parts.deny_cache,
            token: parts.token,
            metrics: parts.metrics,
            resolvers: parts.resolvers,
            hosts: parts.hosts,
            store_calls: StoreCalls::default(),
        }
    }

    /// Whether the request carries the admin token: 401 without it, 403 when none is set.
    fn authorize(&self, session: &ServerSession) -> Result<(), (StatusCode, String)> {
        let Some(token) = &self.token else {
            return Err((
                StatusCode::FORBIDDEN,
                "mutating calls are off: set admin.token_env to the name of a variable holding a \
                 token\n"
                    .into(),
            ));
        };
        let given = session
            .req_header()
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        match given {
            Some(given) if same(given.as_bytes(), token.as_bytes()) => Ok(()),
            _ => Err((
                StatusCode::UNAUTHORIZED,
                "this call needs Authorization: Bearer <the admin token>\n".into(),
            )),
        }
    }
}

/// The status page: one self-contained file (no CDN, no external font) that polls the JSON
/// endpoints.
const STATUS_PAGE: &str = include_str!("../status.html");

/// Equal, in a time that does not say where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

impl<L: Limiter> Admin<L> {
    /// `GET /v1/buckets`: each bucket as the store holds it now, read without writing.
    async fn buckets(&self, query: &str) -> (StatusCode, String) {
        let (config, _, _) = self.reloader.snapshot();
        let (route, targets) = match console::targets(&config, query) {
            Ok(found) => found,
            Err(why) => return (StatusCode::BAD_REQUEST, format!("{why}\n")),
        };
        let mut limits = Vec::with_capacity(targets.len());
        for t in &targets {
            match self.limiter.inspect(&t.store_key).await {
                Ok(read) => limits.push(console::bucket(t, &read)),
                Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}\n")),
            }
        }
        let body = serde_json::json!({ "route": route, "limits": limits });
        (StatusCode::OK, format!("{body:#}\n"))
    }

    /// `DELETE /v1/buckets`: the buckets forgotten (full again), and this proxy's remembered
    /// denials of them with them.
    async fn reset(&self, query: &str) -> (StatusCode, String) {
        let (config, _, _) = self.reloader.snapshot();
        let (route, targets) = match console::targets(&config, query) {
            Ok(found) => found,
            Err(why) => return (StatusCode::BAD_REQUEST, format!("{why}\n")),
        };
        let mut reset = Vec::with_capacity(targets.len());
        for t in &targets {
            let existed = match self.limiter.reset(&t.store_key).await {
                Ok(existed) => existed,
                Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}\n")),
            };
            if let Some(cache) = &self.deny_cache {
                cache.forget_key(&t.store_key);
            }
            let plan = self.plan.load();
            let shown = plan
                .routes
                .iter()
                .find(|r| r.name == route)
                .map_or_else(|| "?".to_string(), |r| console::shown_key(r, &t.store_key));
            log::info!(
                "admin: reset bucket {shown} (route {route}, limit {})",
                t.limit
            );
            reset.push(serde_json::json!({
                "limit": t.limit,
                "store_key": t.store_key,
                "existed": existed,
            }));
        }
        let body = serde_json::json!({
            "route": route,
            "reset": reset,
            "note": "other proxies answer denials they remember of these buckets until each one's retry instant",
        });
        (StatusCode::OK, format!("{body:#}\n"))
    }

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
        let query = session.req_header().uri.query().unwrap_or("").to_string();
        let method = session.req_header().method.clone();
        let json = |(status, body): (StatusCode, String)| {
            let kind = if status == StatusCode::OK {
                "application/json"
            } else {
                "text/plain"
            };
            (status, kind, body)
        };
        let req = session.req_header();
        let host = req
            .headers
            .get(header::HOST)
            .map(|h| h.as_bytes())
            .or_else(|| req.uri.authority().map(|a| a.as_str().as_bytes()));
        let local = session.server_addr().and_then(|a| a.as_inet()).copied();
        let probe = matches!(path.as_str(), "/healthz" | "/readyz");
        let store_call = path == "/v1/buckets"
            && (method == http::Method::GET || method == http::Method::DELETE);
        // A store call's place, held until its answer is built.
        let mut place = None;
        let refused = if !probe && !self.hosts.allows(host, local) {
            Some((
                StatusCode::MISDIRECTED_REQUEST,
                "text/plain",
                "this admin port answers only to its own address, localhost with its port, or a \
                 name in admin.allowed_hosts\n"
                    .to_string(),
            ))
        } else if store_call {
            place = self.store_calls.try_enter();
            place.is_none().then(|| {
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    "text/plain",
                    format!(
                        "{} bucket calls are under way, the most the admin makes at once: retry \
                         in a second\n",
                        guard::STORE_CALLS
                    ),
                )
            })
        } else {
            None
        };
        let (status, content_type, body) = match refused {
            Some(refused) => refused,
            None => match path.as_str() {
                "/v1/buckets" if method == http::Method::GET => json(self.buckets(&query).await),
                "/v1/buckets" if method == http::Method::DELETE => match self.authorize(session) {
                    Ok(()) => json(self.reset(&query).await),
                    Err((status, why)) => (status, "text/plain", why),
                },
                "/" => (
                    StatusCode::OK,
                    "text/html; charset=utf-8",
                    STATUS_PAGE.to_string(),
                ),
                "/v1/status" => {
                    let (config, hash, last) = self.reloader.snapshot();
                    let body = console::status(
                        &self.plan.load(),
                        (&config, &hash, &last),
                        &self.metrics,
                        &self.resolvers.expiries(),
                    );
                    (StatusCode::OK, "application/json", format!("{body:#}\n"))
                }
                "/v1/top" => {
                    let now = crate::clock::Clock::now_us(&crate::clock::SystemClock);
                    match console::top(&self.plan.load(), &query, now) {
                        Ok(body) => (StatusCode::OK, "application/json", format!("{body:#}\n")),
                        Err(why) => (StatusCode::BAD_REQUEST, "text/plain", format!("{why}\n")),
                    }
                }
                "/v1/buckets" => (
                    StatusCode::METHOD_NOT_ALLOWED,
                    "text/plain",
                    "GET or DELETE\n".to_string(),
                ),
                "/metrics" => (
                    StatusCode::OK,
                    "text/plain; version=0.0.4",
                    metrics::render(&self.registry),
                ),
                "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
                "/v1/routes" => {
                    let (config, hash, last) = self.reloader.snapshot();
                    let body = console::routes(&config, &hash, &last);
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
                    "not found: try /metrics, /healthz, /readyz, /v1/routes or /v1/buckets\n"
                        .to_string(),
                ),
            },
        };
        let mut response = Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, content_type)
            .header(header::CONTENT_LENGTH, body.len());
        for (name, value) in security_headers() {
            response = response.header(name, value);
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            response = response.header(header::RETRY_AFTER, "1");
        }
        drop(place);
        response.body(body.into_bytes()).unwrap_or_default()
    }
}
