//! Token sampling, as in llama.cpp and Hugging Face `generate`.
//!
//! A [`Sampler`] turns one step's logits (one `f32` per vocabulary entry) into a token id.
//! The pipeline, in order:
//!
//! 1. **Repetition penalty** (HF `RepetitionPenaltyLogitsProcessor` / CTRL): every distinct
//!    token among the last [`SamplerConfig::repeat_last_n`] tokens of the history has its
//!    logit divided by the penalty when positive and multiplied by it otherwise.
//! 2. **Greedy** when the temperature is `<= 1e-6`: the argmax (ties go to the lowest id).
//! 3. Otherwise **top-k** (keep the `k` largest logits), **softmax with temperature**,
//!    **top-p** (nucleus: the smallest set of most probable tokens whose cumulative
//!    probability reaches `p`, never fewer than one), **min-p** (drop tokens whose probability
//!    is below `min_p × max probability`), renormalise, and draw with a seeded PRNG.
//!
//! The PRNG is a xoshiro256** seeded through splitmix64, and the softmax uses an `exp` built
//! from IEEE `+`/`*` only, both written here so that a given seed draws the same sequence on
//! every platform and with every dependency version. The draw walks the candidates in a
//! canonical order (token id, or descending probability after top-k / top-p).
//!
//! Non-finite logits never panic: NaN counts as `-inf`, `+inf` as the largest finite `f32`.
//! If no token has a usable logit (all `-inf`/NaN), the sampler falls back to token `0`
//! (the argmax with ties to the lowest id).
//!
//! ```
//! use luminal_models::sampling::{Sampler, SamplerConfig};
//!
//! let mut greedy = Sampler::new(SamplerConfig::default());
//! assert_eq!(greedy.sample(&[0.1, 2.0, -1.0], &[]).unwrap(), 1);
//!
//! let mut s = Sampler::new(SamplerConfig {
//!     temperature: 0.8,
//!     top_k: 40,
//!     top_p: 0.95,
//!     ..Default::default()
//! });
//! let tok = s.sample(&[0.1, 2.0, -1.0], &[1]).unwrap();
//! assert!(tok < 3);
//! ```

/// Temperatures at or below this are treated as greedy decoding.
pub const GREEDY_TEMPERATURE: f32 = 1e-6;

/// Errors from [`Sampler::sample`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// The logits slice was empty.
    #[error("cannot sample from empty logits")]
    EmptyLogits,
    /// The vocabulary does not fit in a `u32` token id.
    #[error("vocabulary of {0} entries does not fit in u32 token ids")]
    VocabTooLarge(usize),
    /// A configuration value is out of range (see [`SamplerConfig::validate`]).
    #[error("invalid sampler config: {0}")]
    InvalidConfig(String),
}

/// Sampling parameters. `Default` is greedy decoding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; `<= 1e-6` means greedy (argmax). Default `0.0`.
    pub temperature: f32,
    /// Keep only the `top_k` largest logits; `0` = off. Default `0`.
    pub top_k: usize,
    /// Nucleus sampling threshold in `[0, 1]`; `1.0` = off. Default `1.0`.
    pub top_p: f32,
    /// Drop tokens with probability below `min_p × max probability`, in `[0, 1]`; `0` = off.
    /// Default `0.0`.
    pub min_p: f32,
    /// Repetition penalty (> 0); `1.0` = off. Default `1.0`.
    pub repetition_penalty: f32,
    /// How many of the most recent history tokens the penalty looks at; `0` = none,
    /// `usize::MAX` = the whole history. Default `64`.
    pub repeat_last_n: usize,
    /// Seed of the PRNG. Default `42`.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repeat_last_n: 64,
            seed: 42,
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding (the default).
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Whether this config decodes greedily (temperature `<= 1e-6`).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= GREEDY_TEMPERATURE
    }

    /// Checks every field is in range: temperature finite and `>= 0`, `top_p` and `min_p`
    /// in `[0, 1]`, repetition penalty finite and `> 0`.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let bad = |msg: String| Err(SamplingError::InvalidConfig(msg));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(format!(
                "temperature must be finite and >= 0, got {}",
                self.temperature
            ));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return bad(format!("top_p must be in [0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return bad(format!(
                "repetition_penalty must be finite and > 0, got {}",
                self.repetition_penalty
            ));
        }
        Ok(())
    }
}

