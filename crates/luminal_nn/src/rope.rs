//! Rotary position embeddings: NeoX (rotate-half, Hugging Face) and interleaved (GPT-J,
//! Meta/GGUF) layouts, with optional frequency scaling: Llama 3 (`rope_type` "llama3"),
//! linear (position interpolation) and YaRN, computed from the `rope_scaling` parameters
//! (Hugging Face `config.json`, GGUF `rope.scaling.*`), or read as per-frequency factors
//! (GGUF `rope_freqs.weight`, Llama 3.1+).

use luminal::prelude::*;
use std::f32::consts::PI;

/// Which pairs of channels rotate together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Channel `i` pairs with `i + d/2` (HF `rotate_half`).
    NeoX,
    /// Channel `2i` pairs with `2i + 1`.
    Interleaved,
}

/// How the inverse frequencies `theta^(-2i/d)` are rescaled for a longer context.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// Llama 3.1 (`rope_type` "llama3"): low frequencies divided by `factor`, high ones
    /// kept, a smooth blend in between (transformers' `_compute_llama3_parameters`).
    Llama3(Llama3Scaling),
    /// Position interpolation (`rope_type` "linear", GGUF `rope.scaling.type = "linear"`):
    /// every inverse frequency divided by `factor`, i.e. positions divided by `factor`.
    Linear { factor: f32 },
    /// YaRN (`rope_type` "yarn", GGUF `rope.scaling.type = "yarn"`).
    Yarn(YarnScaling),
}

impl RopeScaling {
    /// The multiplier of cos and sin (so `q·k` is scaled by its square): YaRN's
    /// attention factor, 1 otherwise.
    pub fn attention_factor(&self) -> f32 {
        match self {
            RopeScaling::Yarn(y) => y.attention_factor,
            _ => 1.0,
        }
    }
}

/// Llama-3 `rope_scaling` parameters (rope_type "llama3").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: f32,
}

/// YaRN parameters, as transformers' `_compute_yarn_parameters` and llama.cpp's
/// `ggml_rope_yarn_corr_dims` / `rope_yarn` define them.
///
/// Pair `i` (of `head_dim / 2`) gets `inv_i · (1 − r_i) + inv_i / factor · r_i` with the
/// ramp `r_i = clamp((i − low) / (high − low), 0, 1)`: frequencies below `low` keep their
/// value (extrapolation), those above `high` are divided by `factor` (interpolation).
/// `low` and `high` are the dimensions where a frequency turns `beta_fast` and `beta_slow`
/// times over `original_max_position_embeddings` positions (see [`Self::correction_range`]).
/// cos and sin are multiplied by `attention_factor`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnScaling {
    pub factor: f32,
    /// The context the model was pre-trained with (GGUF `rope.scaling.original_context_length`).
    pub original_max_position_embeddings: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// Multiplier of cos and sin; default [`YarnScaling::default_attention_factor`].
    pub attention_factor: f32,
    /// Round the correction range outwards to whole dimensions (transformers' `truncate`,
    /// default true; llama.cpp always does).
    pub truncate: bool,
}

impl YarnScaling {
    /// The defaults of transformers and llama.cpp: `beta_fast` 32, `beta_slow` 1, the
    /// attention factor `0.1·ln(factor) + 1`, truncated correction range.
    pub fn new(factor: f32, original_max_position_embeddings: f32) -> Self {
        YarnScaling {
            factor,
            original_max_position_embeddings,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: Self::default_attention_factor(factor),
            truncate: true,
        }
    }

    /// `0.1·ln(factor) + 1`, and 1 for `factor ≤ 1` (transformers' `get_mscale`).
    pub fn default_attention_factor(factor: f32) -> f32 {
        Self::mscale(factor, 1.0)
    }

