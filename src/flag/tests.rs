//! The unit tests of `flag.rs`.

use super::*;
use crate::queue::TargetType;

#[test]
fn decimals_are_written_like_to_string() {
    let mut buf = [0u8; 20];
    for n in [0, 1, 9, 10, 1001, 987_654_321, u64::MAX - 1, u64::MAX] {
        assert_eq!(write_decimal(n, &mut buf), n.to_string().as_bytes());
    }
    // The documented definition, computed the slow way.
    let by_definition = |user: u64| {
        let d = ring::digest::digest(&ring::digest::SHA256, user.to_string().as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&d.as_ref()[..8]);
        (u64::from_be_bytes(first) % 100) as u8
    };
    for user in (1..2000).chain([u64::MAX, 1 << 40]) {
        assert_eq!(bucket(user), by_definition(user));
    }
}

#[test]
fn rollout_ends_need_no_bucket_and_agree_with_it() {
    let t = QueueTarget::new(TargetType::LimitedDrop, 1);
    for user in 1..500 {
        assert!(FlagState::new(true, 100).queue_on(t, user));
        assert!(!FlagState::new(true, 0).queue_on(t, user));
        assert!(!FlagState::new(false, 100).queue_on(t, user));
        assert_eq!(
            FlagState::new(true, 37).queue_on(t, user),
            bucket(user) < 37
        );
    }
}

#[test]
fn buckets_are_stable_and_spread() {
    assert_eq!(bucket(1001), bucket(1001));
    let mut counts = [0u32; 100];
    for u in 1..=100_000u64 {
        counts[bucket(u) as usize] += 1;
    }
    assert!(
        counts.iter().all(|&c| (800..1200).contains(&c)),
        "{counts:?}"
    );
}

#[test]
fn hash_fields_override_the_defaults() {
    let defaults = FlagState::new(false, 100);
    let f = |pairs: &[(&str, &str)]| {
        let fields: Vec<(String, String)> = pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        FlagState::with_overrides(&defaults, &fields)
    };
    let (s, problems) = f(&[
        ("enabled", "on"),
        ("rollout_percent", "10"),
        ("LIMITED_DROP:42", "off"),
        ("queued_since", "1783591200"),
    ]);
    assert!(problems.is_empty());
    assert_eq!(s.queued_since, Some(1_783_591_200));
    assert!(s.enabled);
    assert_eq!(s.rollout_percent, 10);
    let t = QueueTarget::new(crate::queue::TargetType::LimitedDrop, 42);
    assert_eq!(s.per_target.get(&t), Some(&false));
    let (s, problems) = f(&[
        ("enabled", "yes"),
        ("rollout_percent", "101"),
        ("LIMITED_DROP:x", "on"),
        ("LIMITED_DROP:1", "1"),
        ("queued_since", "-5"),
    ]);
    assert_eq!(s, defaults);
    assert_eq!(problems.len(), 5, "{problems:?}");
}

#[test]
fn an_unknown_flag_queues_everyone() {
    let t = QueueTarget::new(TargetType::LimitedDrop, 42);
    let f = Flag::unknown();
    assert!(f.queue_on(t, 7));
    assert_eq!(f.gate_view(t, 7), GateView::Unknown);
    f.set(FlagState::new(false, 100));
    assert!(!f.queue_on(t, 7));
    assert_eq!(f.gate_view(t, 7), GateView::Off);
    f.set(FlagState::new(true, 100));
    assert_eq!(f.gate_view(t, 7), GateView::On { queued_since: None });
}

#[test]
fn rollout_and_overrides() {
    let t = QueueTarget::new(TargetType::LimitedDrop, 42);
    let other = QueueTarget::new(TargetType::LimitedDrop, 43);
    let off = FlagState::new(false, 100);
    assert!(!off.queue_on(t, 1));
    let all = FlagState::new(true, 100);
    assert!((1..1000).all(|u| all.queue_on(t, u)));
    let none = FlagState::new(true, 0);
    assert!((1..1000).all(|u| !none.queue_on(t, u)));
    let half = FlagState::new(true, 50);
    let on = (1..10_000).filter(|&u| half.queue_on(t, u)).count();
    assert!((4500..5500).contains(&on), "{on}");
    assert!((1..1000).all(|u| half.queue_on(t, u) == (bucket(u) < 50)));
    let mut one = FlagState::new(false, 100);
    one.per_target.insert(t, true);
    assert!(one.queue_on(t, 7));
    assert!(!one.queue_on(other, 7));
}

#[test]
fn a_flag_change_writes_its_fields_and_says_when_the_queue_took_users_in() {
    let pairs = |c: &FlagChange| c.fields(1_000).unwrap();
    let on = FlagChange {
        enabled: Some(true),
        ..FlagChange::default()
    };
    assert_eq!(
        pairs(&on),
        [
            ("enabled".to_string(), "on".to_string()),
            (QUEUED_SINCE.to_string(), "1000".to_string())
        ]
    );
    let off = FlagChange {
        enabled: Some(false),
        ..FlagChange::default()
    };
    assert_eq!(pairs(&off), [("enabled".to_string(), "off".to_string())]);
    let sale = QueueTarget::new(TargetType::LimitedDrop, 42);
    let sale_off = FlagChange {
        enabled: Some(false),
        target: Some(sale),
        ..FlagChange::default()
    };
    assert_eq!(
        pairs(&sale_off),
        [("LIMITED_DROP:42".to_string(), "off".to_string())]
    );
    for bad in [
        FlagChange::default(),
        FlagChange {
            rollout: Some(101),
            ..FlagChange::default()
        },
        FlagChange {
            rollout: Some(5),
            enabled: Some(true),
            target: Some(sale),
        },
        FlagChange {
            target: Some(sale),
            ..FlagChange::default()
        },
    ] {
        assert!(bad.fields(1).is_err(), "{bad:?}");
    }
}

#[test]
fn a_flag_change_is_read_strictly_from_json() {
    assert_eq!(
        FlagChange::from_json(br#"{"target":"LIMITED_DROP:42","enabled":false}"#),
        Ok(FlagChange {
            enabled: Some(false),
            rollout: None,
            target: Some(QueueTarget::new(TargetType::LimitedDrop, 42)),
        })
    );
    assert_eq!(
        FlagChange::from_json(br#" {"rolloutPercent":30}"#).map(|c| c.rollout),
        Ok(Some(30))
    );
    for bad in [
        &br#"{"enabled":"on"}"#[..],
        br#"{"enabled":null}"#,
        br#"{"enabled":true,"enabled":false}"#,
        br#"{"rolloutPercent":256}"#,
        br#"{"rolloutPercent":-1}"#,
        br#"{"target":"LIMITED_DROP:042","enabled":true}"#,
        br#"{"Enabled":true}"#,
        br#"[true]"#,
        b"",
    ] {
        assert!(
            FlagChange::from_json(bad).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}
