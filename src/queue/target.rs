//! Queue targets: the `(type, id)` pair a waiting room is keyed by (docs/api.md#targets-and-users).
//!
//! Parsing is strict: the path segment must be exactly `limited-drop` or `ticketing-event`, and the
//! id a canonical positive 64-bit decimal (no sign, no leading zero). This module does no I/O.

use std::fmt;

/// The two kinds of sale a queue can guard.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TargetType {
    LimitedDrop,
    TicketingEvent,
}

impl TargetType {
    pub const ALL: [TargetType; 2] = [TargetType::LimitedDrop, TargetType::TicketingEvent];

    /// The enum name used in tokens, Redis keys and metrics: `LIMITED_DROP`.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetType::LimitedDrop => "LIMITED_DROP",
            TargetType::TicketingEvent => "TICKETING_EVENT",
        }
    }

    /// The API path segment: `limited-drop`.
    pub fn path_segment(self) -> &'static str {
        match self {
            TargetType::LimitedDrop => "limited-drop",
            TargetType::TicketingEvent => "ticketing-event",
        }
    }

    pub fn from_path_segment(s: &str) -> Option<TargetType> {
        TargetType::ALL.into_iter().find(|t| t.path_segment() == s)
    }

    pub fn from_enum_name(s: &str) -> Option<TargetType> {
        TargetType::from_enum_bytes(s.as_bytes())
    }

    /// [`TargetType::from_enum_name`] of bytes.
    pub fn from_enum_bytes(b: &[u8]) -> Option<TargetType> {
        TargetType::ALL
            .into_iter()
            .find(|t| t.as_str().as_bytes() == b)
    }
}

/// One waiting room: `LIMITED_DROP:42`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueTarget {
    pub kind: TargetType,
    pub id: u64,
}

impl QueueTarget {
    pub fn new(kind: TargetType, id: u64) -> QueueTarget {
        QueueTarget { kind, id }
    }

    /// Parses the `LIMITED_DROP:42` form used in `queue:active` and flag fields.
    pub fn parse_key(s: &str) -> Option<QueueTarget> {
        let (kind, id) = s.split_once(':')?;
        Some(QueueTarget::new(
            TargetType::from_enum_name(kind)?,
            parse_positive_id(id)?,
        ))
    }
}

impl fmt::Display for QueueTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.as_str(), self.id)
    }
}

/// A canonical positive 64-bit decimal: digits only, no leading zero, not zero, no overflow.
pub fn parse_positive_id(s: &str) -> Option<u64> {
    positive_id(s.as_bytes())
}

/// [`parse_positive_id`] of bytes.
pub fn positive_id(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 20 || b[0] == b'0' {
        return None;
    }
    b.iter().try_fold(0u64, |v, &c| {
        let digit = c.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        v.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_and_names_round_trip() {
        for t in TargetType::ALL {
            assert_eq!(TargetType::from_path_segment(t.path_segment()), Some(t));
            assert_eq!(TargetType::from_enum_name(t.as_str()), Some(t));
        }
        assert_eq!(TargetType::from_path_segment("Limited-Drop"), None);
        assert_eq!(TargetType::from_path_segment("limited_drop"), None);
    }

    #[test]
    fn ids_are_canonical_positive_integers() {
        assert_eq!(parse_positive_id("42"), Some(42));
        assert_eq!(parse_positive_id("18446744073709551615"), Some(u64::MAX));
        for bad in [
            "",
            "0",
            "042",
            "+1",
            "-1",
            " 1",
            "1 ",
            "18446744073709551616",
            "1e3",
            "x",
        ] {
            assert_eq!(parse_positive_id(bad), None, "{bad:?}");
        }
    }

    proptest::proptest! {
        /// The digit loop gives the answer of the standard parser under the canonical rule.
        #[test]
        fn positive_ids_parse_as_the_standard_parser_does(s in "[0-9]{0,22}|[ -~]{0,8}|\\PC{0,6}") {
            let b = s.as_bytes();
            let canonical = !b.is_empty() && b[0] != b'0' && b.iter().all(u8::is_ascii_digit);
            let want = if canonical { s.parse::<u64>().ok() } else { None };
            proptest::prop_assert_eq!(parse_positive_id(&s), want);
        }
    }

    #[test]
    fn key_form_round_trips() {
        let t = QueueTarget::new(TargetType::TicketingEvent, 7);
        assert_eq!(t.to_string(), "TICKETING_EVENT:7");
        assert_eq!(QueueTarget::parse_key("TICKETING_EVENT:7"), Some(t));
        assert_eq!(QueueTarget::parse_key("TICKETING_EVENT:07"), None);
        assert_eq!(QueueTarget::parse_key("EVENT:7"), None);
    }
}
