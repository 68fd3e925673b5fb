//! Bidirectional (encoder) and cross attention with a key padding mask, and the
//! multi-head attention layer built on it (BERT, Whisper's encoder and cross-attention).

use crate::{join, Linear, Module};
use luminal::prelude::*;

/// The additive attention bias of a key padding mask: `mask: [b, t]` (1 = a real token,
/// 0 = padding; any float dtype) → `[b, 1, 1, t]` holding 0 for kept keys and `f32::MIN`
/// for padded ones (as transformers does: a query whose keys are all padding attends
/// uniformly instead of producing NaN).
pub fn key_padding_bias<'g>(mask: GraphTensor<'g>) -> GraphTensor<'g> {
    assert!(
        mask.rank() == 2,
        "key_padding_bias: mask must be [batch, keys], got {:?}",
        mask.shape()
    );
    let mask = if mask.dtype() == DType::F32 {
        mask
    } else {
        mask.cast(DType::F32)
    };
    // (mask − 1) · f32::MAX: 0 where mask is 1, f32::MIN where it is 0.
    ((mask - 1.0) * f32::MAX).unsqueeze(1).unsqueeze(1)
}

/// Scaled dot-product attention without a causal mask (every query sees every key),
/// `softmax(q·kᵀ/√d + bias)·v`.
///
/// `q: [b, h, s, d]`, `k, v: [b, h, t, d]` (`t` may differ from `s`: cross-attention),
/// `key_mask: [b, t]` with 1 for real keys and 0 for padding (see [`key_padding_bias`]).
/// Returns `[b, h, s, d]`.
pub fn attention<'g>(
    q: GraphTensor<'g>,
    k: GraphTensor<'g>,
    v: GraphTensor<'g>,
    key_mask: Option<GraphTensor<'g>>,
) -> GraphTensor<'g> {
    let (qs, ks) = (q.shape(), k.shape());
    assert!(
        qs.len() == 4 && ks.len() == 4 && v.shape() == ks && qs[3] == ks[3] && qs[..2] == ks[..2],
        "attention: need q [b, h, s, d] and k, v [b, h, t, d], got {qs:?}, {ks:?}, {:?}",
        v.shape()
    );
    let head_dim = qs[3]
        .as_constant()
        .unwrap_or_else(|| panic!("attention: head dim must be a constant, got {qs:?}"));
    let scores = q.matmul(k.transpose(-1, -2)) * (1.0 / (head_dim as f32).sqrt());
    let scores = match key_mask {
        Some(mask) => {
            assert!(
                mask.rank() == 2 && mask.shape()[0] == qs[0] && mask.shape()[1] == ks[2],
                "attention: key mask must be [b, t] = [{}, {}], got {:?}",
                qs[0],
                ks[2],
                mask.shape()
            );
            scores + key_padding_bias(mask).expand_to(scores.shape())
        }
        None => scores,
    };
    scores.softmax(-1).matmul(v)
}

/// Multi-head attention with q/k/v/output projections (each with an optional bias), for
/// self-attention (`forward_self`, bidirectional) and cross-attention (`forward_cross`:
/// queries from `x`, keys and values from an encoder's output).
pub struct MultiHeadAttention<'g> {
    pub q_proj: Linear<'g>,
    pub k_proj: Linear<'g>,
    pub v_proj: Linear<'g>,
    pub out_proj: Linear<'g>,
    pub n_heads: usize,
}

impl<'g> MultiHeadAttention<'g> {
    /// Parameters `{prefix}.q_proj`, `k_proj`, `v_proj`, `out_proj` (the names of
    /// transformers' BART/Whisper attention), `dim → dim`, all with biases when `bias`.
    /// For other names or bias patterns build the projections and use
    /// [`MultiHeadAttention::from_projections`].
    pub fn new(cx: &'g Graph, prefix: &str, dim: usize, n_heads: usize, bias: bool) -> Self {
        let proj = |name: &str| Linear::new(cx, &join(prefix, name), dim, dim, bias);
        Self::from_projections(
            proj("q_proj"),
            proj("k_proj"),
            proj("v_proj"),
            proj("out_proj"),
            n_heads,
        )
    }

    pub fn from_projections(
        q_proj: Linear<'g>,
        k_proj: Linear<'g>,
        v_proj: Linear<'g>,
        out_proj: Linear<'g>,
        n_heads: usize,
    ) -> Self {
        assert!(n_heads > 0, "MultiHeadAttention: n_heads must be positive");
        let inner = q_proj.weight.shape()[0].as_constant().unwrap();
        assert!(
            inner % n_heads as i64 == 0,
            "MultiHeadAttention: projection width {inner} is not a multiple of {n_heads} heads"
        );
        MultiHeadAttention {
            q_proj,
            k_proj,
            v_proj,
            out_proj,
            n_heads,
        }
    }

    fn head_dim(&self) -> usize {
        self.q_proj.weight.shape()[0].as_constant().unwrap() as usize / self.n_heads
    }

    /// `[b, s, h·d]` → `[b, h, s, d]`.
    fn split_heads(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        let s = x.shape();
        assert!(
            s.len() == 3,
            "MultiHeadAttention: input must be [batch, seq, dim], got {s:?}"
        );
        x.reshape(vec![
            s[0].clone(),
            s[1].clone(),
            Expression::from(self.n_heads),
            Expression::from(self.head_dim()),
        ])
        .permute(&[0, 2, 1, 3])
    }

    /// Queries from `x: [b, s, dim]`, keys and values from `memory: [b, t, dim_kv]`,
    /// `memory_mask: [b, t]` (1 real, 0 padding). Returns `[b, s, dim]`.
    pub fn forward_cross(
        &self,
        x: GraphTensor<'g>,
        memory: GraphTensor<'g>,
        memory_mask: Option<GraphTensor<'g>>,
    ) -> GraphTensor<'g> {
        let q = self.split_heads(self.q_proj.forward(x));
        let k = self.split_heads(self.k_proj.forward(memory));
        let v = self.split_heads(self.v_proj.forward(memory));
        let out = attention(q, k, v, memory_mask); // [b, h, s, d]
        let s = x.shape();
        let merged = out.permute(&[0, 2, 1, 3]).reshape(vec![
            s[0].clone(),
            s[1].clone(),
            Expression::from(self.n_heads * self.head_dim()),
        ]);
        self.out_proj.forward(merged)
    }

    /// Bidirectional self-attention over `x: [b, s, dim]` with `mask: [b, s]` (1 real,
    /// 0 padding): padded keys get no weight. Returns `[b, s, dim]`.
    pub fn forward_self(
        &self,
        x: GraphTensor<'g>,
        mask: Option<GraphTensor<'g>>,
    ) -> GraphTensor<'g> {
        self.forward_cross(x, x, mask)
    }
}

impl<'g> Module<'g> for MultiHeadAttention<'g> {
    /// Unmasked bidirectional self-attention.
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        self.forward_self(x, None)
    }
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        [&self.q_proj, &self.k_proj, &self.v_proj, &self.out_proj]
            .iter()
            .flat_map(|l| l.parameters())
            .collect()
    }
}
