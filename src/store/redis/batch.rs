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
mod tests;
