//! The unit tests of `replies.rs`.

use super::*;

fn arr(items: &[Value]) -> Value {
    Value::Array(items.to_vec())
}

#[test]
fn a_flat_reply_splits_into_one_reply_per_user() {
    let flat = vec![
        "FULL".into(),
        "WAITING".into(),
        "3".into(),
        Value::Integer(2),
        Value::Integer(0),
        "ADMITTED".into(),
        "1700|tok".into(),
        "FULL".into(),
    ];
    let users = per_user(flat, enter_fields, "enter").unwrap();
    assert_eq!(
        users,
        vec![
            arr(&["FULL".into()]),
            arr(&[
                "WAITING".into(),
                "3".into(),
                Value::Integer(2),
                Value::Integer(0)
            ]),
            arr(&["ADMITTED".into(), "1700|tok".into()]),
            arr(&["FULL".into()]),
        ]
    );
    assert_eq!(per_user(Vec::new(), enter_fields, "enter").unwrap(), vec![]);
    // Cut short, an unknown tag, a field where a tag belongs: protocol errors.
    let short = vec!["WAITING".into(), "3".into(), Value::Integer(2)];
    let unknown = vec!["NONE".into()];
    let not_a_tag = vec![Value::Integer(7)];
    for bad in [short, unknown, not_a_tag] {
        assert!(matches!(
            per_user(bad, enter_fields, "enter"),
            Err(StoreError::Protocol(_))
        ));
    }
}

#[test]
fn protocol_errors_never_carry_a_reply_string() {
    // A stored token where a tag belongs (a misaligned reply): the logged error names its
    // kind and size only.
    let token = "1700|eyJzZWNyZXQiOnRydWV9.c2lnbmF0dXJl";
    let misaligned = vec![token.into()];
    let Err(StoreError::Protocol(message)) = per_user(misaligned, poll_fields, "poll") else {
        panic!("a misaligned reply must be a protocol error");
    };
    assert!(
        !message.contains("eyJ") && !message.contains("1700"),
        "{message}"
    );
    assert!(
        message.contains(&format!("{} bytes", token.len())),
        "{message}"
    );
    let Err(StoreError::Protocol(message)) = as_u64(&token.into(), "seq") else {
        panic!("a token is not a seq");
    };
    assert!(!message.contains("eyJ"), "{message}");
}

#[test]
fn a_flat_poll_reply_decodes_user_by_user() {
    let flat = vec![
        "WAITING".into(),
        "9".into(),
        Value::Integer(4),
        Value::Integer(7),
        "DUE".into(),
        "ADMITTED".into(),
        "1700|tok".into(),
        "NONE".into(),
    ];
    let users = per_user(flat, poll_fields, "poll").unwrap();
    let decoded: Vec<(PollReply, u64)> = users.into_iter().map(|u| poll(u).unwrap()).collect();
    assert_eq!(
        decoded,
        vec![
            (
                PollReply::Outcome(PollOutcome::Waiting { seq: 9, ahead: 4 }),
                7
            ),
            (PollReply::Due, 0),
            (
                PollReply::Outcome(PollOutcome::Admitted {
                    token: "tok".into(),
                    expires_at: 1700,
                    waited_ms: None,
                }),
                0
            ),
            (PollReply::Outcome(PollOutcome::NotInQueue), 0),
        ]
    );
    // An enter tag in a poll reply, or a WAITING without its rank and mark: protocol errors.
    for bad in [
        vec!["FULL".into()],
        vec!["WAITING".into(), "9".into()],
        vec!["WAITING".into(), "9".into(), Value::Integer(4)],
    ] {
        assert!(matches!(
            per_user(bad, poll_fields, "poll"),
            Err(StoreError::Protocol(_))
        ));
    }
}

