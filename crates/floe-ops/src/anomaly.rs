//! Anomalies (`kind = "anomaly"`, on [`crate::series`]): per series and measure, a robust
//! online baseline, and every final minute that departs from it by `threshold` deviations.
//!
//! **Baseline** — exponentially weighted mean and variance, Holt–Winters style with an
//! additive offset per hour of day:
//!
//! * expected = level + the hour of day's offset; the offsets are learned from the series'
//!   second day on, each minute moving its hour's offset [`SEASON_WEIGHT`] of the way to the
//!   minute's (clipped) departure from the level, while the level learns what the offset
//!   does not explain — an hour that is busy every day is expected after a few days;
//! * deviation = √(max(variance, (`min_deviation` × |expected|)², `min_delta`²) + binomial),
//!   where binomial = p(1 − p)/n for a `ratio` over n rows (p smoothed towards ½ by one row
//!   each way), else 0; score = (observed − expected) / deviation;
//! * a minute learns with weight max(`alpha`, 1/(minutes learned + 1)) — an exact mean and
//!   variance over the first minutes, then exponential forgetting; after `warmup` minutes its
//!   residual is clipped to ±[`CLIP`] deviations first, so one outlier moves the baseline
//!   little while a lasting shift is adopted within tens of minutes.
//!
//! Scores are emitted from the `warmup`-th learned minute on (the scores stream); those with
//! |score| ≥ `threshold` in `direction` (`up`, `down` or `both`) are anomalies (the main
//! stream). Columns: `expected`, `deviation`, `score`, `direction` (of the departure).
//!
//! **State** per measure: ≈ 30 bytes, plus 24 × 6 bytes of offsets from the series' second
//! day on when seasonality is on.

use crate::codec::{Reader, Writer};
use crate::series::{Cell, DAY_MINUTES, Observation};

/// Residuals are clipped to this many deviations before a warmed-up model learns them.
pub const CLIP: f64 = 3.0;

/// The weight of a minute in its hour of day's offset: an hour's offset moves 95 % of the way
/// to what it saw in one day (60 minutes), averaging about its last 20 minutes.
pub const SEASON_WEIGHT: f64 = 0.05;

/// Which departures are anomalies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Above the baseline only (latency, errors).
    Up,
    /// Below only (throughput, free space).
    Down,
    /// Either way.
    Both,
}

impl Direction {
    /// Parses `up`, `down` or `both`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "up" => Some(Self::Up),
            "down" => Some(Self::Down),
            "both" => Some(Self::Both),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Down => "down",
            Self::Both => "both",
        }
    }

    fn flags(self, score: f64, threshold: f64) -> bool {
        match self {
            Self::Up => score >= threshold,
            Self::Down => score <= -threshold,
            Self::Both => score.abs() >= threshold,
        }
    }
}

/// How series are scored.
#[derive(Debug, Clone, PartialEq)]
pub struct AnomalySettings {
    /// |score| at or above this is an anomaly.
    pub threshold: f64,
    /// The weight of a new minute once warmed up.
    pub alpha: f64,
    /// Minutes learned before a series is scored.
    pub warmup: u32,
    /// Values a minute needs to be scored and learned.
    pub min_count: u64,
    /// The deviation is at least this share of the expected value.
    pub min_deviation: f64,
    /// The deviation is at least this.
    pub min_delta: f64,
    /// Whether an offset per hour of day is learned.
    pub seasonality: bool,
    /// Minutes without values after which a series is forgotten.
    pub ttl_minutes: i64,
    /// Which departures are anomalies.
    pub direction: Direction,
}

/// Defaults of the settings a job file may leave out.
pub const DEFAULTS: AnomalySettings = AnomalySettings {
    threshold: 4.0,
    alpha: 0.05,
    warmup: 30,
    min_count: 1,
    min_deviation: 0.05,
    min_delta: 0.0,
    seasonality: true,
    ttl_minutes: 1440,
    direction: Direction::Both,
};

