//! Sales as run-time objects: each sale's parameters live in Redis in the sale's own slot
//! (`queue:{TYPE:ID}:sale`, a hash written by `lua/sale_write.lua`) and the scripts that enter,
//! poll, advance and sweep read them in the same step as the state they act on. A replica's
//! `[queue]` keys are only the defaults of a sale created without them, so replicas whose config
//! files differ (a rolling change) never apply different budgets, capacities or heartbeat
//! windows to one sale. No I/O: the parsing, validation and merging shared by the admin API,
//! the CLI and the memory store.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::queue::QueueTarget;

/// The most users one admission step may admit.
pub const MAX_BATCH: u64 = 1_000_000;
/// The shortest and longest admission tick.
pub const TICK_MS: (u64, u64) = (10, 3_600_000);
/// The largest waiting room.
pub const MAX_CAPACITY: u64 = 100_000_000;
/// The shortest and longest heartbeat timeout.
pub const HEARTBEAT_TIMEOUT_S: (u64, u64) = (1, 86_400);
/// Opening times (epoch ms): 0 (none) up to the year 3000.
pub const EPOCH_MS: (u64, u64) = (0, 32_503_680_000_000);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaleState {
    /// Admitting at the sale's budget.
    Open,
    /// Admitting nobody; waiting users keep their places and are told so.
    Paused,
}

impl SaleState {
    pub fn as_str(self) -> &'static str {
        match self {
            SaleState::Open => "open",
            SaleState::Paused => "paused",
        }
    }

    fn parse(s: &str) -> Option<SaleState> {
        match s {
            "open" => Some(SaleState::Open),
            "paused" => Some(SaleState::Paused),
            _ => None,
        }
    }
}

/// A sale's parameters as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sale {
    pub batch_size: u32,
    pub tick_ms: u64,
    pub max_capacity: u64,
    pub heartbeat_timeout_s: u64,
    pub state: SaleState,
    /// 0: created by a first enter from that replica's defaults; every operator's change adds one.
    pub version: u64,
    pub updated_at_ms: u64,
    /// The heartbeat windows' width: a quarter of the timeout (`store/liveness.rs`).
    pub window_ms: u64,
    /// When that width took effect (0: from the start): sweeps evict nobody until a whole
    /// timeout has passed since, as the heartbeats before it are in windows of the old width.
    /// The draw moves it too (users change seqs, and heartbeats are kept by seq).
    pub window_since_ms: u64,
    /// The announced opening (epoch ms; 0: none, the queue is FIFO from its first user). Until
    /// then users enter a pre-queue; at the opening the draw gives them random places.
    pub opens_at_ms: u64,
    /// When the pre-queue opens (epoch ms; 0: as soon as the sale exists). Enters before it are
    /// refused.
    pub prequeue_opens_at_ms: u64,
    /// The draw's public commitment (hex SHA-256 of the seed; empty without an opening).
    pub draw_commitment: String,
    /// The draw's seed (hex), secret until the draw has run (with Redis: not stored before it,
    /// derived by the replicas from `draw_nonce`, `draw::DrawKeys`).
    pub draw_seed: String,
    /// The nonce the draw's seed is derived from (hex; empty: the seed is stored instead).
    pub draw_nonce: String,
    /// When the draw ran (epoch ms; 0: not yet).
    pub drawn_at_ms: u64,
    /// The last seq of the pre-queue: set when the draw starts; later enters queue behind it.
    pub draw_seq: u64,
    /// How many users the draw placed.
    pub draw_entrants: u64,
    /// Not 0: this is a paused stand-in the scripts made when they found the sale lost with
    /// Redis' data next to its queue (epoch ms of the finding, docs/state.md). A replica's
    /// write-back of the sale it read replaces it; an operator's change makes it a sale.
    pub lost_at_ms: u64,
}

/// What a sale is created with when its creator does not say: the replica's `[queue]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaleDefaults {
    pub batch_size: u32,
    pub tick_ms: u64,
    pub max_capacity: u64,
    pub heartbeat_timeout_s: u64,
}

impl Default for SaleDefaults {
    /// The `[queue]` defaults (docs/configuration.md).
    fn default() -> SaleDefaults {
        SaleDefaults {
            batch_size: 100,
            tick_ms: 2_000,
            max_capacity: 100_000,
            heartbeat_timeout_s: 60,
        }
    }
}

