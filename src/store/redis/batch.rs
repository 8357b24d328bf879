//! Enters and polls gathered per thread and target, and sent as one script call.
//!
//! In a sale, many requests for the same target arrive on a proxy thread while one of its
//! calls is on its way to Redis. A call that finds no open batch for its (store, script, target)
//! opens one and leads it. If no call of that key is in flight on the thread,
//! the leader sends at once: a call alone pays nothing for batching. If one is in flight, the
//! leader waits until it has answered (at most `MAX_WAIT`), and the calls of the same key that
//! come meanwhile join its batch (group commit): the busier the thread, the bigger the batch,
//! and a key never has more than one batch waiting on a thread. The leader then sends the batch
//! as one `enter.lua` / `poll.lua` call and hands each caller its own reply; the scripts answer
//! exactly as the same calls made one after another in the order joined. A batch that reaches
//! `MAX_BATCH` users is sent at once by the call that filled it.
//!
//! Each caller still waits within its own deadline, and a call that fails fails every user of
//! its batch with the same error. A leader dropped before it answered (its deadline passed)
//! closes its batch, and the others send their users alone. The open batches of a thread sit
//! behind an `Arc<Mutex>` the leader holds, so a leader that resumes on another thread (a
//! multi-threaded runtime) still finds its batch.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::Value;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::queue::QueueTarget;
use crate::store::StoreError;

/// The most users one call carries (the scripts' `unpack` limits are far above it).
pub const MAX_BATCH: usize = 64;

/// The longest a leader waits for the call in flight before it sends its batch anyway: a slow
/// Redis adds at most this to a call's time, not a whole round trip.
pub const MAX_WAIT: Duration = Duration::from_millis(2);

/// Which script a batch is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Enter,
    Poll,
}

/// Calls that may share one script call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchKey {
    /// Which `RedisStore` (`store_id`).
    pub store: u64,
    pub kind: Kind,
    pub target: QueueTarget,
}

/// Sends one batch: its users in order and the latest `now` (ms) among its calls; answers one
/// reply per user, in the same order.
pub type SendBatch =
    Box<dyn FnOnce(Vec<u64>, u64) -> Pin<Box<dyn Future<Output = Sent> + Send>> + Send>;
pub type Sent = Result<Vec<Value>, StoreError>;

#[derive(Default)]
struct Batch {
    /// Tells this batch from a later one for the same key.
    id: u64,
    users: Vec<u64>,
    now_ms: u64,
    replies: Vec<oneshot::Sender<Result<Value, StoreError>>>,
}

/// A thread's open batches, how many calls of each key it has in flight, and the leader
/// waiting for them to answer. (Keyed with ahash, several times cheaper than SipHash on these
/// keys, and still keyed per process: target ids come from clients.)
#[derive(Default)]
struct Batches {
    open: HashMap<BatchKey, Batch, ahash::RandomState>,
    in_flight: HashMap<BatchKey, u32, ahash::RandomState>,
    waiting: HashMap<BatchKey, oneshot::Sender<()>, ahash::RandomState>,
}

type Open = Arc<Mutex<Batches>>;