#[test]
fn replies_decode_and_bad_ones_are_protocol_errors() {
    assert_eq!(
        enter(arr(&[
            "WAITING".into(),
            "3".into(),
            Value::Integer(2),
            Value::Integer(0)
        ]))
        .unwrap(),
        (EnterOutcome::Waiting { seq: 3, ahead: 2 }, false)
    );
    assert_eq!(
        enter(arr(&[
            "WAITING".into(),
            "1".into(),
            Value::Integer(0),
            Value::Integer(1)
        ]))
        .unwrap(),
        (EnterOutcome::Waiting { seq: 1, ahead: 0 }, true)
    );
    assert!(matches!(
        enter(arr(&["WAITING".into(), "3".into(), Value::Integer(2)])),
        Err(StoreError::Protocol(_))
    ));
    assert_eq!(
        enter(arr(&["ADMITTED".into(), "1700|tok".into()])).unwrap(),
        (
            EnterOutcome::Admitted {
                token: "tok".into(),
                expires_at: 1700
            },
            false
        )
    );
    assert_eq!(
        enter(arr(&["FULL".into()])).unwrap(),
        (EnterOutcome::Full, false)
    );
    assert_eq!(
        poll(arr(&["NONE".into()])).unwrap(),
        (PollReply::Outcome(PollOutcome::NotInQueue), 0)
    );
    assert_eq!(poll(arr(&["DUE".into()])).unwrap(), (PollReply::Due, 0));
    assert_eq!(
        issue(arr(&["HELD".into(), "12".into()])).unwrap(),
        PollOutcome::Due { seq: 12 }
    );
    assert_eq!(
        issue(arr(&[
            "ADMITTED".into(),
            "1700|tok".into(),
            Value::Integer(5)
        ]))
        .unwrap(),
        PollOutcome::Admitted {
            token: "tok".into(),
            expires_at: 1700,
            waited_ms: Some(5)
        }
    );
    let a = advance(arr(&[
        "GUARDED".into(),
        Value::Integer(4),
        Value::Integer(0),
        Value::Integer(9),
        Value::Integer(120),
        Value::Integer(50),
        Value::Integer(2000),
        Value::Integer(11),
        "seq=2,sale=1".into(),
    ]))
    .unwrap();
    assert_eq!((a.outcome, a.retry_in_ms), (AdvanceOutcome::Guarded, 120));
    assert_eq!((a.batch_size, a.tick_ms, a.seq), (50, 2000, 11));
    assert_eq!(
        a.losses,
        vec![("seq".to_string(), 2), ("sale".to_string(), 1)]
    );
    assert!(matches!(
        advance(arr(&[
            "IDLE".into(),
            Value::Integer(4),
            Value::Integer(0),
            Value::Integer(9),
            Value::Integer(0),
            Value::Integer(50),
            Value::Integer(2000),
            Value::Integer(11),
            "seq".into(),
        ])),
        Err(StoreError::Protocol(_))
    ));
    assert_eq!(
        rejoin(arr(&["WAITING".into(), "7".into(), Value::Integer(3)])).unwrap(),
        PollReply::Outcome(PollOutcome::Waiting { seq: 7, ahead: 3 })
    );
    assert_eq!(rejoin(arr(&["DUE".into()])).unwrap(), PollReply::Due);
    for bad in [
        arr(&["WAT".into()]),
        arr(&["WAITING".into()]),
        arr(&["ADMITTED".into(), "no-expiry".into()]),
        Value::Integer(1),
    ] {
        assert!(matches!(enter(bad), Err(StoreError::Protocol(_))));
    }
    assert!(matches!(
        stats(arr(&[Value::Integer(1)])),
        Err(StoreError::Protocol(_))
    ));
}

#[test]
fn roster_members_read_every_member_version_and_their_hashes() {
    let pairs = |items: &[(&str, &str)]| -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let members = pairs(&[
        ("a|0:500000|5", "1700000000123"),
        ("b|0.5", "1700000000456"),
        ("c", "1.7e12"),
    ]);
    let credit = pairs(&[("a", "2500:1700000000000")]);
    let presence = pairs(&[("a", "0123abcd|gateway-1"), ("b", "0123abcd|")]);
    let read = roster_members(&members, &credit, &presence);
    let view: Vec<(&str, &str, &str, u64, u64)> = read
        .iter()
        .map(|m| {
            (
                m.instance.as_str(),
                m.name.as_str(),
                m.slice.as_str(),
                m.last_seen_ms,
                m.credit_ms,
            )
        })
        .collect();
    assert_eq!(
        view,
        [
            ("a", "gateway-1", "0:500000", 1_700_000_000_123, 2_500),
            ("b", "", "", 1_700_000_000_456, 0),
            ("c", "", "", 1_700_000_000_000, 0),
        ]
    );
    let nested = Value::Array(vec![Value::Array(vec!["a".into(), "1".into()])]);
    assert_eq!(
        flattened(nested),
        Value::Array(vec!["a".into(), "1".into()])
    );
}

#[test]
fn tick_figures_round_trip_and_refuse_anything_else() {
    use crate::store::TickFigures;
    let figures = TickFigures {
        at_ms: 1_700_000_000_000,
        admitted: 9,
        evicted: 2,
        waiting: 391,
        batch: 9,
        outcome: AdvanceOutcome::Paused,
    };
    assert_eq!(figures.encode(), "1700000000000:9:2:391:9:paused");
    assert_eq!(TickFigures::decode(&figures.encode()), Some(figures));
    for bad in [
        "",
        "1:2:3:4:5",
        "1:2:3:4:5:stopped",
        "1:2:3:4:5:idle:6",
        "x:2:3:4:5:idle",
        "1:-2:3:4:5:idle",
    ] {
        assert_eq!(TickFigures::decode(bad), None, "{bad}");
    }
    assert_eq!(TickFigures::keep(500), 1_200);
    assert_eq!(TickFigures::keep(0), 600_000);
}