impl SaleDefaults {
    /// The sale an enter creates for a target nobody created.
    pub fn sale(&self, now_ms: u64) -> Sale {
        Sale {
            batch_size: self.batch_size,
            tick_ms: self.tick_ms,
            max_capacity: self.max_capacity,
            heartbeat_timeout_s: self.heartbeat_timeout_s,
            state: SaleState::Open,
            version: 0,
            updated_at_ms: now_ms,
            window_ms: window_ms(self.heartbeat_timeout_s),
            window_since_ms: 0,
            opens_at_ms: 0,
            prequeue_opens_at_ms: 0,
            draw_commitment: String::new(),
            draw_seed: String::new(),
            draw_nonce: String::new(),
            drawn_at_ms: 0,
            draw_seq: 0,
            draw_entrants: 0,
            lost_at_ms: 0,
        }
    }
}

/// The heartbeat window width for a timeout: a quarter of it (eviction is at most a quarter of
/// the timeout late), as the scripts compute it.
pub fn window_ms(heartbeat_timeout_s: u64) -> u64 {
    (heartbeat_timeout_s.saturating_mul(1000) / 4).max(1)
}

/// An operator's change: the fields given, each checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SalePatch {
    pub batch_size: Option<u32>,
    pub tick_ms: Option<u64>,
    pub max_capacity: Option<u64>,
    pub heartbeat_timeout_s: Option<u64>,
    pub state: Option<SaleState>,
    pub opens_at_ms: Option<u64>,
    pub prequeue_opens_at_ms: Option<u64>,
}

/// A bad field of a sale change: its name and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

fn bad(field: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.to_string(),
        message: message.into(),
    }
}

/// The fields of a sale change, as named in JSON and in the stored hash.
pub const FIELDS: [&str; 7] = [
    "batchSize",
    "tickMs",
    "maxCapacity",
    "heartbeatTimeoutS",
    "state",
    "opensAt",
    "prequeueOpensAt",
];

impl SalePatch {
    /// A JSON object of any of `FIELDS`: unknown or repeated keys, non-integers, out-of-range
    /// values and anything but an object are refused, naming the field.
    pub fn from_json(body: &[u8]) -> Result<SalePatch, FieldError> {
        /// A key given with any value, `null` included (which a plain `Option` would read as
        /// absent, quietly ignoring it).
        fn given<'de, D: serde::Deserializer<'de>>(
            d: D,
        ) -> Result<Option<serde_json::Value>, D::Error> {
            serde::Deserialize::deserialize(d).map(Some)
        }
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Raw {
            #[serde(default, deserialize_with = "given")]
            batch_size: Option<serde_json::Value>,
            #[serde(default, deserialize_with = "given")]
            tick_ms: Option<serde_json::Value>,
            #[serde(default, deserialize_with = "given")]
            max_capacity: Option<serde_json::Value>,
            #[serde(default, deserialize_with = "given")]
            heartbeat_timeout_s: Option<serde_json::Value>,
            #[serde(default, deserialize_with = "given")]
            state: Option<serde_json::Value>,
            #[serde(default, deserialize_with = "given")]
            opens_at: Option<serde_json::Value>,
            #[serde(default, deserialize_with = "given")]
            prequeue_opens_at: Option<serde_json::Value>,
        }
        // A JSON array would fill the fields in order: only an object is a change.
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(bad("body", "must be a JSON object"));
        }
        let raw: Raw = serde_json::from_slice(body).map_err(|e| {
            let text = e.to_string();
            // serde names the key in its message: "unknown field `x`", "duplicate field `x`".
            let field = text
                .split('`')
                .nth(1)
                .filter(|_| text.contains(" field `"))
                .unwrap_or("body");
            bad(field, text.clone())
        })?;
        let int = |name: &str, v: Option<serde_json::Value>, (lo, hi): (u64, u64)| {
            v.map(|v| {
                v.as_u64()
                    .filter(|n| (lo..=hi).contains(n))
                    .ok_or_else(|| bad(name, format!("must be an integer from {lo} to {hi}")))
            })
            .transpose()
        };
        Ok(SalePatch {
            batch_size: int("batchSize", raw.batch_size, (1, MAX_BATCH))?
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
            tick_ms: int("tickMs", raw.tick_ms, TICK_MS)?,
            max_capacity: int("maxCapacity", raw.max_capacity, (1, MAX_CAPACITY))?,
            heartbeat_timeout_s: int(
                "heartbeatTimeoutS",
                raw.heartbeat_timeout_s,
                HEARTBEAT_TIMEOUT_S,
            )?,
            state: raw
                .state
                .map(|v| {
                    v.as_str()
                        .and_then(SaleState::parse)
                        .ok_or_else(|| bad("state", "must be \"open\" or \"paused\""))
                })
                .transpose()?,
            opens_at_ms: int("opensAt", raw.opens_at, EPOCH_MS)?,
            prequeue_opens_at_ms: int("prequeueOpensAt", raw.prequeue_opens_at, EPOCH_MS)?,
        })
    }

    /// One field given as `name=value` on the command line.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), FieldError> {
        let json = match name {
            "state" => serde_json::json!({ name: value }),
            _ if FIELDS.contains(&name) => {
                let number: u64 = value.parse().map_err(|_| bad(name, "must be an integer"))?;
                serde_json::json!({ name: number })
            }
            _ => {
                return Err(bad(
                    name,
                    format!("not a sale field ({})", FIELDS.join(", ")),
                ))
            }
        };
        let one = SalePatch::from_json(json.to_string().as_bytes())?;
        self.batch_size = one.batch_size.or(self.batch_size);
        self.tick_ms = one.tick_ms.or(self.tick_ms);
        self.max_capacity = one.max_capacity.or(self.max_capacity);
        self.heartbeat_timeout_s = one.heartbeat_timeout_s.or(self.heartbeat_timeout_s);
        self.state = one.state.or(self.state);
        self.opens_at_ms = one.opens_at_ms.or(self.opens_at_ms);
        self.prequeue_opens_at_ms = one.prequeue_opens_at_ms.or(self.prequeue_opens_at_ms);
        Ok(())
    }

    /// The given fields as hash field/value pairs.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(v) = self.batch_size {
            out.push(("batchSize", v.to_string()));
        }
        if let Some(v) = self.tick_ms {
            out.push(("tickMs", v.to_string()));
        }
        if let Some(v) = self.max_capacity {
            out.push(("maxCapacity", v.to_string()));
        }
        if let Some(v) = self.heartbeat_timeout_s {
            out.push(("heartbeatTimeoutS", v.to_string()));
        }
        if let Some(v) = self.state {
            out.push(("state", v.as_str().to_string()));
        }
        if let Some(v) = self.opens_at_ms {
            out.push(("opensAt", v.to_string()));
        }
        if let Some(v) = self.prequeue_opens_at_ms {
            out.push(("prequeueOpensAt", v.to_string()));
        }
        out
    }
}

