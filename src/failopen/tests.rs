//! The unit tests of `failopen.rs`.

use super::*;
use crate::queue::TargetType;

fn t(id: u64) -> QueueTarget {
    QueueTarget::new(TargetType::LimitedDrop, id)
}

fn config(tick_ms: u64, batch: u32, min_replicas: u32) -> PacerConfig {
    PacerConfig {
        tick_ms,
        batch,
        min_replicas,
        paced_for_ms: 120_000,
        call_timeout_ms: 150,
    }
}

/// Seat 0 of `n` equal slices.
fn seat0(n: u32) -> Slice {
    Slice::new(0, crate::slice::UNIT / n)
}

/// A pacer that registered once at epoch ms 0 with `replicas` counted (holding seat 0 of
/// them), and has been cut off since; `PACING` is a moment inside its pacing window.
fn cut_off(tick_ms: u64, batch: u32, replicas: u32) -> Pacer {
    let p = Pacer::new(config(tick_ms, batch, 1));
    p.registering(Slice::EMPTY, 0);
    p.registered(Slice::EMPTY, seat0(replicas), 0, replicas);
    let asked = p.slice_to_ask();
    p.registering(asked, 0);
    p.registered(asked, asked, 0, replicas);
    p
}

const PACING: u64 = 50_000;

#[test]
fn the_slice_asked_for_is_the_seat_the_roster_told() {
    let p = Pacer::new(config(2000, 100, 1));
    assert_eq!(p.slice_to_ask(), Slice::EMPTY, "never told: nothing");
    p.registered(Slice::EMPTY, seat0(3), 0, 3);
    assert_eq!(p.slice_to_ask(), seat0(3));
}

#[test]
fn paces_only_inside_the_window_the_pumps_hold_back_for() {
    // Tick 1 s: live window 3 s, so pacing starts 4 × 150 + 3000 + 1000 ms after the last
    // registration sent, and stops 2 s before the 120 s the pumps hold back for.
    let half = Slice::new(0, 500_000);
    let p = Pacer::new(config(1000, 10, 1));
    assert_eq!(p.paced_slice(10_000), None, "never registered");
    p.registering(Slice::EMPTY, 1_000);
    p.registered(Slice::EMPTY, half, 1_000, 2);
    p.registering(half, 2_000);
    p.registered(half, half, 2_000, 2);
    assert_eq!(p.config().pace_after_ms(), 4_600);
    assert_eq!(p.paced_slice(6_599), None, "a pump may still count it live");
    assert_eq!(p.paced_slice(6_600), Some(half));
    assert_eq!(p.paced_slice(119_999), Some(half));
    assert_eq!(
        p.paced_slice(120_000),
        None,
        "the pumps are about to forget it"
    );
    assert_eq!(
        p.try_admit(t(1), 1, 130_000, 2_000),
        Pace::Held,
        "nobody after the window"
    );
    // An attempt whose answer was lost may have landed: it holds pacing back again, and
    // what the replica held of the slice it asked for is what it paces with.
    let moved = Slice::new(300_000, 800_000);
    p.registering(moved, 60_000);
    assert_eq!(p.paced_slice(64_599), None);
    assert_eq!(p.paced_slice(64_600), Some(Slice::new(300_000, 500_000)));
    assert_eq!(p.own_slice(64_600), Slice::new(300_000, 500_000));
    assert_eq!(
        p.own_slice(120_000),
        Slice::EMPTY,
        "the roster may have forgotten it"
    );
    // A slice is never paced with before it is confirmed.
    p.registering(half, 70_000);
    assert_eq!(p.paced_slice(80_000), Some(Slice::new(300_000, 500_000)));
    p.registered(half, half, 70_000, 1);
    assert_eq!(p.paced_slice(80_000), Some(half));
    assert_eq!(
        p.paced_slice(187_999),
        Some(half),
        "the window runs from the last confirmed registration"
    );
    assert_eq!(p.paced_slice(188_000), None);
}

