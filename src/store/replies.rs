//! One decoder per script reply: the scripts of `lua/` answer tagged arrays (see each script's
//! `Reply:` header) and this is the only place that reads them, so a change of a script's reply
//! meets one function. Pure: no I/O.

use fred::prelude::*;

use super::{Advance, AdvanceOutcome, EnterOutcome, PollOutcome, StoreError};
use crate::queue::QueueStats;

/// A reply that is not what `what` expects. The error is logged, so it names the value's kind
/// and size but never a string's bytes: a misaligned reply can put a stored entry token where a
/// tag or a number belongs.
pub fn protocol(what: &str, v: &Value) -> StoreError {
    let got = match v {
        Value::Integer(i) => format!("the integer {i}"),
        Value::Double(d) => format!("the number {d}"),
        Value::Boolean(b) => format!("the boolean {b}"),
        Value::Null => "nil".to_string(),
        Value::String(s) => format!("a string of {} bytes", s.len()),
        Value::Bytes(b) => format!("a string of {} bytes", b.len()),
        Value::Array(items) => format!("an array of {} values", items.len()),
        Value::Map(map) => format!("a map of {} entries", map.len()),
        _ => "an unexpected kind of value".to_string(),
    };
    StoreError::Protocol(format!("{what}: unexpected reply, {got}"))
}

pub fn reply_array(v: Value, what: &str) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(protocol(what, &other)),
    }
}

pub fn as_u64(v: &Value, what: &str) -> Result<u64, StoreError> {
    match v {
        Value::Integer(i) => u64::try_from(*i).map_err(|_| protocol(what, v)),
        _ => v
            .as_str()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| protocol(what, v)),
    }
}

fn as_f64(v: &Value, what: &str) -> Result<f64, StoreError> {
    v.as_str()
        .and_then(|s| s.parse::<f64>().ok())
        .ok_or_else(|| protocol(what, v))
}

fn tag(items: &[Value]) -> String {
    items
        .first()
        .and_then(|v| v.as_str().map(|s| s.into_owned()))
        .unwrap_or_default()
}

/// `expiresAt|token`, the stored token value.
fn stored_token(v: Option<&Value>) -> Result<(String, u64), StoreError> {
    let s = v
        .and_then(|v| v.as_string())
        .ok_or_else(|| StoreError::Protocol("token reply missing".into()))?;
    let (exp, token) = s
        .split_once('|')
        .ok_or_else(|| StoreError::Protocol("stored token without expiry".into()))?;
    let exp = exp
        .parse::<u64>()
        .map_err(|_| StoreError::Protocol("stored token expiry not a number".into()))?;
    Ok((token.to_string(), exp))
}

fn waiting_reply(items: &[Value]) -> Result<(u64, u64), StoreError> {
    match (items.get(1), items.get(2)) {
        (Some(seq), Some(rank)) => Ok((as_u64(seq, "seq")?, as_u64(rank, "rank")?)),
        _ => Err(StoreError::Protocol("short WAITING reply".into())),
    }
}

/// Splits the flat reply of a script call for many users into one reply array per user: the
/// script answers each user's tag followed by `fields(tag)` values, in order (one array instead
/// of a table per user, which Redis converts for less). An unknown tag or a reply cut short is a
/// protocol error.
pub fn per_user(
    flat: Vec<Value>,
    fields: fn(&str) -> Option<usize>,
    what: &str,
) -> Result<Vec<Value>, StoreError> {
    let mut users = Vec::new();
    let mut items = flat.into_iter();
    while let Some(tag) = items.next() {
        let n = tag
            .as_str()
            .and_then(|t| fields(&t))
            .ok_or_else(|| protocol(what, &tag))?;
        let mut reply = Vec::with_capacity(n + 1);
        reply.push(tag);
        for _ in 0..n {
            let field = items
                .next()
                .ok_or_else(|| StoreError::Protocol(format!("{what}: a reply cut short")))?;
            reply.push(field);
        }
        users.push(Value::Array(reply));
    }
    Ok(users)
}

