//! A connection to one Redis server that does the hot path's one exchange itself: write a packed
//! command, read its one reply. No client library in between.
//!
//! A decision's call is one request and one reply, made by the thread's batch driver, which never
//! has two calls in flight on a connection. redis-rs's multiplexed connection is built for
//! something else (many callers pipelining on one socket): each call crossed to its connection
//! task and back over channels, and its general parser cost more than the script. Here the driver
//! writes and reads the socket itself, and the reply is read by a parser for RESP2's five types.
//! redis-rs still encodes the commands, makes every error a `RedisError`, and does everything off
//! this path (TLS, Cluster, asking sentinels for their primary).

use redis::{Cmd, ConnectionAddr, ConnectionInfo, RedisError, Value};
use std::cell::RefCell;
use std::sync::{Arc, Weak};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

/// Idle connections a thread keeps per server: the batch driver needs one; a health check that
/// overlaps a call takes a second.
const IDLE_PER_THREAD: usize = 2;

thread_local! {
    /// This thread's idle connections to each live pool's server. An entry whose pool is gone (a
    /// limiter dropped, a primary replaced at failover) is dropped, its connections closed, the
    /// next time this thread looks.
    static IDLE: RefCell<Vec<(Weak<()>, Vec<Wire>)>> = const { RefCell::new(Vec::new()) };
}

/// Connections to one server, each thread's own: made on a thread's first call and kept there.
pub struct Pool {
    info: ConnectionInfo,
    /// Tells this pool's thread-local entries apart, and ends them when the pool goes.
    alive: Arc<()>,
}

impl Pool {
    /// Connections to the server `info` describes, which [`Wire::reaches`]. Connects nothing yet.
    pub fn new(info: ConnectionInfo) -> Pool {
        Pool {
            info,
            alive: Arc::new(()),
        }
    }

    /// On this thread's idle connection, or a new one. A connection that failed is dropped; one
    /// that was idle may have been closed by a restarted server meanwhile, so that failure gets
    /// one retry on a new connection (the command may have run: a retried decision can only
    /// take tokens twice, never admit more).
    pub async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let (mut wire, reused) = match self.idle() {
            Some(wire) => (wire, true),
            None => (Wire::connect(&self.info).await?, false),
        };
        let mut result = wire.exchange(cmd).await;
        if reused && matches!(&result, Err(e) if !usable_after(e)) {
            wire = Wire::connect(&self.info).await?;
            result = wire.exchange(cmd).await;
        }
        match &result {
            Err(e) if !usable_after(e) => {}
            _ => self.put_back(wire),
        }
        result
    }

    /// Whether a thread-local entry is this pool's.
    fn owns(&self, entry: &Weak<()>) -> bool {
        std::ptr::eq(entry.as_ptr(), Arc::as_ptr(&self.alive))
    }

    fn idle(&self) -> Option<Wire> {
        IDLE.with_borrow_mut(|table| {
            table.retain(|(pool, _)| pool.strong_count() > 0);
            let (_, idle) = table.iter_mut().find(|(pool, _)| self.owns(pool))?;
            idle.pop()
        })
    }

    fn put_back(&self, wire: Wire) {
        IDLE.with_borrow_mut(
            |table| match table.iter_mut().find(|(pool, _)| self.owns(pool)) {
                Some((_, idle)) if idle.len() < IDLE_PER_THREAD => idle.push(wire),
                Some(_) => {}
                None => table.push((Arc::downgrade(&self.alive), vec![wire])),
            },
        )
    }
}

/// Nested arrays deeper than this are not a reply of ours: the connection is dropped.
const MAX_DEPTH: usize = 4;
/// Nor is a reply larger than this (a batch's reply is a few kilobytes).
const MAX_REPLY: usize = 16 << 20;

trait Socket: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Socket for T {}

pub struct Wire {
    socket: Box<dyn Socket>,
    /// What was read and not parsed yet; empty between exchanges.
    input: Vec<u8>,
    /// The command being sent, kept to reuse its allocation.
    output: Vec<u8>,
}

