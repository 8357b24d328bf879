//! The unit tests of `sale.rs`.

use super::*;

fn patch(json: &str) -> Result<SalePatch, FieldError> {
    SalePatch::from_json(json.as_bytes())
}

#[test]
fn a_change_names_its_bad_field() {
    assert_eq!(
        patch(r#"{"batchSize": 20, "state": "paused"}"#).unwrap(),
        SalePatch {
            batch_size: Some(20),
            state: Some(SaleState::Paused),
            ..Default::default()
        }
    );
    for (body, field) in [
        (r#"{"batchSize": 0}"#, "batchSize"),
        (r#"{"batchSize": 1.5}"#, "batchSize"),
        (r#"{"batchSize": "20"}"#, "batchSize"),
        (r#"{"batchSize": -1}"#, "batchSize"),
        (r#"{"batchSize": null}"#, "batchSize"),
        (r#"{"tickMs": 9}"#, "tickMs"),
        (r#"{"maxCapacity": 100000001}"#, "maxCapacity"),
        (r#"{"heartbeatTimeoutS": 0}"#, "heartbeatTimeoutS"),
        (r#"{"state": "closed"}"#, "state"),
        (r#"{"state": 1}"#, "state"),
        (r#"{"batch_size": 5}"#, "batch_size"),
        (r#"{"batchSize": 5, "batchSize": 6}"#, "batchSize"),
        (r#"[1]"#, "body"),
        (r#"{"#, "body"),
    ] {
        assert_eq!(patch(body).unwrap_err().field, field, "{body}");
    }
}

#[test]
fn a_merge_keeps_what_is_not_given_and_restarts_windows_on_a_new_width() {
    let d = SaleDefaults::default();
    let seed = [3u8; 32];
    let merge = |old: Option<&Sale>, p: &str, now| {
        Sale::merged(old, &patch(p).unwrap(), d, &seed, now).unwrap()
    };
    let created = merge(None, r#"{"batchSize": 5}"#, 1_000);
    assert_eq!(
        (created.batch_size, created.tick_ms, created.version),
        (5, 2_000, 1)
    );
    assert_eq!((created.window_ms, created.window_since_ms), (15_000, 0));
    let same_width = merge(Some(&created), r#"{"tickMs": 500}"#, 2_000);
    assert_eq!((same_width.batch_size, same_width.tick_ms), (5, 500));
    assert_eq!((same_width.window_since_ms, same_width.version), (0, 2));
    let shorter = merge(Some(&same_width), r#"{"heartbeatTimeoutS": 20}"#, 3_000);
    assert_eq!((shorter.window_ms, shorter.window_since_ms), (5_000, 3_000));
    let back = Sale::from_fields(shorter.to_fields()).unwrap();
    assert_eq!(back, shorter);
    // The first opening commits to the seed; a later change keeps the commitment.
    assert!(shorter.draw_commitment.is_empty());
    let scheduled = merge(
        Some(&shorter),
        r#"{"opensAt": 9000, "prequeueOpensAt": 5000}"#,
        4_000,
    );
    assert_eq!(scheduled.draw_commitment, crate::draw::commitment(&seed));
    assert!(scheduled.prequeue());
    let other = [4u8; 32];
    let moved = Sale::merged(
        Some(&scheduled),
        &patch(r#"{"opensAt": 9500}"#).unwrap(),
        d,
        &other,
        4_500,
    )
    .unwrap();
    assert_eq!(moved.draw_commitment, scheduled.draw_commitment);
    assert_eq!(Sale::from_fields(moved.to_fields()).unwrap(), moved);
    for (p, field) in [
        (r#"{"prequeueOpensAt": 9600}"#, "prequeueOpensAt"),
        (r#"{"opensAt": 0}"#, "prequeueOpensAt"),
    ] {
        let e = Sale::merged(Some(&moved), &patch(p).unwrap(), d, &seed, 5_000).unwrap_err();
        assert_eq!(e.field, field, "{p}");
    }
    let drawn = Sale {
        drawn_at_ms: 9_500,
        ..moved
    };
    let e = Sale::merged(
        Some(&drawn),
        &patch(r#"{"opensAt": 9700}"#).unwrap(),
        d,
        &seed,
        9_600,
    )
    .unwrap_err();
    assert_eq!(e.field, "opensAt");
    assert!(Sale::merged(
        Some(&drawn),
        &patch(r#"{"batchSize": 9}"#).unwrap(),
        d,
        &seed,
        9_600
    )
    .is_ok());
}

#[test]
fn a_stored_sale_with_a_bad_field_is_refused() {
    let mut fields = SaleDefaults::default().sale(5).to_fields();
    fields.retain(|(k, _)| *k != "windowMs");
    assert_eq!(Sale::from_fields(fields).unwrap_err().field, "windowMs");
}

#[test]
fn the_book_answers_fresh_readings_and_lets_one_request_read_again() {
    let d = SaleDefaults::default();
    let book = SaleBook::new(d);
    let t = QueueTarget::new(crate::queue::TargetType::LimitedDrop, 1);
    assert!(matches!(
        book.lookup(t, 10),
        BookLookup::Refresh { last: None }
    ));
    assert_eq!(book.view(None).batch_size, 100);
    let mut sale = d.sale(0);
    sale.batch_size = 7;
    sale.state = SaleState::Paused;
    book.set(t, Some(sale.clone()), Some(12.5), 1_000);
    let BookLookup::Answer(v) = book.lookup(t, 1_500) else {
        panic!("fresh");
    };
    assert_eq!(
        (v.batch_size, v.paused, v.measured_rate_per_sec),
        (7, true, 12.5)
    );
    assert_eq!(book.fresh(t, 1_500).flatten().as_deref(), Some(&sale));
    assert_eq!(book.fresh(t, 2_000), None, "stale after BOOK_FRESH_MS");
    // Stale: one request reads it again, the others answer from the last reading.
    assert!(matches!(
        book.lookup(t, 2_100),
        BookLookup::Refresh { last: Some(_) }
    ));
    assert!(matches!(book.lookup(t, 2_200), BookLookup::Answer(_)));
    book.refresh_failed(t);
    assert!(matches!(book.lookup(t, 2_300), BookLookup::Refresh { .. }));
    // A reading without a rate keeps the last measurement.
    book.set(t, None, None, 3_000);
    let BookLookup::Answer(v) = book.lookup(t, 3_001) else {
        panic!("fresh");
    };
    assert_eq!((v.batch_size, v.measured_rate_per_sec), (100, 12.5));
    assert_eq!(book.last(t), None);
}

#[test]
fn the_command_line_sets_one_field_at_a_time() {
    let mut p = SalePatch::default();
    p.set("batchSize", "7").unwrap();
    p.set("state", "paused").unwrap();
    assert_eq!(
        p.fields(),
        vec![("batchSize", "7".into()), ("state", "paused".into())]
    );
    assert_eq!(p.set("batchSize", "x").unwrap_err().field, "batchSize");
    assert_eq!(p.set("nope", "1").unwrap_err().field, "nope");
}
