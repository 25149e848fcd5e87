//! Prometheus metrics with typed methods, so names and labels live here alone and label values
//! stay bounded (route names and fixed words — never a client key).

use crate::canonical::Refused;
use crate::top::TopKeys;
use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

words! {
    /// What happened to a request, as the `decision` label spells it.
    pub enum Outcome {
        Allowed = "allowed",
        Rejected = "rejected",
        FailOpen = "fail_open",
        FailClosed = "fail_closed",
        /// Redis failed; the in-process fallback bucket allowed it.
        LocalFallback = "local_fallback",
        /// Redis failed; the in-process fallback bucket rejected it.
        LocalRejected = "local_rejected",
        /// A shadow limit would have rejected it; it was let through.
        ShadowRejected = "shadow_rejected",
        /// The route's allowlist let it skip the limits.
        Bypassed = "bypassed",
    }
}

words! {
    /// Why a client connection was closed by the proxy (or found closed), as
    /// `ratelimit_connections_closed_total`'s `reason` label spells it.
    pub enum Closed {
        /// The request head did not arrive whole within `downstream.header_timeout_ms`.
        HeaderTimeout = "header_timeout",
        /// A kept-alive connection sent no request within `downstream.idle_timeout_ms`.
        IdleTimeout = "idle_timeout",
        /// A request body stalled longer than `downstream.body_timeout_ms` (on HTTP/2: a stream
        /// whose request was still open sent no frame for that long, and was reset).
        BodyTimeout = "body_timeout",
        /// A request body was not whole within `downstream.request_body_timeout_ms` of its head
        /// (on HTTP/2 the stream is reset).
        RequestBodyTimeout = "request_body_timeout",
        /// A TLS handshake did not finish within `downstream.header_timeout_ms`.
        HandshakeTimeout = "handshake_timeout",
        /// Closed at accept: `downstream.max_connections` were open.
        MaxConnections = "max_connections",
        /// The client reset or closed the connection in the middle of a request.
        ClientReset = "client_reset",
    }
}

words! {
    /// Why a request was answered 503 before any route saw it, as
    /// `ratelimit_requests_shed_total`'s `reason` label spells it.
    pub enum Shed {
        /// `downstream.max_requests_in_flight` requests were being served (or, for a further
        /// stream of an HTTP/2 connection, half of them).
        MaxRequestsInFlight = "max_requests_in_flight",
    }
}

