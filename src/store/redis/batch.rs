//! Enters and polls gathered per thread and target, and sent as one script call.
//!
//! In a sale, many requests for the same target are ready in the same turn of a proxy thread's
//! event loop. The first of them opens a batch for its (store, script, target, heartbeat window)
//! and spawns a task that yields once, so that every request task already runnable on the thread
//! runs first and joins the batch. The task then sends the batch as one `enter.lua` /
//! `poll.lua` call and hands each caller its own reply. The scripts answer exactly as the same
//! calls made one after another in the order joined. A batch that reaches `MAX_BATCH` users is
//! sent at once.
//!
//! Nothing else changes for a caller: it waits within its own deadline (a caller that gave up
//! leaves its user in the batch, as a pipelined call that timed out is still executed), and a
//! call that fails fails every user of its batch with the same error. Every open batch has a
//! task that will send it: a batch is sent only by whoever removes it from the map, and a
//! request that finds no open batch opens one and spawns its task.
//!
//! The open batches of a thread sit behind an `Arc<Mutex>` that the task holds, so a task that
//! runs on another thread (a multi-threaded runtime) still sends the batch it was spawned for.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fred::prelude::Value;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::queue::QueueTarget;
use crate::store::StoreError;

/// The most users one call carries (the scripts' `unpack` limits are far above it).
pub const MAX_BATCH: usize = 64;

/// Which script a batch is for, with what makes its calls differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Enter { capacity: u64 },
    Poll,
}

/// Calls that may share one script call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchKey {
    /// Which `RedisStore` (`store_id`).
    pub store: u64,
    pub kind: Kind,
    pub target: QueueTarget,
    /// The heartbeat window (`Liveness::window`) the calls fall in.
    pub window: u64,
}

/// Sends one batch: its users in order and the latest `now` (ms) among its calls; answers one
/// reply per user, in the same order.
pub type SendBatch =
    Box<dyn FnOnce(Vec<u64>, u64) -> Pin<Box<dyn Future<Output = Sent> + Send>> + Send>;
pub type Sent = Result<Vec<Value>, StoreError>;

#[derive(Default)]
struct Batch {
    users: Vec<u64>,
    now_ms: u64,
    replies: Vec<oneshot::Sender<Result<Value, StoreError>>>,
}

type Open = Arc<Mutex<HashMap<BatchKey, Batch>>>;

thread_local! {
    static OPEN: Open = Open::default();
}

static NEXT_STORE: AtomicU64 = AtomicU64::new(1);

/// A new store's id, telling its batches from another store's on the same thread.
pub fn store_id() -> u64 {
    NEXT_STORE.fetch_add(1, Ordering::Relaxed)
}

/// What joining a batch asks of the caller.
enum Joined {
    /// The batch was open already: its task sends it.
    Waits,
    /// This call opened the batch: spawn the task that sends it after a yield.
    Opened(Open),
    /// This call filled the batch: send it now.
    Full(Batch),
}

/// Adds `user` to this thread's open batch for `key` (opening one if there is none) and waits
/// for its reply. `send` is called at most once, by the task that sends the batch.
pub async fn join(
    key: BatchKey,
    user: u64,
    now_ms: u64,
    send: impl FnOnce() -> SendBatch,
) -> Result<Value, StoreError> {
    let (tx, rx) = oneshot::channel();
    let joined = OPEN.with(|open| {
        let mut batches = open.lock();
        let batch = batches.entry(key).or_default();
        let opened = batch.users.is_empty();
        batch.users.push(user);
        batch.replies.push(tx);
        batch.now_ms = batch.now_ms.max(now_ms);
        if batch.users.len() >= MAX_BATCH {
            Joined::Full(batches.remove(&key).unwrap_or_default())
        } else if opened {
            Joined::Opened(open.clone())
        } else {
            Joined::Waits
        }
    });
    match joined {
        Joined::Waits => {}
        Joined::Full(batch) => {
            tokio::spawn(deliver(batch, send()));
        }
        Joined::Opened(open) => {
            let send = send();
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                let batch = open.lock().remove(&key);
                // Gone when it filled up meanwhile and was sent by the call that filled it.
                if let Some(batch) = batch {
                    deliver(batch, send).await;
                }
            });
        }
    }
    rx.await.unwrap_or_else(|_| {
        Err(StoreError::Unavailable(
            "the batched call was dropped".into(),
        ))
    })
}

