//! ratelimit-proxy: a Pingora reverse proxy that enforces token-bucket rate limits shared by a
//! fleet through Redis.
//!
//! # Layout
//!
//! A request travels `proxy` (Pingora phases) → `route` (which route) → `key` (which buckets) →
//! `limiter` (one atomic decision: `limiter::redis` runs `lua/token_bucket.lua`, `limiter::memory`
//! the same arithmetic in-process, from `limiter::bucket`) → `headers` (what the client sees) →
//! `metrics` (what the operator sees). `config` validates the YAML into the types all of these use;
//! `plan` compiles it for the request path; `server` and `admin` wire it into Pingora.

pub mod admin;
pub mod client;
pub mod clock;
pub mod config;
pub mod deny_cache;
pub mod draw;
pub mod explain;
pub mod headers;
pub mod health;
pub mod key;
pub mod limiter;
pub mod metrics;
pub mod plan;
pub mod proxy;
pub mod reload;
pub mod route;
pub mod server;
pub mod upstream;
