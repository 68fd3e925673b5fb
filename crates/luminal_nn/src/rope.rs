//! Rotary position embeddings: NeoX (rotate-half, Hugging Face) and interleaved (GPT-J,
//! Meta/GGUF) layouts, with optional Llama-3 frequency scaling — either computed from the
//! `rope_scaling` parameters (Hugging Face `config.json`) or read as per-frequency factors
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

/// Llama-3 `rope_scaling` (rope_type "llama3").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: f32,
}

/// Rotary embedding of `head_dim` channels with base `theta`.
///
/// The inverse frequencies are `theta^(-2i/head_dim)` for `i < head_dim / 2`, then
/// rescaled by `scaling` (if any), then divided element-wise by `freq_factors` (if any).
/// A loader sets one of the two: `scaling` from a Hugging Face `rope_scaling`, or
/// `freq_factors` from a GGUF `rope_freqs.weight` (as llama.cpp does).
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

    /// `theta^(-2i/d)`, with the Llama-3 `scaling` applied if set.
    fn scaled_inv_freq(&self, cx: &'g Graph) -> GraphTensor<'g> {
        let half = self.head_dim / 2;
        let i = cx.arange(half);
        // theta^(-2i/d) = 2^(-(2i/d)·log2 theta)
        let inv = (i * (-2.0 * self.theta.log2() / self.head_dim as f32)).exp2();
        let Some(s) = self.scaling else { return inv };
        let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
        let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
        let wavelen = inv.recip() * (2.0 * PI);
        let scaled = wavelen.gt(low_wavelen).select(inv / s.factor, inv);
        let smooth = (wavelen.recip() * s.original_max_position_embeddings - s.low_freq_factor)
            / (s.high_freq_factor - s.low_freq_factor);
        let smoothed = (1.0 - smooth) * scaled / s.factor + smooth * scaled;
        let medium = wavelen
            .lt(high_wavelen)
            .not()
            .and(wavelen.gt(low_wavelen).not());
        medium.select(smoothed, scaled)
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
        let (cos, sin) = (angles.cos(), angles.sin());
        match self.layout {
            RopeLayout::NeoX => {
                let x1 = x.slice(-1, 0, half);
                let x2 = x.slice(-1, half, self.head_dim);
                let o1 = x1 * cos - x2 * sin;
                let o2 = x2 * cos + x1 * sin;
                o1.concat_along(o2, -1)
            }
            RopeLayout::Interleaved => {
                let mut pairs = shape[..rank - 1].to_vec();
                pairs.extend([Expression::from(half), Expression::from(2)]);
                let xp = x.reshape(pairs);
                let (xe, xo) = (
                    xp.slice(-1, 0, 1).squeeze(-1),
                    xp.slice(-1, 1, 2).squeeze(-1),
                );
                let oe = xe * cos - xo * sin;
                let oo = xo * cos + xe * sin;
                GraphTensor::stack(&[oe, oo], -1).reshape(shape)
            }
        }
    }
}