/// Sends `batch` and hands each caller its reply (or the call's error).
async fn deliver(batch: Batch, send: SendBatch) {
    let Batch {
        users,
        now_ms,
        replies,
    } = batch;
    let n = users.len();
    match send(users, now_ms).await {
        Ok(values) if values.len() == n => {
            for (tx, value) in replies.into_iter().zip(values) {
                let _ = tx.send(Ok(value));
            }
        }
        Ok(values) => {
            let e = StoreError::Protocol(format!("{} replies for {n} users", values.len()));
            for tx in replies {
                let _ = tx.send(Err(e.clone()));
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
            window: 1,
        }
    }

    /// A sender that records each batch and answers each user with its own id.
    fn echo(log: Arc<Mutex<Vec<Vec<u64>>>>) -> impl FnOnce() -> SendBatch {
        move || {
            Box::new(move |users: Vec<u64>, _now| {
                Box::pin(async move {
                    log.lock().push(users.clone());
                    Ok(users
                        .into_iter()
                        .map(|u| Value::Integer(u as i64))
                        .collect())
                })
            })
        }
    }

    #[tokio::test]
    async fn calls_ready_in_one_turn_share_a_call_and_get_their_own_replies() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let calls: Vec<_> = (1..=10)
            .map(|u| tokio::spawn(join(key(7), u, u, echo(log.clone()))))
            .collect();
        for (u, call) in (1..=10).zip(calls) {
            assert_eq!(call.await.unwrap().unwrap(), Value::Integer(u));
        }
        assert_eq!(*log.lock(), vec![(1..=10).collect::<Vec<u64>>()]);
    }

    #[tokio::test]
    async fn targets_do_not_share_and_a_full_batch_goes_at_once() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let n = MAX_BATCH as u64 + 5;
        let mut calls = Vec::new();
        for u in 0..n {
            calls.push(tokio::spawn(join(key(1), u, 0, echo(log.clone()))));
            calls.push(tokio::spawn(join(key(2), 1000 + u, 0, echo(log.clone()))));
        }
        for call in calls {
            call.await.unwrap().unwrap();
        }
        let mut sizes: Vec<(bool, usize)> =
            log.lock().iter().map(|b| (b[0] >= 1000, b.len())).collect();
        sizes.sort();
        assert_eq!(
            sizes,
            vec![(false, 5), (false, MAX_BATCH), (true, 5), (true, MAX_BATCH)]
        );
        // Each batch keeps the order joined, and nobody is in two.
        for b in log.lock().iter() {
            assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
        }
    }

    #[tokio::test]
    async fn a_failed_call_fails_every_user_of_its_batch() {
        let failing = || -> SendBatch {
            Box::new(|_users, _now| Box::pin(async { Err(StoreError::Timeout) }))
        };
        let short = || -> SendBatch {
            Box::new(|_users, _now| Box::pin(async { Ok(vec![Value::Integer(1)]) }))
        };
        let a = tokio::spawn(join(key(3), 1, 0, failing));
        let b = tokio::spawn(join(key(3), 2, 0, failing));
        assert!(matches!(a.await.unwrap(), Err(StoreError::Timeout)));
        assert!(matches!(b.await.unwrap(), Err(StoreError::Timeout)));
        let a = tokio::spawn(join(key(4), 1, 0, short));
        let b = tokio::spawn(join(key(4), 2, 0, short));
        assert!(matches!(a.await.unwrap(), Err(StoreError::Protocol(_))));
        assert!(matches!(b.await.unwrap(), Err(StoreError::Protocol(_))));
    }

    #[tokio::test]
    async fn a_caller_that_gives_up_leaves_the_others_their_replies() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(tokio::sync::Notify::new());
        let gated = |log: Arc<Mutex<Vec<Vec<u64>>>>, gate: Arc<tokio::sync::Notify>| {
            move || -> SendBatch {
                Box::new(move |users: Vec<u64>, _now| {
                    Box::pin(async move {
                        log.lock().push(users.clone());
                        gate.notified().await;
                        Ok(users
                            .into_iter()
                            .map(|u| Value::Integer(u as i64))
                            .collect())
                    })
                })
            }
        };
        let gone = tokio::spawn(join(key(5), 1, 0, gated(log.clone(), gate.clone())));
        let kept = tokio::spawn(join(key(5), 2, 0, gated(log.clone(), gate.clone())));
        // Both join, and the batch is on its way, before the first caller gives up.
        while log.lock().is_empty() {
            tokio::task::yield_now().await;
        }
        gone.abort();
        gate.notify_one();
        assert_eq!(kept.await.unwrap().unwrap(), Value::Integer(2));
        assert_eq!(*log.lock(), vec![vec![1, 2]]);
    }
}
