//! Grouped-query causal self-attention (optionally over a sliding window, as Mistral) and the
//! pre-norm Llama transformer block.

use crate::{join, Linear, Module, RmsNorm, Rope, SwiGluMlp};
use luminal::prelude::*;

/// Scaled dot-product attention with a causal mask.
///
/// `q: [b, hq, s, d]`, `k, v: [b, hkv, t, d]` with `hq` a multiple of `hkv` (grouped-query
/// attention) and `t ≥ s`: query row `i` is position `t − s + i` and sees keys `0..=t−s+i`
/// (so the same function serves prefill, `t = s`, and decoding with earlier keys cached).
pub fn causal_attention<'g>(
    q: GraphTensor<'g>,
    k: GraphTensor<'g>,
    v: GraphTensor<'g>,
) -> GraphTensor<'g> {
    causal_attention_windowed(q, k, v, None)
}

/// [`causal_attention`], with an optional sliding window: with `Some(w)`, query position `i`
/// sees only keys `j` with `i − w < j ≤ i` (itself and the `w − 1` before it; transformers'
/// `sliding_window_overlay`, llama.cpp's `LLAMA_SWA_TYPE_STANDARD`). Positions are absolute
/// (query row `r` is position `t − s + r`), so the mask is the same in prefill and in
/// decoding with earlier keys cached.
pub fn causal_attention_windowed<'g>(
    q: GraphTensor<'g>,
    k: GraphTensor<'g>,
    v: GraphTensor<'g>,
    window: Option<usize>,
) -> GraphTensor<'g> {
    let (qs, ks) = (q.shape(), k.shape());
    assert!(
        qs.len() == 4 && ks.len() == 4 && v.shape() == ks && qs[3] == ks[3] && qs[0] == ks[0],
        "causal_attention: need q [b, hq, s, d] and k, v [b, hkv, t, d], got {qs:?}, {ks:?}, {:?}",
        v.shape()
    );
    let (hq, hkv) = (qs[1].as_constant().unwrap(), ks[1].as_constant().unwrap());
    assert!(
        hq % hkv == 0,
        "causal_attention: {hq} query heads is not a multiple of {hkv} kv heads"
    );
    let head_dim = qs[3].as_constant().unwrap();
    let groups = hq / hkv;
    let scale = 1.0 / (head_dim as f32).sqrt();
    // Grouped-query attention without copying the cache: the query heads are viewed as
    // [b, hkv, groups, s, d] and each kv head is broadcast over its group (a stride-0 view
    // the matmuls read in place), instead of materialising k and v repeated per query head.
    let grouped = groups > 1;
    let (q, k, v) = if grouped {
        let split = |t: GraphTensor<'g>| {
            let s = t.shape();
            t.reshape(vec![
                s[0].clone(),
                Expression::from(hkv),
                Expression::from(groups),
                s[2].clone(),
                s[3].clone(),
            ])
        };
        (split(q), k.expand(2, groups), v.expand(2, groups))
    } else {
        (q, k, v)
    };
    let scores = scores_product(q, k) * scale; // [b, (hkv, groups | hq), s, t]
    let (s, t) = (qs[2].clone(), ks[2].clone());
    // Additive mask: log2(1) = 0 where visible, log2(0) = -inf elsewhere, visible where
    // key index − query index ≤ t − s, written `< t − s + 1` (the indices are integers): one
    // comparison, the form `luminal::patterns::causal_limit` recognises (kernels then compute
    // the mask from the indices). Built in f32 from two aranges (small integers, exact) so
    // backends fuse it into one kernel over the [s, t] grid; the mask is shared by every head
    // and, through CSE, every layer.
    let cx = q.graph;
    let key = cx.arange(t.clone()).expand(0, s.clone());
    let query = cx.arange(s.clone()).expand(1, t.clone());
    let offset = key - query;
    let mut visible = offset.lt(cx.constant_expr(t.clone() - s.clone() + 1, DType::F32));
    if let Some(w) = window {
        assert!(w > 0, "causal_attention: sliding window must be positive");
        // Key position j = key, query position i = t − s + query: j > i − w.
        visible = visible.and(offset.gt(cx.constant_expr(t - s - w as i64, DType::F32)));
    }
    let bias = visible.cast(DType::F32).log2();
    let scores = scores + bias.expand_to(scores.shape());
    let out = values_product(scores.softmax(-1), v);
    if grouped {
        out.reshape(vec![
            qs[0].clone(),
            qs[1].clone(),
            qs[2].clone(),
            qs[3].clone(),
        ])
    } else {
        out
    }
}

