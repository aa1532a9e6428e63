//! Per-replica predictions of a request's time to first token and time per output token, learned
//! online from the gateway's own streams, for `balance: slo`.
//!
//! Each replica has two linear models over the same features, taken when a request is sent (see
//! [`State`]): one, the prompt's length, the requests this gateway already has in flight to the
//! replica and their prompt tokens, from the engine's last scrape (0 without one) its waiting and
//! running requests and its KV-cache usage, and whether prefix affinity would pick this replica
//! for the prompt (its prefix cache may hold it). They are
//! fitted by recursive least squares with a forgetting factor, so that a replica that slows down
//! (or recovers) is followed within a few dozen requests, at a fixed cost of a few dozen
//! multiplications per update and eight per prediction: cheap enough for every request, where a
//! gradient-boosted model (llm-d's latency predictor runs XGBoost in sidecars) is not. Linear in
//! load holds while a replica is below its knee; past it, the error metric says how far to trust it.

use std::time::Duration;

/// Features: 1, prompt tokens / 1000, in flight here, their prompt tokens / 1000, waiting and
/// running in the engine, its KV-cache usage, and whether the replica is the prompt prefix's home.
pub(crate) const FEATURES: usize = 8;
/// Samples before a model is used: until then the route balances by least outstanding.
const WARM_UP: u32 = 8;
/// The forgetting factor: a sample's weight halves after about 35 newer ones.
const FORGET: f64 = 0.98;
/// The initial covariance's scale: the first samples move the model freely.
const DELTA: f64 = 1e3;
/// The smoothing of the error's moving average (about the last 40 samples).
const ERROR_ALPHA: f64 = 0.05;

pub(crate) type Features = [f64; FEATURES];

/// The features of a request to a replica.
/// What a replica's state is when a request is sent to it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct State {
    pub(crate) input_tokens: u32,
    /// Requests this gateway has in flight to it, and their prompt tokens.
    pub(crate) in_flight: u32,
    pub(crate) tokens_in_flight: u64,
    /// From the engine's last scrape (0 without one).
    pub(crate) engine_waiting: f64,
    pub(crate) engine_running: f64,
    pub(crate) kv: f64,
    /// The replica prefix affinity would send the prompt to (its prefix cache may hold it).
    pub(crate) prefix_home: bool,
}

pub(crate) fn features(s: State) -> Features {
    [
        1.0,
        f64::from(s.input_tokens) / 1000.0,
        f64::from(s.in_flight),
        s.tokens_in_flight as f64 / 1000.0,
        s.engine_waiting,
        s.engine_running,
        s.kv,
        if s.prefix_home { 1.0 } else { 0.0 },
    ]
}

/// One quantity's model (milliseconds), fitted by recursive least squares.
#[derive(Debug, Clone)]
struct Rls {
    theta: Features,
    p: [[f64; FEATURES]; FEATURES],
    samples: u32,
    /// Mean relative error of the prediction made before each sample was learned: out of sample.
    error: Option<f64>,
}

impl Default for Rls {
    fn default() -> Self {
        let mut p = [[0.0; FEATURES]; FEATURES];
        for (i, row) in p.iter_mut().enumerate() {
            row[i] = DELTA;
        }
        Rls {
            theta: [0.0; FEATURES],
            p,
            samples: 0,
            error: None,
        }
    }
}

impl Rls {
    fn predict(&self, x: &Features) -> f64 {
        self.theta.iter().zip(x).map(|(t, v)| t * v).sum::<f64>().max(0.0)
    }

    fn learn(&mut self, x: &Features, y: f64) {
        if self.samples >= WARM_UP {
            let rel = (self.predict(x) - y).abs() / y.max(1.0);
            self.error = Some(match self.error {
                Some(e) => e + ERROR_ALPHA * (rel - e),
                None => rel,
            });
        }
        let mut px = [0.0; FEATURES];
        for (i, out) in px.iter_mut().enumerate() {
            *out = (0..FEATURES).map(|j| self.p[i][j] * x[j]).sum();
        }
        let denom = FORGET + x.iter().zip(&px).map(|(a, b)| a * b).sum::<f64>();
        if !(denom.is_finite() && denom > 0.0) {
            *self = Rls::default();
            return;
        }
        let gain: Features = std::array::from_fn(|i| px[i] / denom);
        let e = y - self.theta.iter().zip(x).map(|(t, v)| t * v).sum::<f64>();
        for (t, g) in self.theta.iter_mut().zip(&gain) {
            *t += g * e;
        }
        // P = (P − g·(Px)ᵀ) / λ, then no direction's variance above where it started: a feature a
        // replica never varies (no engine scrape: waiting is always 0) would otherwise grow
        // without end under forgetting. Scaling row and column i together keeps P positive.
        for (row, g) in self.p.iter_mut().zip(&gain) {
            for (cell, pxj) in row.iter_mut().zip(&px) {
                *cell = (*cell - g * pxj) / FORGET;
            }
        }
        for i in 0..FEATURES {
            let d = self.p[i][i];
            if d > DELTA {
                let scale = (DELTA / d).sqrt();
                for k in 0..FEATURES {
                    self.p[i][k] *= scale;
                    self.p[k][i] *= scale;
                }
            }
        }
        self.samples = self.samples.saturating_add(1);
    }
}

