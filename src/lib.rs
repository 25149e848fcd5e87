//! ratelimit-proxy: a Pingora reverse proxy that enforces token-bucket rate limits shared by a
//! fleet through Redis.
//!
//! # Layout
//!
//! A connection passes `downstream` (how many, how long each may take; each head read by
//! `client_conn` and checked by `head` before Pingora parses it; a TLS one `handshake` first),
//! and each of its requests takes a place in `inflight`, its body held to its deadlines by
//! `body_clock` (HTTP/1.1) or `h2_watch` (each HTTP/2 stream). A request then travels `proxy`
//! (Pingora phases) → `canonical` (the one form routes, keys and the upstream see) → `route`
//! (which route) → `client` (who is asking, behind trusted proxies) → `gate` (the decision
//! policy: allowlist, `draw` of the buckets built by `key`, enforced and shadow, `deny_cache`, the
//! route's `on_redis_error`) → `limiter` (one atomic decision: `limiter::redis` runs
//! `lua/token_bucket.lua` on one of its topologies behind `limiter::breaker`, `limiter::memory`
//! the same arithmetic in-process, from `limiter::bucket`) → `headers` (what the client sees) →
//! `upstream` (which backend of the pool) → `metrics` (what the operator sees).
//!
//! `config` validates the YAML into the types all of these use (their words listed once, with
//! `words!`), and `explain` prints them for `--check`; `plan` compiles them for the request path
//! and `reload` swaps a new plan in; `server` wires everything into Pingora on sockets `bind`
//! bound first, with `admin` (metrics and health endpoints) and `health` (active upstream checks)
//! beside the proxy, and `logging` keeping clients from writing the log.

#[macro_use]
pub mod words;

pub mod admin;
pub mod answer;
pub mod bind;
pub mod body_clock;
pub mod calendar;
pub mod canonical;
pub mod client;
pub mod client_conn;
pub mod clock;
pub mod config;
pub mod console;
pub mod deny_cache;
pub mod downstream;
pub mod drain;
pub mod draw;
pub mod explain;
pub mod gate;
pub mod grpc;
pub mod h2_watch;
pub mod handshake;
pub mod head;
pub mod head_room;
pub mod headers;
pub mod health;
pub mod held;
pub mod inflight;
pub mod key;
pub mod key_budget;
pub mod limiter;
pub mod logging;
pub mod metrics;
pub mod peer;
pub mod plan;
pub mod preflight;
pub mod proxy;
pub mod refusal;
pub mod relay;
pub mod reload;
pub mod route;
pub mod server;
pub mod shed;
pub mod text;
pub mod throttle;
pub mod tls;
pub mod top;
pub mod upstream;
pub mod usage;