/// Batch 2 and three replicas cut off at once: each admits in some ticks, and the three
/// together never more than 2 in a tick.
#[test]
fn a_batch_smaller_than_the_replica_count_rotates() {
    let seat = |k: u32| {
        Slice::new(
            crate::slice::UNIT / 3 * k,
            if k == 2 {
                crate::slice::UNIT
            } else {
                crate::slice::UNIT / 3 * (k + 1)
            },
        )
    };
    let pacers: Vec<Pacer> = (0..3)
        .map(|k| {
            let p = Pacer::new(config(1000, 2, 1));
            p.registering(seat(k), 0);
            p.registered(seat(k), seat(k), 0, 3);
            p
        })
        .collect();
    let mut each = [0usize; 3];
    let mut users: Vec<std::collections::VecDeque<u64>> =
        (0..3).map(|k| owned(seat(k), 64 * 5).into()).collect();
    for tick in 0..64u64 {
        let now = PACING - PACING % 1000 + tick * 1000 + 1;
        let mut in_tick = 0;
        for (k, p) in pacers.iter().enumerate() {
            for _ in 0..5 {
                let user = users[k].pop_front().unwrap();
                if p.try_admit(t(1), user, now, 0) == Pace::Admitted {
                    each[k] += 1;
                    in_tick += 1;
                }
            }
        }
        assert!(in_tick <= 2, "tick {tick}: {in_tick}");
    }
    assert!(each.iter().all(|n| *n >= 40), "{each:?}");
    assert_eq!(each.iter().sum::<usize>(), 128, "{each:?}");
}

/// The first `n` users `slice` owns.
fn owned(slice: Slice, n: usize) -> Vec<u64> {
    (0..).filter(|u| slice.owns(*u)).take(n).collect()
}

#[test]
fn admits_at_most_the_share_per_tick_and_target() {
    let p = cut_off(1000, 10, 2);
    let users = owned(seat0(2), 200);
    let now = PACING;
    let admitted: Vec<u64> = users[..100]
        .iter()
        .copied()
        .filter(|u| p.try_admit(t(1), *u, now, 0) == Pace::Admitted)
        .collect();
    assert_eq!(admitted.len(), 5);
    assert_eq!(
        p.try_admit(t(2), users[0], now + 10, 0),
        Pace::Admitted,
        "another target has its own budget"
    );
    assert_eq!(p.try_admit(t(1), users[99], now + 999, 0), Pace::Spent);
    assert_eq!(
        p.try_admit(t(1), admitted[2], now + 999, 0),
        Pace::Admitted,
        "an admitted user again"
    );
    let next = users[100..]
        .iter()
        .filter(|u| p.try_admit(t(1), **u, now + 1000, 0) == Pace::Admitted)
        .count();
    assert_eq!(next, 5, "a new tick, a new budget");
}

/// Two replicas cut off at once, every user asking both: each user is let through by the
/// replica its slice belongs to, never by the other, and the two together keep the batch.
#[test]
fn a_user_is_let_through_only_by_the_replica_that_owns_it() {
    let half = |k: u32| Slice::new(k * 500_000, (k + 1) * 500_000);
    let pacers: Vec<Pacer> = (0..2)
        .map(|k| {
            let p = Pacer::new(config(1000, 6, 1));
            p.registering(half(k), 0);
            p.registered(half(k), half(k), 0, 2);
            p
        })
        .collect();
    let mut by: HashMap<u64, Vec<usize>> = HashMap::new();
    for tick in 0..20u64 {
        let now = PACING - PACING % 1000 + tick * 1000 + 600;
        let mut in_tick = 0;
        for user in 0..200u64 {
            for (k, p) in pacers.iter().enumerate() {
                if p.try_admit(t(1), user, now, 0) == Pace::Admitted {
                    let replicas = by.entry(user).or_default();
                    if !replicas.contains(&k) {
                        replicas.push(k);
                        in_tick += 1;
                    }
                    assert!(half(k as u32).owns(user), "user {user} let through by {k}");
                }
            }
        }
        assert!(in_tick <= 6, "tick {tick}: {in_tick} new users");
    }
    assert_eq!(by.len(), 120, "six a tick for 20 ticks");
    assert!(by.values().all(|r| r.len() == 1));
}

