//! The `attention` rule: `softmax(q·kᵀ·scale + bias)·v` as the core's hl_ops build it
//! (`luminal_nn::causal_attention`, `luminal_nn::attention`) becomes one fused kernel (`kernels/attention/`) that
//! never materialises the `[s, t]` scores.
//!
//! The primop pattern, matched from the final product down (every node in it private to it):
//!
//! ```text
//! out = Sum_t( P[.., s, ·, t] * V[.., ·, d, t] )         P·V
//! P   = E * Recip(Sum_t(E))[.., s, ·]                    softmax
//! E   = Exp2((X + Max_t(X)[.., s, ·] * -1) * log2 e)
//! X   = Sum_d(Q[.., s, ·, d] * K[.., ·, t, d]) * scale (+ bias[.., s, t])
//! ```
//!
//! q, k and v may be any views with unit stride along `d` (the kernel reads them in place);
//! k and v may also be f16 or block-quantized values widened by a cast as the last step (an
//! f16 or q8_0 KV cache, `luminal_nn::scores_product` / `values_product`): the kernel then
//! reads the f16 data or decodes the blocks, a block of rows at a time.
//! The bias is optional (`luminal_nn::attention` without a mask has none); when present it
//! is any f32 node read unmasked with unit stride along the keys — the causal mask `[s, t]`
//! broadcast over heads, or a padding bias `[b, 1, 1, t]` broadcast over heads and queries —
//! computed inside the kernel by its fused program, block by block.

use super::{Lowered, Lowering};
use crate::kernel::BufId;
use crate::kernels::attention::{AttentionBias, AttentionGradKernel, AttentionKernel, QSource};
use crate::view::{LaunchExpr, ViewExprs};
use luminal::graph::NodeId;
use luminal::patterns::{AttentionGrad, AttentionMatch, AttentionRules};
use luminal::{DType, Result};

/// Storage the kernel reads keys and values from besides f32: f16, and the block types a
/// tensor can be cast to (a quantized KV cache), decoded a block of rows at a time.
fn kv_storage(dt: DType) -> bool {
    dt == DType::F16 || (dt.is_quantized() && luminal::quant::encoder(dt).is_some())
}

impl Lowering<'_> {
    /// The attention whose output is `id` ([`luminal::patterns::AttentionMatch`], the
    /// matcher every backend shares), as this kernel takes it.
    pub(super) fn match_attention(&self, id: NodeId) -> Option<AttentionMatch> {
        let rules = AttentionRules {
            kv_storage: &kv_storage,
            bias_unit_keys: true,
        };
        AttentionMatch::find(self.g, &self.uses, id, &rules)
    }

    /// The bias of an attention kernel: the fused program of its node, read through `be`'s
    /// view (None when the node has no fused program).
    fn attention_bias(&self, be: &luminal::graph::Edge) -> Result<Option<AttentionBias>> {
        let bn = self.g.node(be.node);
        let Some(program) = self.node_program(be.node)? else {
            return Ok(None);
        };
        let numel = LaunchExpr::new(&bn.shape.iter().product(), self.names)?;
        Ok(Some(AttentionBias::new(
            program,
            ViewExprs::new(&be.view, self.names)?,
            numel,
        )))
    }

    /// The fused attention kernel (see the module docs).
    pub(super) fn attention(&self, id: NodeId) -> Result<Option<Lowered>> {
        let Some(m) = self.match_attention(id) else {
            return Ok(None);
        };
        let bias = match &m.bias {
            None => None,
            Some(be) => match self.attention_bias(be)? {
                Some(b) => Some(b),
                None => return Ok(None),
            },
        };
        let views = (
            ViewExprs::new(&m.q.view, self.names)?,
            ViewExprs::new(&m.k.view, self.names)?,
            ViewExprs::new(&m.v.view, self.names)?,
        );
        let mut k = AttentionKernel::new(
            (
                BufId::of(m.q.node),
                BufId::of(m.k.node),
                BufId::of(m.v.node),
            ),
            views,
            m.batch_dims,
            m.scale,
            bias,
        );
        // A private elementwise q (the rotary embedding over the query projection) is
        // evaluated by the kernel itself: it gets no kernel or buffer of its own.
        let qn = self.g.node(m.q.node);
        if !self.disabled("fused_elementwise")
            && qn.dtype == DType::F32
            && self.private_fusable(&m.q)
        {
            if let Some(program) = self.tree_program(m.q.node)? {
                let numel = LaunchExpr::new(&qn.shape.iter().product(), self.names)?;
                k.q_source = Some(QSource { program, numel });
            }
        }
        let name = match &k.q_source {
            Some(q) => Self::name_of(&q.program, "attention+"),
            None => "attention".into(),
        };
        Ok(Some((name, Box::new(k))))
    }
}

impl Lowering<'_> {
    /// The stacked gradient of an attention that autograd built in one piece
    /// ([`luminal::patterns::AttentionGrad`], checked against the nodes): one kernel,
    /// flash-attention's backward over short heads (`kernels/attention/small.rs`).
    pub(super) fn attention_grad(&self, id: NodeId) -> Result<Option<Lowered>> {
        let Some(m) = AttentionGrad::find(self.g, id) else {
            return Ok(None);
        };
        let a = &m.grad;
        let r = a.q.view.rank();
        let d = a.q.view.dims()[r - 1].as_constant();
        let s = a.q.view.dims()[r - 2].as_constant();
        // Heads up to 128 wide over a known sequence of at most 512 positions (the kernel
        // keeps a head's [s, t] scores in scratch; otherwise the primops run); unit stride
        // along d for every operand, keys adjacent in the bias.
        let small = d.is_some_and(|d| d as usize <= crate::kernels::attention::SMALL_MAX_D)
            && s.is_some_and(|s| s as usize <= crate::kernels::attention::SMALL_MAX_T);
        let unit = |v: &luminal::ShapeTracker| {
            !v.is_masked() && v.strides()[r - 1].as_constant() == Some(1)
        };
        if !small
            || ![&a.q, &a.k, &a.v, &a.d_out]
                .into_iter()
                .chain(a.bias.as_ref())
                .all(|e| unit(&e.view))
        {
            return Ok(None);
        }
        let bias = match &a.bias {
            None => None,
            Some(be) => match self.attention_bias(be)? {
                Some(b) => Some(b),
                None => return Ok(None),
            },
        };
        let exprs = [
            ViewExprs::new(&a.q.view, self.names)?,
            ViewExprs::new(&a.k.view, self.names)?,
            ViewExprs::new(&a.v.view, self.names)?,
            ViewExprs::new(&a.d_out.view, self.names)?,
        ];
        let bufs = [a.q.node, a.k.node, a.v.node, a.d_out.node].map(BufId::of);
        let k = AttentionGradKernel::new(bufs, exprs, r - 2, a.scale, bias);
        Ok(Some(("attention_grad".into(), Box::new(k))))
    }
}
