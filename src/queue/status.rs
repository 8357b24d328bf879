//! What the API answers: `QueueEntryResponse` and `QueueStatsResponse`, field for field as
//! docs/api.md (camelCase; fields that do not apply are present as `null`), plus the additive
//! `degraded` field: true when the answer was given without the shared store (fail-open,
//! docs/failures.md).

use serde::Serialize;

/// The outcome of an enter or a poll, before it is rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryStatus {
    Waiting {
        seq: u64,
        ahead: u64,
        /// `None` while the sale is paused: nobody can say when it resumes.
        eta_seconds: Option<u64>,
        poll_after_seconds: u64,
    },
    /// Admitted by the pump; `token` is the stored, idempotent entry token.
    Admitted { token: String, expires_at: u64 },
    /// Let through without queueing (flag off for this user, or the store failed open).
    DirectAdmitted { token: String, expires_at: u64 },
    /// In the sale's pre-queue: no place until the draw at `opens_at` (epoch s) gives one.
    Prequeued {
        eta_seconds: u64,
        poll_after_seconds: u64,
        opens_at: u64,
    },
    /// The store is unavailable and this replica's paced budget for the tick is used up: poll
    /// again after `poll_after_seconds`. Neither the user's place nor an ETA is known without
    /// the store (`etaSeconds` is `null`).
    WaitingDegraded { poll_after_seconds: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueEntryResponse {
    pub status: &'static str,
    pub position: Option<u64>,
    pub ahead_count: Option<u64>,
    pub eta_seconds: Option<u64>,
    pub entry_token: Option<String>,
    pub token_expires_at: Option<String>,
    /// When to poll next, in seconds (additive; only while `WAITING`): see
    /// `position::poll_after_seconds`, or the retry hint of a degraded answer.
    pub poll_after_seconds: Option<u64>,
    /// Answered while the shared store was unavailable (per `fail_open.mode`).
    pub degraded: bool,
    /// A signed proof of the user's place (additive; on enter answers while `WAITING`): sent
    /// back in `X-Queue-Ticket`, it gives the user precedence over fresh arrivals, by seq, while
    /// the store is down (`token::TicketPayload`).
    pub queue_ticket: Option<String>,
    /// The sale's opening (additive; only while pre-queued): the draw then gives the user a
    /// place.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opens_at: Option<String>,
}

impl QueueEntryResponse {
    pub fn degraded(mut self) -> Self {
        self.degraded = true;
        self
    }

    pub fn with_ticket(mut self, ticket: String) -> Self {
        self.queue_ticket = Some(ticket);
        self
    }
}

impl From<EntryStatus> for QueueEntryResponse {
    fn from(s: EntryStatus) -> Self {
        let waiting = |seq, ahead, eta, poll| QueueEntryResponse {
            status: "WAITING",
            position: Some(seq),
            ahead_count: Some(ahead),
            eta_seconds: eta,
            entry_token: None,
            token_expires_at: None,
            poll_after_seconds: Some(poll),
            degraded: false,
            queue_ticket: None,
            opens_at: None,
        };
        let with_token = |status, token, exp| QueueEntryResponse {
            status,
            position: None,
            ahead_count: None,
            eta_seconds: None,
            entry_token: Some(token),
            token_expires_at: Some(iso8601_utc(exp)),
            poll_after_seconds: None,
            degraded: false,
            queue_ticket: None,
            opens_at: None,
        };
        match s {
            EntryStatus::Waiting {
                seq,
                ahead,
                eta_seconds,
                poll_after_seconds,
            } => waiting(seq, ahead, eta_seconds, poll_after_seconds),
            EntryStatus::Admitted { token, expires_at } => {
                with_token("ADMITTED", token, expires_at)
            }
            EntryStatus::DirectAdmitted { token, expires_at } => {
                with_token("DIRECT_ADMITTED", token, expires_at)
            }
            EntryStatus::WaitingDegraded { poll_after_seconds } => QueueEntryResponse {
                status: "WAITING",
                position: None,
                ahead_count: None,
                eta_seconds: None,
                entry_token: None,
                token_expires_at: None,
                poll_after_seconds: Some(poll_after_seconds),
                degraded: true,
                queue_ticket: None,
                opens_at: None,
            },
            EntryStatus::Prequeued {
                eta_seconds,
                poll_after_seconds,
                opens_at,
            } => QueueEntryResponse {
                status: "WAITING",
                position: None,
                ahead_count: None,
                eta_seconds: Some(eta_seconds),
                entry_token: None,
                token_expires_at: None,
                poll_after_seconds: Some(poll_after_seconds),
                degraded: false,
                queue_ticket: None,
                opens_at: Some(iso8601_utc(opens_at)),
            },
        }
    }
}

/// Cluster-wide figures as the store reports them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct QueueStats {
    pub waiting_count: u64,
    pub admitted_count: u64,
    /// Users admitted over the recent sample window, per second.
    pub admission_rate_per_sec: f64,
    pub avg_wait_seconds: f64,
    pub p95_wait_seconds: f64,
    /// Live users admitted over the recent sample window, per second (the mark also moves over
    /// users who left: this is what an ETA divides users ahead by).
    pub live_rate_per_sec: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatsResponse {
    pub waiting_count: u64,
    pub admitted_count: u64,
    pub admission_rate_per_sec: f64,
    pub avg_wait_seconds: f64,
    pub p95_wait_seconds: f64,
}

impl From<QueueStats> for QueueStatsResponse {
    fn from(s: QueueStats) -> Self {
        let round = |x: f64| (x * 1000.0).round() / 1000.0;
        QueueStatsResponse {
            waiting_count: s.waiting_count,
            admitted_count: s.admitted_count,
            admission_rate_per_sec: round(s.admission_rate_per_sec),
            avg_wait_seconds: round(s.avg_wait_seconds),
            p95_wait_seconds: round(s.p95_wait_seconds),
        }
    }
}

/// `2026-07-09T10:00:00Z` for an epoch second (proleptic Gregorian, UTC).
pub fn iso8601_utc(epoch_secs: u64) -> String {
    let days = epoch_secs / 86_400;
    let rem = epoch_secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), by 400-year eras of 146,097 days.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_dates() {
        assert_eq!(iso8601_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601_utc(1_783_591_200), "2026-07-09T10:00:00Z");
        assert_eq!(iso8601_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601_utc(4_107_542_399), "2100-02-28T23:59:59Z");
    }

    #[test]
    fn waiting_json_has_every_field() {
        let r: QueueEntryResponse = EntryStatus::Waiting {
            seq: 17,
            ahead: 16,
            eta_seconds: Some(2),
            poll_after_seconds: 2,
        }
        .into();
        let v = serde_json::to_value(r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"status":"WAITING","position":17,"aheadCount":16,"etaSeconds":2,
                "entryToken":null,"tokenExpiresAt":null,"pollAfterSeconds":2,"degraded":false,
                "queueTicket":null})
        );
    }

    #[test]
    fn admitted_json_nulls_the_position() {
        let r: QueueEntryResponse = EntryStatus::Admitted {
            token: "t".into(),
            expires_at: 1_783_591_200,
        }
        .into();
        let v = serde_json::to_value(r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"status":"ADMITTED","position":null,"aheadCount":null,"etaSeconds":null,
                "entryToken":"t","tokenExpiresAt":"2026-07-09T10:00:00Z","pollAfterSeconds":null,
                "degraded":false,"queueTicket":null})
        );
    }

    #[test]
    fn degraded_waiting_has_no_position_and_no_eta() {
        let r: QueueEntryResponse = EntryStatus::WaitingDegraded {
            poll_after_seconds: 2,
        }
        .into();
        let v = serde_json::to_value(r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"status":"WAITING","position":null,"aheadCount":null,"etaSeconds":null,
                "entryToken":null,"tokenExpiresAt":null,"pollAfterSeconds":2,"degraded":true,
                "queueTicket":null})
        );
    }

    #[test]
    fn stats_json_is_camel_case() {
        let v = serde_json::to_value(QueueStatsResponse::from(QueueStats {
            waiting_count: 3,
            admitted_count: 2,
            admission_rate_per_sec: 50.0,
            avg_wait_seconds: 1.23456,
            p95_wait_seconds: 2.0,
            live_rate_per_sec: 40.0,
        }))
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"waitingCount":3,"admittedCount":2,"admissionRatePerSec":50.0,
                "avgWaitSeconds":1.235,"p95WaitSeconds":2.0})
        );
    }
}
