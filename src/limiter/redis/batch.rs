//! Decisions that arrive while this thread's previous call is in flight go to Redis together, as
//! one call of the script that decides them one after the other.
//!
//! Redis spends most of a decision on the call around it (reading and parsing the command,
//! setting up the script, writing the reply, the syscalls), and so does the proxy (encoding,
//! the client library's bookkeeping, the wake-ups). A batch pays for that once. Nothing waits to
//! fill a batch: a decision on an idle thread goes out at once, alone; under load, the batch is
//! whatever queued up during one round trip, so it grows with the load and no further.
//!
//! Each worker thread has its own queue and its own driver task, so a decision never leaves the
//! thread that asked (see `standalone` for the connection per thread). Each request keeps its own
//! deadline without a timer of its own: a call may take until the earliest deadline among its
//! requests, and a request whose deadline passed while it queued is answered at once and left
//! out of the next call, so it takes no tokens.

use super::Caller;
use crate::limiter::late::{self, classify};
use crate::limiter::{Bucket, BucketParams, LimiterError};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// At most this many requests per call. The script runs alone on the Redis server, so one call
/// must stay short even when every request has several limits; and past a few dozen requests a
/// call's own cost is already spread thin (bench/redis_instructions.sh: 8 and 32 requests per call
/// differ by a tenth per decision).
pub const MAX_BATCH: usize = 32;

/// One request's buckets, waiting for its batch.
pub struct Job {
    pub keys: Vec<String>,
    pub params: Vec<BucketParams>,
    /// When the request's budget (`timeout_ms`) runs out.
    deadline: Instant,
    /// `None` once answered.
    answer: Option<oneshot::Sender<Result<Answer, LimiterError>>>,
}

impl Job {
    fn new(
        buckets: &[Bucket<'_>],
        deadline: Instant,
        answer: Option<oneshot::Sender<Result<Answer, LimiterError>>>,
    ) -> Job {
        Job {
            keys: buckets.iter().map(|b| b.key.to_owned()).collect(),
            params: buckets.iter().map(|b| b.params).collect(),
            deadline,
            answer,
        }
    }

    /// When the request asked (its deadline less the budget).
    fn asked(&self, budget: std::time::Duration) -> Instant {
        self.deadline.checked_sub(budget).unwrap_or(self.deadline)
    }

    fn answer(&mut self, result: Result<Answer, LimiterError>) {
        if let Some(answer) = self.answer.take() {
            let _ = answer.send(result);
        }
    }

    /// Not answered yet, and its caller still waits.
    fn waited_for(&self) -> bool {
        self.answer.as_ref().is_some_and(|a| !a.is_closed())
    }

    /// The script's reply for this request: `allowed`, then three integers per limit.
    pub fn reply_len(&self) -> usize {
        1 + 3 * self.params.len()
    }
}

/// A request's part of its batch's reply.
pub struct Answer {
    reply: Arc<[i64]>,
    at: usize,
    len: usize,
}

impl Answer {
    pub fn reply(&self) -> &[i64] {
        &self.reply[self.at..self.at + self.len]
    }

    /// The instant the call decided at (the reply's first integer).
    pub fn now(&self) -> u64 {
        self.reply[0] as u64
    }
}

/// Tells apart the limiters of one process (tests make several), for the per-thread table.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's queue of each limiter, found without a lock. Weak: the limiter's `Batches`
    /// holds the queues open, so that dropping it ends its drivers.
    static QUEUES: RefCell<Vec<(u64, mpsc::WeakUnboundedSender<Job>)>> = const { RefCell::new(Vec::new()) };
}

/// The per-thread queues of one limiter. Dropping it ends its drivers (their queues close).
pub struct Batches {
    id: u64,
    caller: Arc<Caller>,
    /// What keeps every thread's queue open while the limiter lives.
    queues: Mutex<Vec<mpsc::UnboundedSender<Job>>>,
}

impl Batches {
    pub fn new(caller: Arc<Caller>) -> Batches {
        Batches {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            caller,
            queues: Mutex::new(Vec::new()),
        }
    }