/// `q·kᵀ` over the last axis: `q: [.., s, d]`, `k: [.., t, d]` → `[.., s, t]`. A `k` held
/// in another float dtype (an f16 KV cache) is widened to f32 as the last step, after the
/// broadcast over the queries: the cast is then of a view a backend can read in place
/// (its attention kernel reads the f16 cache directly), instead of a widened copy.
pub fn scores_product<'g>(q: GraphTensor<'g>, k: GraphTensor<'g>) -> GraphTensor<'g> {
    if k.dtype() == DType::F32 {
        return q.matmul(k.transpose(-1, -2));
    }
    let r = q.rank();
    let (s, t) = (q.shape()[r - 2].clone(), k.shape()[r - 2].clone());
    let q = q.expand(r - 1, t); // [.., s, t, d]
    let k = k.expand(r - 2, s).cast(DType::F32); // [.., s, t, d]
    (q * k).sum(r)
}

/// `p·v`: `p: [.., s, t]`, `v: [.., t, d]` → `[.., s, d]`; a `v` in another float dtype is
/// widened last, as in [`scores_product`].
pub fn values_product<'g>(p: GraphTensor<'g>, v: GraphTensor<'g>) -> GraphTensor<'g> {
    if v.dtype() == DType::F32 {
        return p.matmul(v);
    }
    let r = p.rank();
    let (s, d) = (p.shape()[r - 2].clone(), v.shape()[r - 1].clone());
    let p = p.expand(r - 1, d); // [.., s, d, t]
    let v = v.transpose(-1, -2).expand(r - 2, s).cast(DType::F32); // [.., s, d, t]
    (p * v).sum(r)
}

/// Llama-family attention: q/k/v/o projections (optional q/k/v bias, as in Qwen2), RoPE,
/// grouped-query causal attention.
pub struct Attention<'g> {
    pub q_proj: Linear<'g>,
    pub k_proj: Linear<'g>,
    pub v_proj: Linear<'g>,
    pub o_proj: Linear<'g>,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rope: Rope<'g>,
    /// Sliding attention window (Mistral): each position attends to itself and the
    /// `w − 1` positions before it. `None`: the whole causal prefix.
    pub sliding_window: Option<usize>,
}

impl<'g> Attention<'g> {
    pub fn new(
        cx: &'g Graph,
        prefix: &str,
        dim: usize,
        n_heads: usize,
        n_kv_heads: usize,
        qkv_bias: bool,
        rope: Rope<'g>,
    ) -> Self {
        let head_dim = rope.head_dim;
        Attention {
            q_proj: Linear::new(
                cx,
                &join(prefix, "q_proj"),
                dim,
                n_heads * head_dim,
                qkv_bias,
            ),
            k_proj: Linear::new(
                cx,
                &join(prefix, "k_proj"),
                dim,
                n_kv_heads * head_dim,
                qkv_bias,
            ),
            v_proj: Linear::new(
                cx,
                &join(prefix, "v_proj"),
                dim,
                n_kv_heads * head_dim,
                qkv_bias,
            ),
            o_proj: Linear::new(cx, &join(prefix, "o_proj"), n_heads * head_dim, dim, false),
            n_heads,
            n_kv_heads,
            head_dim,
            rope,
            sliding_window: None,
        }
    }

    /// Restricts attention to a sliding window of `window` positions (see
    /// [`causal_attention_windowed`]).
    pub fn with_sliding_window(self, window: Option<usize>) -> Self {
        Attention {
            sliding_window: window,
            ..self
        }
    }

