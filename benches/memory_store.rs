//! How the in-memory store scales across threads: decisions per second with 1 and 2 threads, on
//! distinct clients (sharded, should scale) and on one hot client (one lock, cannot scale). Then
//! what a bucket costs: resident memory after one million distinct clients.
//!
//! `cargo bench --bench memory_store` — a plain timing loop (no harness): numbers on a shared
//! machine are noisy, the ratio between rows of one run is the result.

use ratelimit_proxy::clock::SystemClock;
use ratelimit_proxy::limiter::memory::MemoryLimiter;
use ratelimit_proxy::limiter::{Bucket, BucketParams, Kind};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PARAMS: BucketParams = BucketParams {
    capacity: 1_000_000,
    scale: 1,
    num: 1,
    cost: 1,
    kind: Kind::Bucket,
};
const RUN: Duration = Duration::from_millis(1500);

fn run(threads: usize, distinct: bool) -> f64 {
    let store = Arc::new(MemoryLimiter::new(SystemClock, 1_000_000));
    let keys: Vec<Vec<String>> = (0..threads)
        .map(|t| {
            (0..10_000)
                .map(|i| match distinct {
                    true => format!("rl:{{api:10.{t}.{}.{}}}:l", i / 256, i % 256),
                    false => "rl:{api:hot}:l".to_string(),
                })
                .collect()
        })
        .collect();
    let started = Instant::now();
    let handles: Vec<_> = keys
        .into_iter()
        .map(|keys| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while started.elapsed() < RUN {
                    for key in keys.iter().take(1000) {
                        let d = store.decide(&[Bucket {
                            key,
                            params: PARAMS,
                        }]);
                        black_box(d.ok());
                        n += 1;
                    }
                }
                n
            })
        })
        .collect();
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    total as f64 / started.elapsed().as_secs_f64()
}

/// Resident set size in bytes, from /proc.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn memory_per_bucket() -> f64 {
    const N: usize = 1_000_000;
    let before = rss();
    let store = MemoryLimiter::new(SystemClock, N);
    // One token a second: no bucket is full again (and forgotten) while this runs.
    let slow = BucketParams {
        capacity: 100,
        scale: 1_000_000,
        num: 1,
        cost: 1,
        kind: Kind::Bucket,
    };
    for i in 0..N {
        let key = format!("rl:{{api:10.{}.{}.{}}}:l", i >> 16, (i >> 8) & 255, i & 255);
        black_box(
            store
                .decide(&[Bucket {
                    key: &key,
                    params: slow,
                }])
                .ok(),
        );
    }
    let grown = rss() - before;
    let tracked = store.len();
    println!(
        "\n{tracked} buckets tracked (cap {N}), resident memory grew by {:.1} MiB",
        grown as f64 / 1048576.0
    );
    grown as f64 / tracked as f64
}

fn main() {
    println!("| clients | threads | decisions/s |");
    println!("|---|---|---|");
    for distinct in [true, false] {
        for threads in [1, 2] {
            let rate = run(threads, distinct);
            let who = if distinct { "distinct" } else { "one hot key" };
            println!("| {who} | {threads} | {rate:.0} |");
        }
    }
    println!("about {:.0} bytes per bucket", memory_per_bucket());
}