impl AnomalySettings {
    /// The settings for `floe validate`.
    pub fn describe(&self) -> String {
        format!(
            "|score| ≥ {} {} after {} min (alpha {}, floor {} × expected or {}, {}seasonal, \
             forgotten after {} min)",
            self.threshold,
            self.direction.name(),
            self.warmup,
            self.alpha,
            self.min_deviation,
            self.min_delta,
            if self.seasonality { "" } else { "not " },
            self.ttl_minutes
        )
    }
}

/// One measure's learned baseline of one series.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Baseline {
    /// Minutes learned (saturating).
    learned: u32,
    level: f64,
    variance: f64,
    /// Empty, or an (offset, minutes learned) per hour of day.
    season: Vec<(f32, u16)>,
}

impl Default for Baseline {
    fn default() -> Self {
        Self {
            learned: 0,
            level: 0.0,
            variance: 0.0,
            season: Vec::new(),
        }
    }
}

/// A minute's score against a baseline.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Scored {
    expected: f64,
    deviation: f64,
    score: f64,
}

impl Baseline {
    /// The hour of day's learned offset (0 until the series' second day).
    fn offset(&self, hour: usize) -> f64 {
        self.season
            .get(hour)
            .map_or(0.0, |&(offset, _)| f64::from(offset))
    }

    /// `observed` (from `count` values, `ratio` if a share) against the baseline.
    fn score(
        &self,
        observed: f64,
        hour: usize,
        count: u64,
        ratio: bool,
        s: &AnomalySettings,
    ) -> Scored {
        let expected = self.level + self.offset(hour);
        let floor = (s.min_deviation * expected.abs()).max(s.min_delta);
        let mut variance = self.variance.max(floor * floor);
        if ratio && count > 0 {
            let n = count as f64;
            let p = ((expected * n + 1.0) / (n + 2.0)).clamp(0.0, 1.0);
            variance += p * (1.0 - p) / n;
        }
        let deviation = variance.sqrt().max(f64::MIN_POSITIVE);
        Scored {
            expected,
            deviation,
            score: (observed - expected) / deviation,
        }
    }

    /// Learns `observed`, scored as `scored`; `seasonal`: the hour's offset learns too.
    fn learn(
        &mut self,
        observed: f64,
        hour: usize,
        scored: Scored,
        seasonal: bool,
        s: &AnomalySettings,
    ) {
        let mut residual = observed - scored.expected;
        if self.learned >= s.warmup {
            let clip = CLIP * scored.deviation;
            residual = residual.clamp(-clip, clip);
        }
        let weight = s.alpha.max(1.0 / (f64::from(self.learned) + 1.0));
        if self.learned == 0 {
            self.level = observed - self.offset(hour);
        } else {
            self.level += weight * residual;
            self.variance = (1.0 - weight) * (self.variance + weight * residual * residual);
        }
        if seasonal {
            if self.season.is_empty() {
                self.season = vec![(0.0, 0); 24];
            }
            // The hour's departure from the (updated) level, clipped like the residual.
            let target = scored.expected + residual - self.level;
            let (offset, n) = &mut self.season[hour];
            *offset += (SEASON_WEIGHT * (target - f64::from(*offset))) as f32;
            *n = n.saturating_add(1);
        }
        self.learned = self.learned.saturating_add(1);
    }