    /// `[b, s, dim]` → `[b, heads, s, head_dim]`.
    fn split_heads(&self, x: GraphTensor<'g>, heads: usize) -> GraphTensor<'g> {
        let s = x.shape();
        x.reshape(vec![
            s[0].clone(),
            s[1].clone(),
            Expression::from(heads),
            Expression::from(self.head_dim),
        ])
        .permute(&[0, 2, 1, 3])
    }

    /// Self-attention over `x: [b, s, dim]` at positions `0..s`.
    pub fn forward_at(&self, x: GraphTensor<'g>, start: impl Into<Expression>) -> GraphTensor<'g> {
        let start = start.into();
        let q = self.rope.forward(
            self.split_heads(self.q_proj.forward(x), self.n_heads),
            start.clone(),
        );
        let k = self.rope.forward(
            self.split_heads(self.k_proj.forward(x), self.n_kv_heads),
            start,
        );
        let v = self.split_heads(self.v_proj.forward(x), self.n_kv_heads);
        let out = causal_attention_windowed(q, k, v, self.sliding_window); // [b, h, s, d]
        let s = x.shape();
        let merged = out.permute(&[0, 2, 1, 3]).reshape(vec![
            s[0].clone(),
            s[1].clone(),
            Expression::from(self.n_heads * self.head_dim),
        ]);
        self.o_proj.forward(merged)
    }
}

/// One layer's key/value cache for batch 1: state inputs `k`, `v` of shape
/// `[kv_heads, max_ctx, head_dim]`, written in place at the current position by each run
/// (see `GraphTensor::write_slice`), never copied or regrown. Set them to zeros once.
pub struct KvCache<'g> {
    pub k: GraphTensor<'g>,
    pub v: GraphTensor<'g>,
    pub max_ctx: usize,
    /// An orthonormal rotation `H: [n, n]` (`n` dividing the head dim) applied to queries,
    /// keys and values before the keys and values are cached, and undone on the attention
    /// output: `q·k = (qH)·(kH)` and `Σ p (vH) = (Σ p v) H`, so the result is unchanged
    /// but the cached rows have their outliers spread across the block, which a 4- or
    /// 5-bit cache then quantizes far better (see [`CacheType::wants_rotation`],
    /// [`hadamard`]; llama.cpp does the same for quantized caches). `None`: no rotation.
    pub rotation: Option<GraphTensor<'g>>,
}

/// Size of the rotation blocks of a quantized KV cache ([`KvCache::rotation`]).
pub const KV_ROTATION: usize = 64;

/// The orthonormal Walsh–Hadamard matrix of order `n` (a power of two), row-major:
/// `H[i][j] = (−1)^popcount(i & j) / √n` (symmetric, and its own inverse).
///
/// # Panics
/// If `n` is not a power of two.
pub fn hadamard(n: usize) -> Vec<f32> {
    assert!(n.is_power_of_two(), "hadamard: {n} is not a power of two");
    let scale = 1.0 / (n as f32).sqrt();
    (0..n * n)
        .map(|k| {
            let (i, j) = (k / n, k % n);
            if (i & j).count_ones() % 2 == 0 {
                scale
            } else {
                -scale
            }
        })
        .collect()
}

/// `x · H` over blocks of `H`'s order along the last axis (`x: [.., d]`, `h: [n, n]`).
fn rotate<'g>(x: GraphTensor<'g>, h: GraphTensor<'g>) -> GraphTensor<'g> {
    let shape = x.shape();
    let n = h.shape()[0].clone();
    let d = shape.last().unwrap().as_constant().unwrap() as usize;
    let nn = n.as_constant().unwrap() as usize;
    let mut blocks = shape[..shape.len() - 1].to_vec();
    blocks.extend([Expression::from(d / nn), n]);
    x.reshape(blocks).matmul(h).reshape(shape)
}

/// The element type of a KV cache, as llama.cpp's `--cache-type-k/-v`: f32; f16 (half the
/// memory and the bytes each decode step reads; new rows are rounded once when written, as
/// llama.cpp's default cache); or a 32-value block type (q8_0: 34 bytes per 32 values,
/// 0.53× of f16; q4_0, q4_1, q5_0, q5_1 smaller still). New rows of a block type are
/// quantized once when written (`x.cast(dtype)`, ggml's reference quantizer, each block of
/// 32 values of a head's row on its own) and read back exactly as they decode: attention
/// then runs in f32 on the decoded keys and values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheType {
    #[default]
    F32,
    F16,
    Q8_0,
    Q5_1,
    Q5_0,
    Q4_1,
    Q4_0,
}