#[test]
fn a_late_clock_reading_never_reopens_an_old_tick() {
    let p = cut_off(1000, 4, 1);
    let admitted = |from: u64, at: u64| {
        (from..from + 100)
            .filter(|u| p.try_admit(t(1), *u, at, 0) == Pace::Admitted)
            .count()
    };
    assert_eq!(admitted(0, PACING + 500), 4);
    // Requests that read the clock in the previous tick and reach the pacer only now (they
    // waited on the store) spend this tick's budget, which is gone.
    assert_eq!(admitted(100, PACING - 100), 0);
    assert_eq!(admitted(200, PACING + 900), 0);
    assert_eq!(admitted(300, PACING + 1000), 4);
}

#[test]
fn a_user_asking_again_spends_nothing() {
    let p = cut_off(1000, 2, 1);
    for _ in 0..10 {
        assert_eq!(p.try_admit(t(1), 7, PACING, 0), Pace::Admitted);
    }
    assert_eq!(p.try_admit(t(1), 8, PACING, 0), Pace::Admitted);
    assert_eq!(p.try_admit(t(1), 9, PACING, 0), Pace::Spent);
}

#[test]
fn nobody_in_a_tick_where_the_store_answered() {
    let p = cut_off(1000, 10, 1);
    assert_eq!(p.try_admit(t(1), 1, PACING + 500, PACING + 100), Pace::Held);
    assert_eq!(
        p.try_admit(t(1), 1, PACING + 1000, PACING + 100),
        Pace::Admitted
    );
}

#[test]
fn the_target_table_is_bounded_and_known_sales_keep_a_budget() {
    let p = cut_off(1000, 10, 1);
    p.set_known(&[t(1)]);
    for id in 100..100 + MAX_PACED_TARGETS as u64 {
        assert_eq!(p.try_admit(t(id), 1, PACING, 0), Pace::Admitted);
    }
    assert_eq!(
        p.try_admit(t(999_999), 1, PACING + 500, 0),
        Pace::Spent,
        "full in this tick"
    );
    assert_eq!(
        p.try_admit(t(1), 1, PACING + 500, 0),
        Pace::Admitted,
        "a known sale still gets its budget"
    );
    assert_eq!(
        p.try_admit(t(999_999), 1, PACING + 1000, 0),
        Pace::Admitted,
        "stale entries make room"
    );
}

#[test]
fn made_up_targets_share_one_bounded_budget_per_tick() {
    let p = cut_off(1000, 100_000, 1);
    p.set_known(&[t(1)]);
    let strangers = (0..70_000u64)
        .filter(|u| p.try_admit(t(2 + u % 8), *u, PACING, 0) == Pace::Admitted)
        .count();
    assert_eq!(strangers, MAX_STRANGER_USERS);
    assert_eq!(
        p.try_admit(t(1), 1, PACING, 0),
        Pace::Admitted,
        "a known sale"
    );
    assert_eq!(
        p.try_admit(t(3), 1_000_000, PACING + 1000, 0),
        Pace::Admitted,
        "a new tick"
    );
}

