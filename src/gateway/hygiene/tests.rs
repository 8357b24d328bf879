//! The unit tests of `hygiene.rs`.

use super::*;

use crate::routing::path::canonicalize;
use crate::test_util::headers as h;

fn check(m: &HeaderMap) -> Result<HeaderFacts<'_>, Refusal> {
    scan_fields(m, 20, usize::MAX, usize::MAX).map_err(|e| match e {
        ScanError::Refused(r) => r,
        ScanError::TooLarge => panic!("no limit was set"),
    })
}

/// The reason `m` is refused, if it is.
fn refusal(m: HeaderMap) -> Option<&'static str> {
    check(&m).err().map(|r| r.reason)
}

#[test]
fn connection_may_not_name_protected_headers() {
    assert!(check(&h(&[("connection", "keep-alive")])).is_ok());
    assert!(check(&h(&[("connection", "Upgrade")])).is_ok());
    for bad in [
        "X-User-Id",
        "keep-alive, x-user-id",
        "X-Entry-Token",
        "authorization",
        "close,\tCookie ",
    ] {
        let r = refusal(h(&[("connection", bad)]));
        assert_eq!(r, Some("connection_header"), "{bad}");
    }
    let two = h(&[("connection", "close"), ("connection", "Cookie")]);
    assert!(check(&two).is_err());
    let mut binary = HeaderMap::new();
    binary.insert(
        header::CONNECTION,
        http::HeaderValue::from_bytes(b"close, \xff").unwrap(),
    );
    assert_eq!(refusal(binary), Some("connection_header"));
}

#[test]
fn content_length_is_one_plain_number() {
    assert!(check(&h(&[("content-length", "84")])).is_ok());
    assert!(check(&h(&[("content-length", "0")])).is_ok());
    assert!(check(&h(&[("content-length", "1000000000000")])).is_ok());
    for bad in [
        "84, 84",
        "+84",
        " 84",
        "0x54",
        "9223372036854775808",
        "1000000000001",
        "99999999999999",
        "",
        "1e3",
    ] {
        let r = refusal(h(&[("content-length", bad)]));
        assert_eq!(r, Some("content_length"), "{bad:?}");
    }
    let dup = h(&[("content-length", "84"), ("content-length", "84")]);
    assert!(check(&dup).is_err());
    let both = h(&[("content-length", "5"), ("transfer-encoding", "chunked")]);
    assert!(check(&both).is_err());
    let te_first = h(&[("transfer-encoding", "chunked"), ("content-length", "5")]);
    assert!(check(&te_first).is_err());
}

#[test]
fn size_and_count_limits_come_first() {
    let m = h(&[("x-a", "12345"), ("connection", "x-user-id")]);
    // Fields cost name + value + 4 bytes each, after the request line.
    let fields = (3 + 5 + 4) + (10 + 9 + 4);
    assert!(scan_fields(&m, 20, 20 + fields, 2).is_err_and(|e| e != ScanError::TooLarge));
    assert_eq!(
        scan_fields(&m, 20, 20 + fields - 1, 2),
        Err(ScanError::TooLarge)
    );
    assert_eq!(scan_fields(&m, 20, usize::MAX, 1), Err(ScanError::TooLarge));
}

#[test]
fn facts_for_the_later_checks() {
    assert_eq!(check(&h(&[("accept", "*/*")])), Ok(HeaderFacts::default()));
    let m = h(&[("upgrade", "websocket")]);
    let f = check(&m).unwrap();
    assert!(f.upgrade && !f.method_override && f.never_forwarded == [false; 2]);
    assert!(
        check(&h(&[("connection", "keep-alive, Upgrade")]))
            .unwrap()
            .upgrade
    );
    assert!(!check(&h(&[("connection", "upgrades")])).unwrap().upgrade);
    for o in [
        "X-HTTP-Method-Override",
        "x-method-override",
        "X-HTTP-Method",
    ] {
        assert!(check(&h(&[(o, "GET")])).unwrap().method_override, "{o}");
    }
    let m = h(&[("X-Entry-Token", "x")]);
    assert_eq!(check(&m).unwrap().never_forwarded, [true, false]);
    let m = h(&[("HTTP2-Settings", "x")]);
    assert_eq!(check(&m).unwrap().never_forwarded, [false, true]);
}