const CACHE_TYPES: [CacheType; 7] = [
    CacheType::F32,
    CacheType::F16,
    CacheType::Q8_0,
    CacheType::Q5_1,
    CacheType::Q5_0,
    CacheType::Q4_1,
    CacheType::Q4_0,
];

impl CacheType {
    pub fn dtype(self) -> DType {
        match self {
            CacheType::F32 => DType::F32,
            CacheType::F16 => DType::F16,
            CacheType::Q8_0 => DType::Q8_0,
            CacheType::Q5_1 => DType::Q5_1,
            CacheType::Q5_0 => DType::Q5_0,
            CacheType::Q4_1 => DType::Q4_1,
            CacheType::Q4_0 => DType::Q4_0,
        }
    }

    /// The cache type storing `dtype`, if any.
    pub fn of(dtype: DType) -> Option<CacheType> {
        CACHE_TYPES.into_iter().find(|c| c.dtype() == dtype)
    }

    /// Whether a cache of this type is kept rotated ([`KvCache::rotation`]): the 4- and
    /// 5-bit types, whose rounding an outlier channel would otherwise dominate. (q8_0 is
    /// as good without: perplexity within 0.1% of an f16 cache either way, see
    /// benches/README.md.)
    pub fn wants_rotation(self) -> bool {
        matches!(
            self,
            CacheType::Q4_0 | CacheType::Q4_1 | CacheType::Q5_0 | CacheType::Q5_1
        )
    }

    /// Zero-filled data for a cache input of `n` values (every type's zero is all-zero
    /// bytes).
    pub fn zeros(self, n: usize) -> HostData {
        HostData::zeros(self.dtype(), n)
    }
}

impl std::str::FromStr for CacheType {
    type Err = String;
    fn from_str(s: &str) -> Result<CacheType, String> {
        let lower = s.to_ascii_lowercase();
        CACHE_TYPES
            .into_iter()
            .find(|c| c.to_string() == lower)
            .ok_or_else(|| {
                format!(
                    "unknown KV cache type {s:?} (expected one of {})",
                    CACHE_TYPES.map(|c| c.to_string()).join(", ")
                )
            })
    }
}

impl std::fmt::Display for CacheType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.dtype().name())
    }
}

impl<'g> KvCache<'g> {
    /// Inputs `{prefix}.k_cache` and `{prefix}.v_cache`.
    pub fn new(
        cx: &'g Graph,
        prefix: &str,
        n_kv_heads: usize,
        max_ctx: usize,
        head_dim: usize,
    ) -> Self {
        Self::with_type(cx, prefix, n_kv_heads, max_ctx, head_dim, CacheType::F32)
    }

    /// [`KvCache::new`] holding `cache_type` elements (the inputs have its dtype).
    pub fn with_type(
        cx: &'g Graph,
        prefix: &str,
        n_kv_heads: usize,
        max_ctx: usize,
        head_dim: usize,
        cache_type: CacheType,
    ) -> Self {
        let shape = (n_kv_heads, max_ctx, head_dim);
        let dt = cache_type.dtype();
        KvCache {
            k: cx.input(&join(prefix, "k_cache"), shape, dt),
            v: cx.input(&join(prefix, "v_cache"), shape, dt),
            max_ctx,
            rotation: None,
        }
    }

    /// The cache's element type.
    pub fn cache_type(&self) -> CacheType {
        CacheType::of(self.k.dtype()).expect("a KV cache holds a cache type")
    }

    /// Rotates queries, keys and values by `h` (`[n, n]`, orthonormal, `n` dividing the
    /// head dim) around this cache: see [`KvCache::rotation`].
    ///
    /// # Panics
    /// If `h` is not square or its order does not divide the head dim.
    pub fn with_rotation(mut self, h: GraphTensor<'g>) -> Self {
        let (hs, d) = (h.shape(), self.k.shape()[2].as_constant().unwrap());
        let n = hs[0].as_constant();
        assert!(
            hs.len() == 2 && hs[0] == hs[1] && n.is_some_and(|n| n > 0 && d % n == 0),
            "KvCache::with_rotation: need a square [n, n] rotation with n dividing the head \
             dim {d}, got {hs:?}"
        );
        self.rotation = Some(h);
        self
    }