/// How many fields follow each tag of `enter.lua`'s flat reply.
pub fn enter_fields(tag: &str) -> Option<usize> {
    match tag {
        "WAITING" => Some(3),
        "ADMITTED" => Some(1),
        "FULL" | "EARLY" => Some(0),
        _ => None,
    }
}

/// How many fields follow each tag of `poll.lua`'s flat reply.
pub fn poll_fields(tag: &str) -> Option<usize> {
    match tag {
        "WAITING" => Some(3),
        "ADMITTED" => Some(1),
        "DUE" | "NONE" => Some(0),
        _ => None,
    }
}

/// One user's `enter.lua` reply (see [`per_user`]): `{"ADMITTED", "expiresAt|token"} |
/// {"WAITING", seq, rank, opened} | {"FULL"}`, with whether this enter opened an empty waiting
/// room (`opened` is 1).
pub fn enter(v: Value) -> Result<(EnterOutcome, bool), StoreError> {
    let items = reply_array(v, "enter")?;
    match tag(&items).as_str() {
        "WAITING" => {
            let (seq, ahead) = waiting_reply(&items)?;
            let opened = match items.get(3) {
                Some(flag) => as_u64(flag, "opened")? == 1,
                None => return Err(StoreError::Protocol("short WAITING reply".into())),
            };
            Ok((EnterOutcome::Waiting { seq, ahead }, opened))
        }
        "ADMITTED" => {
            let (token, expires_at) = stored_token(items.get(1))?;
            Ok((EnterOutcome::Admitted { token, expires_at }, false))
        }
        "FULL" => Ok((EnterOutcome::Full, false)),
        "EARLY" => Ok((EnterOutcome::Early, false)),
        _ => Err(StoreError::Protocol("unknown enter reply".into())),
    }
}

/// What `poll.lua` answered: an outcome, or `Due` (admitted, no token yet: sign one and run
/// `issue.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollReply {
    Outcome(PollOutcome),
    Due,
}

/// One user's `poll.lua` reply (see [`per_user`]): `{"WAITING", seq, rank, mark} | {"DUE"} |
/// {"ADMITTED", "expiresAt|token"} | {"NONE"}`, and the mark a waiting answer read (0 else).
pub fn poll(v: Value) -> Result<(PollReply, u64), StoreError> {
    let items = reply_array(v, "poll")?;
    if tag(&items) == "DUE" {
        return Ok((PollReply::Due, 0));
    }
    let mark = match tag(&items).as_str() {
        "WAITING" => items
            .get(3)
            .map(|v| as_u64(v, "mark"))
            .transpose()?
            .unwrap_or(0),
        _ => 0,
    };
    outcome(items, "poll").map(|o| (PollReply::Outcome(o), mark))
}

/// `issue.lua`: `{"ADMITTED", "expiresAt|token"[, waited ms]} | {"WAITING", seq, rank} |
/// {"NONE"}`.
pub fn issue(v: Value) -> Result<PollOutcome, StoreError> {
    outcome(reply_array(v, "issue")?, "issue")
}

fn outcome(items: Vec<Value>, what: &str) -> Result<PollOutcome, StoreError> {
    match tag(&items).as_str() {
        "WAITING" => {
            let (seq, ahead) = waiting_reply(&items)?;
            Ok(PollOutcome::Waiting { seq, ahead })
        }
        "ADMITTED" => {
            let (token, expires_at) = stored_token(items.get(1))?;
            let waited_ms = items.get(2).and_then(|v| as_u64(v, "waited").ok());
            Ok(PollOutcome::Admitted {
                token,
                expires_at,
                waited_ms,
            })
        }
        "NONE" => Ok(PollOutcome::NotInQueue),
        // Admitted, and no token is signed now (issue.lua: the sale's state was repaired).
        "HELD" => Ok(PollOutcome::Due {
            seq: items
                .get(1)
                .map(|v| as_u64(v, "held seq"))
                .transpose()?
                .unwrap_or(0),
        }),
        _ => Err(StoreError::Protocol(format!("unknown {what} reply"))),
    }
}