/// Counts one open client connection (or request in flight) while it lives.
pub struct OpenConnection(IntGauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

words! {
    /// What failed in a store call, as `ratelimit_redis_errors_total`'s `kind` label spells it.
    pub enum ErrorKind {
        /// No answer within `timeout_ms`.
        Timeout = "timeout",
        /// No answer within `timeout_ms`, most of it lost to the proxy's own lateness.
        ProxyLate = "proxy_late",
        /// Redis unreachable: refused, reset, dropped.
        Connection = "connection",
        /// The script failed.
        Script = "script",
        /// Redis at `maxmemory` refused the writes.
        Oom = "oom",
        /// The in-memory store at `memory.max_keys` had no room for a new bucket.
        StoreFull = "store_full",
        /// A bucket key held something else and was rewritten (the decision was made).
        BadState = "bad_state",
        Other = "other",
        /// Not asked: the circuit breaker is open.
        Unavailable = "unavailable",
    }
}

words! {
    /// Why a decision was not made by the store and followed the route's `on_redis_error`, as
    /// `ratelimit_store_failures_total`'s `cause` label spells it. Every `fail_open`,
    /// `fail_closed`, `local_fallback` and `local_rejected` decision is counted under one.
    pub enum Cause {
        /// Redis did not answer within `timeout_ms`, and it had at least half of it.
        Timeout = "timeout",
        /// The budget ran out while the proxy itself ran late (a starved or overloaded process):
        /// not counted against Redis by the circuit breaker.
        ProxyLate = "proxy_late",
        /// Redis unreachable: refused, reset, dropped.
        Connection = "connection",
        /// Not asked: the circuit breaker is open (or probing).
        BreakerOpen = "breaker_open",
        /// Redis at `maxmemory` with `noeviction` refused the writes.
        Oom = "oom",
        /// The in-memory store at `memory.max_keys` had no room for a new bucket.
        StoreFull = "store_full",
        /// The script failed, or its reply was not understood.
        Script = "script",
        Other = "other",
    }
}

words! {
    /// The circuit breaker's state (`limiter::breaker`), as `ratelimit_redis_breaker_transitions_total{state}` names it.
    pub enum BreakerState {
        Closed = "closed",
        Open = "open",
        HalfOpen = "half_open",
    }
}

#[derive(Clone)]
pub struct Metrics {
    decisions: IntCounterVec,
    redis_duration: Histogram,
    redis_batch: Histogram,
    redis_errors: IntCounterVec,
    reloads: IntCounterVec,
    last_reload_success: IntGauge,
    config_info: IntGaugeVec,
    redis_up: IntGauge,
    breaker_transitions: IntCounterVec,
    deny_cache_hits: IntCounterVec,
    store_failures: IntCounterVec,
    responses: IntCounterVec,
    inflight: IntGaugeVec,
    usage_charged: IntCounterVec,
    usage_unreported: IntCounterVec,
    connections_open: IntGauge,
    /// By `Closed`, in `Closed::ALL` order.
    connections_closed: Vec<IntCounter>,
    /// By `Refused`, in `Refused::ALL` order.
    refused: Vec<IntCounter>,
    /// By `Shed`, in `Shed::ALL` order.
    shed: Vec<IntCounter>,
    requests_in_flight: IntGauge,
    /// Each route's most refused keys (not metrics: their labels would be unbounded), kept by
    /// route name across reloads, as the counters are.
    tops: Arc<Mutex<HashMap<String, Arc<TopKeys>>>>,
}

/// One route's counters, resolved once so the request path does no label lookup.
#[derive(Clone)]
pub struct RouteCounters {
    decisions: [IntCounter; Outcome::COUNT],
    deny_cache_hits: IntCounter,
    /// Decisions that followed `on_redis_error`, by `Cause`.
    store_failures: [IntCounter; Cause::COUNT],
    /// Responses by status class, 1xx to 5xx.
    responses: [IntCounter; 5],
    /// The route's most refused keys (`/v1/top`).
    pub top: Arc<TopKeys>,
}

impl RouteCounters {
    pub fn count(&self, outcome: Outcome) {
        self.decisions[outcome as usize].inc();
    }

    /// Every outcome and its count so far (the status page works out rates from two readings).
    pub fn totals(&self) -> impl Iterator<Item = (Outcome, u64)> + '_ {
        Outcome::ALL
            .iter()
            .map(|&o| (o, self.decisions[o as usize].get()))
    }

    /// A rejection answered from the deny cache, without a store call.
    pub fn deny_cache_hit(&self) {
        self.deny_cache_hits.inc();
    }

    /// The store did not decide, for this cause: the route's `on_redis_error` did.
    pub fn store_failed(&self, cause: Cause) {
        self.store_failures[cause as usize].inc();
    }

    /// A response with `status` went to the client (whoever wrote it: upstream, limiter, proxy).
    pub fn response(&self, status: u16) {
        if let Some(c) = self
            .responses
            .get(usize::from(status / 100).wrapping_sub(1))
        {
            c.inc();
        }
    }
}