impl Wire {
    /// Whether `info` is reached by a connection of this kind: plain TCP or a Unix socket (TLS
    /// stays with redis-rs).
    pub fn reaches(info: &ConnectionInfo) -> bool {
        matches!(
            info.addr(),
            ConnectionAddr::Tcp(..) | ConnectionAddr::Unix(_)
        )
    }

    /// Connects, authenticates and selects the database as `info` says.
    pub async fn connect(info: &ConnectionInfo) -> Result<Wire, RedisError> {
        let socket: Box<dyn Socket> = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let socket = TcpStream::connect((host.as_str(), *port)).await?;
                // Small writes, one per call: Nagle would hold each for the last one's ACK.
                socket.set_nodelay(true)?;
                Box::new(socket)
            }
            ConnectionAddr::Unix(path) => Box::new(UnixStream::connect(path).await?),
            _ => {
                return Err(RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "TLS connections are made by redis-rs",
                )))
            }
        };
        let mut wire = Wire {
            socket,
            input: Vec::with_capacity(512),
            output: Vec::with_capacity(512),
        };
        let settings = info.redis_settings();
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
            wire.exchange(&auth).await?;
        }
        if settings.db() != 0 {
            wire.exchange(redis::cmd("SELECT").arg(settings.db()))
                .await?;
        }
        Ok(wire)
    }

    /// Sends `cmd` and reads its reply. A server's error reply is an `Err` that leaves the
    /// connection usable ([`usable_after`]); any other error leaves it in an unknown state.
    pub async fn exchange(&mut self, cmd: &redis::Cmd) -> Result<Value, RedisError> {
        self.output.clear();
        cmd.write_packed_command(&mut self.output);
        self.socket.write_all(&self.output).await?;
        self.input.clear();
        loop {
            if let Some((value, used)) = parse(&self.input, 0)? {
                if used != self.input.len() {
                    return Err(protocol("bytes after the reply"));
                }
                return value.extract_error();
            }
            if self.input.len() > MAX_REPLY {
                return Err(protocol("a reply larger than 16 MiB"));
            }
            if self.socket.read_buf(&mut self.input).await? == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
        }
    }
}

/// Whether a connection may be used again after `error`: the server answered, so the exchange
/// finished (NOSCRIPT, OOM, a script error).
pub fn usable_after(error: &RedisError) -> bool {
    error.code().is_some()
}

fn protocol(what: &'static str) -> RedisError {
    RedisError::from((
        redis::ErrorKind::Parse,
        "unexpected reply from Redis",
        what.into(),
    ))
}

/// One RESP2 reply at the start of `buf`, and its length; `None` while it is incomplete.
fn parse(buf: &[u8], depth: usize) -> Result<Option<(Value, usize)>, RedisError> {
    // A line's end: CR, then LF (no line of a reply holds a CR).
    let Some(end) = memchr::memchr(b'\r', buf) else {
        return Ok(None);
    };
    match buf.get(end + 1) {
        None => return Ok(None),
        Some(b'\n') => {}
        Some(_) => return Err(protocol("a CR without its LF")),
    }
    let Some((&kind, line)) = buf[..end].split_first() else {
        return Err(protocol("an empty line"));
    };
    let after = end + 2;
    let value = match kind {
        b':' => Value::Int(integer(line)?),
        b'+' if line == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(String::from_utf8_lossy(line).into_owned()),
        // redis-rs makes the error (its kind from the code: NOSCRIPT, OOM, ...); rare, so its
        // general parser is fine here.
        b'-' => redis::parse_redis_value(&buf[..after])?,
        b'$' => {
            let Ok(len) = usize::try_from(integer(line)?) else {
                return Ok(Some((Value::Nil, after)));
            };
            let Some(body) = buf.get(after..after + len + 2) else {
                return Ok(None);
            };
            if !body.ends_with(b"\r\n") {
                return Err(protocol("a bulk string without its CRLF"));
            }
            return Ok(Some((
                Value::BulkString(body[..len].to_vec()),
                after + len + 2,
            )));
        }
        b'*' => {
            let Ok(len) = usize::try_from(integer(line)?) else {
                return Ok(Some((Value::Nil, after)));
            };
            if depth >= MAX_DEPTH {
                return Err(protocol("arrays nested too deep"));
            }
            // Each element takes at least 3 bytes: no allocation larger than what was read.
            let mut items = Vec::with_capacity(len.min(buf.len() / 3));
            let mut at = after;
            for _ in 0..len {
                let Some((item, used)) = parse(&buf[at..], depth + 1)? else {
                    return Ok(None);
                };
                items.push(item);
                at += used;
            }
            return Ok(Some((Value::Array(items), at)));
        }
        _ => return Err(protocol("a type RESP2 does not have")),
    };
    Ok(Some((value, after)))
}

