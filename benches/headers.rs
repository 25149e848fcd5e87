//! What the response headers of an allowed request cost: `RouteHeaders::each` on a route with one
//! token bucket, and on the LLM gateway's three limits (tokens, in flight, monthly), in
//! nanoseconds and heap allocations per response.
//!
//! `cargo bench --bench headers` — a plain timing loop (no harness): nanoseconds on a shared
//! machine are noisy; allocations per call are exact, and so are instructions under callgrind:
//! `BENCH_ONLY=one BENCH_N=100000 valgrind --tool=callgrind --toggle-collect='*RouteHeaders*each*'
//! target/release/deps/headers-…` (`one`: the one-bucket route, `llm`: the three limits).

use ratelimit_proxy::config::Config;
use ratelimit_proxy::headers::RouteHeaders;
use ratelimit_proxy::limiter::{Decision, LimitState};
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn headers(limits: &str) -> RouteHeaders {
    let yaml = format!(
        "listen: \"127.0.0.1:1\"\nroutes:\n  - name: api\n    upstream: \"h:1\"\n    limits:\n{limits}"
    );
    RouteHeaders::new(&Config::parse("bench.yaml", &yaml).expect("config").routes[0])
}

fn state(remaining: u64, reset_us: u64, wait_us: u64) -> LimitState {
    LimitState {
        ok: true,
        remaining,
        reset_us,
        wait_us,
        held: remaining,
        lag_us: 0,
    }
}

fn run(label: &str, h: &RouteHeaders, d: &Decision, limits: &[usize]) {
    let n: u64 = std::env::var("BENCH_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    let mut bytes = 0usize;
    for _ in 0..10_000 {
        h.each(d, limits, |_, v| bytes += v.len());
    }
    let allocs = ALLOCS.load(Ordering::Relaxed);
    let started = Instant::now();
    for _ in 0..n {
        h.each(black_box(d), black_box(limits), |n, v| {
            bytes += n.as_str().len() + v.len();
        });
    }
    let ns = started.elapsed().as_nanos() as f64 / n as f64;
    let per = (ALLOCS.load(Ordering::Relaxed) - allocs) as f64 / n as f64;
    println!("{label:<24} {ns:7.1} ns/response  {per:4.1} allocations/response  ({bytes} bytes)");
}

fn main() {
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let one = headers("      - { name: burst, capacity: 20, refill: \"10/s\" }\n");
    let d1 = Decision {
        allowed: true,
        limits: vec![state(19, 100_000, 100_000)],
    };
    if only != "llm" {
        run("one bucket", &one, &d1, &[0]);
    }
    let llm = headers(
        "      - { name: tokens, capacity: 200000, refill: \"200000/h\", cost: 5 }\n      \
         - { name: inflight, concurrency: 10 }\n      \
         - { name: monthly, quota: { amount: 1000000, period: month } }\n",
    );
    let d3 = Decision {
        allowed: true,
        limits: vec![
            state(199_950, 900_000, 0),
            state(9, 0, 0),
            state(999_999, 1_000_000_000_000, 1_000_000_000_000),
        ],
    };
    if only != "one" {
        run("tokens+inflight+monthly", &llm, &d3, &[0, 1, 2]);
    }
}