/// A replica's TTFT and TPOT models.
#[derive(Debug, Clone, Default)]
pub(crate) struct Predictor {
    ttft: Rls,
    tpot: Rls,
    /// When the TTFT model last learned: a replica nobody sends to keeps what it last showed,
    /// however long ago (see `balance::pick_slo`'s exploration).
    learned_at: Option<tokio::time::Instant>,
}

/// What a replica is predicted to give a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Prediction {
    pub(crate) ttft: Duration,
    /// `None` until enough streams of several tokens were seen.
    pub(crate) tpot: Option<Duration>,
    /// The models' mean relative errors so far (0 before any was measured).
    pub(crate) ttft_error: f64,
    pub(crate) tpot_error: f64,
}

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64((v / 1000.0).clamp(0.0, 3600.0))
}

impl Predictor {
    /// `None` until the TTFT model has seen enough samples.
    pub(crate) fn predict(&self, x: &Features) -> Option<Prediction> {
        (self.ttft.samples >= WARM_UP).then(|| Prediction {
            ttft: ms(self.ttft.predict(x)),
            tpot: (self.tpot.samples >= WARM_UP).then(|| ms(self.tpot.predict(x))),
            ttft_error: self.ttft.error.unwrap_or(0.0),
            tpot_error: self.tpot.error.unwrap_or(0.0),
        })
    }

    pub(crate) fn learn_ttft(&mut self, x: &Features, ttft: Duration) {
        self.ttft.learn(x, ttft.as_secs_f64() * 1000.0);
        self.learned_at = Some(tokio::time::Instant::now());
    }

    /// Whether the TTFT model has learned nothing since `since`.
    pub(crate) fn stale(&self, since: tokio::time::Instant) -> bool {
        self.learned_at.is_none_or(|at| at < since)
    }

    pub(crate) fn learn_tpot(&mut self, x: &Features, tpot: Duration) {
        self.tpot.learn(x, tpot.as_secs_f64() * 1000.0);
    }

    /// (samples, mean relative error) of the TTFT and TPOT models.
    pub(crate) fn quality(&self) -> [(u32, Option<f64>); 2] {
        [
            (self.ttft.samples, self.ttft.error),
            (self.tpot.samples, self.tpot.error),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_a_linear_replica_and_follows_it_when_it_slows() {
        let mut p = Predictor::default();
        // TTFT = 20 ms + 30 ms per 1k prompt tokens + 15 ms per request in flight.
        let truth = |x: &Features, slow: f64| slow * (20.0 + 30.0 * x[1] + 15.0 * x[2]);
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for _ in 0..200 {
            let x = features(State {
                input_tokens: next() % 4000,
                in_flight: next() % 12,
                ..State::default()
            });
            p.learn_ttft(&x, Duration::from_secs_f64(truth(&x, 1.0) / 1000.0));
        }
        let x = features(State {
            input_tokens: 2000,
            in_flight: 6,
            engine_waiting: 0.0,
            ..State::default()
        });
        let got = p.predict(&x).unwrap().ttft.as_secs_f64() * 1000.0;
        assert!((got - truth(&x, 1.0)).abs() < 1.0, "{got} vs {}", truth(&x, 1.0));
        assert!(p.quality()[0].1.unwrap() < 0.01);
        // The replica turns four times slower: the forgetting model follows it.
        for _ in 0..300 {
            let x = features(State {
                input_tokens: next() % 4000,
                in_flight: next() % 12,
                ..State::default()
            });
            p.learn_ttft(&x, Duration::from_secs_f64(truth(&x, 4.0) / 1000.0));
        }
        let got = p.predict(&x).unwrap().ttft.as_secs_f64() * 1000.0;
        let want = truth(&x, 4.0);
        assert!((got - want).abs() / want < 0.05, "{got} vs {want}");
    }

    #[test]
    fn knows_nothing_before_its_warm_up() {
        let mut p = Predictor::default();
        let x = features(State {
            input_tokens: 100,
            in_flight: 1,
            engine_waiting: 0.0,
            ..State::default()
        });
        for _ in 0..WARM_UP - 1 {
            p.learn_ttft(&x, Duration::from_millis(50));
        }
        assert_eq!(p.predict(&x), None);
        p.learn_ttft(&x, Duration::from_millis(50));
        let got = p.predict(&x).unwrap();
        assert!((got.ttft.as_secs_f64() - 0.05).abs() < 0.002, "{got:?}");
        assert_eq!(got.tpot, None);
    }
}
