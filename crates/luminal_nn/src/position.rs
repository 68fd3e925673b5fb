//! Position embeddings: learned tables (BERT, GPT-2, Whisper's decoder) and fixed sinusoids
//! (Whisper's encoder).

use crate::{join, Module};
use luminal::prelude::*;

/// A learned absolute position table `{prefix}.weight: [max_positions, dim]` (transformers'
/// `position_embeddings` / `embed_positions`). Positions `start..start + len` are a slice
/// of the table (no gather).
pub struct PositionEmbedding<'g> {
    pub weight: GraphTensor<'g>,
    pub max_positions: usize,
}

impl<'g> PositionEmbedding<'g> {
    pub fn new(cx: &'g Graph, prefix: &str, max_positions: usize, dim: usize) -> Self {
        PositionEmbedding {
            weight: cx.tensor(&join(prefix, "weight"), (max_positions, dim)),
            max_positions,
        }
    }

    /// Rows `start..start + len` of the table: `[len, dim]`. The caller keeps
    /// `start + len ≤ max_positions` (a model checks its input length before running).
    pub fn positions(
        &self,
        start: impl Into<Expression>,
        len: impl Into<Expression>,
    ) -> GraphTensor<'g> {
        let (start, len) = (start.into(), len.into());
        let dim = self.weight.shape()[1].clone();
        // The slice's length reads `min(max_positions, start + len) − start`; the caller
        // guarantees the table is long enough, so it is `len` (what shapes downstream use).
        self.weight
            .slice(0, start.clone(), start + len.clone())
            .reshape(vec![len, dim])
    }

    /// Rows at explicit positions: `I32` ids of any shape → `[ids..., dim]`.
    pub fn lookup(&self, position_ids: GraphTensor<'g>) -> GraphTensor<'g> {
        self.weight.embedding(position_ids)
    }
}

impl<'g> Module<'g> for PositionEmbedding<'g> {
    /// `x: [..., s, dim]` plus the embeddings of positions `0..s`.
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        let shape = x.shape();
        assert!(
            shape.len() >= 2,
            "PositionEmbedding: input must be [..., seq, dim], got {shape:?}"
        );
        let seq = shape[shape.len() - 2].clone();
        x + self.positions(0, seq).expand_to(shape)
    }
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        vec![self.weight]
    }
}

/// Fixed sinusoidal position embeddings `[len, dim]` in Whisper's layout: the first
/// `dim / 2` columns are `sin(p·ω_i)`, the last `dim / 2` are `cos(p·ω_i)`, with
/// `ω_i = max_timescale^(−i / (dim/2 − 1))` (openai-whisper's `sinusoids`, whose table
/// transformers stores as the encoder's `embed_positions`). `dim` must be even and ≥ 4.
pub fn sinusoidal_positions<'g>(
    cx: &'g Graph,
    len: impl Into<Expression>,
    dim: usize,
    max_timescale: f32,
) -> GraphTensor<'g> {
    assert!(
        dim >= 4 && dim.is_multiple_of(2),
        "sinusoidal_positions: dim must be even and at least 4, got {dim}"
    );
    let len = len.into();
    let half = dim / 2;
    let increment = max_timescale.ln() / (half - 1) as f32;
    let inv_timescales = (cx.arange(half) * -increment).exp(); // [half]
    let time = cx
        .arange(len.clone())
        .unsqueeze(1)
        .expand_to((len.clone(), half));
    let angle = time * inv_timescales.expand_to((len, half)); // [len, half]
                                                              // cos(x) = 1 − 2·sin²(x/2): exact-to-rounding for large angles, where sin(x + π/2) would
                                                              // lose the low bits of x to the addition.
    let half_sin = (angle * 0.5).sin();
    let cos = 1.0 - half_sin * half_sin * 2.0;
    GraphTensor::concat(&[angle.sin(), cos], 1)
}
