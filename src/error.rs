//! Errors at the HTTP boundary: `ApiError` and the one function that turns it into a status and a
//! JSON body `{"code": "...", "detail": "..."}` (docs/api.md#errors). Details are for humans and
//! never carry internals (no store errors, no token bytes, no secrets).

use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(&'static str),
    #[error("{0}")]
    BypassDenied(&'static str),
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("you are not in this queue")]
    NotInQueue,
    #[error("unknown target type; expected limited-drop or ticketing-event")]
    UnknownTargetType,
    #[error("this sale has no waiting room")]
    UnknownTarget,
    #[error("method not allowed here")]
    MethodNotAllowed,
    #[error("the request headers are too large or too many")]
    HeadersTooLarge,
    #[error("the queue is full, please try again shortly")]
    QueueFull,
    #[error("too many queues are open right now, please try again shortly")]
    TooManyQueues,
    #[error("the waiting room cannot take new users right now, please try again shortly")]
    StoreFull,
    #[error("queue statistics are temporarily unavailable")]
    QueueUnavailable,
    #[error("the backend is unavailable")]
    UpstreamUnavailable,
    #[error("the backend did not answer in time")]
    UpstreamTimeout,
    /// The sale's pre-queue opens in this many seconds (`prequeueOpensAt`).
    #[error("this sale's waiting room is not open yet")]
    NotOpenYet(u64),
    #[error("this sale has no draw")]
    NoDraw,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    detail: String,
}

impl ApiError {
    pub fn status(&self) -> u16 {
        match self {
            ApiError::BadRequest(_) => 400,
            ApiError::BypassDenied(_) => 403,
            ApiError::Unauthorized(_) => 401,
            ApiError::NotInQueue
            | ApiError::UnknownTargetType
            | ApiError::UnknownTarget
            | ApiError::NoDraw => 404,
            ApiError::NotOpenYet(_) => 403,
            ApiError::MethodNotAllowed => 405,
            ApiError::HeadersTooLarge => 431,
            ApiError::QueueFull | ApiError::TooManyQueues | ApiError::StoreFull => 429,
            ApiError::UpstreamUnavailable => 502,
            ApiError::QueueUnavailable => 503,
            ApiError::UpstreamTimeout => 504,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "BAD_REQUEST",
            ApiError::BypassDenied(_) => "QUEUE_BYPASS_DENIED",
            ApiError::Unauthorized(_) => "UNAUTHORIZED",
            ApiError::NotInQueue => "NOT_IN_QUEUE",
            ApiError::UnknownTargetType => "UNKNOWN_TARGET_TYPE",
            ApiError::UnknownTarget => "UNKNOWN_TARGET",
            ApiError::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            ApiError::HeadersTooLarge => "HEADERS_TOO_LARGE",
            ApiError::QueueFull | ApiError::TooManyQueues | ApiError::StoreFull => "QUEUE_FULL",
            ApiError::QueueUnavailable => "QUEUE_UNAVAILABLE",
            ApiError::UpstreamUnavailable => "UPSTREAM_UNAVAILABLE",
            ApiError::UpstreamTimeout => "UPSTREAM_TIMEOUT",
            ApiError::NotOpenYet(_) => "QUEUE_NOT_OPEN",
            ApiError::NoDraw => "NO_DRAW",
        }
    }

    /// `Retry-After` seconds for refusals that pass by themselves.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::QueueFull
            | ApiError::TooManyQueues
            | ApiError::StoreFull
            | ApiError::QueueUnavailable => Some(1),
            ApiError::NotOpenYet(secs) => Some((*secs).max(1)),
            _ => None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&ErrorBody {
            code: self.code(),
            detail: self.to_string(),
        })
        .unwrap_or_else(|_| br#"{"code":"INTERNAL","detail":"error"}"#.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_status_and_code() {
        let cases = [
            (ApiError::BadRequest("x"), 400, "BAD_REQUEST"),
            (ApiError::BypassDenied("x"), 403, "QUEUE_BYPASS_DENIED"),
            (ApiError::NotInQueue, 404, "NOT_IN_QUEUE"),
            (ApiError::UnknownTargetType, 404, "UNKNOWN_TARGET_TYPE"),
            (ApiError::MethodNotAllowed, 405, "METHOD_NOT_ALLOWED"),
            (ApiError::NotOpenYet(5), 403, "QUEUE_NOT_OPEN"),
            (ApiError::NoDraw, 404, "NO_DRAW"),
            (ApiError::QueueFull, 429, "QUEUE_FULL"),
            (ApiError::QueueUnavailable, 503, "QUEUE_UNAVAILABLE"),
            (ApiError::UpstreamUnavailable, 502, "UPSTREAM_UNAVAILABLE"),
        ];
        for (e, status, code) in cases {
            assert_eq!(e.status(), status);
            let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
            assert_eq!(v["code"], code);
            assert!(v["detail"].as_str().is_some_and(|d| !d.is_empty()));
        }
    }
}