impl Sale {
    /// An operator's change applied to the stored sale (or, for a new one, to `defaults`): the
    /// model of `sale_write.lua`'s merge. A changed heartbeat width restarts the windows. The
    /// opening may not change once the draw has run, and the pre-queue opens before it; the
    /// first opening set takes `seed` as the draw's seed (its commitment is public from then on).
    pub fn merged(
        old: Option<&Sale>,
        patch: &SalePatch,
        defaults: SaleDefaults,
        seed: &[u8; 32],
        now_ms: u64,
    ) -> Result<Sale, FieldError> {
        let base = old.cloned().unwrap_or_else(|| Sale {
            window_ms: 0,
            ..defaults.sale(now_ms)
        });
        let heartbeat_timeout_s = patch
            .heartbeat_timeout_s
            .unwrap_or(base.heartbeat_timeout_s);
        let window = window_ms(heartbeat_timeout_s);
        let window_since_ms = match old {
            Some(o) if o.window_ms == window => o.window_since_ms,
            Some(_) => now_ms,
            None => 0,
        };
        let opens_at_ms = patch.opens_at_ms.unwrap_or(base.opens_at_ms);
        let prequeue_opens_at_ms = patch
            .prequeue_opens_at_ms
            .unwrap_or(base.prequeue_opens_at_ms);
        check_schedule(&base, opens_at_ms, prequeue_opens_at_ms)?;
        let (draw_commitment, draw_seed) = if opens_at_ms > 0 && base.draw_commitment.is_empty() {
            (crate::draw::commitment(seed), crate::draw::hex(seed))
        } else {
            (base.draw_commitment.clone(), base.draw_seed.clone())
        };
        Ok(Sale {
            batch_size: patch.batch_size.unwrap_or(base.batch_size),
            tick_ms: patch.tick_ms.unwrap_or(base.tick_ms),
            max_capacity: patch.max_capacity.unwrap_or(base.max_capacity),
            heartbeat_timeout_s,
            state: patch.state.unwrap_or(base.state),
            version: old.map_or(0, |o| o.version) + 1,
            updated_at_ms: now_ms,
            window_ms: window,
            window_since_ms,
            opens_at_ms,
            prequeue_opens_at_ms,
            draw_commitment,
            draw_seed,
            lost_at_ms: 0,
            ..base
        })
    }