    pub(crate) fn encode(&self, w: &mut Writer) {
        w.varint(u64::from(self.learned));
        w.f64(self.level);
        w.f64(self.variance);
        w.u8(self.season.len() as u8);
        for (offset, n) in &self.season {
            w.0.extend_from_slice(&offset.to_le_bytes());
            w.0.extend_from_slice(&n.to_le_bytes());
        }
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, String> {
        let learned = r.varint()?.min(u64::from(u32::MAX)) as u32;
        let (level, variance) = (r.f64()?, r.f64()?);
        let slots = r.u8()? as usize;
        let mut season = Vec::with_capacity(slots);
        for _ in 0..slots {
            let b = r.take(6)?;
            season.push((
                f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                u16::from_le_bytes([b[4], b[5]]),
            ));
        }
        Ok(Self {
            learned,
            level,
            variance,
            season,
        })
    }

    /// Scores minute `at` (once warmed up: its cells and whether it is an anomaly), then
    /// learns it.
    pub(crate) fn observe(
        &mut self,
        s: &AnomalySettings,
        at: &Observation,
    ) -> Option<(Vec<Cell>, bool)> {
        let hour = at.minute.rem_euclid(DAY_MINUTES) as usize / 60;
        let seasonal = s.seasonality && at.minute - at.first >= DAY_MINUTES;
        let scored = self.score(at.value, hour, at.count, at.ratio, s);
        let out = (self.learned >= s.warmup).then(|| {
            let cells = vec![
                Cell::F64(Some(scored.expected)),
                Cell::F64(Some(scored.deviation)),
                Cell::F64(Some(scored.score)),
                Cell::Text(if scored.score >= 0.0 { "up" } else { "down" }),
            ];
            (cells, s.direction.flags(scored.score, s.threshold))
        });
        self.learn(at.value, hour, scored, seasonal, s);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: u64) -> impl FnMut() -> u64 {
        let mut state = seed;
        move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            state >> 33
        }
    }

    #[test]
    fn the_baseline_is_exact_at_first_then_forgets_and_resists_outliers() {
        let s = AnomalySettings {
            warmup: 3,
            seasonality: false,
            ..DEFAULTS
        };
        let mut b = Baseline::default();
        for x in [10.0, 12.0, 14.0] {
            let scored = b.score(x, 0, 1, false, &s);
            b.learn(x, 0, scored, false, &s);
        }
        assert!((b.level - 12.0).abs() < 1e-12, "{}", b.level);
        // Population variance of 10, 12, 14.
        assert!((b.variance - 8.0 / 3.0).abs() < 1e-12, "{}", b.variance);
        let before = b.level;
        let scored = b.score(1000.0, 0, 1, false, &s);
        assert!(scored.score > 100.0);
        b.learn(1000.0, 0, scored, false, &s);
        // Clipped to 3 deviations, weighted alpha (max(0.05, 1/4) = 0.25).
        let moved = b.level - before;
        assert!(
            (moved - 0.25 * CLIP * scored.deviation).abs() < 1e-9,
            "{moved}"
        );
        // A round trip through the state encoding.
        let mut w = Writer(Vec::new());
        b.season = vec![(1.5, 7); 24];
        b.encode(&mut w);
        assert_eq!(Baseline::decode(&mut Reader(&w.0)).unwrap(), b);
    }

    #[test]
    fn an_hour_that_is_always_busy_is_expected_once_learned() {
        // Day after day, the hour 03:00–04:00 UTC runs at 200 instead of 100.
        let s = AnomalySettings {
            seasonality: true,
            ..DEFAULTS
        };
        let mut b = Baseline::default();
        let mut next = lcg(9);
        let mut last_busy_score = f64::NAN;
        for minute in 0..5 * DAY_MINUTES {
            let hour = (minute.rem_euclid(DAY_MINUTES) / 60) as usize;
            let x = if hour == 3 { 200.0 } else { 100.0 } + (next() % 5) as f64;
            let seasonal = minute >= DAY_MINUTES;
            let scored = b.score(x, hour, 1, false, &s);
            if hour == 3 && minute % 60 == 0 {
                last_busy_score = scored.score;
            }
            b.learn(x, hour, scored, seasonal, &s);
        }
        // On day five the busy hour's first minute is expected.
        assert!(last_busy_score.abs() < s.threshold, "{last_busy_score}");
    }
}
