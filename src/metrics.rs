//! Prometheus metrics with typed methods, so names and labels live here alone and label values
//! stay bounded (route names and fixed words — never a client key).

use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};
use std::time::Duration;

/// What happened to a request, as the `decision` label spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Rejected,
    FailOpen,
    FailClosed,
}

impl Outcome {
    const ALL: [Outcome; 4] = [
        Outcome::Allowed,
        Outcome::Rejected,
        Outcome::FailOpen,
        Outcome::FailClosed,
    ];

    fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Rejected => "rejected",
            Outcome::FailOpen => "fail_open",
            Outcome::FailClosed => "fail_closed",
        }
    }
}

/// Error kinds, as `LimiterError::kind` spells them.
const ERROR_KINDS: [&str; 4] = ["timeout", "connection", "script", "other"];

#[derive(Clone)]
pub struct Metrics {
    decisions: IntCounterVec,
    redis_duration: Histogram,
    redis_errors: IntCounterVec,
    reloads: IntCounterVec,
    last_reload_success: IntGauge,
    config_info: IntGaugeVec,
}

/// One route's decision counters, resolved once so the request path does no label lookup.
#[derive(Clone)]
pub struct RouteCounters([IntCounter; 4]);

impl RouteCounters {
    pub fn count(&self, outcome: Outcome) {
        self.0[outcome as usize].inc();
    }
}

impl Metrics {
    /// Registers the metrics in `registry` (the binary passes the default one).
    pub fn new(registry: &Registry) -> prometheus::Result<Metrics> {
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
        registry.register(Box::new(decisions.clone()))?;
        registry.register(Box::new(redis_duration.clone()))?;
        registry.register(Box::new(redis_errors.clone()))?;
        registry.register(Box::new(reloads.clone()))?;
        registry.register(Box::new(last_reload_success.clone()))?;
        registry.register(Box::new(config_info.clone()))?;
        for kind in ERROR_KINDS {
            redis_errors.with_label_values(&[kind]);
        }
        for result in ["success", "failure"] {
            reloads.with_label_values(&[result]);
        }
        last_reload_success.set(1);
        Ok(Metrics {
            decisions,
            redis_duration,
            redis_errors,
            reloads,
            last_reload_success,
            config_info,
        })
    }

    /// The counters of one route, every outcome present at 0 from the start.
    pub fn route(&self, route: &str) -> RouteCounters {
        RouteCounters(Outcome::ALL.map(|o| self.decisions.with_label_values(&[route, o.label()])))
    }

    pub fn redis_latency(&self, took: Duration) {
        self.redis_duration.observe(took.as_secs_f64());
    }

    pub fn redis_error(&self, kind: &'static str) {
        self.redis_errors.with_label_values(&[kind]).inc();
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
        let m = Metrics::new(&registry).unwrap();
        let api = m.route("api");
        api.count(Outcome::Rejected);
        api.count(Outcome::Rejected);
        m.redis_error("timeout");
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
}