/// `stats.lua`: `{waitingCount, admittedCount, "rate", "avgWait", "p95Wait"}`.
pub fn stats(v: Value) -> Result<QueueStats, StoreError> {
    let items = reply_array(v, "stats")?;
    let get = |i: usize| {
        items
            .get(i)
            .ok_or_else(|| StoreError::Protocol("short stats reply".into()))
    };
    Ok(QueueStats {
        waiting_count: as_u64(get(0)?, "waitingCount")?,
        admitted_count: as_u64(get(1)?, "admittedCount")?,
        admission_rate_per_sec: as_f64(get(2)?, "rate")?,
        avg_wait_seconds: as_f64(get(3)?, "avgWait")?,
        p95_wait_seconds: as_f64(get(4)?, "p95Wait")?,
        live_rate_per_sec: as_f64(get(5)?, "liveRate")?,
    })
}

/// `advance.lua`: `{outcome, mark, admitted, waiting, ms until allowed, batch, tick, seq,
/// "kind=count,..." losses}`.
pub fn advance(v: Value) -> Result<Advance, StoreError> {
    let items = reply_array(v, "advance")?;
    let outcome = match tag(&items).as_str() {
        "ADVANCED" => AdvanceOutcome::Advanced,
        "GUARDED" => AdvanceOutcome::Guarded,
        "IDLE" => AdvanceOutcome::Idle,
        "PAUSED" => AdvanceOutcome::Paused,
        "PREQUEUE" => AdvanceOutcome::Prequeue,
        _ => return Err(StoreError::Protocol("unknown advance reply".into())),
    };
    let num = |i: usize, what: &str| match items.get(i) {
        Some(v) => as_u64(v, what),
        None => Err(StoreError::Protocol("short advance reply".into())),
    };
    Ok(Advance {
        outcome,
        admitted_count: num(1, "mark")?,
        admitted_now: num(2, "admitted")?,
        waiting: num(3, "waiting")?,
        retry_in_ms: num(4, "retry")?,
        batch_size: u32::try_from(num(5, "batch size")?)
            .map_err(|_| StoreError::Protocol("batch size out of range".into()))?,
        tick_ms: num(6, "tick")?,
        seq: num(7, "seq")?,
        losses: losses(items.get(8).and_then(|v| v.as_string()).as_deref())?,
        deleted: items.get(9).map_or(Ok(0), |v| as_u64(v, "deleted"))? == 1,
    })
}

/// The losses field of `advance.lua`'s reply: "kind=count,..." ("" for none).
fn losses(field: Option<&str>) -> Result<Vec<(String, u64)>, StoreError> {
    let Some(field) = field.filter(|f| !f.is_empty()) else {
        return Ok(Vec::new());
    };
    field
        .split(',')
        .map(|pair| {
            let (kind, count) = pair
                .split_once('=')
                .ok_or_else(|| StoreError::Protocol(format!("bad losses {pair:?}")))?;
            let count = count
                .parse()
                .map_err(|_| StoreError::Protocol(format!("bad losses {pair:?}")))?;
            Ok((kind.to_string(), count))
        })
        .collect()
}

/// `rejoin.lua`: `{"ADMITTED", "expiresAt|token"} | {"WAITING", seq, rank} | {"DUE"} | {"NONE"}`.
pub fn rejoin(v: Value) -> Result<PollReply, StoreError> {
    let items = reply_array(v, "rejoin")?;
    match tag(&items).as_str() {
        "ADMITTED" => {
            let (token, expires_at) = stored_token(items.get(1))?;
            Ok(PollReply::Outcome(PollOutcome::Admitted {
                token,
                expires_at,
                waited_ms: None,
            }))
        }
        "WAITING" => {
            let (seq, ahead) = waiting_reply(&items)?;
            Ok(PollReply::Outcome(PollOutcome::Waiting { seq, ahead }))
        }
        "DUE" => Ok(PollReply::Due),
        "NONE" => Ok(PollReply::Outcome(PollOutcome::NotInQueue)),
        _ => Err(StoreError::Protocol("unknown rejoin reply".into())),
    }
}

