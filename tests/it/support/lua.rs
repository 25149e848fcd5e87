//! `lua/token_bucket.lua` loaded into a test's own redis-server and called by hand, with the
//! caller's clock (time is exact) or Redis `TIME`, its reply read back into the Rust types so it
//! can be compared with `bucket::evaluate` field for field.

use super::redis::RedisServer;
use ratelimit_proxy::limiter::redis::{full_reply, parse_reply, Format, TOKEN_BUCKET_LUA};
use ratelimit_proxy::limiter::{Bucket, BucketParams, Decision, Kind};
use redis::Value;

/// An instant in 2027, in µs: far from 0 and from 2^53 µs (year 2255), as real clocks are.
pub const T0: u64 = 1_800_000_000_000_000;

/// The script as commit f41d9d0 shipped it, the last that called it one request at a time (no
/// limit count per request). Same stored state: a fleet being upgraded runs both on one Redis.
pub const PREVIOUS_LUA: &str = include_str!("../../fixtures/lua/token_bucket_f41d9d0.lua");

pub struct Script {
    pub redis: RedisServer,
    pub sha: String,
    /// `PREVIOUS_LUA`, loaded beside it.
    pub previous_sha: String,
    /// What the calls below write buckets as (`batch_in` chooses per call).
    pub format: Format,
}

/// One request of a batch: its buckets and their limits.
pub type Request<'a> = (Vec<&'a str>, Vec<BucketParams>);

impl Script {
    /// The script writing hashes, as proxies do by default.
    pub fn load() -> Script {
        Script::writing(Format::Hash)
    }

    pub fn writing(format: Format) -> Script {
        let redis = RedisServer::start();
        let sha: String = redis.cmd(&["SCRIPT", "LOAD", TOKEN_BUCKET_LUA]);
        let previous_sha: String = redis.cmd(&["SCRIPT", "LOAD", PREVIOUS_LUA]);
        Script {
            redis,
            sha,
            previous_sha,
            format,
        }
    }

    /// One call deciding `requests` in order at `now`, as a proxy writing `format` sends the
    /// decisions that queued during a round trip: each one's decision.
    pub fn batch_in(&self, format: Format, requests: &[Request<'_>], now: u64) -> Vec<Decision> {
        let mut cmd = redis::cmd("EVALSHA");
        let keys: Vec<&str> = requests
            .iter()
            .flat_map(|(k, _)| k.iter().copied())
            .collect();
        cmd.arg(&self.sha).arg(keys.len()).arg(&keys).arg(now);
        cmd.arg(format.as_str());
        // The table of distinct limits, then each request's numbers in it.
        let mut table: Vec<BucketParams> = Vec::new();
        let numbers: Vec<Vec<usize>> = requests
            .iter()
            .map(|(_, limits)| {
                limits
                    .iter()
                    .map(|p| match table.iter().position(|l| l == p) {
                        Some(i) => i + 1,
                        None => {
                            table.push(*p);
                            table.len()
                        }
                    })
                    .collect()
            })
            .collect();
        cmd.arg(table.len());
        for p in &table {
            limit_args(&mut cmd, p);
        }
        // As the proxy sends it: nothing per request when each has the one limit.
        if !(table.len() == 1 && numbers.iter().all(|n| n.len() == 1)) {
            for n in &numbers {
                cmd.arg(n.len()).arg(n);
            }
        }
        let mut c = self.redis.connection().unwrap();
        let reply: Vec<i64> = cmd.query(&mut c).expect("EVALSHA of a batch");
        let reply = full_reply(reply, requests.iter().map(|(_, limits)| limits.len()))
            .unwrap_or_else(|e| panic!("{e}"));
        // After the call's `now`, which each request's part is given too.
        let mut at = 1;
        let decisions = requests
            .iter()
            .map(|(_, limits)| {
                let len = 1 + 3 * limits.len();
                let part = [&reply[..1], &reply[at..at + len]].concat();
                at += len;
                decision_of(&part, limits)
            })
            .collect();
        assert_eq!(at, reply.len(), "a reply of exactly the batch's length");
        decisions
    }

    /// One decision by the previous version's script (`PREVIOUS_LUA`), which knows no quotas.
    pub fn previous(&self, keys: &[&str], now: u64, limits: &[BucketParams]) -> Decision {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.previous_sha)
            .arg(keys.len())
            .arg(keys)
            .arg(now);
        for p in limits {
            limit_args(&mut cmd, p);
        }
        let mut c = self.redis.connection().unwrap();
        let Value::Array(reply) = cmd.query(&mut c).expect("EVALSHA") else {
            panic!("not an array")
        };
        // Its reply does not start with the call's instant yet.
        decision(
            &Value::Array([vec![Value::Int(now as i64)], reply].concat()),
            limits,
        )
    }