impl Metrics {
    /// Registers the metrics in `registry` (the binary passes the default one); the Redis ones
    /// (`ratelimit_redis_*`, the deny cache's) only `with_redis`: an in-memory proxy exporting
    /// `ratelimit_redis_up 1` would tell a dashboard about a Redis that is not there.
    pub fn new(registry: &Registry, with_redis: bool) -> prometheus::Result<Metrics> {
        let decisions = IntCounterVec::new(
            Opts::new(
                "ratelimit_decisions_total",
                "Rate-limit decisions by route and outcome",
            ),
            &["route", "decision"],
        )?;
        // 100 µs to ~1.6 s: a loopback round trip sits in the first buckets, a timeout in the last.
        let redis_duration = Histogram::with_opts(
            HistogramOpts::new(
                "ratelimit_redis_duration_seconds",
                "Round-trip time of one rate-limit decision in Redis",
            )
            .buckets(exponential_buckets(0.0001, 2.0, 15)?),
        )?;
        let redis_batch = Histogram::with_opts(
            HistogramOpts::new(
                "ratelimit_redis_batch_size",
                "Requests decided by one call of the script: those that queued during a round trip",
            )
            .buckets(exponential_buckets(1.0, 2.0, 7)?),
        )?;
        let redis_errors = IntCounterVec::new(
            Opts::new(
                "ratelimit_redis_errors_total",
                "Redis calls that failed, by kind",
            ),
            &["kind"],
        )?;
        let reloads = IntCounterVec::new(
            Opts::new(
                "ratelimit_config_reloads_total",
                "Config reloads, by result",
            ),
            &["result"],
        )?;
        let last_reload_success = IntGauge::new(
            "ratelimit_config_last_reload_success",
            "1 when the last reload was applied, 0 when it was refused",
        )?;
        let config_info = IntGaugeVec::new(
            Opts::new(
                "ratelimit_config_info",
                "The running config, by the SHA-1 prefix of its file (always 1)",
            ),
            &["hash"],
        )?;
        let redis_up = IntGauge::new(
            "ratelimit_redis_up",
            "1 while the circuit breaker lets calls reach Redis, 0 while it is open",
        )?;
        let breaker_transitions = IntCounterVec::new(
            Opts::new(
                "ratelimit_redis_breaker_transitions_total",
                "Circuit-breaker state changes, by the state entered",
            ),
            &["state"],
        )?;
        let deny_cache_hits = IntCounterVec::new(
            Opts::new(
                "ratelimit_deny_cache_hits_total",
                "Rejections answered from the local deny cache, without a Redis call",
            ),
            &["route"],
        )?;
        let store_failures = IntCounterVec::new(
            Opts::new(
                "ratelimit_store_failures_total",
                "Decisions the store did not make, which followed on_redis_error, by route and cause",
            ),
            &["route", "cause"],
        )?;
        registry.register(Box::new(store_failures.clone()))?;
        let responses = IntCounterVec::new(
            Opts::new(
                "ratelimit_responses_total",
                "Responses to clients by route and status class (a dead upstream shows as 5xx)",
            ),
            &["route", "class"],
        )?;
        let inflight = IntGaugeVec::new(
            Opts::new(
                "ratelimit_inflight",
                "Concurrency leases this proxy holds now, by route and limit",
            ),
            &["route", "limit"],
        )?;
        let usage_charged = IntCounterVec::new(
            Opts::new(
                "ratelimit_usage_charged_total",
                "Usage charged from responses (the reported amount, up-front cost included)",
            ),
            &["route", "limit"],
        )?;
        let usage_unreported = IntCounterVec::new(
            Opts::new(
                "ratelimit_usage_unreported_total",
                "Responses that did not report their usage: charged the up-front cost only",
            ),
            &["route", "limit"],
        )?;
        registry.register(Box::new(inflight.clone()))?;
        registry.register(Box::new(usage_charged.clone()))?;
        registry.register(Box::new(usage_unreported.clone()))?;
        let connections_open =
            IntGauge::new("ratelimit_connections_open", "Client connections open now")?;
        let connections_closed = IntCounterVec::new(
            Opts::new(
                "ratelimit_connections_closed_total",
                "Client connections closed by a limit or a timeout, or reset by the client mid-request",
            ),
            &["reason"],
        )?;
        let refused = IntCounterVec::new(
            Opts::new(
                "ratelimit_requests_refused_total",
                "Requests refused with 400 before any route saw them, by reason",
            ),
            &["reason"],
        )?;
        let shed = IntCounterVec::new(
            Opts::new(
                "ratelimit_requests_shed_total",
                "Requests answered 503 with Retry-After because the process was at a limit, by reason",
            ),
            &["reason"],
        )?;
        let requests_in_flight = IntGauge::new(
            "ratelimit_requests_in_flight",
            "Client requests (HTTP/2 streams included) being served now",
        )?;
        registry.register(Box::new(connections_open.clone()))?;
        registry.register(Box::new(connections_closed.clone()))?;
        registry.register(Box::new(refused.clone()))?;
        registry.register(Box::new(shed.clone()))?;
        registry.register(Box::new(requests_in_flight.clone()))?;
        let shed = Shed::ALL
            .iter()
            .map(|r| shed.with_label_values(&[r.as_str()]))
            .collect();
        let connections_closed = Closed::ALL
            .iter()
            .map(|c| connections_closed.with_label_values(&[c.as_str()]))
            .collect();
        let refused = Refused::ALL
            .iter()
            .map(|r| refused.with_label_values(&[r.as_str()]))
            .collect();
        registry.register(Box::new(responses.clone()))?;
        if with_redis {
            registry.register(Box::new(redis_up.clone()))?;
            registry.register(Box::new(breaker_transitions.clone()))?;
            registry.register(Box::new(deny_cache_hits.clone()))?;
            registry.register(Box::new(redis_duration.clone()))?;
            registry.register(Box::new(redis_batch.clone()))?;
            registry.register(Box::new(redis_errors.clone()))?;
        }
        redis_up.set(1);
        for state in BreakerState::words() {
            breaker_transitions.with_label_values(&[state]);
        }
        registry.register(Box::new(decisions.clone()))?;
        registry.register(Box::new(reloads.clone()))?;
        registry.register(Box::new(last_reload_success.clone()))?;
        registry.register(Box::new(config_info.clone()))?;
        for kind in ErrorKind::words() {
            redis_errors.with_label_values(&[kind]);
        }
        for result in ["success", "failure"] {
            reloads.with_label_values(&[result]);
        }
        last_reload_success.set(1);
        Ok(Metrics {
            decisions,
            redis_duration,
            redis_batch,
            redis_errors,
            reloads,
            last_reload_success,
            config_info,
            redis_up,
            breaker_transitions,
            deny_cache_hits,
            store_failures,
            responses,
            inflight,
            usage_charged,
            usage_unreported,
            connections_open,
            connections_closed,
            refused,
            shed,
            requests_in_flight,
            tops: Arc::default(),
        })
    }