thread_local! {
    static OPEN: Open = Open::default();
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A new store's id, telling its batches from another store's on the same thread.
pub fn store_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// What joining a batch asks of the caller.
enum Joined {
    /// The batch was open already: its leader sends it.
    Waits,
    /// This call opened batch `id`: it leads it, and sends it at once, or, when a call of the
    /// same key is in flight, once `answered` tells that it has answered (others are likely to
    /// come meanwhile, and join the batch).
    Leads {
        open: Open,
        id: u64,
        answered: Option<oneshot::Receiver<()>>,
    },
    /// This call filled the batch: it sends it now.
    Full(Open, Batch),
}

/// Adds `user` to this thread's open batch for `key` (opening one if there is none) and waits
/// for its reply. `send` makes the sender of a batch; a caller uses it when it leads a batch,
/// and to send its user alone when the leader of its batch was dropped (its own deadline passed)
/// before answering: enters and polls may run twice, with the same answers.
pub async fn join(
    key: BatchKey,
    user: u64,
    now_ms: u64,
    send: impl Fn() -> SendBatch,
) -> Result<Value, StoreError> {
    let (tx, rx) = oneshot::channel();
    let joined = OPEN.with(|open| {
        let mut batches = open.lock();
        let busy = batches.in_flight.contains_key(&key);
        let batches = &mut *batches;
        let batch = batches.open.entry(key).or_insert_with(|| Batch {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            ..Batch::default()
        });
        let opened = batch.users.is_empty();
        batch.users.push(user);
        batch.replies.push(tx);
        batch.now_ms = batch.now_ms.max(now_ms);
        if batch.users.len() >= MAX_BATCH {
            let batch = batches.open.remove(&key).unwrap_or_default();
            Joined::Full(open.clone(), batch)
        } else if opened {
            let answered = busy.then(|| {
                let (tx, rx) = oneshot::channel();
                // A leader still waiting here had its batch filled and sent: it is woken.
                batches.waiting.insert(key, tx);
                rx
            });
            Joined::Leads {
                open: open.clone(),
                id: batch.id,
                answered,
            }
        } else {
            Joined::Waits
        }
    });
    match joined {
        Joined::Waits => {}
        Joined::Full(open, batch) => deliver(&open, key, batch, send()).await,
        Joined::Leads { open, id, answered } => {
            let lead = Lead { open, key, id };
            if let Some(answered) = answered {
                // The calls of this key that come until the one in flight answers join the
                // batch. (Not `tokio::task::yield_now`, which waits for the I/O driver's next
                // poll: on a thread saturated with other work that poll can be many tasks away.)
                let _ = tokio::time::timeout(MAX_WAIT, answered).await;
            }
            // Gone when it filled up meanwhile: the call that filled it sent it.
            if let Some(batch) = lead.take() {
                deliver(&lead.open, key, batch, send()).await;
            }
        }
    }
    match rx.await {
        Ok(reply) => reply,
        Err(_) => {
            let mut alone = send()(vec![user], now_ms).await?;
            alone
                .pop()
                .ok_or_else(|| StoreError::Protocol("no reply for a single user".into()))
        }
    }
}

/// The leader of an open batch. Dropped before sending it (its caller gave up), it closes the
/// batch: the other callers then send their users alone.
struct Lead {
    open: Open,
    key: BatchKey,
    id: u64,
}

impl Lead {
    /// Removes the batch this leads from the open ones, unless it was sent already.
    fn take(&self) -> Option<Batch> {
        let mut batches = self.open.lock();
        if batches.open.get(&self.key).is_some_and(|b| b.id == self.id) {
            batches.open.remove(&self.key)
        } else {
            None
        }
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        drop(self.take());
    }
}

/// A call of `key` in flight on this thread, counted while it lives.
struct InFlight {
    open: Open,
    key: BatchKey,
}

impl InFlight {
    fn start(open: &Open, key: BatchKey) -> InFlight {
        *open.lock().in_flight.entry(key).or_default() += 1;
        InFlight {
            open: open.clone(),
            key,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut batches = self.open.lock();
        if let Some(n) = batches.in_flight.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                batches.in_flight.remove(&self.key);
                if let Some(leader) = batches.waiting.remove(&self.key) {
                    let _ = leader.send(());
                }
            }
        }
    }
}

