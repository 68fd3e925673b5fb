//! LayerNorm and RMSNorm over the last dimension, with learned scale (and shift).

use crate::{join, Module};
use luminal::prelude::*;

/// `(x − mean) / sqrt(var + eps) · weight + bias` over the last dim.
pub struct LayerNorm<'g> {
    pub weight: Option<GraphTensor<'g>>,
    pub bias: Option<GraphTensor<'g>>,
    pub eps: f32,
}

impl<'g> LayerNorm<'g> {
    pub fn new(
        cx: &'g Graph,
        prefix: &str,
        dim: usize,
        affine: bool,
        bias: bool,
        eps: f32,
    ) -> Self {
        LayerNorm {
            weight: affine.then(|| cx.tensor(&join(prefix, "weight"), dim)),
            bias: bias.then(|| cx.tensor(&join(prefix, "bias"), dim)),
            eps,
        }
    }
}

impl<'g> Module<'g> for LayerNorm<'g> {
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        let mut y = x.layer_norm(-1, self.eps);
        if let Some(w) = self.weight {
            y = y * w;
        }
        if let Some(b) = self.bias {
            y = y + b;
        }
        y
    }
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        self.weight.into_iter().chain(self.bias).collect()
    }
}

/// `x / sqrt(mean(x²) + eps) · weight` over the last dim (Llama's RMSNorm).
pub struct RmsNorm<'g> {
    pub weight: GraphTensor<'g>,
    pub eps: f32,
}

impl<'g> RmsNorm<'g> {
    pub fn new(cx: &'g Graph, prefix: &str, dim: usize, eps: f32) -> Self {
        RmsNorm {
            weight: cx.tensor(&join(prefix, "weight"), dim),
            eps,
        }
    }
}

impl<'g> Module<'g> for RmsNorm<'g> {
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        x.rms_norm(-1, self.eps) * self.weight
    }
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        vec![self.weight]
    }
}
