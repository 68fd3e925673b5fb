//! Linear and Embedding.

use crate::{join, Module};
use luminal::prelude::*;

/// `y = x · Wᵀ + b` with `W: [out, in]` (PyTorch layout), optional bias `[out]`.
///
/// `W` may be stored quantized or in half precision (a loader's choice, see
/// `Graph::set_tensor_dtype`): it is read through `.dequantize()`, which backends fold into
/// the product (no f32 copy of the weight).
pub struct Linear<'g> {
    pub weight: GraphTensor<'g>,
    pub bias: Option<GraphTensor<'g>>,
}

impl<'g> Linear<'g> {
    /// Parameters `{prefix}.weight` (and `{prefix}.bias`) as inputs (f32 unless the graph was
    /// told another dtype for them).
    pub fn new(
        cx: &'g Graph,
        prefix: &str,
        in_features: usize,
        out_features: usize,
        bias: bool,
    ) -> Self {
        Linear {
            weight: cx.tensor(&join(prefix, "weight"), (out_features, in_features)),
            bias: bias.then(|| cx.tensor(&join(prefix, "bias"), out_features)),
        }
    }
}

impl<'g> Module<'g> for Linear<'g> {
    /// `x: [..., in]` → `[..., out]`.
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        let y = x.matmul(self.weight.dequantize().transpose(0, 1));
        match self.bias {
            Some(b) => y + b,
            None => y,
        }
    }
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        std::iter::once(self.weight).chain(self.bias).collect()
    }
}

/// Lookup table `[vocab, dim]`: `I32` ids of any shape → `[ids..., dim]`. The table may be
/// stored quantized or in half precision (rows are dequantized as they are gathered).
pub struct Embedding<'g> {
    pub weight: GraphTensor<'g>,
}

impl<'g> Embedding<'g> {
    pub fn new(cx: &'g Graph, prefix: &str, vocab: usize, dim: usize) -> Self {
        Embedding {
            weight: cx.tensor(&join(prefix, "weight"), (vocab, dim)),
        }
    }
}

impl<'g> Module<'g> for Embedding<'g> {
    fn forward(&self, ids: GraphTensor<'g>) -> GraphTensor<'g> {
        self.weight.dequantize().embedding(ids)
    }
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        vec![self.weight]
    }
}