/// Sends `batch` and hands each caller its reply (or the call's error).
async fn deliver(open: &Open, key: BatchKey, batch: Batch, send: SendBatch) {
    let Batch {
        users,
        now_ms,
        replies,
        ..
    } = batch;
    let count = users.len();
    let in_flight = InFlight::start(open, key);
    let sent = send(users, now_ms).await;
    drop(in_flight);
    match sent {
        Ok(values) if values.len() == count => {
            for (tx, value) in replies.into_iter().zip(values) {
                let _ = tx.send(Ok(value));
            }
        }
        Ok(values) => {
            let error = StoreError::Protocol(format!("{} replies for {count} users", values.len()));
            for tx in replies {
                let _ = tx.send(Err(error.clone()));
            }
        }
        Err(e) => {
            for tx in replies {
                let _ = tx.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::TargetType;

    fn key(target: u64) -> BatchKey {
        BatchKey {
            store: 0,
            kind: Kind::Poll,
            target: QueueTarget::new(TargetType::LimitedDrop, target),
        }
    }

    type Log = Arc<Mutex<Vec<Vec<u64>>>>;

    /// A sender that records each batch and answers each user with its own id, after `gate`
    /// lets it (when given).
    fn echo(log: Log, gate: Option<Arc<tokio::sync::Notify>>) -> impl Fn() -> SendBatch {
        move || {
            let (log, gate) = (log.clone(), gate.clone());
            Box::new(move |users: Vec<u64>, _now| {
                Box::pin(async move {
                    log.lock().push(users.clone());
                    match gate {
                        Some(gate) => gate.notified().await,
                        // A round trip: other tasks run meanwhile.
                        None => tokio::task::yield_now().await,
                    }
                    Ok(users
                        .into_iter()
                        .map(|u| Value::Integer(u as i64))
                        .collect())
                })
            })
        }
    }

    /// The first call goes at once; the calls that come while it is in flight share the next.
    #[tokio::test]
    async fn calls_ready_together_share_a_call_and_get_their_own_replies() {
        let log = Log::default();
        let calls: Vec<_> = (1..=10)
            .map(|u| tokio::spawn(join(key(7), u, u, echo(log.clone(), None))))
            .collect();
        for (u, call) in (1..=10).zip(calls) {
            assert_eq!(call.await.unwrap().unwrap(), Value::Integer(u));
        }
        assert_eq!(*log.lock(), vec![vec![1], (2..=10).collect::<Vec<u64>>()]);
        assert!(OPEN.with(|open| open.lock().in_flight.is_empty()));
    }

    /// Alone on its thread, a call goes at once and alone, every time.
    #[tokio::test]
    async fn a_call_alone_goes_at_once() {
        let log = Log::default();
        for u in 1..=3 {
            assert_eq!(
                join(key(8), u, 0, echo(log.clone(), None)).await.unwrap(),
                Value::Integer(u as i64)
            );
        }
        assert_eq!(*log.lock(), vec![vec![1], vec![2], vec![3]]);
    }

    #[tokio::test]
    async fn targets_do_not_share_and_a_full_batch_goes_at_once() {
        let log = Log::default();
        let n = MAX_BATCH as u64 + 5;
        let mut calls = Vec::new();
        for u in 0..n {
            calls.push(tokio::spawn(join(key(1), u, 0, echo(log.clone(), None))));
            calls.push(tokio::spawn(join(
                key(2),
                1000 + u,
                0,
                echo(log.clone(), None),
            )));
        }
        for call in calls {
            call.await.unwrap().unwrap();
        }
        let mut sizes: Vec<(bool, usize)> =
            log.lock().iter().map(|b| (b[0] >= 1000, b.len())).collect();
        sizes.sort();
        assert_eq!(
            sizes,
            vec![
                (false, 1),
                (false, 4),
                (false, MAX_BATCH),
                (true, 1),
                (true, 4),
                (true, MAX_BATCH)
            ]
        );
        // Each batch keeps the order joined, and nobody is in two.
        for b in log.lock().iter() {
            assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
        }
    }

    #[tokio::test]
    async fn a_failed_call_fails_every_user_of_its_batch() {
        let failing = || -> SendBatch {
            Box::new(|_users, _now| {
                Box::pin(async {
                    tokio::task::yield_now().await;
                    Err(StoreError::Timeout)
                })
            })
        };
        let short = || -> SendBatch {
            Box::new(|_users, _now| {
                Box::pin(async {
                    tokio::task::yield_now().await;
                    Ok(vec![Value::Integer(1)])
                })
            })
        };
        // The first call of each key goes alone; the next two share one.
        let calls: Vec<_> = (1..=3)
            .map(|u| tokio::spawn(join(key(3), u, 0, failing)))
            .collect();
        for call in calls {
            assert!(matches!(call.await.unwrap(), Err(StoreError::Timeout)));
        }
        let alone = tokio::spawn(join(key(4), 1, 0, short));
        let a = tokio::spawn(join(key(4), 2, 0, short));
        let b = tokio::spawn(join(key(4), 3, 0, short));
        assert_eq!(alone.await.unwrap().unwrap(), Value::Integer(1));
        assert!(matches!(a.await.unwrap(), Err(StoreError::Protocol(_))));
        assert!(matches!(b.await.unwrap(), Err(StoreError::Protocol(_))));
    }

    /// A call of `key` held in flight until `gate` opens, so that the next calls batch.
    fn hold(
        key: BatchKey,
        log: &Log,
        gate: &Arc<tokio::sync::Notify>,
    ) -> tokio::task::JoinHandle<Result<Value, StoreError>> {
        tokio::spawn(join(key, 0, 0, echo(log.clone(), Some(gate.clone()))))
    }

    /// The leader gives up while the batch is on its way: the others send their users alone.
    #[tokio::test]
    async fn when_the_leader_gives_up_the_others_send_alone() {
        let log = Log::default();
        let (first, second) = (
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(tokio::sync::Notify::new()),
        );
        let held = hold(key(5), &log, &first);
        let leader = tokio::spawn(join(key(5), 1, 0, echo(log.clone(), Some(second.clone()))));
        let other = tokio::spawn(join(key(5), 2, 0, echo(log.clone(), None)));
        while log.lock().len() < 2 {
            tokio::task::yield_now().await;
        }
        leader.abort();
        assert_eq!(other.await.unwrap().unwrap(), Value::Integer(2));
        first.notify_one();
        held.await.unwrap().unwrap();
        assert_eq!(*log.lock(), vec![vec![0], vec![1, 2], vec![2]]);
    }

    /// The leader gives up before sending: the batch closes, and the others send alone.
    #[tokio::test]
    async fn a_batch_whose_leader_is_gone_before_sending_is_closed() {
        let log = Log::default();
        let gate = Arc::new(tokio::sync::Notify::new());
        let held = hold(key(6), &log, &gate);
        while log.lock().is_empty() {
            tokio::task::yield_now().await;
        }
        let mut leader = Box::pin(join(key(6), 1, 0, echo(log.clone(), None)));
        // Polled once, the leader opens the batch and waits for the call in flight to answer.
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(leader.as_mut().poll(cx)));
        assert!(first.await.is_pending());
        let other = tokio::spawn(join(key(6), 2, 0, echo(log.clone(), None)));
        while OPEN.with(|open| open.lock().open.get(&key(6)).map_or(0, |b| b.users.len())) < 2 {
            tokio::task::yield_now().await;
        }
        drop(leader);
        assert_eq!(other.await.unwrap().unwrap(), Value::Integer(2));
        gate.notify_one();
        held.await.unwrap().unwrap();
        assert_eq!(*log.lock(), vec![vec![0], vec![2]]);
        assert!(OPEN.with(|open| {
            let batches = open.lock();
            batches.open.is_empty() && batches.in_flight.is_empty()
        }));
    }

    /// The leader sends when the call in flight answers, not before: every call that comes
    /// meanwhile rides along.
    #[tokio::test(start_paused = true)]
    async fn the_leader_waits_for_the_call_in_flight() {
        let log = Log::default();
        let gate = Arc::new(tokio::sync::Notify::new());
        let held = hold(key(9), &log, &gate);
        while log.lock().is_empty() {
            tokio::task::yield_now().await;
        }
        let mut calls = Vec::new();
        for u in 1..=5 {
            calls.push(tokio::spawn(join(key(9), u, 0, echo(log.clone(), None))));
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(*log.lock(), vec![vec![0]]);
        gate.notify_one();
        held.await.unwrap().unwrap();
        for (u, call) in (1..=5).zip(calls) {
            assert_eq!(call.await.unwrap().unwrap(), Value::Integer(u));
        }
        assert_eq!(*log.lock(), vec![vec![0], vec![1, 2, 3, 4, 5]]);
    }

    /// A call in flight that does not answer holds the next batch back `MAX_WAIT` at most.
    #[tokio::test(start_paused = true)]
    async fn a_call_in_flight_that_hangs_holds_the_next_batch_back_briefly() {
        let log = Log::default();
        let gate = Arc::new(tokio::sync::Notify::new());
        let held = hold(key(10), &log, &gate);
        while log.lock().is_empty() {
            tokio::task::yield_now().await;
        }
        let start = tokio::time::Instant::now();
        let a = tokio::spawn(join(key(10), 1, 0, echo(log.clone(), None)));
        let b = tokio::spawn(join(key(10), 2, 0, echo(log.clone(), None)));
        assert_eq!(a.await.unwrap().unwrap(), Value::Integer(1));
        assert_eq!(b.await.unwrap().unwrap(), Value::Integer(2));
        assert_eq!(start.elapsed(), MAX_WAIT);
        assert_eq!(*log.lock(), vec![vec![0], vec![1, 2]]);
        gate.notify_one();
        held.await.unwrap().unwrap();
    }
}