    /// The EVALSHA of one decision, for callers that pipeline it or wrap it in MULTI.
    /// `now: None` asks the script to read Redis `TIME`.
    pub fn invocation(
        &self,
        keys: &[&str],
        now: Option<u64>,
        limits: &[BucketParams],
    ) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(keys.len()).arg(keys);
        cmd.arg(now.map_or(String::new(), |n| n.to_string()));
        cmd.arg(self.format.as_str());
        // Each limit its own entry in the table of limits, the one request drawing on all of them.
        cmd.arg(limits.len());
        for p in limits {
            limit_args(&mut cmd, p);
        }
        cmd.arg(limits.len())
            .arg((1..=limits.len()).collect::<Vec<_>>());
        cmd
    }

    /// The EVALSHA of one charge (`amounts[i]` whole tokens from `keys[i]`, negative to
    /// refund), in the format this script writes.
    pub fn charging(
        &self,
        keys: &[&str],
        now: u64,
        limits: &[BucketParams],
        amounts: &[i64],
    ) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(keys.len()).arg(keys).arg(now);
        cmd.arg(self.format.as_str()).arg(limits.len());
        for (p, amount) in limits.iter().zip(amounts) {
            cmd.arg(p.capacity).arg(p.scale);
            match p.kind {
                Kind::Bucket => cmd.arg(p.num),
                Kind::Quota(period) => cmd.arg(period.as_str()),
                Kind::Leases { ms, id } => cmd.arg(format!("lease:{ms}:{id}")),
            };
            cmd.arg(*amount);
        }
        cmd.arg(-(limits.len() as i64))
            .arg((1..=limits.len()).collect::<Vec<_>>());
        cmd
    }

    pub fn raw(&self, keys: &[&str], now: Option<u64>, limits: &[BucketParams]) -> Value {
        let mut c = self.redis.connection().unwrap();
        self.invocation(keys, now, limits)
            .query(&mut c)
            .expect("EVALSHA")
    }

    pub fn eval(&self, keys: &[&str], now: u64, limits: &[BucketParams]) -> Decision {
        decision(&self.raw(keys, Some(now), limits), limits)
    }
}

/// A bucket as stored at `key`, in either format: `[v, t, s]` (`s` is 0 when a hash has none),
/// `None` when there is no key. Panics on anything else.
pub fn stored(redis: &RedisServer, key: &str) -> Option<[u64; 3]> {
    let kind: String = redis.cmd(&["TYPE", key]);
    match kind.as_str() {
        "none" => None,
        "hash" => {
            let f: Vec<Option<u64>> = redis.cmd(&["HMGET", key, "v", "t", "s"]);
            Some([f[0].expect("v"), f[1].expect("t"), f[2].unwrap_or(0)])
        }
        "string" => {
            let bytes: Vec<u8> = redis.cmd(&["GET", key]);
            Some(unpack(&bytes).unwrap_or_else(|| panic!("{key}: {bytes:?} is not packed")))
        }
        other => panic!("{key} is a {other}"),
    }
}

/// A packed bucket: three little-endian doubles, each a whole number (packed_ttl: a fourth, the
/// instant its expiry covers, see [`covered`]).
pub fn unpack(bytes: &[u8]) -> Option<[u64; 3]> {
    let all = doubles(bytes)?;
    Some([all[0], all[1], all[2]])
}

/// The instant a packed_ttl bucket's expiry covers; `None` for any other value.
pub fn covered(bytes: &[u8]) -> Option<u64> {
    doubles(bytes)
        .filter(|all| all.len() == 4)
        .map(|all| all[3])
}

fn doubles(bytes: &[u8]) -> Option<Vec<u64>> {
    if bytes.len() != 24 && bytes.len() != 32 {
        return None;
    }
    let mut out = vec![0; bytes.len() / 8];
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(8)) {
        let f = f64::from_le_bytes(c.try_into().unwrap());
        if !(f >= 0.0 && f.fract() == 0.0 && f <= 2f64.powi(53)) {
            return None;
        }
        *o = f as u64;
    }
    Some(out)
}

/// A packed bucket's bytes, as the script writes them.
pub fn pack(state: [u64; 3]) -> Vec<u8> {
    state
        .iter()
        .flat_map(|n| (*n as f64).to_le_bytes())
        .collect()
}

/// What `format` stores a key as (Redis `TYPE`).
pub fn type_of(format: Format) -> &'static str {
    match format {
        Format::Hash => "hash",
        Format::Packed | Format::PackedTtl => "string",
    }
}

/// The script's reply for one request (`now` first) as a `Decision`, read as the proxy reads it;
/// panics unless every element is a non-negative integer and no key held anything but a bucket.
pub fn decision(reply: &Value, limits: &[BucketParams]) -> Decision {
    let Value::Array(items) = reply else {
        panic!("not an array: {reply:?}")
    };
    let n: Vec<i64> = items
        .iter()
        .map(|v| match v {
            Value::Int(i) => *i,
            other => panic!("every reply element must be an integer, got {other:?}"),
        })
        .collect();
    let n = full_reply(n, std::iter::once(limits.len())).unwrap_or_else(|e| panic!("{e}"));
    decision_of(&n, limits)
}

/// [`decision`] of a reply already in full.
fn decision_of(n: &[i64], limits: &[BucketParams]) -> Decision {
    let buckets: Vec<Bucket<'_>> = limits
        .iter()
        .map(|p| Bucket {
            key: "",
            params: *p,
        })
        .collect();
    let (decision, bad) =
        parse_reply(&n[1..], n[0] as u64, &buckets).unwrap_or_else(|e| panic!("{e}"));
    assert!(bad.is_empty(), "keys {bad:?} held something else");
    decision
}

/// A limit's four arguments: capacity, scale, units per µs (a quota: its period), cost.
pub fn limit_args(cmd: &mut redis::Cmd, p: &BucketParams) {
    cmd.arg(p.capacity).arg(p.scale);
    match p.kind {
        Kind::Bucket => cmd.arg(p.num),
        Kind::Quota(period) => cmd.arg(period.as_str()),
        Kind::Leases { ms, id } => cmd.arg(format!("lease:{ms}:{id}")),
    };
    cmd.arg(p.cost);
}
