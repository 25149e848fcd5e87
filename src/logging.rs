//! The log: env_logger (`RUST_LOG`), with Pingora's lines about clients that misbehave or go away
//! moved down to debug.
//!
//! Pingora logs at error level when a client resets a connection mid-head, when it is gone before
//! its response is flushed, and when the admin listener gets a request it cannot parse; none of
//! these has a hook. Any client could then write a line per connection (115k resets wrote 18 MB
//! in 15 s). They are counted instead (`ratelimit_connections_closed_total`) and logged at debug.

use log::{Level, Log, Metadata, Record};

/// Installs the logger; `RUST_LOG` sets the filter, `info` by default.
pub fn init() {
    let inner =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).build();
    let max = inner.filter();
    if log::set_boxed_logger(Box::new(Demoting { inner })).is_ok() {
        log::set_max_level(max);
    }
}

struct Demoting {
    inner: env_logger::Logger,
}

impl Log for Demoting {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if record.level() > Level::Warn || !about_a_client(record) {
            return self.inner.log(record);
        }
        let metadata = Metadata::builder()
            .level(Level::Debug)
            .target(record.target())
            .build();
        if self.inner.enabled(&metadata) {
            self.inner.log(
                &Record::builder()
                    .metadata(metadata)
                    .args(*record.args())
                    .module_path(record.module_path())
                    .file(record.file())
                    .line(record.line())
                    .build(),
            );
        }
    }

    fn flush(&self) {
        self.inner.flush()
    }
}

/// Whether `record` is one of Pingora's lines about a client connection (reset, closed early,
/// malformed, a failed TLS or HTTP/2 handshake, or the pool race clients provoke by leaving),
/// which no hook reaches.
fn about_a_client(record: &Record<'_>) -> bool {
    let prefixes: &[&str] = match record.target() {
        "pingora_proxy" => &[
            // A head that could not be read: the client reset or closed mid-head.
            "Fail to proxy: ",
            "failed to send error response to downstream",
        ],
        "pingora_proxy::proxy_h1" => &["Error finish sending body to downstream"],
        "pingora_core::apps::http_app" => &["HTTP server fails to"],
        // A TLS client that sent garbage, stalled or hung up mid-handshake; an HTTP/2 client
        // whose preface was not one.
        "pingora_core::services::listening" => {
            &["Downstream handshake error", "Downstream handshake timeout"]
        }
        "pingora_core::apps" => &["H2 handshake error"],
        // A race in Pingora's upstream pool (an idle connection still watched as it is taken),
        // which clients going away at the right moment provoke; Pingora connects anew.
        "pingora_core::connectors" => &["failed to acquire reusable stream"],
        _ => return false,
    };
    let text = record.args().to_string();
    prefixes.iter().any(|p| text.starts_with(p))
        && (record.target() != "pingora_proxy"
            || !text.starts_with("Fail to proxy: ")
            || text.contains("downstream session type"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(target: &str, text: std::fmt::Arguments<'_>, check: impl FnOnce(&Record<'_>)) {
        check(
            &Record::builder()
                .level(Level::Error)
                .target(target)
                .args(text)
                .build(),
        )
    }

    #[test]
    fn only_lines_about_clients_are_demoted() {
        record(
            "pingora_proxy",
            format_args!("Fail to proxy: Downstream ReadError, downstream session type: h1"),
            |r| assert!(about_a_client(r)),
        );
        record(
            "pingora_proxy",
            format_args!("Fail to proxy: Upstream ConnectRefused, status: 502"),
            |r| assert!(!about_a_client(r), "hooked, and not about a client"),
        );
        record(
            "pingora_proxy::proxy_h1",
            format_args!("Error finish sending body to downstream: {}", "broken pipe"),
            |r| assert!(about_a_client(r)),
        );
        record(
            "pingora_core::services::listening",
            format_args!(
                "Downstream handshake error from {}: {}",
                "127.0.0.1:5", "bad"
            ),
            |r| assert!(about_a_client(r)),
        );
        record(
            "pingora_core::connectors",
            format_args!("failed to acquire reusable stream"),
            |r| assert!(about_a_client(r)),
        );
        record(
            "ratelimit_proxy::server",
            format_args!("Fail to proxy: x, downstream session type: h1"),
            |r| assert!(!about_a_client(r)),
        );
    }
}