#[test]
fn ticket_holders_come_first_lowest_seq_first() {
    let p = cut_off(1000, 4, 1);
    let tick = PACING - PACING % 1000 + 1000;
    // Holders with seqs 10..20 were seen while this replica could not pace yet (the store
    // answered in that tick): they are remembered, and come first in seq order from the
    // first paced tick.
    for seq in [19, 12, 15, 10, 11, 13, 14, 16, 17, 18] {
        assert_eq!(
            p.admit(t(1), seq, Some(seq), tick - 10, tick - 20),
            Pace::Held
        );
    }
    // Fresh users flood the start of the tick.
    for u in 0..50u64 {
        assert_eq!(
            p.try_admit(t(1), 1000 + u, tick + 1, 0),
            Pace::Spent,
            "the first half is the holders'"
        );
    }
    let admitted: Vec<u64> = [19, 12, 15, 10, 11, 13, 14, 16, 17, 18]
        .into_iter()
        .filter(|&seq| p.admit(t(1), seq, Some(seq), tick + 2, 0) == Pace::Admitted)
        .collect();
    assert_eq!(admitted, vec![12, 10, 11, 13], "the four lowest seqs");
    assert_eq!(p.try_admit(t(1), 2000, tick + 600, 0), Pace::Spent, "spent");
    // Next tick: the holders left keep coming first; with none waiting, fresh users may use
    // the second half.
    let next = tick + 1000;
    assert_eq!(p.admit(t(1), 19, Some(19), next + 1, 0), Pace::Spent);
    for seq in [14, 15, 16, 17] {
        assert_eq!(p.admit(t(1), seq, Some(seq), next + 1, 0), Pace::Admitted);
    }
    let later = next + 1000 * 10;
    assert_eq!(
        p.try_admit(t(1), 3000, later + 1, 0),
        Pace::Admitted,
        "nobody holds a ticket"
    );
}

#[test]
fn a_user_let_through_is_not_let_through_again_for_another_share() {
    let p = cut_off(1000, 2, 1);
    let tick = PACING - PACING % 1000 + 1000;
    assert_eq!(p.admit(t(1), 5, Some(5), tick + 1, 0), Pace::Admitted);
    // The next tick: the same user (replaying its ticket) is answered again, for free.
    let next = tick + 1000;
    assert_eq!(p.admit(t(1), 5, Some(5), next + 1, 0), Pace::Admitted);
    assert_eq!(p.admit(t(1), 6, Some(6), next + 2, 0), Pace::Admitted);
    assert_eq!(p.admit(t(1), 7, Some(7), next + 3, 0), Pace::Admitted);
    assert_eq!(
        p.admit(t(1), 8, Some(8), next + 4, 0),
        Pace::Spent,
        "two a tick"
    );
}

#[test]
fn fresh_users_get_what_the_holders_left_in_the_second_half() {
    let p = cut_off(1000, 4, 1);
    let tick = PACING - PACING % 1000 + 1000;
    assert_eq!(p.admit(t(1), 5, Some(5), tick + 10, 0), Pace::Admitted);
    assert_eq!(p.admit(t(1), 6, Some(6), tick + 10, 0), Pace::Admitted);
    assert_eq!(p.admit(t(1), 9, Some(9), tick + 10, 0), Pace::Admitted);
    // Holder 9 was the last one seen; it is let through, so nobody holds a ticket now.
    assert_eq!(p.try_admit(t(1), 100, tick + 400, 0), Pace::Admitted);
    assert_eq!(
        p.try_admit(t(1), 101, tick + 600, 0),
        Pace::Spent,
        "the share is used"
    );
    let next = tick + 1000;
    // A holder seen but not let through keeps the first half for holders.
    assert_eq!(p.admit(t(1), 20, Some(20), next + 1, 0), Pace::Admitted);
    for u in 21..24 {
        assert_eq!(p.admit(t(1), u, Some(u), next + 2, 0), Pace::Admitted);
    }
    assert_eq!(p.admit(t(1), 30, Some(30), next + 3, 0), Pace::Spent);
    assert_eq!(p.try_admit(t(1), 102, next + 700, 0), Pace::Spent);
}