/// `roster.lua`: `{live, recent, legacy held back, "s:e,..." held back, recorded "s:e",
/// desired "s:e", credit, retired, presence seen, dead, retired others}`.
pub fn roster(v: Value) -> Result<super::Roster, StoreError> {
    use crate::slice::Slice;
    let items = reply_array(v, "instances")?;
    let get = |i: usize| {
        items
            .get(i)
            .ok_or_else(|| StoreError::Protocol("short instances reply".into()))
    };
    let count = |i: usize| -> Result<u32, StoreError> {
        Ok(u32::try_from(as_u64(get(i)?, "instances")?).unwrap_or(u32::MAX))
    };
    let text =
        |i: usize| -> Result<String, StoreError> { Ok(get(i)?.as_string().unwrap_or_default()) };
    let slice = |i: usize| -> Result<Slice, StoreError> {
        let field = text(i)?;
        Slice::parse(&field).ok_or_else(|| StoreError::Protocol(format!("bad slice {field:?}")))
    };
    let held = text(3)?;
    let held_back = held
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| Slice::parse(s).ok_or_else(|| StoreError::Protocol(format!("bad slice {s:?}"))))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(super::Roster {
        live: count(0)?,
        recent: count(1)?,
        held_back_legacy: count(2)?,
        held_back,
        recorded: slice(4)?,
        desired: slice(5)?,
        credit_ms: as_u64(get(6)?, "instances")?,
        retired: count(7)? == 1,
        presence_seen: count(8)? == 1,
        dead: count(9)?,
        retired_others: count(10)?,
        clock: items.get(11).map_or(Ok(0), |v| as_u64(v, "clock"))?,
        rollbacks: items.get(12).map_or(Ok(0), |v| as_u64(v, "rollbacks"))?,
    })
}

/// `claim.lua`'s answer to "take": `{outcome, attempts}`.
/// A reply whose pairs may come nested (`ZRANGE … WITHSCORES` under RESP3: `[[m, s], …]`) as
/// the flat array RESP2 gives.
pub fn flattened(v: Value) -> Value {
    match v {
        Value::Array(items) if items.iter().all(|i| matches!(i, Value::Array(_))) => Value::Array(
            items
                .into_iter()
                .flat_map(|i| match i {
                    Value::Array(pair) => pair,
                    _ => Vec::new(),
                })
                .collect(),
        ),
        other => other,
    }
}

/// The roster for operators, from `queue:instances` (member → last seen) and its credit and
/// presence hashes (`roster.lua`'s header). Members of older versions carry no slice.
pub fn roster_members(
    members: &[(String, String)],
    credit: &[(String, String)],
    presence: &[(String, String)],
) -> Vec<super::RosterMember> {
    let lookup = |pairs: &[(String, String)], id: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == id)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    members
        .iter()
        .map(|(member, seen)| {
            let mut parts = member.split('|');
            let instance = parts.next().unwrap_or_default().to_string();
            let slice = parts
                .next()
                .filter(|s| s.contains(':'))
                .unwrap_or_default()
                .to_string();
            let credit_ms = lookup(credit, &instance)
                .split(':')
                .next()
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let name = lookup(presence, &instance)
                .split_once('|')
                .map(|(_, name)| name.to_string())
                .unwrap_or_default();
            super::RosterMember {
                last_seen_ms: seen.parse::<f64>().map_or(0, |ms| ms as u64),
                instance,
                name,
                slice,
                credit_ms,
            }
        })
        .collect()
}

pub fn claim_take(v: Value) -> Result<super::ClaimTake, StoreError> {
    use super::ClaimTake;
    let items = reply_array(v, "claim")?;
    let attempts = match items.get(1) {
        Some(v) => u32::try_from(as_u64(v, "claim")?).unwrap_or(u32::MAX),
        None => return Err(StoreError::Protocol("short claim reply".into())),
    };
    match tag(&items).as_str() {
        "TAKEN" => Ok(ClaimTake::Taken { attempts }),
        "SPENT" => Ok(ClaimTake::Spent),
        "IN_FLIGHT" => Ok(ClaimTake::InFlight),
        "EXHAUSTED" => Ok(ClaimTake::Exhausted),
        _ => Err(StoreError::Protocol("unknown claim reply".into())),
    }
}