    /// Decides `buckets` in this thread's next batch, answering by `deadline`.
    pub async fn decide(
        &self,
        buckets: &[Bucket<'_>],
        deadline: Instant,
    ) -> Result<Answer, LimiterError> {
        let (answer, answered) = oneshot::channel();
        let mut job = Job::new(buckets, deadline, Some(answer));
        // A driver ends when its runtime does (a test's runtime, say): the first send after that
        // fails and this thread gets a new one.
        for _ in 0..2 {
            match self.queue(false).send(job) {
                Ok(()) => break,
                Err(mpsc::error::SendError(back)) => {
                    job = back;
                    self.queue(true);
                }
            }
        }
        answered
            .await
            .map_err(|_| LimiterError::Other("the batch was dropped unanswered".into()))?
    }

    /// This thread's queue, with a driver spawned on this thread's runtime when it has none (or
    /// `fresh`: its driver is gone).
    fn queue(&self, fresh: bool) -> mpsc::UnboundedSender<Job> {
        if !fresh {
            let found = QUEUES.with_borrow(|queues| {
                queues
                    .iter()
                    .find(|(id, _)| *id == self.id)
                    .and_then(|(_, q)| q.upgrade())
            });
            if let Some(q) = found {
                return q;
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(drive(self.caller.clone(), rx));
        QUEUES.with_borrow_mut(|queues| {
            queues.retain(|(id, q)| *id != self.id && q.strong_count() > 0);
            queues.push((self.id, tx.downgrade()));
        });
        let mut open = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|q| !q.is_closed());
        open.push(tx.clone());
        tx
    }
}

/// Sends what has queued as one call, waits for its reply, answers each request; again. A request
/// whose budget runs out is told whether the proxy's own lateness explains it (`late`).
async fn drive(caller: Arc<Caller>, mut queue: mpsc::UnboundedReceiver<Job>) {
    let mut jobs: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    // One timer for every call. Moving its deadline later (as a busy thread's calls do) only
    // updates it in place; a timer per call would enter and leave the runtime's timer wheel.
    let expiry = tokio::time::sleep_until(tokio::time::Instant::now());
    tokio::pin!(expiry);
    let budget = caller.timeout;
    let tick = late::tick(budget);
    let mut lateness = late::Log::default();
    loop {
        let idle_since = Instant::now();
        if queue.recv_many(&mut jobs, MAX_BATCH).await == 0 {
            break;
        }
        let woke = Instant::now();
        // The first decision woke this driver; the thread's other ready tasks (requests read in
        // the same poll) are about to ask too. Letting them run first puts them in this call
        // rather than the next, one round trip later. The runtime resumes this task at its next
        // look at the sockets, so on an idle thread this costs one poll, not a timer.
        tokio::task::yield_now().await;
        while jobs.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        // The wait for this thread to run the driver again: the proxy's own lateness.
        let now = Instant::now();
        lateness.note(now, late::past(now, woke));
        // Out of time while they queued (or gone): answered now, they take nothing. A request
        // that asked while the driver was idle also waited for the driver to wake.
        jobs.retain_mut(|j| {
            if j.deadline <= now {
                let asked = j.asked(budget);
                let waking = if asked >= idle_since {
                    late::past(woke, asked)
                } else {
                    Duration::ZERO
                };
                let late = lateness.since(asked) + waking;
                j.answer(Err(classify(budget, now - asked, late)));
            }
            j.waited_for()
        });
        let Some(deadline) = jobs.iter().map(|j| j.deadline).min() else {
            continue;
        };
        // Until the deadline, with a look at the clock every `tick` (a call that answers sooner
        // never sees one): a look that comes late, or a reply read after a look that never ran,
        // is the thread's lateness.
        let mut due = Instant::now() + tick;
        let mut call_late = Duration::ZERO;
        expiry.as_mut().reset(deadline.min(due).into());
        let result = {
            let call = caller.call(&jobs);
            tokio::pin!(call);
            loop {
                tokio::select! {
                    biased;
                    result = &mut call => {
                        call_late += late::past(Instant::now(), due);
                        break result;
                    }
                    () = &mut expiry => {
                        let now = Instant::now();
                        call_late += late::past(now, deadline.min(due));
                        if now >= deadline {
                            break Err(LimiterError::Timeout(budget));
                        }
                        due = now + tick;
                        expiry.as_mut().reset(deadline.min(due).into());
                    }
                }
            }
        };
        let now = Instant::now();
        lateness.note(now, call_late);
        match result {
            Ok(reply) => {
                let reply: Arc<[i64]> = reply.into();
                // After the call's `now`.
                let mut at = 1;
                for mut job in jobs.drain(..) {
                    let len = job.reply_len();
                    job.answer(Ok(Answer {
                        reply: reply.clone(),
                        at,
                        len,
                    }));
                    at += len;
                }
            }
            Err(LimiterError::Timeout(_)) => {
                for mut job in jobs.drain(..) {
                    let asked = job.asked(budget);
                    let late = lateness.since(asked);
                    job.answer(Err(classify(budget, now - asked, late)));
                }
            }
            Err(e) => {
                for mut job in jobs.drain(..) {
                    job.answer(Err(e.clone()));
                }
            }
        }
    }
}

/// A request decided alone, on the task that asks (Cluster: keys of many slots cannot share a
/// call). Same reply shape as a batch of one.
pub async fn alone(caller: &Caller, buckets: &[Bucket<'_>]) -> Result<Answer, LimiterError> {
    let job = Job::new(buckets, Instant::now(), None);
    let reply = caller.call(std::slice::from_ref(&job)).await?;
    Ok(Answer {
        reply: reply.into(),
        at: 1,
        len: job.reply_len(),
    })
}