    /// transformers' `get_mscale(scale, mscale)`: `0.1·mscale·ln(scale) + 1`, 1 for
    /// `scale ≤ 1` (used with DeepSeek's `mscale` / `mscale_all_dim`).
    pub fn mscale(scale: f32, mscale: f32) -> f32 {
        if scale <= 1.0 {
            1.0
        } else {
            (0.1 * mscale as f64 * (scale as f64).ln() + 1.0) as f32
        }
    }

    /// The ramp's ends `(low, high)` in pair indices, for rotary dimension `head_dim` and
    /// base `theta`: the dimension `d · ln(L / (2π·β)) / (2·ln θ)` at which a frequency
    /// turns `β` times over `L = original_max_position_embeddings` positions, for
    /// `β = beta_fast` (low, floored) and `beta_slow` (high, ceiled), clamped to
    /// `[0, head_dim − 1]`. Computed in f64, as transformers does in Python floats.
    pub fn correction_range(&self, head_dim: usize, theta: f32) -> (f64, f64) {
        let d = head_dim as f64;
        let dim_of = |turns: f32| {
            d * (self.original_max_position_embeddings as f64
                / (turns as f64 * 2.0 * std::f64::consts::PI))
                .ln()
                / (2.0 * (theta as f64).ln())
        };
        let (mut low, mut high) = (dim_of(self.beta_fast), dim_of(self.beta_slow));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        (low.max(0.0), high.min(d - 1.0))
    }
}

/// Rotary embedding of `head_dim` channels with base `theta`.
///
/// The inverse frequencies are `theta^(-2i/head_dim)` for `i < head_dim / 2`, then
/// rescaled by `scaling` (if any), then divided element-wise by `freq_factors` (if any);
/// cos and sin are multiplied by the scaling's [`RopeScaling::attention_factor`]. Llama 3
/// scaling comes either as `scaling` (Hugging Face `rope_scaling`) or as `freq_factors`
/// (GGUF `rope_freqs.weight`, as llama.cpp does), never both.
#[derive(Clone, Copy, Debug)]
pub struct Rope<'g> {
    pub head_dim: usize,
    pub theta: f32,
    pub layout: RopeLayout,
    pub scaling: Option<RopeScaling>,
    /// Per-frequency divisors `[head_dim / 2]` of the inverse frequencies: a graph input
    /// (see [`Rope::with_freq_factors`]), shared by every layer.
    pub freq_factors: Option<GraphTensor<'g>>,
}

impl<'g> Rope<'g> {
    /// Plain RoPE (no scaling, no frequency factors).
    pub fn new(head_dim: usize, theta: f32, layout: RopeLayout) -> Self {
        assert!(
            head_dim > 0 && head_dim.is_multiple_of(2),
            "rope: head_dim must be even and positive, got {head_dim}"
        );
        Rope {
            head_dim,
            theta,
            layout,
            scaling: None,
            freq_factors: None,
        }
    }

    /// Adds per-frequency factors as a new f32 graph input `name` of shape
    /// `[head_dim / 2]` (GGUF: `rope_freqs.weight`); the loader sets its data.
    pub fn with_freq_factors(self, cx: &'g Graph, name: &str) -> Self {
        Rope {
            freq_factors: Some(cx.tensor(name, self.head_dim / 2)),
            ..self
        }
    }

    /// The multiplier of cos and sin (YaRN's attention factor; 1 otherwise).
    pub fn attention_factor(&self) -> f32 {
        self.scaling.map_or(1.0, |s| s.attention_factor())
    }