/// What `draw.lua` answered to "prepare", with the draw's stored seed (empty when only its
/// nonce is stored), nonce and commitment.
pub struct Prepared {
    pub step: crate::store::DrawStep,
    pub nonce: String,
    pub commitment: String,
}

/// `draw.lua`'s answer to "prepare".
pub fn draw_step(v: Value) -> Result<Prepared, StoreError> {
    use crate::store::DrawStep;
    let items = reply_array(v, "draw")?;
    let bare = |step| Prepared {
        step,
        nonce: String::new(),
        commitment: String::new(),
    };
    match tag(&items).as_str() {
        "NOT_YET" => Ok(bare(DrawStep::NotYet)),
        "DRAWN" => Ok(bare(DrawStep::Drawn)),
        "ENTRANTS" => {
            let draw_seq = as_u64(
                items
                    .get(1)
                    .ok_or_else(|| StoreError::Protocol("short draw reply".into()))?,
                "draw seq",
            )?;
            let text = |i: usize| items.get(i).and_then(|v| v.as_string()).unwrap_or_default();
            let (seed, nonce, commitment) = (text(2), text(3), text(4));
            let mut entrants = Vec::with_capacity(items.len().saturating_sub(5) / 2);
            for pair in items[5.min(items.len())..].chunks(2) {
                let [user, seq] = pair else {
                    return Err(StoreError::Protocol("odd draw reply".into()));
                };
                entrants.push((as_u64(user, "draw user")?, as_u64(seq, "draw seq")?));
            }
            Ok(Prepared {
                step: DrawStep::Entrants {
                    draw_seq,
                    seed,
                    entrants,
                },
                nonce,
                commitment,
            })
        }
        _ => Err(StoreError::Protocol("unknown draw reply".into())),
    }
}

/// `sale_write.lua`'s answer to a merge: the stored sale, or `{"REFUSED", field, why}`.
pub fn sale_written(
    v: Value,
) -> Result<Result<crate::sale::Sale, crate::sale::FieldError>, StoreError> {
    if let Value::Array(items) = &v {
        if items.first().and_then(|t| t.as_string()).as_deref() == Some("REFUSED") {
            let text = |i: usize| items.get(i).and_then(|x| x.as_string()).unwrap_or_default();
            return Ok(Err(crate::sale::FieldError {
                field: text(1),
                message: text(2),
            }));
        }
    }
    sale(v)?
        .map(Ok)
        .ok_or_else(|| StoreError::Protocol("sale_write: no sale".into()))
}

/// A sale hash (`HGETALL`, or `sale_write.lua`'s answer): `None` when empty. A stored sale the
/// scripts could not use (a field missing or out of range, written by hand) is a protocol error
/// naming the field.
pub fn sale(v: Value) -> Result<Option<crate::sale::Sale>, StoreError> {
    let mut pairs = Vec::new();
    match v {
        Value::Map(map) => {
            for (k, v) in map.inner() {
                let (Some(k), Some(v)) = (k.as_str().map(|s| s.to_string()), v.as_string()) else {
                    return Err(StoreError::Protocol("sale: not text".into()));
                };
                pairs.push((k, v));
            }
        }
        Value::Null => {}
        other => {
            let items = reply_array(other, "sale")?;
            for pair in items.chunks(2) {
                let [k, v] = pair else {
                    return Err(StoreError::Protocol("sale: odd reply".into()));
                };
                let (Some(k), Some(v)) = (k.as_string(), v.as_string()) else {
                    return Err(StoreError::Protocol("sale: not text".into()));
                };
                pairs.push((k, v));
            }
        }
    }
    if pairs.is_empty() {
        return Ok(None);
    }
    crate::sale::Sale::from_fields(pairs)
        .map(Some)
        .map_err(|e| StoreError::Protocol(format!("sale: {e}")))
}

#[cfg(test)]
mod tests;