    /// Every field as stored in the hash.
    pub fn to_fields(&self) -> Vec<(&'static str, String)> {
        vec![
            ("batchSize", self.batch_size.to_string()),
            ("tickMs", self.tick_ms.to_string()),
            ("maxCapacity", self.max_capacity.to_string()),
            ("heartbeatTimeoutS", self.heartbeat_timeout_s.to_string()),
            ("state", self.state.as_str().to_string()),
            ("version", self.version.to_string()),
            ("updatedAtMs", self.updated_at_ms.to_string()),
            ("windowMs", self.window_ms.to_string()),
            ("windowSince", self.window_since_ms.to_string()),
            ("opensAt", self.opens_at_ms.to_string()),
            ("prequeueOpensAt", self.prequeue_opens_at_ms.to_string()),
            ("drawCommitment", self.draw_commitment.clone()),
            ("drawSeed", self.draw_seed.clone()),
            ("drawNonce", self.draw_nonce.clone()),
            ("drawnAt", self.drawn_at_ms.to_string()),
            ("drawSeq", self.draw_seq.to_string()),
            ("drawEntrants", self.draw_entrants.to_string()),
        ]
    }

    /// Whether users entering now are pre-queued: an opening is announced and the draw has not
    /// run yet.
    pub fn prequeue(&self) -> bool {
        self.opens_at_ms > 0 && self.drawn_at_ms == 0
    }

    /// The stored hash (field/value pairs, as `HGETALL` answers). A hash missing a field or
    /// holding a value out of range is refused, naming the field: the scripts would read it.
    pub fn from_fields<I, K, V>(pairs: I) -> Result<Sale, FieldError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let map: BTreeMap<String, String> = pairs
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_string(), v.as_ref().to_string()))
            .collect();
        let int = |name: &str, (lo, hi): (u64, u64)| -> Result<u64, FieldError> {
            map.get(name)
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|n| (lo..=hi).contains(n))
                .ok_or_else(|| {
                    bad(
                        name,
                        format!("missing, or not an integer from {lo} to {hi}"),
                    )
                })
        };
        let any = (0, u64::MAX);
        let opt = |name: &str| -> Result<u64, FieldError> {
            match map.get(name) {
                None => Ok(0),
                Some(_) => int(name, any),
            }
        };
        Ok(Sale {
            batch_size: u32::try_from(int("batchSize", (1, MAX_BATCH))?).unwrap_or(u32::MAX),
            tick_ms: int("tickMs", TICK_MS)?,
            max_capacity: int("maxCapacity", (1, MAX_CAPACITY))?,
            heartbeat_timeout_s: int("heartbeatTimeoutS", HEARTBEAT_TIMEOUT_S)?,
            state: map
                .get("state")
                .and_then(|s| SaleState::parse(s))
                .ok_or_else(|| bad("state", "missing, or not open or paused"))?,
            version: int("version", any)?,
            updated_at_ms: int("updatedAtMs", any)?,
            window_ms: int("windowMs", (1, u64::MAX))?,
            window_since_ms: int("windowSince", any)?,
            // The schedule and the draw: absent in a sale without an opening.
            opens_at_ms: opt("opensAt")?,
            prequeue_opens_at_ms: opt("prequeueOpensAt")?,
            draw_commitment: map.get("drawCommitment").cloned().unwrap_or_default(),
            draw_seed: map.get("drawSeed").cloned().unwrap_or_default(),
            draw_nonce: map.get("drawNonce").cloned().unwrap_or_default(),
            drawn_at_ms: opt("drawnAt")?,
            draw_seq: opt("drawSeq")?,
            draw_entrants: opt("drawEntrants")?,
            lost_at_ms: opt("lostAtMs")?,
        })
    }

    /// The sale as the admin API and the CLI show it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "batchSize": self.batch_size,
            "tickMs": self.tick_ms,
            "maxCapacity": self.max_capacity,
            "heartbeatTimeoutS": self.heartbeat_timeout_s,
            "state": self.state.as_str(),
            "version": self.version,
            "updatedAtMs": self.updated_at_ms,
            "opensAt": (self.opens_at_ms > 0).then_some(self.opens_at_ms),
            "prequeueOpensAt": (self.prequeue_opens_at_ms > 0).then_some(self.prequeue_opens_at_ms),
            "drawCommitment": (!self.draw_commitment.is_empty()).then(|| self.draw_commitment.clone()),
            "drawnAt": (self.drawn_at_ms > 0).then_some(self.drawn_at_ms),
            "drawEntrants": (self.drawn_at_ms > 0).then_some(self.draw_entrants),
            "lostAt": (self.lost_at_ms > 0).then_some(self.lost_at_ms),
        })
    }
}