    /// The graph inputs this rotary embedding reads (the frequency factors, if any). They
    /// are shared by every layer using this `Rope`, so layers do not list them: the owner of
    /// the `Rope` does, once.
    pub fn parameters(&self) -> Vec<GraphTensor<'g>> {
        self.freq_factors.into_iter().collect()
    }

    /// Inverse frequencies `[head_dim / 2]` (f32, computed in the graph).
    pub fn inv_freq(&self, cx: &'g Graph) -> GraphTensor<'g> {
        let inv = self.scaled_inv_freq(cx);
        let Some(f) = self.freq_factors else {
            return inv;
        };
        assert_eq!(
            f.shape(),
            vec![Expression::from(self.head_dim / 2)],
            "rope: freq_factors must have shape [head_dim / 2 = {}], got {:?}",
            self.head_dim / 2,
            f.shape()
        );
        inv / f
    }

    /// `theta^(-2i/d)`, with `scaling` applied if set.
    fn scaled_inv_freq(&self, cx: &'g Graph) -> GraphTensor<'g> {
        let half = self.head_dim / 2;
        let i = cx.arange(half);
        // theta^(-2i/d) = 2^(-(2i/d)·log2 theta)
        let inv = (i * (-2.0 * self.theta.log2() / self.head_dim as f32)).exp2();
        match self.scaling {
            None => inv,
            Some(RopeScaling::Linear { factor }) => inv / factor,
            Some(RopeScaling::Llama3(s)) => {
                let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
                let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
                let wavelen = inv.recip() * (2.0 * PI);
                let scaled = wavelen.gt(low_wavelen).select(inv / s.factor, inv);
                let smooth = (wavelen.recip() * s.original_max_position_embeddings
                    - s.low_freq_factor)
                    / (s.high_freq_factor - s.low_freq_factor);
                let smoothed = (1.0 - smooth) * scaled / s.factor + smooth * scaled;
                let medium = wavelen
                    .lt(high_wavelen)
                    .not()
                    .and(wavelen.gt(low_wavelen).not());
                medium.select(smoothed, scaled)
            }
            Some(RopeScaling::Yarn(y)) => {
                let (low, mut high) = y.correction_range(self.head_dim, self.theta);
                if high == low {
                    high += 0.001; // as transformers' `linear_ramp_factor`
                }
                let ramp = ((i - low as f32) * (1.0 / (high - low)) as f32).clamp(0.0, 1.0);
                inv * (1.0 - ramp) + (inv / y.factor) * ramp
            }
        }
    }

    /// Rotates `x: [..., seq, head_dim]` for positions `start, start+1, …` (`start` may be
    /// a dynamic dim such as the KV-cache length).
    pub fn forward(&self, x: GraphTensor<'g>, start: impl Into<Expression>) -> GraphTensor<'g> {
        let shape = x.shape();
        let rank = shape.len();
        assert!(
            rank >= 2,
            "rope: input must be [..., seq, head_dim], got shape {shape:?}"
        );
        assert_eq!(
            shape[rank - 1].as_constant(),
            Some(self.head_dim as i64),
            "rope: last dim of shape {shape:?} must be head_dim {}",
            self.head_dim
        );
        let cx = x.graph;
        let seq = shape[rank - 2].clone();
        let half = self.head_dim / 2;
        let positions = cx
            .iota(Expression::var("z") + start.into(), seq.clone())
            .cast(DType::F32);
        let angles = positions.unsqueeze(1) * self.inv_freq(cx).unsqueeze(0); // [seq, half]
        let (mut cos, mut sin) = (angles.cos(), angles.sin());
        let m = self.attention_factor();
        if m != 1.0 {
            (cos, sin) = (cos * m, sin * m);
        }
        match self.layout {
            RopeLayout::NeoX => {
                // As below, over the halves `[..., seq, 2, half]`: `x·cos + swap(x)·(−sin,
                // +sin)` with `swap` exchanging the two halves (HF `rotate_half` is
                // `swap(x)·(−1, +1)`).
                let mut halves = shape[..rank - 1].to_vec();
                halves.extend([Expression::from(2), Expression::from(half)]);
                let xh = x.reshape(halves);
                let swapped = xh.slice(-2, 1, 2).concat_along(xh.slice(-2, 0, 1), -2);
                let sign = (cx.arange(2) * 2.0 - 1.0).unsqueeze(1);
                let (c2, s2) = (cos.expand(1, 2), sin.expand(1, 2) * sign);
                (xh * c2 + swapped * s2).reshape(shape)
            }
            RopeLayout::Interleaved => {
                // One elementwise expression over the pairs `[..., seq, half, 2]`:
                // `x·cos + swap(x)·(−sin, +sin)`, where `swap` exchanges the two channels of
                // each pair (a concatenation of two views of `x`). The same values as
                // `(xe·cos − xo·sin, xo·cos + xe·sin)` (`a + (−b)` is `a − b` exactly), but
                // one kernel reading `x` in place instead of two halves computed apart and
                // then interleaved.
                let mut pairs = shape[..rank - 1].to_vec();
                pairs.extend([Expression::from(half), Expression::from(2)]);
                let xp = x.reshape(pairs);
                let swapped = xp.slice(-1, 1, 2).concat_along(xp.slice(-1, 0, 1), -1);
                let sign = cx.arange(2) * 2.0 - 1.0;
                let (c2, s2) = (cos.expand(2, 2), sin.expand(2, 2) * sign);
                (xp * c2 + swapped * s2).reshape(shape)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ends of the YaRN ramp against transformers' `find_correction_range` evaluated in
    /// Python (`dim·ln(L/(2π·β)) / (2·ln θ)`, floored / ceiled, clamped):
    /// (16, 1e4, 2048, β 32/1) → 2.016…, 5.026… → (2, 6);
    /// (16, 1e4, 2048, β 16/2) → 2.618…, 4.424… → (2, 5);
    /// (128, 1e6, 32768, β 32/1) (Qwen3's YaRN) → 23.596…, 39.651… → (23, 40);
    /// (64, 5e5, 8192, β 32/1) → 9.0406, 17.492 → (9, 18).
    #[test]
    fn yarn_correction_range_matches_transformers() {
        let yarn = |l: f32| YarnScaling::new(4.0, l);
        assert_eq!(yarn(2048.0).correction_range(16, 1e4), (2.0, 6.0));
        let custom = YarnScaling {
            beta_fast: 16.0,
            beta_slow: 2.0,
            ..yarn(2048.0)
        };
        assert_eq!(custom.correction_range(16, 1e4), (2.0, 5.0));
        assert_eq!(yarn(32768.0).correction_range(128, 1e6), (23.0, 40.0));
        assert_eq!(yarn(8192.0).correction_range(64, 5e5), (9.0, 18.0));
        // Untruncated: the raw dimensions.
        let (lo, hi) = YarnScaling {
            truncate: false,
            ..yarn(2048.0)
        }
        .correction_range(16, 1e4);
        assert!((lo - 2.0160002112515443).abs() < 1e-9 && (hi - 5.026300167891356).abs() < 1e-9);
        // Clamped to [0, d − 1]: a tiny original context puts `low` below 0.
        let (lo, hi) = yarn(64.0).correction_range(16, 1e4);
        assert_eq!((lo, hi), (0.0, 3.0));
    }

    /// `0.1·ln(factor) + 1` (Python: factor 4 → 1.138629436111989, 40 → 1.3688879454113936),
    /// 1 for factor ≤ 1.
    #[test]
    fn yarn_default_attention_factor() {
        assert!((YarnScaling::default_attention_factor(4.0) - 1.138_629_4).abs() < 1e-6);
        assert!((YarnScaling::default_attention_factor(40.0) - 1.368_888).abs() < 1e-6);
        assert_eq!(YarnScaling::default_attention_factor(1.0), 1.0);
        assert_eq!(YarnScaling::default_attention_factor(0.5), 1.0);
        let y = RopeScaling::Yarn(YarnScaling::new(4.0, 2048.0));
        assert_eq!(
            y.attention_factor(),
            YarnScaling::default_attention_factor(4.0)
        );
        assert_eq!(RopeScaling::Linear { factor: 2.0 }.attention_factor(), 1.0);
    }
}