    /// Writes `k, v: [1, kv_heads, s, head_dim]` at `past..past + s` (rounded to the cache's
    /// type) and returns the cached keys and values of positions `0..past + s`, as
    /// `[1, kv_heads, past + s, head_dim]` in the cache's type ([`causal_attention`] takes
    /// them as they are).
    pub fn append(
        &self,
        k: GraphTensor<'g>,
        v: GraphTensor<'g>,
        past: Expression,
    ) -> (GraphTensor<'g>, GraphTensor<'g>) {
        let s = k.shape()[2].clone();
        let total = past.clone() + s;
        let step = |cache: GraphTensor<'g>, new: GraphTensor<'g>| {
            // Squeezed first: the cast's result is then the written rows themselves (a
            // quantized cast's blocks are stored as they are, never re-viewed).
            let new = new.squeeze(0).cast(cache.dtype());
            cache
                .write_slice(1, past.clone(), new)
                .slice(1, 0, total.clone())
                .unsqueeze(0)
        };
        (step(self.k, k), step(self.v, v))
    }
}

impl<'g> Attention<'g> {
    /// Self-attention over `x: [1, s, dim]` at positions `past..past + s`, attending to the
    /// `past` positions held in `cache` too; the new keys and values are appended to it.
    pub fn forward_cached(
        &self,
        x: GraphTensor<'g>,
        past: impl Into<Expression>,
        cache: &KvCache<'g>,
    ) -> GraphTensor<'g> {
        let past = past.into();
        let q = self.rope.forward(
            self.split_heads(self.q_proj.forward(x), self.n_heads),
            past.clone(),
        );
        let k = self.rope.forward(
            self.split_heads(self.k_proj.forward(x), self.n_kv_heads),
            past.clone(),
        );
        let v = self.split_heads(self.v_proj.forward(x), self.n_kv_heads);
        let (q, k, v) = match cache.rotation {
            Some(h) => (rotate(q, h), rotate(k, h), rotate(v, h)),
            None => (q, k, v),
        };
        let (k, v) = cache.append(k, v, past);
        let mut out = causal_attention_windowed(q, k, v, self.sliding_window);
        if let Some(h) = cache.rotation {
            out = rotate(out, h); // H is its own inverse
        }
        let s = x.shape();
        let merged = out.permute(&[0, 2, 1, 3]).reshape(vec![
            s[0].clone(),
            s[1].clone(),
            Expression::from(self.n_heads * self.head_dim),
        ]);
        self.o_proj.forward(merged)
    }
}

impl<'g> Module<'g> for Attention<'g> {
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        self.forward_at(x, 0)
    }
    /// The projections' parameters. The `rope`'s own inputs (frequency factors) are shared
    /// across layers and listed once by its owner ([`Rope::parameters`]).
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj]
            .iter()
            .flat_map(|l| l.parameters())
            .collect()
    }
}

/// Pre-norm transformer block: `x + attn(norm(x))`, then `h + mlp(norm(h))` (HF Llama names).
pub struct TransformerBlock<'g> {
    pub input_layernorm: RmsNorm<'g>,
    pub self_attn: Attention<'g>,
    pub post_attention_layernorm: RmsNorm<'g>,
    pub mlp: SwiGluMlp<'g>,
}

impl<'g> TransformerBlock<'g> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cx: &'g Graph,
        prefix: &str,
        dim: usize,
        hidden: usize,
        n_heads: usize,
        n_kv_heads: usize,
        qkv_bias: bool,
        rope: Rope<'g>,
        eps: f32,
    ) -> Self {
        TransformerBlock {
            input_layernorm: RmsNorm::new(cx, &join(prefix, "input_layernorm"), dim, eps),
            self_attn: Attention::new(
                cx,
                &join(prefix, "self_attn"),
                dim,
                n_heads,
                n_kv_heads,
                qkv_bias,
                rope,
            ),
            post_attention_layernorm: RmsNorm::new(
                cx,
                &join(prefix, "post_attention_layernorm"),
                dim,
                eps,
            ),
            mlp: SwiGluMlp::new(cx, &join(prefix, "mlp"), dim, hidden),
        }
    }

    /// The block with its attention restricted to a sliding window (see
    /// [`Attention::with_sliding_window`]).
    pub fn with_sliding_window(self, window: Option<usize>) -> Self {
        TransformerBlock {
            self_attn: self.self_attn.with_sliding_window(window),
            ..self
        }
    }
}

