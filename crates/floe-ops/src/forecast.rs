//! Saturation forecasts (`kind = "forecast"`, on [`crate::series`]): per series and measure,
//! Holt's linear trend, and the time left until the series crosses a threshold.
//!
//! **Trend** — per final minute with a value x, `gap` minutes after the previous one:
//!
//! * predicted = level + trend × gap; error = x − predicted, clipped to ±[`CLIP`] deviations
//!   once warmed up (deviation = √variance, at least 1 % of |level|), so one spike barely
//!   bends the trend;
//! * level ← predicted + `alpha` × error; trend ← trend + w × ((level − previous level) / gap
//!   − trend), with w = max(`beta`, 1/(minutes learned)) — the mean slope over the first
//!   minutes, then exponential forgetting; variance ← the errors' exponentially weighted
//!   square (weight `alpha`).
//!
//! From the `warmup`-th minute on each minute gives a row (the scores stream): the level, the
//! trend per minute, and — when the trend heads for the `threshold` in `direction` (`up`:
//! crossing from below, disk or pool usage; `down`: from above, free space) — the minutes
//! left, level to threshold at the trend's pace (0 once past it), and when that is. A minute
//! with less than `horizon` left is a forecast (the main stream). Columns: `level`,
//! `trend_per_minute`, `threshold`, `minutes_left`, `crossing_at` (null when the trend
//! points away).
//!
//! **State** per measure: ≈ 30 bytes.

use crate::anomaly::CLIP;
use crate::codec::{Reader, Writer};
use crate::minutes::MINUTE;
use crate::series::{Cell, Observation};

/// Which way a series saturates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crossing {
    /// Rising to the threshold (usage, queue depth).
    Up,
    /// Falling to it (free space, idle connections).
    Down,
}

impl Crossing {
    /// Parses `up` or `down`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "up" => Some(Self::Up),
            "down" => Some(Self::Down),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Down => "down",
        }
    }
}

/// How series are forecast.
#[derive(Debug, Clone, PartialEq)]
pub struct ForecastSettings {
    /// The value that is saturation.
    pub threshold: f64,
    /// A series with less time than this left (minutes) is forecast.
    pub horizon_minutes: i64,
    /// The level's weight of a new minute.
    pub alpha: f64,
    /// The trend's weight of a new minute once warmed up.
    pub beta: f64,
    /// Minutes learned before a series is forecast.
    pub warmup: u32,
    /// Values a minute needs to be learned.
    pub min_count: u64,
    /// Minutes without values after which a series is forgotten.
    pub ttl_minutes: i64,
    /// Which way it saturates.
    pub direction: Crossing,
}

/// Defaults of the settings a job file may leave out (`threshold` has none).
pub const DEFAULTS: ForecastSettings = ForecastSettings {
    threshold: f64::NAN,
    horizon_minutes: 60,
    alpha: 0.2,
    beta: 0.05,
    warmup: 15,
    min_count: 1,
    ttl_minutes: 1440,
    direction: Crossing::Up,
};

impl ForecastSettings {
    /// The settings for `floe validate`.
    pub fn describe(&self) -> String {
        format!(
            "crossing {} {} within {} min (alpha {}, beta {}, after {} min, forgotten after {} \
             min)",
            self.threshold,
            self.direction.name(),
            self.horizon_minutes,
            self.alpha,
            self.beta,
            self.warmup,
            self.ttl_minutes
        )
    }
}

/// One measure's learned trend of one series.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Trend {
    /// Minutes learned (saturating).
    learned: u32,
    level: f64,
    /// Per minute.
    trend: f64,
    /// Of the one-step errors.
    variance: f64,
}

impl Trend {
    /// Learns minute `at`, then (once warmed up) its cells and whether it is a forecast.
    pub(crate) fn observe(
        &mut self,
        s: &ForecastSettings,
        at: &Observation,
    ) -> Option<(Vec<Cell>, bool)> {
        let x = at.value;
        let gap = at.gap.max(1) as f64;
        if self.learned == 0 {
            self.level = x;
        } else {
            let predicted = self.level + self.trend * gap;
            let mut error = x - predicted;
            if self.learned >= s.warmup {
                let deviation = self.variance.sqrt().max(0.01 * self.level.abs());
                error = error.clamp(-CLIP * deviation, CLIP * deviation);
            }
            let previous = self.level;
            self.level = predicted + s.alpha * error;
            let weight = s.beta.max(1.0 / f64::from(self.learned));
            self.trend += weight * ((self.level - previous) / gap - self.trend);
            self.variance = (1.0 - s.alpha) * (self.variance + s.alpha * error * error);
        }
        self.learned = self.learned.saturating_add(1);
        if self.learned <= s.warmup {
            return None;
        }
        let (distance, pace) = match s.direction {
            Crossing::Up => (s.threshold - self.level, self.trend),
            Crossing::Down => (self.level - s.threshold, -self.trend),
        };
        let left = if distance <= 0.0 {
            Some(0.0)
        } else if pace > 0.0 {
            Some(distance / pace)
        } else {
            None
        };
        let end = (at.minute + 1) * MINUTE;
        let crossing = left
            .filter(|m| *m < (i64::MAX / MINUTE / 2) as f64)
            .map(|m| end + (m * MINUTE as f64) as i64);
        let cells = vec![
            Cell::F64(Some(self.level)),
            Cell::F64(Some(self.trend)),
            Cell::F64(Some(s.threshold)),
            Cell::F64(left),
            Cell::Time(crossing),
        ];
        let soon = left.is_some_and(|m| m < s.horizon_minutes as f64);
        Some((cells, soon))
    }

