//! Integration tests: real redis-server processes, a real upstream, the real proxy binary.
//! One test binary, so it links once.

mod admin_port;
mod cli;
mod compose;
mod config_errors;
mod connections;
mod console;
mod fail_causes;
mod first_run;
mod grpc;
mod h2_spellings;
mod http2;
mod key_floods;
mod llm_clients;
mod llm_sdks;
mod lua_script;
mod normalise;
mod operations;
mod policies;
mod preflight;
mod proofs;
mod redis_faults;
mod redis_security;
mod resilience;
mod scenarios;
mod status_page;
mod support;
mod tls_listener;
mod topologies;
mod upstream_schemes;
mod usage;
mod usage_aborts;