/// A reply's integer: an optional minus, then digits.
fn integer(text: &[u8]) -> Result<i64, RedisError> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let n = crate::text::digits(digits)
        .and_then(|n| i64::try_from(n).ok())
        .ok_or_else(|| protocol("an integer that is not one"))?;
    Ok(if negative { -n } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::IntoConnectionInfo;

    fn whole(bytes: &[u8]) -> Value {
        let (value, used) = parse(bytes, 0).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        value
    }

    fn idle_entries() -> Vec<usize> {
        IDLE.with_borrow(|table| table.iter().map(|(_, idle)| idle.len()).collect())
    }

    #[test]
    fn a_gone_pool_leaves_no_connection_behind_on_its_threads() {
        let wire = || Wire {
            socket: Box::new(tokio::io::duplex(64).0),
            input: Vec::new(),
            output: Vec::new(),
        };
        let info = || "redis://127.0.0.1:1".into_connection_info().unwrap();
        let old = Pool::new(info());
        for _ in 0..3 {
            old.put_back(wire());
        }
        assert_eq!(idle_entries(), [IDLE_PER_THREAD], "at most this many kept");
        drop(old);
        let new = Pool::new(info());
        assert!(new.idle().is_none());
        assert!(
            idle_entries().is_empty(),
            "the gone pool's entry was dropped"
        );
        new.put_back(wire());
        assert!(new.idle().is_some());
    }

    #[test]
    fn reads_the_replies_the_proxy_gets() {
        assert_eq!(
            whole(b"*4\r\n:1\r\n:-5\r\n:0\r\n:0\r\n"),
            Value::Array(vec![
                Value::Int(1),
                Value::Int(-5),
                Value::Int(0),
                Value::Int(0)
            ])
        );
        assert_eq!(whole(b"+OK\r\n"), Value::Okay);
        assert_eq!(whole(b"+PONG\r\n"), Value::SimpleString("PONG".into()));
        assert_eq!(
            whole(b"$5\r\nab\r\nc\r\n"),
            Value::BulkString(b"ab\r\nc".to_vec())
        );
        assert_eq!(whole(b"$-1\r\n"), Value::Nil);
        assert_eq!(whole(b"*0\r\n"), Value::Array(vec![]));
        assert_eq!(
            whole(b":-123456789012345678\r\n"),
            Value::Int(-123456789012345678)
        );
    }

    #[test]
    fn an_error_reply_keeps_its_kind_and_the_connection() {
        let err = whole(b"-NOSCRIPT No matching script.\r\n")
            .extract_error()
            .unwrap_err();
        assert_eq!(
            err.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        );
        assert!(usable_after(&err));
        let io: RedisError = std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into();
        assert!(!usable_after(&io));
    }

    #[test]
    fn waits_for_the_rest_of_a_reply_cut_anywhere() {
        let reply = b"*3\r\n:1\r\n$3\r\nabc\r\n*1\r\n:-2\r\n";
        for cut in 0..reply.len() {
            assert!(parse(&reply[..cut], 0).unwrap().is_none(), "cut at {cut}");
        }
        whole(reply);
    }

    #[test]
    fn refuses_what_is_not_a_reply() {
        for bad in [
            &b"?1\r\n"[..],
            b":x\r\n",
            b":\r\n",
            b":-\r\n",
            b":9223372036854775808\r\n",
            b":+1\r\n",
            b":1\r2\r\n",
            b"\r\n",
            b"$3\r\nabcd\r\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
        ] {
            assert!(parse(bad, 0).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