    /// `ratelimit_inflight{route,limit}`: the leases this proxy holds of a concurrency limit.
    pub fn inflight(&self, route: &str, limit: &str) -> IntGauge {
        self.inflight.with_label_values(&[route, limit])
    }

    /// `ratelimit_usage_charged_total` and `ratelimit_usage_unreported_total` of a limit
    /// charged from the response.
    pub fn usage(&self, route: &str, limit: &str) -> (IntCounter, IntCounter) {
        (
            self.usage_charged.with_label_values(&[route, limit]),
            self.usage_unreported.with_label_values(&[route, limit]),
        )
    }

    /// A client connection was accepted; it counts as open until the guard drops.
    pub fn connection_open(&self) -> OpenConnection {
        self.connections_open.inc();
        OpenConnection(self.connections_open.clone())
    }

    pub fn connection_closed(&self, why: Closed) {
        self.connections_closed[why as usize].inc();
    }

    /// A request was answered 503 at a process limit.
    pub fn shed(&self, why: Shed) {
        self.shed[why as usize].inc();
    }

    /// A client request is being served; it counts until the guard drops.
    pub fn request_in_flight(&self) -> OpenConnection {
        self.requests_in_flight.inc();
        OpenConnection(self.requests_in_flight.clone())
    }

    /// A request was refused with 400 before routing.
    pub fn refused(&self, why: Refused) {
        self.refused[why as usize].inc();
    }

    /// The counters of one route, every outcome present at 0 from the start.
    pub fn route(&self, route: &str) -> RouteCounters {
        RouteCounters {
            decisions: Outcome::ALL.map(|o| self.decisions.with_label_values(&[route, o.as_str()])),
            deny_cache_hits: self.deny_cache_hits.with_label_values(&[route]),
            store_failures: Cause::ALL
                .map(|c| self.store_failures.with_label_values(&[route, c.as_str()])),
            responses: ["1xx", "2xx", "3xx", "4xx", "5xx"]
                .map(|class| self.responses.with_label_values(&[route, class])),
            top: self
                .tops
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(route.to_string())
                .or_default()
                .clone(),
        }
    }

    /// The breaker entered `state`; Redis counts as up only while it is closed.
    pub fn breaker(&self, state: BreakerState) {
        self.breaker_transitions
            .with_label_values(&[state.as_str()])
            .inc();
        self.redis_up.set(i64::from(state == BreakerState::Closed));
    }

    /// Whether the breaker lets calls reach Redis (`ratelimit_redis_up`).
    pub fn redis_up(&self) -> bool {
        self.redis_up.get() == 1
    }

