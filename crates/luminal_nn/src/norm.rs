//! LayerNorm and RMSNorm over the last dimension, with optional learned scale (and shift).

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

/// `x / sqrt(mean(x²) + eps) · weight` over the last dim (Llama's RMSNorm); without a
/// weight (`elementwise_affine=False` in PyTorch) the scale is 1.
pub struct RmsNorm<'g> {
    pub weight: Option<GraphTensor<'g>>,
    pub eps: f32,
}

impl<'g> RmsNorm<'g> {
    /// With a learned weight `{prefix}.weight` (the usual form).
    pub fn new(cx: &'g Graph, prefix: &str, dim: usize, eps: f32) -> Self {
        Self::with_affine(cx, prefix, dim, true, eps)
    }

    /// With (`affine`) or without a learned weight.
    pub fn with_affine(cx: &'g Graph, prefix: &str, dim: usize, affine: bool, eps: f32) -> Self {
        RmsNorm {
            weight: affine.then(|| cx.tensor(&join(prefix, "weight"), dim)),
            eps,
        }
    }
}

impl<'g> Module<'g> for RmsNorm<'g> {
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        let y = x.rms_norm(-1, self.eps);
        match self.weight {
            Some(w) => y * w,
            None => y,
        }
    }
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        self.weight.into_iter().collect()
    }
}