#[test]
fn the_entry_token_is_read_as_a_single_header() {
    let mut binary = HeaderMap::new();
    binary.insert("x-entry-token", HeaderValue::from_bytes(b"a\xffb").unwrap());
    let maps = [
        h(&[]),
        h(&[("accept", "*/*")]),
        h(&[("x-entry-token", "abc.def")]),
        h(&[("X-Entry-Token", "abc.def"), ("accept", "*/*")]),
        h(&[("x-entry-token", "a"), ("x-entry-token", "a")]),
        h(&[
            ("x-entry-token", "a"),
            ("accept", "*/*"),
            ("x-entry-token", "b"),
        ]),
        binary,
    ];
    for m in &maps {
        let facts = check(m).unwrap();
        let single = crate::headers::single(m, TOKEN_HEADER);
        assert_eq!(facts.entry_token(), single, "{m:?}");
    }
}

#[test]
fn underscore_spellings_of_protected_headers() {
    let m = h(&[("x_user_id", "7")]);
    let f = check(&m).unwrap();
    assert!(f.underscored && !f.method_override);
    assert!(check(&h(&[("X_Entry_Token", "t")])).unwrap().underscored);
    let m = h(&[("x_http_method_override", "POST")]);
    let f = check(&m).unwrap();
    assert!(f.underscored && f.method_override);
    for fine in ["x_request_id", "accept", "x-user-id"] {
        assert!(!check(&h(&[(fine, "1")])).unwrap().underscored, "{fine}");
    }
}

#[test]
fn method_override_query_parameters() {
    for q in [
        "_method=POST",
        "a=1&_method=POST",
        "a=1;_METHOD=post",
        "_%6Dethod=POST",
        "%5Fmethod=POST",
        "+_method=POST",
        "_method",
        "X-HTTP-Method-Override=POST",
        "_method%00=POST",
    ] {
        assert!(method_override_query(q.as_bytes()), "{q}");
    }
    for q in [
        "",
        "method=POST",
        "_methods=1",
        "a=_method",
        "x=%5",
        "_method_=1",
        "%",
    ] {
        assert!(!method_override_query(q.as_bytes()), "{q}");
    }
}

#[test]
fn upgrades() {
    assert!(websocket_only(&h(&[("upgrade", "WebSocket")])));
    assert!(!websocket_only(&h(&[("upgrade", "h2c")])));
    assert!(!websocket_only(&h(&[("upgrade", "websocket, h2c")])));
    assert!(!websocket_only(&h(&[])));
    let prefixes = vec![vec!["ws".to_string()]];
    let under = |p: &str| under_prefix(&prefixes, &canonicalize(p.as_bytes()).unwrap());
    assert!(under("/ws/chat"));
    assert!(under("/WS/chat"));
    assert!(under("/ws"));
    assert!(!under("/wsx/chat"));
    assert!(!under("/"));
    assert!(!under_prefix(&[], &canonicalize(b"/ws/chat").unwrap()));
}

#[test]
fn methods() {
    assert!(upper_case_method(&Method::POST));
    assert!(!upper_case_method(&Method::from_bytes(b"post").unwrap()));
    assert!(!upper_case_method(&Method::from_bytes(b"Post").unwrap()));
    assert!(unsafe_method(&Method::POST));
    assert!(unsafe_method(&Method::from_bytes(b"post").unwrap()));
    assert!(!unsafe_method(&Method::GET));
    assert!(!unsafe_method(&Method::from_bytes(b"options").unwrap()));
    assert!(unsafe_method(&Method::from_bytes(b"GETX").unwrap()));
}