impl<'g> TransformerBlock<'g> {
    /// The block over `x: [1, s, dim]` at positions `past..past + s` with a KV cache.
    pub fn forward_cached(
        &self,
        x: GraphTensor<'g>,
        past: impl Into<Expression>,
        cache: &KvCache<'g>,
    ) -> GraphTensor<'g> {
        let attn = self
            .self_attn
            .forward_cached(self.input_layernorm.forward(x), past, cache);
        let h = x + attn;
        h + self.mlp.forward(self.post_attention_layernorm.forward(h))
    }
}

impl<'g> Module<'g> for TransformerBlock<'g> {
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        let h = x + self.self_attn.forward(self.input_layernorm.forward(x));
        h + self.mlp.forward(self.post_attention_layernorm.forward(h))
    }
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        let mut p = self.input_layernorm.parameters();
        p.extend(self.self_attn.parameters());
        p.extend(self.post_attention_layernorm.parameters());
        p.extend(self.mlp.parameters());
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use luminal::patterns::{causal_limit, AttentionMatch, AttentionRules};

    /// The bias edge of the one attention in `cx` after the generic passes, and its causal
    /// limit evaluated at `s`, `t`.
    fn limit(cx: &Graph, s: i64, t: i64) -> Option<i64> {
        let mut g = cx.snapshot();
        use luminal::passes::Pass;
        luminal::passes::GenericPasses::default().run(&mut g);
        let (order, _) = luminal::passes::live_order(&g);
        let mut uses = std::collections::HashMap::new();
        for &id in &order {
            for e in &g.node(id).inputs {
                *uses.entry(e.node).or_insert(0usize) += 1;
            }
        }
        let rules = AttentionRules {
            kv_storage: &|dt| dt == DType::F16,
            bias_unit_keys: false,
        };
        let m = order
            .iter()
            .find_map(|&id| AttentionMatch::find(&g, &uses, id, &rules))
            .expect("an attention");
        let bias = m.bias.expect("a bias");
        causal_limit(&g, &bias).map(|c| {
            c.eval_with(&|v| match v {
                "s" => Some(s),
                "t" => Some(t),
                _ => None,
            })
            .unwrap()
        })
    }

    #[test]
    fn the_causal_mask_is_recognised_and_windows_and_padding_are_not() {
        // Keys j visible from query row i where j − i < t − s + 1, with and without grouped
        // queries and an f16 cache.
        for (hq, kv) in [(2, DType::F32), (6, DType::F16)] {
            let cx = Graph::new();
            let q = cx.tensor("q", (1, hq, "s", 16));
            let k = cx.input("k", (1, 2, "t", 16), kv);
            let v = cx.input("v", (1, 2, "t", 16), kv);
            causal_attention(q, k, v).output();
            assert_eq!(limit(&cx, 5, 9), Some(5));
            assert_eq!(limit(&cx, 1, 300), Some(300));
        }
        let cx = Graph::new();
        let q = cx.tensor("q", (1, 2, "s", 16));
        let k = cx.tensor("k", (1, 2, "t", 16));
        let v = cx.tensor("v", (1, 2, "t", 16));
        causal_attention_windowed(q, k, v, Some(4)).output();
        assert_eq!(limit(&cx, 5, 9), None);
        // A padding mask over the keys.
        let cx = Graph::new();
        let q = cx.tensor("q", (2, 2, 7, 16));
        let k = cx.tensor("k", (2, 2, 7, 16));
        let v = cx.tensor("v", (2, 2, 7, 16));
        let keep = cx.tensor("keep", (2, 7));
        crate::attention(q, k, v, Some(keep)).output();
        assert_eq!(limit(&cx, 7, 7), None);
    }
}