/// Applies the HF/CTRL repetition penalty in place: each *distinct* token id among the last
/// `last_n` entries of `history` (ids outside `logits` are ignored) has its logit divided by
/// `penalty` if it is positive, multiplied by `penalty` otherwise. Repeated occurrences do
/// not compound. `penalty == 1.0` or `last_n == 0` leaves the logits unchanged.
pub fn apply_repetition_penalty(logits: &mut [f32], history: &[u32], penalty: f32, last_n: usize) {
    if penalty == 1.0 || last_n == 0 || history.is_empty() {
        return;
    }
    let start = history.len().saturating_sub(last_n);
    let mut recent: Vec<u32> = history[start..]
        .iter()
        .copied()
        .filter(|&t| (t as usize) < logits.len())
        .collect();
    recent.sort_unstable();
    recent.dedup();
    for t in recent {
        let l = &mut logits[t as usize];
        if *l > 0.0 {
            *l /= penalty;
        } else {
            *l *= penalty;
        }
    }
}

/// xoshiro256** (Blackman & Vigna), seeded through splitmix64. Deterministic everywhere.
#[derive(Debug, Clone)]
struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A sort key whose *descending* order is logit descending, then id ascending: a total
/// order on integers, so selection and sorting are fast and deterministic. The logit must
/// not be NaN, and `-0.0` must have been normalised to `0.0`.
#[inline]
fn key(id: u32, logit: f32) -> u64 {
    let b = logit.to_bits();
    let ordered = if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    };
    ((ordered as u64) << 32) | (u32::MAX - id) as u64
}

/// The token id of a [`key`].
#[inline]
fn key_id(k: u64) -> u32 {
    u32::MAX - (k as u32)
}

/// `e^x` for `x <= 0` in `f32`, from IEEE `+`/`*`/bit operations only: the same bits on
/// every platform (unlike `f32::exp`, which calls the platform's libm), branch-free so the
/// compiler vectorises it. `x` is clamped to `[-87, 0]` (below, `e^x` is not a normal
/// `f32`; callers zero such tokens themselves). Cody–Waite reduction `x = k·ln2 + r`,
/// `|r| <= ln2/2`, then a degree-7 Taylor polynomial: relative error about 1e-7.
#[inline]
fn exp_nonpositive(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75; // 0x3f317200: few mantissa bits, k·LN2_HI is exact
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding 1.5·2^23 rounds x·log2(e) to an integer held in the low mantissa bits.
    const SHIFTER: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 0.0);
    let t = x * std::f32::consts::LOG2_E + SHIFTER;
    let kf = t - SHIFTER;
    let r = (x - kf * LN2_HI) - kf * LN2_LO;
    let mut p = 1.0 / 5_040.0; // 1/7!
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    // 2^k, k in [-126, 0]: t's low bits are 2^22 + k; the shift drops the 2^22.
    let scale = f32::from_bits(t.to_bits().wrapping_add(127) << 23);
    p * scale
}

/// Relative log-probability below which a token is dropped before the softmax:
/// `exp(-80) ≈ 1.8e-35`, so even a 10⁶-token vocabulary loses under 1e-28 of the mass.
const NEGLIGIBLE_LOG_PROB: f32 = 80.0;

/// A stateful token sampler: owns its config, PRNG and scratch buffers.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Xoshiro256,
    /// Penalised, sanitised logits.
    scratch: Vec<f32>,
    /// Candidate sort keys (see [`key`]).
    keys: Vec<u64>,
    /// The distribution to draw from (unnormalised).
    dist: Dist,
}

/// The prepared distribution: unnormalised, non-negative weights in a canonical order.
#[derive(Debug, Clone)]
enum Dist {
    /// One weight per vocabulary entry, in id order (zero = excluded). Used when no
    /// ordering filter (top-k / top-p) is set: a single vectorised pass.
    Dense(Vec<f32>),
    /// `(id, weight)` by descending weight (ids ascending on ties).
    Sparse(Vec<(u32, f32)>),
}

impl Dist {
    fn total(&self) -> f64 {
        match self {
            Dist::Dense(w) => w.iter().map(|&p| p as f64).sum(),
            Dist::Sparse(c) => c.iter().map(|c| c.1 as f64).sum(),
        }
    }

    /// The token at cumulative weight `target` (in `[0, total)`).
    fn pick(&self, target: f64) -> u32 {
        let mut acc = 0.0;
        let mut last = 0;
        let mut walk = |id: u32, p: f32| {
            if p > 0.0 {
                acc += p as f64;
                last = id;
                target < acc
            } else {
                false
            }
        };
        match self {
            Dist::Dense(w) => {
                for (i, &p) in w.iter().enumerate() {
                    if walk(i as u32, p) {
                        return i as u32;
                    }
                }
            }
            Dist::Sparse(c) => {
                for &(id, p) in c {
                    if walk(id, p) {
                        return id;
                    }
                }
            }
        }
        // Rounding left `target` at the very top: the last token with weight.
        last
    }

    /// Zeroes / drops weights below `cut`.
    fn cut_below(&mut self, cut: f32) {
        match self {
            Dist::Dense(w) => w.iter_mut().for_each(|p| {
                if *p < cut {
                    *p = 0.0
                }
            }),
            Dist::Sparse(c) => c.retain(|c| c.1 >= cut),
        }
    }