/// Why a first opening is refused on a queue that already has users (as `sale_write.lua` says
/// it): the draw would reshuffle places already shown, admitted users back to waiting.
pub const QUEUED: &str =
    "users already queue in arrival order: an opening (and its draw) can only be set before the first enter";

/// Refuses a change that sets a sale's first opening once anyone entered its queue (`queued`).
pub fn check_first_opening(
    old: Option<&Sale>,
    patch: &SalePatch,
    queued: bool,
) -> Result<(), FieldError> {
    let had = old.map_or(0, |o| o.opens_at_ms);
    match patch.opens_at_ms {
        Some(at) if at > 0 && had == 0 && queued => Err(bad("opensAt", QUEUED)),
        _ => Ok(()),
    }
}

/// Why a change of the schedule is refused after the draw (as `sale_write.lua` says it).
const DRAWN: &str = "the draw has run: the schedule can no longer change";

/// The schedule rules of a change: the opening is fixed once the draw has run, and a pre-queue
/// opens before the opening.
fn check_schedule(
    base: &Sale,
    opens_at_ms: u64,
    prequeue_opens_at_ms: u64,
) -> Result<(), FieldError> {
    if base.drawn_at_ms > 0 && opens_at_ms != base.opens_at_ms {
        return Err(bad("opensAt", DRAWN));
    }
    if base.drawn_at_ms > 0 && prequeue_opens_at_ms != base.prequeue_opens_at_ms {
        return Err(bad("prequeueOpensAt", DRAWN));
    }
    if prequeue_opens_at_ms > 0 && (opens_at_ms == 0 || prequeue_opens_at_ms > opens_at_ms) {
        return Err(bad(
            "prequeueOpensAt",
            "must come before opensAt (set opensAt too)",
        ));
    }
    Ok(())
}

/// How long a replica answers from what it last read of a sale before reading it again.
pub const BOOK_FRESH_MS: u64 = 1_000;

/// The most sales a replica's book holds (clients choose target ids).
const BOOK_MAX: usize = 16_384;

/// What a replica last read of each sale (`None`: no sale yet) and the live admission rate its
/// queue measured, for what it answers without asking the store per request: the ETA and the
/// poll hint, which must follow the sale's own budget, tick and heartbeat timeout, not this
/// replica's file. Kept fresh by the settings refresher and the admin API, and read through by
/// one request per sale and `BOOK_FRESH_MS` (the others answer from the last reading meanwhile).
#[derive(Debug)]
pub struct SaleBook {
    defaults: SaleDefaults,
    entries: RwLock<HashMap<QueueTarget, BookEntry>>,
}

#[derive(Debug, Clone)]
struct BookEntry {
    sale: Option<Arc<Sale>>,
    view: SaleView,
    read_ms: u64,
    /// When a request took on reading it again (0: none is).
    refreshing_ms: u64,
}

/// What the book holds for a request.
#[derive(Debug, Clone)]
pub enum BookLookup {
    /// Read within `BOOK_FRESH_MS`, or being read again by another request: answer from it.
    Answer(SaleView),
    /// This request reads the sale again (`last`: the reading before, if any).
    Refresh { last: Option<SaleView> },
}

/// The parameters an answer about a sale uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SaleView {
    pub batch_size: u32,
    pub tick_ms: u64,
    pub heartbeat_timeout_s: u64,
    pub paused: bool,
    /// The opening while users are pre-queued (epoch ms), else 0.
    pub prequeue_until_ms: u64,
    /// When the pre-queue opens (epoch ms; 0: none announced).
    pub prequeue_opens_at_ms: u64,
    /// The live users admitted per second, as measured over the recent admissions (0: no
    /// history); set by the caller from the queue's statistics.
    pub measured_rate_per_sec: f64,
    /// The sale is a paused stand-in for one Redis lost (`Sale::lost_at_ms`): its schedule is
    /// unknown until a replica writes it back, so no place is shown (a draw may still move it).
    pub lost: bool,
}