    pub(crate) fn encode(&self, w: &mut Writer) {
        w.varint(u64::from(self.learned));
        w.f64(self.level);
        w.f64(self.trend);
        w.f64(self.variance);
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, String> {
        Ok(Self {
            learned: r.varint()?.min(u64::from(u32::MAX)) as u32,
            level: r.f64()?,
            trend: r.f64()?,
            variance: r.f64()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(minute: i64, value: f64) -> Observation {
        Observation {
            minute,
            first: 0,
            gap: 1,
            value,
            count: 1,
            ratio: false,
        }
    }

    fn settings() -> ForecastSettings {
        ForecastSettings {
            threshold: 90.0,
            ..DEFAULTS
        }
    }

    /// (minute, minutes left, forecast) of every row `values` give.
    fn run(s: &ForecastSettings, values: &[f64]) -> Vec<(i64, Option<f64>, bool)> {
        let mut t = Trend::default();
        let mut out = Vec::new();
        for (m, v) in values.iter().enumerate() {
            if let Some((cells, soon)) = t.observe(s, &at(m as i64, *v)) {
                let Cell::F64(left) = cells[3] else {
                    panic!("{cells:?}")
                };
                out.push((m as i64, left, soon));
            }
        }
        out
    }

    #[test]
    fn a_steady_climb_is_forecast_with_the_time_it_has_left() {
        // A disk at 40 % filling 0.5 points a minute, with ±1 of noise: 90 % in 100 minutes.
        let values: Vec<f64> = (0..60)
            .map(|m| 40.0 + 0.5 * m as f64 + [0.0, 1.0, -1.0, 0.5][m % 4])
            .collect();
        let out = run(&settings(), &values);
        assert_eq!(out.first().unwrap().0, 15, "rows from the warm-up on");
        // At minute 59 the truth is (90 − 69.5) / 0.5 = 41 minutes.
        let (_, left, soon) = *out.last().unwrap();
        let left = left.unwrap();
        assert!((left - 41.0).abs() < 6.0, "{left}");
        assert!(soon);
        // Far from it at first: the warm-up's end sees ~ 85 minutes, not a forecast.
        assert!(!out[0].2, "{:?}", out[0]);
    }

    #[test]
    fn a_flat_or_falling_series_and_one_spike_are_never_forecast() {
        let flat: Vec<f64> = (0..120).map(|m| 50.0 + [0.0, 2.0, -2.0][m % 3]).collect();
        assert!(run(&settings(), &flat).iter().all(|r| !r.2));
        let falling: Vec<f64> = (0..120).map(|m| 80.0 - 0.2 * m as f64).collect();
        assert!(
            run(&settings(), &falling)
                .iter()
                .all(|r| r.1.is_none() && !r.2)
        );
        let mut spiked = flat.clone();
        spiked[60] = 100.0;
        let out = run(&settings(), &spiked);
        assert!(out.iter().all(|r| !r.2), "{:?}", &out[44..50]);
        // Past the threshold: no time left.
        let full: Vec<f64> = (0..30).map(|_| 95.0).collect();
        assert_eq!(run(&settings(), &full).last().unwrap().1, Some(0.0));
        // Free space falling to a floor.
        let free = ForecastSettings {
            threshold: 10.0,
            direction: Crossing::Down,
            ..DEFAULTS
        };
        let emptying: Vec<f64> = (0..60).map(|m| 80.0 - m as f64).collect();
        let out = run(&free, &emptying);
        assert!(out.last().unwrap().2, "{:?}", out.last());
        assert!(run(&free, &flat).iter().all(|r| !r.2));
    }

    #[test]
    fn the_state_round_trips() {
        let mut t = Trend::default();
        for m in 0..20 {
            t.observe(&settings(), &at(m, m as f64));
        }
        let mut w = Writer(Vec::new());
        t.encode(&mut w);
        assert_eq!(Trend::decode(&mut Reader(&w.0)).unwrap(), t);
    }
}