    fn max_weight(&self) -> f32 {
        match self {
            Dist::Dense(w) => w.iter().fold(0.0, |m: f32, &p| m.max(p)),
            Dist::Sparse(c) => c.iter().fold(0.0, |m: f32, c| m.max(c.1)),
        }
    }

    /// The tokens with positive weight, as `(id, weight)`.
    fn support(&self) -> Vec<(u32, f32)> {
        match self {
            Dist::Dense(w) => w
                .iter()
                .enumerate()
                .filter(|(_, &p)| p > 0.0)
                .map(|(i, &p)| (i as u32, p))
                .collect(),
            Dist::Sparse(c) => c.iter().copied().filter(|c| c.1 > 0.0).collect(),
        }
    }
}

impl Sampler {
    /// A sampler with the PRNG seeded from `cfg.seed`. The config is checked on each
    /// [`sample`](Self::sample); call [`SamplerConfig::validate`] to check it up front.
    pub fn new(cfg: SamplerConfig) -> Self {
        Self {
            cfg,
            rng: Xoshiro256::new(cfg.seed),
            scratch: Vec::new(),
            keys: Vec::new(),
            dist: Dist::Sparse(Vec::new()),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Restarts the PRNG from `seed` (and records it in the config).
    pub fn reseed(&mut self, seed: u64) {
        self.cfg.seed = seed;
        self.rng = Xoshiro256::new(seed);
    }

    /// Picks the next token from `logits` (one per vocabulary entry), given the token
    /// `history` so far (prompt + generated) for the repetition penalty.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, SamplingError> {
        let decided = self.prepare(logits, history)?;
        // A stochastic config consumes exactly one draw per call, even when the filters
        // leave a single candidate, so later draws do not depend on earlier collapses.
        let u = if self.cfg.is_greedy() {
            0.0
        } else {
            self.rng.next_f64()
        };
        if let Some(tok) = decided {
            return Ok(tok);
        }
        Ok(self.dist.pick(u * self.dist.total()))
    }

    /// The distribution [`sample`](Self::sample) would draw from, as `(token, probability)`
    /// pairs with probabilities summing to 1 (a single `(argmax, 1.0)` when greedy). Does not
    /// advance the PRNG. Useful for debugging and for tests.
    pub fn distribution(
        &mut self,
        logits: &[f32],
        history: &[u32],
    ) -> Result<Vec<(u32, f64)>, SamplingError> {
        if let Some(tok) = self.prepare(logits, history)? {
            return Ok(vec![(tok, 1.0)]);
        }
        let total = self.dist.total();
        Ok(self
            .dist
            .support()
            .into_iter()
            .map(|(id, p)| (id, p as f64 / total))
            .collect())
    }

    /// Runs the pipeline up to the draw. Returns `Some(token)` when the choice is already
    /// determined (greedy, or one candidate left); otherwise leaves `dist` with at least two
    /// tokens of positive weight.
    fn prepare(&mut self, logits: &[f32], history: &[u32]) -> Result<Option<u32>, SamplingError> {
        if logits.is_empty() {
            return Err(SamplingError::EmptyLogits);
        }
        if logits.len() > u32::MAX as usize {
            return Err(SamplingError::VocabTooLarge(logits.len()));
        }
        self.cfg.validate()?;
        let cfg = self.cfg;

        // Sanitise: NaN -> -inf, +inf -> f32::MAX (so the softmax stays finite), -0 -> +0
        // (for the sort keys).
        self.scratch.clear();
        self.scratch.extend(logits.iter().map(|&l| {
            if l.is_nan() {
                f32::NEG_INFINITY
            } else {
                l.min(f32::MAX) + 0.0
            }
        }));
        apply_repetition_penalty(
            &mut self.scratch,
            history,
            cfg.repetition_penalty,
            cfg.repeat_last_n,
        );

        // Greedy argmax, ties to the lowest id (also the fallback when nothing is finite).
        let (argmax, max) = self.scratch.iter().enumerate().fold(
            (0usize, f32::NEG_INFINITY),
            |(bi, bv), (i, &v)| {
                if v > bv {
                    (i, v)
                } else {
                    (bi, bv)
                }
            },
        );
        let argmax = argmax as u32;
        if cfg.is_greedy() || max == f32::NEG_INFINITY || cfg.top_k == 1 {
            return Ok(Some(argmax));
        }

        // Tokens whose probability relative to the max is negligible (and -inf ones) are
        // dropped, which also bounds the work below.
        let floor = max as f64 - NEGLIGIBLE_LOG_PROB as f64 * cfg.temperature as f64;
        let floor = if floor > f32::MIN as f64 {
            floor as f32
        } else {
            f32::MIN
        };
        // Softmax with temperature, unnormalised: the max gets 1.0, all others (0, 1].
        // (l - max) can be -inf for huge logits, which the clamp in exp absorbs.
        let inv_t = 1.0 / cfg.temperature;
        let weight = |l: f32| -> f32 { exp_nonpositive((l - max) * inv_t) };
        let scratch = &self.scratch;

        let ordered = (cfg.top_k > 0 && cfg.top_k < scratch.len()) || cfg.top_p < 1.0;
        if !ordered {
            // Plain temperature (maybe with min-p): one dense, vectorisable pass.
            let mut w = match std::mem::replace(&mut self.dist, Dist::Dense(Vec::new())) {
                Dist::Dense(w) => w,
                Dist::Sparse(_) => Vec::new(),
            };
            w.clear();
            w.resize(scratch.len(), 0.0);
            for (o, &l) in w.iter_mut().zip(scratch) {
                let p = weight(l);
                *o = if l >= floor { p } else { 0.0 };
            }
            self.dist = Dist::Dense(w);
        } else {
            let keys = &mut self.keys;
            keys.clear();
            keys.extend(
                scratch
                    .iter()
                    .enumerate()
                    .filter(|&(_, &l)| l >= floor)
                    .map(|(i, &l)| key(i as u32, l)),
            );
            let desc = |a: &u64, b: &u64| b.cmp(a);
            let weight_of = |k: u64| weight(scratch[key_id(k) as usize]);

            // Top-k: partial selection, no full sort.
            if cfg.top_k > 0 && cfg.top_k < keys.len() {
                keys.select_nth_unstable_by(cfg.top_k - 1, desc);
                keys.truncate(cfg.top_k);
            }

            // Top-p: the smallest prefix, by descending probability, reaching top_p of the
            // mass. Sort only as much as needed: select the best `k`, sort them, and widen
            // `k` only when their mass falls short.
            let n = keys.len();
            let keep = if cfg.top_p < 1.0 {
                let total: f64 = keys.iter().map(|&k| weight_of(k) as f64).sum();
                let threshold = cfg.top_p as f64 * total;
                let mut k = n.min(256);
                loop {
                    if k < n {
                        keys.select_nth_unstable_by(k - 1, desc);
                    }
                    keys[..k].sort_unstable_by(desc);
                    let mut acc = 0.0;
                    let found = keys[..k].iter().position(|&key| {
                        acc += weight_of(key) as f64;
                        acc >= threshold
                    });
                    match found {
                        Some(i) => break i + 1,
                        None if k == n => break n,
                        None => k = n.min(k * 8),
                    }
                }
            } else {
                // A canonical order for the draw (selection leaves it unspecified).
                keys.sort_unstable_by(desc);
                n
            };
            keys.truncate(keep.max(1));
            let mut c = match std::mem::replace(&mut self.dist, Dist::Sparse(Vec::new())) {
                Dist::Sparse(c) => c,
                Dist::Dense(_) => Vec::new(),
            };
            c.clear();
            c.extend(keys.iter().map(|&k| (key_id(k), weight_of(k))));
            self.dist = Dist::Sparse(c);
        }

        // Min-p relative to the most probable survivor (the max, weight 1.0, survives).
        if cfg.min_p > 0.0 {
            let cut = cfg.min_p * self.dist.max_weight();
            self.dist.cut_below(cut);
        }

        match &self.dist {
            Dist::Sparse(c) if c.iter().filter(|c| c.1 > 0.0).count() <= 1 => {
                Ok(Some(c.iter().find(|c| c.1 > 0.0).map_or(argmax, |c| c.0)))
            }
            // Dense always holds the argmax with weight exp(0) = 1 (min-p keeps it too).
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{exp_nonpositive, key, key_id};

    #[test]
    fn exp_matches_libm() {
        let mut x = 0.0f32;
        while x >= -87.0 {
            let (got, want) = (exp_nonpositive(x) as f64, (x as f64).exp());
            assert!(((got - want) / want).abs() < 3e-7, "x={x}: {got} vs {want}");
            x -= 0.00731;
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(f32::NEG_INFINITY) < 1e-37);
    }

    #[test]
    fn keys_order_by_logit_then_id() {
        let mut ks = [
            key(3, 1.0),
            key(1, -2.0),
            key(0, 1.0),
            key(2, f32::MAX),
            key(5, 0.0),
            key(4, f32::MIN),
        ];
        ks.sort_unstable_by(|a, b| b.cmp(a));
        let ids: Vec<u32> = ks.iter().map(|&k| key_id(k)).collect();
        assert_eq!(ids, [2, 0, 3, 5, 1, 4]);
    }
}
