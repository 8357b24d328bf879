//! The unit tests of `batch.rs`.

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
