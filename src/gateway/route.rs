//! Request classification: every request is classified once, from its canonical path, into a
//! bounded `RouteClass` (also the metric label) and, for the queue API, the call it names.
//!
//! Pure: no I/O. The canonicaliser (`routing::path`) has already rejected ambiguous spellings.

use http::Method;

use crate::error::ApiError;
use crate::queue::{parse_positive_id, QueueTarget, TargetType};
use crate::routing::path::CanonicalPath;
pub use crate::routing::API_PREFIX;

/// Bounded route classes, used as the `route_class` metric label and in logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteClass {
    Enter,
    Poll,
    Leave,
    Stats,
    Draw,
    /// Under `/virtual-queues` but not a valid call (answered with an error).
    QueueError,
    /// A gated purchase route.
    Gated,
    /// Proxied unchanged.
    Proxy,
    /// Rejected before routing (unparsable or ambiguous path, bad headers).
    Rejected,
}

impl RouteClass {
    pub fn as_str(self) -> &'static str {
        match self {
            RouteClass::Enter => "queue_enter",
            RouteClass::Poll => "queue_poll",
            RouteClass::Leave => "queue_leave",
            RouteClass::Stats => "queue_stats",
            RouteClass::Draw => "queue_draw",
            RouteClass::QueueError => "queue_error",
            RouteClass::Gated => "gated",
            RouteClass::Proxy => "proxy",
            RouteClass::Rejected => "rejected",
        }
    }
}

/// The four operations of the queue API (docs/api.md#endpoints), and the sale's draw (public, like
/// stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiOp {
    Enter,
    Poll,
    Leave,
    Stats,
    Draw,
}

impl ApiOp {
    /// The route class (metric label) of the operation.
    pub fn class(self) -> RouteClass {
        match self {
            ApiOp::Enter => RouteClass::Enter,
            ApiOp::Poll => RouteClass::Poll,
            ApiOp::Leave => RouteClass::Leave,
            ApiOp::Stats => RouteClass::Stats,
            ApiOp::Draw => RouteClass::Draw,
        }
    }
}

/// A queue API call with its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiCall {
    pub op: ApiOp,
    pub target: QueueTarget,
}

/// Whether the first segment is the API prefix, in any case.
pub fn is_api_path(path: &CanonicalPath) -> bool {
    let p = path.as_str().as_bytes();
    let n = API_PREFIX.len();
    p.get(1..=n)
        .is_some_and(|first| first.eq_ignore_ascii_case(API_PREFIX.as_bytes()))
        && matches!(p.get(n + 1), None | Some(b'/'))
}

/// Parses `/virtual-queues/{type}/{targetId}/...` (docs/api.md#endpoints). Checks in the order a
/// client can act on: the type (404), the id (400), the resource (400), then the method (405).
pub fn parse_api(path: &CanonicalPath, method: &Method) -> Result<ApiCall, ApiError> {
    let mut segments = path.segments().skip(1);
    let kind = match segments.next() {
        Some(t) => TargetType::from_path_segment(t).ok_or(ApiError::UnknownTargetType)?,
        None => {
            return Err(ApiError::BadRequest(
                "expected /virtual-queues/{type}/{targetId}/...",
            ))
        }
    };
    let id = segments
        .next()
        .and_then(parse_positive_id)
        .ok_or(ApiError::BadRequest("targetId must be a positive integer"))?;
    let target = QueueTarget::new(kind, id);
    // The resource: at most two segments after the id (a third makes it unknown).
    let rest = [segments.next(), segments.next(), segments.next()];
    let op = match (rest, method) {
        ([Some("entries"), None, None], &Method::POST) => ApiOp::Enter,
        ([Some("entries"), Some("me"), None], &Method::GET) => ApiOp::Poll,
        ([Some("entries"), Some("me"), None], &Method::DELETE) => ApiOp::Leave,
        ([Some("stats"), None, None], &Method::GET) => ApiOp::Stats,
        ([Some("draw"), None, None], &Method::GET) => ApiOp::Draw,
        (
            [Some("entries"), None | Some("me"), None]
            | [Some("stats"), None, None]
            | [Some("draw"), None, None],
            _,
        ) => return Err(ApiError::MethodNotAllowed),
        _ => return Err(ApiError::BadRequest("unknown queue resource")),
    };
    Ok(ApiCall { op, target })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::path::canonicalize;

    fn parse(p: &str, m: Method) -> Result<ApiCall, ApiError> {
        let c = canonicalize(p.as_bytes()).unwrap();
        assert!(is_api_path(&c));
        parse_api(&c, &m)
    }

    #[test]
    fn the_four_calls() {
        let t = QueueTarget::new(TargetType::LimitedDrop, 42);
        let ok = |p, m, op| assert_eq!(parse(p, m), Ok(ApiCall { op, target: t }));
        ok(
            "/virtual-queues/limited-drop/42/entries",
            Method::POST,
            ApiOp::Enter,
        );
        ok(
            "/virtual-queues/limited-drop/42/entries/me",
            Method::GET,
            ApiOp::Poll,
        );
        ok(
            "/virtual-queues/limited-drop/42/entries/me/",
            Method::DELETE,
            ApiOp::Leave,
        );
        ok(
            "/virtual-queues/limited-drop/42/stats",
            Method::GET,
            ApiOp::Stats,
        );
        ok(
            "/virtual-queues/limited-drop/42/draw",
            Method::GET,
            ApiOp::Draw,
        );
        assert_eq!(
            parse("/virtual-queues/limited-drop/42/draw", Method::POST),
            Err(ApiError::MethodNotAllowed)
        );
        let e = parse("/virtual-queues/ticketing-event/7/stats", Method::GET).unwrap();
        assert_eq!(e.target, QueueTarget::new(TargetType::TicketingEvent, 7));
    }

    #[test]
    fn errors_in_client_order() {
        assert_eq!(
            parse("/virtual-queues/concert/42/entries", Method::POST),
            Err(ApiError::UnknownTargetType)
        );
        for bad in ["0", "042", "-1", "abc", "99999999999999999999"] {
            let p = format!("/virtual-queues/limited-drop/{bad}/entries");
            assert!(
                matches!(parse(&p, Method::POST), Err(ApiError::BadRequest(_))),
                "{bad}"
            );
        }
        for extra in [
            "nope",
            "entries/me/x",
            "entries/me/x/y",
            "stats/x",
            "entries/x",
        ] {
            let p = format!("/virtual-queues/limited-drop/42/{extra}");
            assert!(
                matches!(parse(&p, Method::GET), Err(ApiError::BadRequest(_))),
                "{extra}"
            );
        }
        assert!(matches!(
            parse("/virtual-queues", Method::GET),
            Err(ApiError::BadRequest(_))
        ));
        assert_eq!(
            parse("/virtual-queues/limited-drop/42/entries", Method::GET),
            Err(ApiError::MethodNotAllowed)
        );
        assert_eq!(
            parse("/virtual-queues/limited-drop/42/stats", Method::PUT),
            Err(ApiError::MethodNotAllowed)
        );
    }

    #[test]
    fn prefix_is_matched_without_case() {
        let c = canonicalize(b"/Virtual-Queues/limited-drop/1/stats").unwrap();
        assert!(is_api_path(&c));
        for other in [
            &b"/virtual-queuesx/limited-drop/1/stats"[..],
            b"/virtual-queue",
            b"/",
        ] {
            assert!(!is_api_path(&canonicalize(other).unwrap()));
        }
        assert!(is_api_path(&canonicalize(b"/VIRTUAL-QUEUES").unwrap()));
    }
}