impl SaleBook {
    pub fn new(defaults: SaleDefaults) -> SaleBook {
        SaleBook {
            defaults,
            entries: RwLock::new(HashMap::new()),
        }
    }

    pub fn defaults(&self) -> SaleDefaults {
        self.defaults
    }

    /// The view to answer with, or that this request should read the sale again (one request
    /// per sale at a time; a read that never reported back is taken over after a second).
    pub fn lookup(&self, target: QueueTarget, now_ms: u64) -> BookLookup {
        {
            let entries = self.entries.read();
            if let Some(e) = entries.get(&target) {
                let fresh = now_ms.saturating_sub(e.read_ms) < BOOK_FRESH_MS;
                let taken =
                    e.refreshing_ms > 0 && now_ms.saturating_sub(e.refreshing_ms) < BOOK_FRESH_MS;
                if fresh || taken {
                    return BookLookup::Answer(e.view);
                }
            }
        }
        let mut entries = self.entries.write();
        match entries.get_mut(&target) {
            Some(e) => {
                if now_ms.saturating_sub(e.read_ms) < BOOK_FRESH_MS
                    || (e.refreshing_ms > 0
                        && now_ms.saturating_sub(e.refreshing_ms) < BOOK_FRESH_MS)
                {
                    return BookLookup::Answer(e.view);
                }
                e.refreshing_ms = now_ms.max(1);
                BookLookup::Refresh { last: Some(e.view) }
            }
            None => BookLookup::Refresh { last: None },
        }
    }

    /// What was read of `target` within `BOOK_FRESH_MS` of `now_ms`, if anything.
    pub fn fresh(&self, target: QueueTarget, now_ms: u64) -> Option<Option<Arc<Sale>>> {
        let entries = self.entries.read();
        let e = entries.get(&target)?;
        (now_ms.saturating_sub(e.read_ms) < BOOK_FRESH_MS).then(|| e.sale.clone())
    }

    /// The last reading of `target`, however old.
    pub fn last(&self, target: QueueTarget) -> Option<Arc<Sale>> {
        self.entries
            .read()
            .get(&target)
            .and_then(|e| e.sale.clone())
    }

    /// Records a reading of `target` made at `now_ms`, with the live admission rate its queue
    /// measured (`None`: not read now; the last measurement stays).
    pub fn set(&self, target: QueueTarget, sale: Option<Sale>, rate: Option<f64>, now_ms: u64) {
        let mut entries = self.entries.write();
        if entries.len() >= BOOK_MAX && !entries.contains_key(&target) {
            entries.retain(|_, e| now_ms.saturating_sub(e.read_ms) < BOOK_FRESH_MS);
            if entries.len() >= BOOK_MAX {
                return;
            }
        }
        let old_rate = entries
            .get(&target)
            .map_or(0.0, |e| e.view.measured_rate_per_sec);
        let mut view = self.view(sale.as_ref());
        view.measured_rate_per_sec = rate.unwrap_or(old_rate);
        entries.insert(
            target,
            BookEntry {
                sale: sale.map(Arc::new),
                view,
                read_ms: now_ms,
                refreshing_ms: 0,
            },
        );
    }

    /// A read through that failed: the next request tries again.
    pub fn refresh_failed(&self, target: QueueTarget) {
        if let Some(e) = self.entries.write().get_mut(&target) {
            e.refreshing_ms = 0;
        }
    }

    /// What an answer about `sale` uses: its own values, or this file's defaults for a sale not
    /// created yet (the first enter creates it with them).
    pub fn view(&self, sale: Option<&Sale>) -> SaleView {
        match sale {
            Some(s) => SaleView {
                batch_size: s.batch_size,
                tick_ms: s.tick_ms,
                heartbeat_timeout_s: s.heartbeat_timeout_s,
                paused: s.state == SaleState::Paused,
                prequeue_until_ms: if s.prequeue() { s.opens_at_ms } else { 0 },
                prequeue_opens_at_ms: s.prequeue_opens_at_ms,
                measured_rate_per_sec: 0.0,
                lost: s.lost_at_ms > 0,
            },
            None => SaleView {
                batch_size: self.defaults.batch_size,
                tick_ms: self.defaults.tick_ms,
                heartbeat_timeout_s: self.defaults.heartbeat_timeout_s,
                paused: false,
                prequeue_until_ms: 0,
                prequeue_opens_at_ms: 0,
                measured_rate_per_sec: 0.0,
                lost: false,
            },
        }
    }
}

#[cfg(test)]
mod tests;