    /// The upper bounds (seconds) of the histogram buckets that hold the `q`-quantiles of the
    /// decisions' Redis latency so far, one per `q`; `None` before any decision.
    pub fn redis_quantiles(&self, qs: &[f64]) -> Option<Vec<f64>> {
        use prometheus::core::Collector;
        let family = self.redis_duration.collect();
        let h = family.first()?.get_metric().first()?.get_histogram();
        let count = h.get_sample_count();
        if count == 0 {
            return None;
        }
        Some(
            qs.iter()
                .map(|q| {
                    let rank = (q * count as f64).ceil() as u64;
                    h.get_bucket()
                        .iter()
                        .find(|b| b.cumulative_count() >= rank)
                        .map_or(f64::INFINITY, |b| b.upper_bound())
                })
                .collect(),
        )
    }

    pub fn redis_latency(&self, took: Duration) {
        self.redis_duration.observe(took.as_secs_f64());
    }

    pub fn redis_batch(&self, requests: usize) {
        self.redis_batch.observe(requests as f64);
    }

    pub fn redis_error(&self, kind: ErrorKind) {
        self.redis_errors.with_label_values(&[kind.as_str()]).inc();
    }

    /// A reload was applied (`true`) or refused.
    pub fn config_reload(&self, applied: bool) {
        let result = if applied { "success" } else { "failure" };
        self.reloads.with_label_values(&[result]).inc();
        self.last_reload_success.set(i64::from(applied));
    }

    /// The config now running, by hash: exactly one series at a time.
    pub fn config_running(&self, hash: &str) {
        self.config_info.reset();
        self.config_info.with_label_values(&[hash]).set(1);
    }
}

/// The Prometheus text exposition of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Encoding into a String fails only on a broken metric family; show what we have.
    let _ = prometheus::TextEncoder::new().encode_utf8(&registry.gather(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_route_and_outcome() {
        let registry = Registry::new();
        let m = Metrics::new(&registry, true).unwrap();
        let api = m.route("api");
        api.count(Outcome::Rejected);
        api.count(Outcome::Rejected);
        m.redis_error(ErrorKind::Timeout);
        m.redis_latency(Duration::from_micros(150));
        let text = render(&registry);
        assert!(
            text.contains("ratelimit_decisions_total{decision=\"rejected\",route=\"api\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("ratelimit_decisions_total{decision=\"allowed\",route=\"api\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("ratelimit_redis_errors_total{kind=\"timeout\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ratelimit_redis_duration_seconds_bucket{le=\"0.0002\"} 1"),
            "{text}"
        );
    }

    /// Every label value of `family` in `text` (the exposition format), for label `label`.
    fn label_values(text: &str, family: &str, label: &str) -> Vec<String> {
        let mut values: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{family}{{")))
            .filter_map(|l| {
                let at = l.find(&format!("{label}=\""))?;
                let rest = &l[at + label.len() + 2..];
                Some(rest[..rest.find('"')?].to_string())
            })
            .collect();
        values.sort();
        values.dedup();
        values
    }

    fn sorted(words: impl Iterator<Item = &'static str>) -> Vec<String> {
        let mut v: Vec<String> = words.map(String::from).collect();
        v.sort();
        v
    }

    /// Each labelled family starts with one series per word of its enum, and no other: the
    /// dashboards and alerts see every word at 0 before it first happens.
    #[test]
    fn label_lists_are_the_enums_word_lists() {
        let registry = Registry::new();
        let m = Metrics::new(&registry, true).unwrap();
        m.route("api");
        let text = render(&registry);
        for (family, label, words) in [
            (
                "ratelimit_decisions_total",
                "decision",
                sorted(Outcome::words()),
            ),
            (
                "ratelimit_redis_errors_total",
                "kind",
                sorted(ErrorKind::words()),
            ),
            (
                "ratelimit_store_failures_total",
                "cause",
                sorted(Cause::words()),
            ),
            (
                "ratelimit_redis_breaker_transitions_total",
                "state",
                sorted(BreakerState::words()),
            ),
            (
                "ratelimit_connections_closed_total",
                "reason",
                sorted(Closed::words()),
            ),
            (
                "ratelimit_requests_refused_total",
                "reason",
                sorted(Refused::words()),
            ),
            (
                "ratelimit_requests_shed_total",
                "reason",
                sorted(Shed::words()),
            ),
        ] {
            assert_eq!(label_values(&text, family, label), words, "{family}");
        }
    }
}