#[test]
fn the_decision_per_mode_and_cause() {
    let p = cut_off(1000, 1, 1);
    let never = || -> Option<u64> { panic!("the ticket is read in paced mode only") };
    let d = decide(&p, FailOpenMode::Open, false, t(1), 1, never, PACING, 0);
    assert_eq!(
        (d.mode, d.outcome, d.answer),
        (FailOpenMode::Open, "direct_admitted", Answer::Admit)
    );
    let d = decide(
        &p,
        FailOpenMode::Closed,
        false,
        t(1),
        1,
        never,
        PACING + 400,
        0,
    );
    assert_eq!(d.answer, Answer::Refuse { retry_after_s: 1 });
    // A replica that only refused the call itself never lets anyone through unmetered.
    let d = decide(&p, FailOpenMode::Open, true, t(1), 1, || None, PACING, 0);
    assert_eq!((d.mode, d.answer), (FailOpenMode::Paced, Answer::Admit));
    let d = decide(&p, FailOpenMode::Open, true, t(1), 2, || None, PACING, 0);
    assert_eq!(
        (d.outcome, d.answer),
        ("waiting", Answer::Wait { retry_after_s: 1 })
    );
    let d = decide(&p, FailOpenMode::Paced, false, t(1), 3, || None, 500_000, 0);
    assert_eq!(d.outcome, "held", "after the pacing window");
}

#[test]
fn tokens_wait_after_a_broken_connection_until_two_registrations_since() {
    let p = Pacer::new(config(1000, 10, 1));
    assert!(!p.unsure_after_break(0, 5_000), "never broke");
    p.registered(Slice::WHOLE, Slice::WHOLE, 1_000, 1);
    p.registered(Slice::WHOLE, Slice::WHOLE, 2_000, 1);
    assert!(
        p.unsure_after_break(2_500, 2_600),
        "broke after the last one"
    );
    p.registered(Slice::WHOLE, Slice::WHOLE, 3_000, 1);
    assert!(
        p.unsure_after_break(2_500, 3_100),
        "one since: another replica may not have registered since"
    );
    p.registered(Slice::WHOLE, Slice::WHOLE, 2_900, 1);
    assert!(
        p.unsure_after_break(2_500, 3_100),
        "an older answer counts not"
    );
    p.registered(Slice::WHOLE, Slice::WHOLE, 4_000, 1);
    assert!(!p.unsure_after_break(2_500, 4_100), "two since");
    // Without registrations it ends four ticks and command timeouts after the break, 5 s at
    // most.
    assert!(p.unsure_after_break(10_000, 14_599));
    assert!(!p.unsure_after_break(10_000, 14_600));
    let slow = Pacer::new(config(3_600_000, 10, 1));
    assert!(slow.unsure_after_break(10_000, 14_999));
    assert!(!slow.unsure_after_break(10_000, 15_000));
}

#[test]
fn a_loss_found_here_is_reported_to_the_roster_as_a_rollback() {
    let p = Pacer::new(config(1000, 10, 1));
    assert!(!p.saw_roster_clock(5, 0, 1_000));
    p.report_loss(1_500);
    assert_eq!(p.roster_clock(), (5, 1), "one rollback more than known");
    assert!(
        p.saw_roster_clock(6, 1, 2_000),
        "the roster took it: learned as a rollback"
    );
    assert!(p.issue_held(2_100));
    assert!(p.take_rollback(), "this replica writes back too");
    assert_eq!(p.roster_clock(), (6, 1), "reported once");
    // Losses found right after are that rollback's: not told again.
    p.report_loss(4_999);
    assert_eq!(p.roster_clock(), (6, 1));
    p.report_loss(5_000);
    assert_eq!(p.roster_clock(), (6, 2), "a later loss is a new one");
}

#[test]
fn retry_after_is_the_rest_of_the_tick() {
    let p = Pacer::new(config(2000, 1, 1));
    assert_eq!(p.retry_after_secs(10_000), 2);
    assert_eq!(p.retry_after_secs(11_500), 1);
}
