//! Kernels of the products that do not go to cuBLAS: rounding an f32 operand to a weight's
//! half type, and the skinny (decode-shaped) products over float weights and over
//! block-quantized ones, which share one kernel frame ([`skinny_source`]).

use super::{c_type, fnv1a, store, Kernel, Val};
use luminal::DType;

/// The kernel that rounds `lum_n` f32 values to `dtype` (f16 or bf16): an f32 operand of a
/// product that cuBLAS multiplies with a half weight ([`crate::gemm::Pattern::round`]).
/// Parameters: the output, the f32 input, `lum_n`.
pub fn round_kernel(dtype: DType) -> Kernel {
    let out_t = c_type(dtype).expect("a half type");
    let text = format!(
        "LUM_EXTERN_C __global__ void KERNEL({out_t}* __restrict__ out, const float* __restrict__ in0, long long lum_n) {{\n    const long long lum_i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n    if (lum_i >= lum_n) return;\n    out[lum_i] = {};\n}}\n",
        store(dtype, Val::Float, "in0[lum_i]")
    );
    let name = format!("lum_round_{}_{:016x}", dtype.name(), fnv1a(&text));
    Kernel {
        source: text.replace("KERNEL", &name),
        name,
        buffer_types: vec![out_t, "float"],
        error_flag: false,
        dims: vec![],
        cooperative: false,
        scalars: None,
    }
}

/// Warps (output columns) per block of a [`skinny_kernel`] launch.
pub const SKINNY_WARPS: u32 = 8;

/// Products one [`skinny_kernel`] launch computes (over the same activations).
pub const SKINNY_GROUPS: usize = 3;

/// The most blocks of a skinny launch: four blocks of [`SKINNY_WARPS`] warps on each of an
/// H100/H200's 132 SMs (each block then takes several rows per warp, the activations staged
/// once).
pub const SKINNY_MAX_BLOCKS: u32 = 4 * 132;

/// Warps that share a weight row of a [`skinny_kernel`] launch over `rows` rows of `k`
/// (its last scalar; a power of two dividing [`SKINNY_WARPS`]): enough warps in all to fill
/// an H200 (132 SMs × 64 warps) with each at least 512 of a row's elements. 1 for
/// [`skinny_quant_kernel`] launches (they take whole rows); 1 with
/// `LUMINAL_CUDA_SKINNY_SPLIT=0` (for comparisons).
pub fn skinny_split(rows: i64, k: i64) -> i64 {
    let mut split = 1;
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*ON.get_or_init(|| std::env::var("LUMINAL_CUDA_SKINNY_SPLIT").as_deref() != Ok("0")) {
        return 1;
    }
    while split < SKINNY_WARPS as i64 && rows * split < 132 * 64 && k >= 1024 * split {
        split *= 2;
    }
    split
}

/// Products with few activation rows (a decode step's linear layers), up to
/// [`SKINNY_GROUPS`] of them over the same activations in one launch (a layer's q, k and v
/// projections; gate and up). Each is cuBLAS's column-major `C = op(A)·B` with `A` read
/// transposed (`A[i, k]` at `oa + i·lda + k`: a `[N, K]` weight, `K` contiguous) and `B` not
/// (`B[k, j]` at `ob + j·ldb + k`: `M` activation rows), `C[i, j]` at `oc + i + j·ldc` —
/// what [`crate::gemm::GemmCall`] describes. Each output column `i` (a weight row, the
/// products' rows one after another) is taken by `split` consecutive warps of a block (the
/// last scalar, [`skinny_split`]; each a part of the row, multiples of 8 elements, their sums
/// added in order through shared memory): the lanes stream the part in 16-byte pieces (8
/// elements, double-buffered in registers) where every offset and stride allows it, else
/// element by element, multiply with each of the `M ≤ SKINNY_ROWS` activation rows (staged
/// once per block in shared memory when `M·K ≤ 8192`, else read from cache; f32 activations
/// rounded to `round` first, as cuBLAS reads them rounded into a scratch buffer, so no
/// rounding launch), accumulate in f32 and combine the lanes by `__shfl_xor_sync`. A block's
/// warps take (row, part) pairs [`SKINNY_WARPS`] at a time, the grid striding over them.
/// Types: `w`, `x` (the buffers' f32/f16/bf16), `c`. Parameters: `out0, out1, out2, w0, w1,
/// w2, x`, then the scalars `M, K, ldb, ob`, per product `N, lda, ldc, oa, oc` (`N = 0` for
/// an unused slot) and `split`; grid `ceil(ΣN·split / SKINNY_WARPS)` blocks of
/// `32·SKINNY_WARPS` threads, at most [`SKINNY_MAX_BLOCKS`]. The host emulator's branch
/// computes each column with one thread, summing in order.
pub fn skinny_kernel(w: DType, x: DType, round: Option<DType>, c: DType) -> Kernel {
    let ty = |d: DType| c_type(d).expect("a float type");
    let (wt, xt) = (ty(w), ty(x));
    // One element as f32: halves through the PTX conversions on a GPU (the prelude's
    // bit-exact software ones in C).
    let widen = |d: DType, v: &str| match d {
        DType::F16 => format!("lum_sk_h2f({v})"),
        DType::BF16 => format!("lum_bf16_to_f32({v})"),
        _ => v.to_string(),
    };
    let rounded = |v: String| match round {
        Some(DType::F16) => format!("lum_sk_round_f16({v})"),
        Some(DType::BF16) => format!("lum_sk_round_bf16({v})"),
        _ => v,
    };
    let (wn, xn) = (w.name(), x.name());
    let wv = widen(w, "wr[lum_e]");
    let xv = rounded(widen(x, "xr[lum_e]"));
    let xq = rounded("lum_x[lum_q]".to_string());
    // Before the activations are staged: the row's first pieces are requested, so the
    // staging's latency overlaps the weights' (`lum_vec`: the 16-byte path applies).
    let prefetch = format!(
        r#"    const {wt}* wr = w + lum_oa + (lum_live ? lum_row : 0) * lum_lda;
    const long long lum_end = lum_live ? lum_k_hi : 0;
    const int lum_vec = lum_stage && ((lum_lda | lum_oa) & 7) == 0;
    unsigned lum_ra[LUM_SK_U_{wn}][LUM_SK_RAW_{wn}], lum_rb[LUM_SK_U_{wn}][LUM_SK_RAW_{wn}];
    if (lum_vec) {{
#pragma unroll
        for (int lum_u = 0; lum_u < LUM_SK_U_{wn}; ++lum_u)
            if (lum_k_lo + 8 * lum_lane + 256 * lum_u < lum_end) lum_sk_raw_{wn}(wr + lum_k_lo + 8 * lum_lane + 256 * lum_u, lum_ra[lum_u]);
    }}
"#
    );
    // Lane l takes elements [8c, 8c + 8) for c = l, l + 32, ... (16 bytes of halves a load):
    // batches of `U` pieces, double-buffered in registers (the next batch is requested
    // before the current one is used: up to 2·U loads in flight a lane).
    let consume = |buf: &str, base: &str| {
        format!(
            r#"#pragma unroll
            for (int lum_u = 0; lum_u < LUM_SK_U_{wn}; ++lum_u) {{
                const long long lum_k1 = {base} + 256 * lum_u;
                if (lum_k1 < lum_end) {{
                    float lum_w[8], lum_x[8];
                    lum_sk_cvt_{wn}({buf}[lum_u], lum_w);
#pragma unroll
                    for (int lum_j = 0; lum_j < LUM_SK_M; ++lum_j) {{
                        if (lum_j < lum_m) {{
                            lum_sk_load8_f32(lum_xs + lum_j * lum_k + lum_k1, lum_x);
#pragma unroll
                            for (int lum_q = 0; lum_q < 8; ++lum_q) lum_acc[lum_j] += lum_w[lum_q] * lum_x[lum_q];
                        }}
                    }}
                }}
            }}
"#
        )
    };
    let load = |buf: &str, base: &str| {
        format!(
            r#"#pragma unroll
            for (int lum_u = 0; lum_u < LUM_SK_U_{wn}; ++lum_u)
                if ({base} + 256 * lum_u < lum_end) lum_sk_raw_{wn}(wr + {base} + 256 * lum_u, {buf}[lum_u]);
"#
        )
    };
    let gpu = format!(
        r#"    if (lum_vec) {{
        const long long lum_step = 256 * LUM_SK_U_{wn};
        for (long long lum_k0 = lum_k_lo + 8 * lum_lane; lum_k0 < lum_end; lum_k0 += 2 * lum_step) {{
            {load_b}            {use_a}            if (lum_k0 + lum_step >= lum_end) break;
            {load_a}            {use_b}        }}
    }} else if (((lum_k | lum_lda | lum_ldb | lum_oa | lum_ob) & 7) == 0) {{
#pragma unroll 2
        for (long long lum_k0 = lum_k_lo + 8 * lum_lane; lum_k0 < lum_end; lum_k0 += 256) {{
            float lum_w[8], lum_x[8];
            lum_sk_load8_{wn}(wr + lum_k0, lum_w);
#pragma unroll
            for (int lum_j = 0; lum_j < LUM_SK_M; ++lum_j) {{
                if (lum_j < lum_m) {{
                    lum_sk_load8_{xn}(x + lum_ob + lum_j * lum_ldb + lum_k0, lum_x);
#pragma unroll
                    for (int lum_q = 0; lum_q < 8; ++lum_q) lum_acc[lum_j] += lum_w[lum_q] * {xq};
                }}
            }}
        }}
    }} else {{
        for (long long lum_e = lum_k_lo + lum_lane; lum_e < lum_end; lum_e += 32) {{
            const float lum_wv = {wv};
#pragma unroll
            for (int lum_j = 0; lum_j < LUM_SK_M; ++lum_j) {{
                if (lum_j < lum_m) {{
                    const {xt}* xr = x + lum_ob + lum_j * lum_ldb;
                    lum_acc[lum_j] += lum_wv * {xv};
                }}
            }}
        }}
    }}
"#,
        load_b = load("lum_rb", "lum_k0 + lum_step"),
        use_a = consume("lum_ra", "lum_k0"),
        load_a = load("lum_ra", "lum_k0 + 2 * lum_step"),
        use_b = consume("lum_rb", "lum_k0 + lum_step"),
    );
    let host = format!(
        r#"    /* One thread per column, summing in order. */
    const {wt}* wr = w + lum_oa + lum_row * lum_lda;
    for (int lum_j = 0; lum_j < LUM_SK_M && lum_j < lum_m; ++lum_j) {{
        const {xt}* xr = x + lum_ob + lum_j * lum_ldb;
        for (long long lum_e = 0; lum_e < lum_k; ++lum_e) lum_acc[lum_j] += {wv} * {xv};
        out[lum_oc + lum_row + lum_j * lum_ldc] = STORE_C;
    }}
"#
    );
    skinny_source(
        &format!("{}_{}_{}", w.name(), x.name(), c.name()),
        (wt, xt, c),
        (
            "((lum_k | lum_ldb | lum_ob) & 7) == 0 && lum_m * lum_k <= LUM_SK_STAGE",
            &xv,
        ),
        (&prefetch, &gpu),
        &host,
        wn,
    )
}

/// [`skinny_kernel`] for a block-quantized weight read in place (Q8_0, Q4_0, Q4_1: a
/// decode step reads 1.06, 0.56 or 0.63 bytes a weight instead of an f16 copy's 2; Q3_K-Q6_K
/// a lane a 32-value piece of a super-block, byte loads), with f32
/// activations rounded to f16 as the f16-copy path rounds them. Rows must be whole blocks
/// (`K`, `lda` and `oa` multiples of 32; the plan checks). Each lane decodes whole blocks of
/// its warp's row (block `b` for `b = lane, lane + 32, …`: its scale and quants) and adds
/// `d·Σ q·x (+ m·Σ x)`. Where every product's rows start 16-byte aligned and the activations
/// are staged, a warp loads its row 32 blocks (a chunk) at a time as 16-byte pieces into
/// shared memory, requesting the next chunk while the lanes decode this one; else each lane
/// reads its block as 2-byte loads. The parameters are [`skinny_kernel`]'s (the weights as
/// bytes; `split` is 1: whole rows). The host emulator's branch sums `lum_deq_<type>(w, i)·x` in order (the
/// core's decoders), so the emulators check the block decoding against them. `None` for
/// other types.
pub fn skinny_quant_kernel(q: DType, c: DType) -> Option<Kernel> {
    if let Some(decode) = kquant_decode(q) {
        return Some(skinny_kquant_kernel(q, c, decode));
    }
    // Per type: block bytes; the whole block's decoding into `lum_q[32]`, `lum_d`, `lum_mn`
    // (from the 2-byte words `lum_h`); the scales alone; and group `lum_i` of 8 quants into
    // `lum_g[8]` (for the fast path: fewer registers than 32 decoded values).
    let (bytes, decode, scales, group) = match q {
        DType::Q8_0 => (
            34,
            "lum_d = lum_sk_lo(lum_h[0]); lum_mn = 0.f;
            for (int lum_i = 0; lum_i < 16; ++lum_i) { const unsigned lum_v = lum_h[1 + lum_i]; lum_q[2 * lum_i] = (float)(signed char)(lum_v & 0xffu); lum_q[2 * lum_i + 1] = (float)(signed char)(lum_v >> 8); }",
            "lum_d = lum_sk_lo(lum_h[0]); lum_mn = 0.f;",
            "for (int lum_t = 0; lum_t < 4; ++lum_t) { const unsigned lum_v = lum_h[1 + 4 * lum_i + lum_t]; lum_g[2 * lum_t] = (float)(signed char)(lum_v & 0xffu); lum_g[2 * lum_t + 1] = (float)(signed char)(lum_v >> 8); }",
        ),
        DType::Q4_0 => (
            18,
            "lum_d = lum_sk_lo(lum_h[0]); lum_mn = 0.f;
            for (int lum_i = 0; lum_i < 8; ++lum_i) { const unsigned lum_v = lum_h[1 + lum_i]; lum_q[2 * lum_i] = (float)((int)(lum_v & 15u) - 8); lum_q[2 * lum_i + 1] = (float)((int)((lum_v >> 8) & 15u) - 8); lum_q[2 * lum_i + 16] = (float)((int)((lum_v >> 4) & 15u) - 8); lum_q[2 * lum_i + 17] = (float)((int)(lum_v >> 12) - 8); }",
            "lum_d = lum_sk_lo(lum_h[0]); lum_mn = 0.f;",
            "for (int lum_t = 0; lum_t < 4; ++lum_t) { const unsigned lum_v = lum_h[1 + 4 * (lum_i & 1) + lum_t] >> (4 * (lum_i >> 1)); lum_g[2 * lum_t] = (float)((int)(lum_v & 15u) - 8); lum_g[2 * lum_t + 1] = (float)((int)((lum_v >> 8) & 15u) - 8); }",
        ),
        DType::Q4_1 => (
            20,
            "lum_d = lum_sk_lo(lum_h[0]); lum_mn = lum_sk_lo(lum_h[1]);
            for (int lum_i = 0; lum_i < 8; ++lum_i) { const unsigned lum_v = lum_h[2 + lum_i]; lum_q[2 * lum_i] = (float)(lum_v & 15u); lum_q[2 * lum_i + 1] = (float)((lum_v >> 8) & 15u); lum_q[2 * lum_i + 16] = (float)((lum_v >> 4) & 15u); lum_q[2 * lum_i + 17] = (float)(lum_v >> 12); }",
            "lum_d = lum_sk_lo(lum_h[0]); lum_mn = lum_sk_lo(lum_h[1]);",
            "for (int lum_t = 0; lum_t < 4; ++lum_t) { const unsigned lum_v = lum_h[2 + 4 * (lum_i & 1) + lum_t] >> (4 * (lum_i >> 1)); lum_g[2 * lum_t] = (float)(lum_v & 15u); lum_g[2 * lum_t + 1] = (float)((lum_v >> 8) & 15u); }",
        ),
        _ => return None,
    };
    // uint4 pieces of 32 blocks (a chunk) each lane holds.
    let pieces = (2 * bytes as usize).div_ceil(32);
    let gpu = format!(
        r#"    const unsigned char* wr = w + ((lum_oa + (lum_live ? lum_row : 0) * lum_lda) / 32) * {bytes};
    /* The fast path (uniform over the launch: every product's rows start 16-byte aligned and
       the activations are staged): each warp loads its row in chunks of 32 blocks, 16 bytes
       a lane (the next chunk requested while this one is used), through shared memory. */
    const int lum_fast = lum_stage && lum_sk_q_aligned(w0, lum_rows0, lum_lda0, lum_oa0, {bytes})
        && lum_sk_q_aligned(w1, lum_rows1, lum_lda1, lum_oa1, {bytes})
        && lum_sk_q_aligned(w2, lum_rows2, lum_lda2, lum_oa2, {bytes});
    if (lum_fast) {{
        __shared__ float4 lum_wq4[LUM_SK_WARPS * 2 * {bytes}];
        unsigned short* lum_ws = (unsigned short*)(lum_wq4 + (threadIdx.x >> 5) * 2 * {bytes});
        const long long lum_nb = lum_k / 32, lum_rowbytes = lum_nb * {bytes};
        unsigned lum_p[{pieces}][4];
#pragma unroll
        for (int lum_i = 0; lum_i < {pieces}; ++lum_i) {{
            const long long lum_at = 16 * (lum_lane + 32 * lum_i);
            if (lum_live && lum_at < lum_rowbytes && lum_at < 32 * {bytes}) lum_sk_words4((const unsigned short*)(wr + lum_at), lum_p[lum_i]);
        }}
        for (long long lum_c = 0; 32 * lum_c < lum_nb; ++lum_c) {{
            const long long lum_cb = 32 * {bytes} * lum_c;
            __syncwarp();
#pragma unroll
            for (int lum_i = 0; lum_i < {pieces}; ++lum_i) {{
                const long long lum_at = 16 * (lum_lane + 32 * lum_i);
                if (lum_at < 32 * {bytes} && lum_cb + lum_at < lum_rowbytes) lum_sk_store4(lum_ws + lum_at / 2, lum_p[lum_i]);
            }}
            __syncwarp();
#pragma unroll
            for (int lum_i = 0; lum_i < {pieces}; ++lum_i) {{
                const long long lum_at = 16 * (lum_lane + 32 * lum_i), lum_next = lum_cb + 32 * {bytes} + lum_at;
                if (lum_live && lum_at < 32 * {bytes} && lum_next < lum_rowbytes) lum_sk_words4((const unsigned short*)(wr + lum_next), lum_p[lum_i]);
            }}
            const long long lum_b = 32 * lum_c + lum_lane;
            if (lum_live && lum_b < lum_nb) {{
                const unsigned short* lum_h = lum_ws + lum_lane * ({bytes} / 2);
                float lum_d, lum_mn, lum_s[LUM_SK_M], lum_sx[LUM_SK_M];
                {scales}
#pragma unroll
                for (int lum_j = 0; lum_j < LUM_SK_M; ++lum_j) lum_s[lum_j] = lum_sx[lum_j] = 0.f;
#pragma unroll
                for (int lum_i = 0; lum_i < 4; ++lum_i) {{
                    float lum_g[8];
#pragma unroll
                    {group}
#pragma unroll
                    for (int lum_j = 0; lum_j < LUM_SK_M; ++lum_j) {{
                        if (lum_j < lum_m) {{
                            float lum_x[8];
                            lum_sk_load8_f32(lum_xs + lum_j * lum_k + 32 * lum_b + 8 * lum_i, lum_x);
#pragma unroll
                            for (int lum_e = 0; lum_e < 8; ++lum_e) {{
                                lum_s[lum_j] += lum_g[lum_e] * lum_x[lum_e];
                                lum_sx[lum_j] += lum_x[lum_e];
                            }}
                        }}
                    }}
                }}
#pragma unroll
                for (int lum_j = 0; lum_j < LUM_SK_M; ++lum_j)
                    if (lum_j < lum_m) lum_acc[lum_j] += lum_d * lum_s[lum_j] + lum_mn * lum_sx[lum_j];
            }}
        }}
    }} else {{
        /* A lane a block, its quants as 2-byte loads. */
{slow}    }}
"#,
        slow = quant_pieces(
            &format!(
                "const unsigned short* lum_h = (const unsigned short*)(wr + lum_b * {bytes});"
            ),
            decode
        ),
    );
    Some(quant_skinny_kernel(q, c, &gpu))
}

/// The loop of a block-quantized skinny kernel in which each lane takes 32-value pieces
/// `lum_b = lane, lane + 32, …` of its warp's row: `locate` points at piece `lum_b`'s bytes,
/// `decode` fills `lum_q[32]`, `lum_d`, `lum_mn` (value `l` is `lum_d·lum_q[l] + lum_mn`),
/// and each activation row adds `d·Σ q·x + m·Σ x`.
fn quant_pieces(locate: &str, decode: &str) -> String {
    format!(
        r#"    const long long lum_nb = lum_live ? lum_k / 32 : 0;
    for (long long lum_b = lum_lane; lum_b < lum_nb; lum_b += 32) {{
        {locate}
        float lum_q[32], lum_d, lum_mn;
        {{
            {decode}
        }}
#pragma unroll
        for (int lum_j = 0; lum_j < LUM_SK_M; ++lum_j) {{
            if (lum_j < lum_m) {{
                float lum_s = 0.f, lum_sx = 0.f;
                for (int lum_e = 0; lum_e < 32; ++lum_e) {{
                    const long long lum_at = lum_b * 32 + lum_e;
                    const float lum_xv = lum_stage ? lum_xs[lum_j * lum_k + lum_at] : lum_sk_round_f16(x[lum_ob + lum_j * lum_ldb + lum_at]);
                    lum_s += lum_q[lum_e] * lum_xv;
                    lum_sx += lum_xv;
                }}
                lum_acc[lum_j] += lum_d * lum_s + lum_mn * lum_sx;
            }}
        }}
    }}
"#
    )
}

/// A block-quantized skinny kernel over `q` weights from its GPU body `gpu`; the host
/// emulator's branch sums the core's decoder's values (`lum_deq_<type>`) in order.
fn quant_skinny_kernel(q: DType, c: DType, gpu: &str) -> Kernel {
    let qn = q.name();
    let host = format!(
        r#"    /* One thread per column: the core's decoder per element, summing in order. */
    for (int lum_j = 0; lum_j < LUM_SK_M && lum_j < lum_m; ++lum_j) {{
        for (long long lum_e = 0; lum_e < lum_k; ++lum_e)
            lum_acc[lum_j] += lum_deq_{qn}(w, lum_oa + lum_row * lum_lda + lum_e) * lum_sk_round_f16(x[lum_ob + lum_j * lum_ldb + lum_e]);
        out[lum_oc + lum_row + lum_j * lum_ldc] = STORE_C;
    }}
"#
    );
    skinny_source(
        &format!("{qn}_{}", c.name()),
        ("unsigned char", "float", c),
        (
            "lum_m * lum_k <= LUM_SK_STAGE",
            "lum_sk_round_f16(xr[lum_e])",
        ),
        ("", gpu),
        &host,
        "q",
    )
}

/// The decoding of 32-value piece `lum_sub` (0..8) of a K-quant super-block at `lum_p`
/// (bytes) into `lum_q[32]`, `lum_d`, `lum_mn` such that value `l` is
/// `lum_d·lum_q[l] + lum_mn`: the core's decoder ([`QUANT_PRELUDE`]'s `lum_deq_<type>`) with
/// the sub-block scales folded into the (small integer, exact) quants where a piece has two.
/// `None` for other types (and Q2_K, whose two 16-value halves have their own minimums).
///
/// [`QUANT_PRELUDE`]: super::prelude::QUANT_PRELUDE
fn kquant_decode(q: DType) -> Option<&'static str> {
    Some(match q {
        DType::Q3_K => {
            "const int lum_half = lum_sub / 4, lum_shift = lum_sub % 4;
            lum_d = lum_half_at(lum_p + 108); lum_mn = 0.f;
            for (int lum_l = 0; lum_l < 32; ++lum_l) {
                const int lum_j = 2 * lum_sub + lum_l / 16;
                const int lum_lo = (lum_p[96 + lum_j % 8] >> (4 * (lum_j / 8))) & 15, lum_hi = (lum_p[104 + lum_j % 4] >> (2 * (lum_j / 4))) & 3;
                const int lum_v = ((lum_p[32 + 32 * lum_half + lum_l] >> (2 * lum_shift)) & 3) | ((lum_p[lum_l] >> (4 * lum_half + lum_shift)) & 1) << 2;
                lum_q[lum_l] = (float)(((lum_lo | lum_hi << 4) - 32) * (lum_v - 4));
            }"
        }
        DType::Q4_K => {
            "int lum_sc, lum_mi;
            lum_k4_scale_min(lum_p + 4, lum_sub, &lum_sc, &lum_mi);
            lum_d = lum_mul(lum_half_at(lum_p), (float)lum_sc); lum_mn = -lum_mul(lum_half_at(lum_p + 2), (float)lum_mi);
            for (int lum_l = 0; lum_l < 32; ++lum_l) lum_q[lum_l] = (float)((lum_p[16 + 32 * (lum_sub / 2) + lum_l] >> (4 * (lum_sub % 2))) & 15);"
        }
        DType::Q5_K => {
            "int lum_sc, lum_mi;
            lum_k4_scale_min(lum_p + 4, lum_sub, &lum_sc, &lum_mi);
            lum_d = lum_mul(lum_half_at(lum_p), (float)lum_sc); lum_mn = -lum_mul(lum_half_at(lum_p + 2), (float)lum_mi);
            for (int lum_l = 0; lum_l < 32; ++lum_l)
                lum_q[lum_l] = (float)(((lum_p[48 + 32 * (lum_sub / 2) + lum_l] >> (4 * (lum_sub % 2))) & 15) | ((lum_p[16 + lum_l] >> lum_sub) & 1) << 4);"
        }
        DType::Q6_K => {
            "const int lum_half = lum_sub / 4, lum_kk = lum_sub % 4;
            lum_d = lum_half_at(lum_p + 208); lum_mn = 0.f;
            for (int lum_l = 0; lum_l < 32; ++lum_l) {
                const int lum_lo = (lum_p[64 * lum_half + 32 * (lum_kk % 2) + lum_l] >> (4 * (lum_kk / 2))) & 15;
                const int lum_hi = (lum_p[128 + 32 * lum_half + lum_l] >> (2 * lum_kk)) & 3;
                lum_q[lum_l] = (float)((signed char)lum_p[192 + 2 * lum_sub + lum_l / 16] * ((lum_lo | lum_hi << 4) - 32));
            }"
        }
        _ => return None,
    })
}

/// [`skinny_quant_kernel`] for a K-quant weight (256-value super-blocks; rows of whole
/// super-blocks, which the plan checks): each lane decodes 32-value pieces of its warp's row
/// (piece `b` for `b = lane, lane + 32, …`; 8 a super-block) with byte loads, and adds
/// `d·Σ q·x + m·Σ x` as the other block types. The host emulator's branch sums the core's
/// decoder's values.
fn skinny_kquant_kernel(q: DType, c: DType, decode: &str) -> Kernel {
    let bytes = q.block_bytes();
    let gpu = format!(
        "    const unsigned char* wr = w + ((lum_oa + (lum_live ? lum_row : 0) * lum_lda) / 256) * {bytes};\n{}",
        quant_pieces(
            &format!(
                "const unsigned char* lum_p = wr + (lum_b / 8) * {bytes};\n        const int lum_sub = (int)(lum_b % 8);"
            ),
            decode
        )
    );
    quant_skinny_kernel(q, c, &gpu)
}

/// Blocks at most of a [`skinny_mma_kernel`] launch: two on each of an H100/H200's 132 SMs
/// (its launch bounds ask for two), striding over the launch's 16-row tiles.
pub const SKINNY_MMA_MAX_BLOCKS: u32 = 2 * 132;

/// Halves of activations a [`skinny_mma_kernel`] block stages (`M·(K + 32)` at most: rows
/// padded by 64 bytes, so that two rows' reads fall in different banks).
pub const SKINNY_MMA_STAGE: i64 = 16384 + 128;

/// Whether a skinny product of `m` activation rows of `k` may run as a
/// [`skinny_mma_kernel`]: every row and offset a whole 16-byte piece (`lda`, `oa`, `ldb`,
/// `ob` multiples of 8 elements) and the activations fit its staging.
pub fn skinny_mma_fits(m: i64, k: i64, lda: i64, oa: i64, ldb: i64, ob: i64) -> bool {
    (1..=crate::gemm::SKINNY_ROWS as i64).contains(&m)
        && ((k | lda | oa | ldb | ob) & 7) == 0
        && k > 0
        && m * (k + 32) <= SKINNY_MMA_STAGE
}

/// The blocks of a [`skinny_mma_kernel`] launch over products of `rows` rows: one per 16-row
/// tile, at most [`SKINNY_MMA_MAX_BLOCKS`].
pub fn skinny_mma_grid(rows: &[i64]) -> u32 {
    let tiles: i64 = rows.iter().map(|r| (r + 15) / 16).sum();
    (tiles.max(1) as u32).min(SKINNY_MMA_MAX_BLOCKS)
}

/// [`skinny_kernel`] on tensor cores, for f16 or bf16 weights (`w`) and activations of the
/// same type or f32 rounded to it (`x`): each block takes a tile of 16 weight rows at a time
/// (the grid striding over the launch's tiles, product after product), its 8 warps the row's
/// 32-element chunks in turn (warp `w`: chunks `w, w + 8, …`). A lane loads 16 bytes of each
/// of the tile's rows `g` and `g + 8` (`g` = lane / 4) per chunk, at element `8·(lane % 4)`,
/// batches of `LUM_SKM_U` chunks double-buffered in registers, and the warp multiplies them
/// with the activations (staged once per block in shared memory, rounded to the weight's
/// type) by two `mma.m16n8k16` (f32 accumulation): the k order inside a chunk is permuted
/// alike for both operands, so the 16-byte pieces are the fragments as loaded, and the
/// activation rows (`M ≤ 4`) are the fragment's columns. The warps' 16×M sums are added in
/// order through shared memory and stored. The parameters are [`skinny_kernel`]'s; the last
/// scalar is unused (1). Rows must meet [`skinny_mma_fits`] (the plan checks); grid
/// [`skinny_mma_grid`] blocks of `32·SKINNY_WARPS` threads; needs sm_80. On the cooperative
/// emulator each `mma` is an exchange through memory between two barriers, every warp
/// calling it alike; on the plain host emulator one thread a row sums in order.
pub fn skinny_mma_kernel(w: DType, x: DType, c: DType) -> Option<Kernel> {
    skinny_mma_source(w, x, c, None, false)
}

/// An RMSNorm that a [`skinny_mma_kernel`] computes while staging its activations
/// (`luminal::patterns::RmsNormMatch`): row `n` of the product's activations is
/// `x[n] · recip(sqrt(Σ x[n]² · scale + eps)) [· weight]` of the norm's input `x`, read at the
/// product's activation offsets (rows of the norm's length), the weight (f32, one per
/// column) after `x` among the buffers when there is one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SkinnyNorm {
    pub weight: bool,
    pub scale: f32,
    pub eps: f32,
}

/// [`skinny_mma_kernel`] over f32 activations that are an RMSNorm of its `x` buffer
/// ([`SkinnyNorm`]): each block sums its rows' squares (the lanes' sums, the warps' in order
/// through shared memory), then stages `round(x · r [· weight])` as the norm's kernels and
/// the product's rounding would (the sum's order aside): the norm then needs no launch of its
/// own when every reader is such a product.
pub fn skinny_mma_norm_kernel(w: DType, c: DType, norm: SkinnyNorm) -> Option<Kernel> {
    skinny_mma_source(w, DType::F32, c, Some(norm), false)
}

/// [`skinny_mma_kernel`] (or [`skinny_mma_norm_kernel`] with `norm`) adding an f32 residual
/// to each f32 output as it stores it: `out[i] = Σ + r[i]` with `r` (the last buffer) read
/// at the output's own index (a residual sum `y = x·Wᵀ + r` over the same layout, whose
/// kernel then does not run).
pub fn skinny_mma_residual_kernel(w: DType, x: DType, norm: Option<SkinnyNorm>) -> Option<Kernel> {
    skinny_mma_source(w, x, DType::F32, norm, true)
}

fn skinny_mma_source(
    w: DType,
    x: DType,
    c: DType,
    norm: Option<SkinnyNorm>,
    residual: bool,
) -> Option<Kernel> {
    let wn = match w {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => return None,
    };
    let xt = match x {
        DType::F32 => "float",
        _ if x == w => "unsigned short",
        _ => return None,
    };
    let ct = c_type(c).ok()?;
    // An activation as the weight's type (its bits), and a weight or activation as f32.
    let (to_bits, half) = match w {
        DType::F16 => ("lum_skm_bits_f16", "lum_f16_to_f32"),
        _ => ("lum_skm_bits_bf16", "lum_bf16_to_f32"),
    };
    // The activation at `lum_xr[j]` (column `lum_e + j` of row `lum_n`) as the product reads
    // it: normed by the row's factor `lum_rn[lum_n]` (and the column's weight) first when the
    // kernel computes a norm.
    let normed = |j: &str| match norm {
        Some(SkinnyNorm { weight: true, .. }) => {
            format!("lum_mul(lum_mul(lum_xr[{j}], lum_rn[lum_n]), lum_nw[lum_e + {j}])")
        }
        Some(_) => format!("lum_mul(lum_xr[{j}], lum_rn[lum_n])"),
        None => format!("lum_xr[{j}]"),
    };
    let x_bits = if x == DType::F32 {
        format!("{to_bits}({})", normed("lum_j"))
    } else {
        "lum_xr[lum_j]".to_string()
    };
    let x_val = if x == DType::F32 {
        format!("{half}({to_bits}({}))", normed("0"))
    } else {
        format!("{half}(lum_xr[lum_e])")
    };
    // The rows' factors `lum_rn` (before the staging; on the host, per row).
    let (norm_param, norm_gpu, norm_host) = match norm {
        Some(n) => {
            let factor = format!(
                "1.0f / sqrtf(lum_mul(lum_ss, {:e}f) + {:e}f)",
                n.scale, n.eps
            );
            (
                if n.weight {
                    ", const float* __restrict__ lum_nw"
                } else {
                    ""
                },
                format!(
                    r#"    /* The norm: each row's sum of squares (lanes, then warps in order). */
    __shared__ float lum_ssp[LUM_SK_WARPS][LUM_SK_M];
    float lum_rn[LUM_SK_M];
#pragma unroll
    for (int lum_n = 0; lum_n < LUM_SK_M; ++lum_n) {{
        float lum_ss = 0.f;
        if (lum_n < lum_m)
            for (int lum_e = (int)threadIdx.x; lum_e < lum_kk; lum_e += (int)blockDim.x) {{
                const float lum_v = x[lum_ob + lum_n * lum_ldb + lum_e];
                lum_ss += lum_mul(lum_v, lum_v);
            }}
        for (int lum_o = 16; lum_o > 0; lum_o >>= 1) lum_ss += __shfl_xor_sync(0xffffffffu, lum_ss, lum_o);
        if (lum_lane == 0) lum_ssp[lum_warp][lum_n] = lum_ss;
    }}
    __syncthreads();
#pragma unroll
    for (int lum_n = 0; lum_n < LUM_SK_M; ++lum_n) {{
        float lum_ss = 0.f;
        for (int lum_p = 0; lum_p < LUM_SK_WARPS; ++lum_p) lum_ss += lum_ssp[lum_p][lum_n];
        lum_rn[lum_n] = {factor};
    }}
"#
                ),
                format!(
                    r#"                float lum_rn;
                {{
                    float lum_ss = 0.f;
                    for (long long lum_e = 0; lum_e < lum_k; ++lum_e) lum_ss += lum_mul(lum_xr[lum_e], lum_xr[lum_e]);
                    lum_rn = {factor};
                }}
"#
                ),
            )
        }
        None => ("", String::new(), String::new()),
    };
    // A lane loads rows g and g + 8 of the tile (8 words a chunk).
    let load = |buf: &str, batch: &str| {
        format!(
            r#"#pragma unroll
            for (int lum_u = 0; lum_u < LUM_SKM_U; ++lum_u) {{
                const int lum_e = 32 * (lum_warp + 8 * ({batch} * LUM_SKM_U + lum_u)) + 8 * lum_q;
                if (lum_e < lum_kk) {{ lum_sk_words4(lum_wa + lum_e, {buf}[lum_u]); lum_sk_words4(lum_wb + lum_e, {buf}[lum_u] + 4); }}
                else for (int lum_z = 0; lum_z < 8; ++lum_z) {buf}[lum_u][lum_z] = 0u;
            }}
"#
        )
    };
    let consume = |buf: &str, batch: &str| {
        format!(
            r#"#pragma unroll
            for (int lum_u = 0; lum_u < LUM_SKM_U; ++lum_u) {{
                const int lum_e = 32 * (lum_warp + 8 * ({batch} * LUM_SKM_U + lum_u)) + 8 * lum_q;
                unsigned lum_xv[4] = {{0u, 0u, 0u, 0u}};
                if (lum_g < lum_m && lum_e < lum_kk) lum_sk_words4(lum_xs + lum_g * lum_ks + lum_e, lum_xv);
                lum_skm_mma_{wn}(lum_acc, {buf}[lum_u][0], {buf}[lum_u][4], {buf}[lum_u][1], {buf}[lum_u][5], lum_xv[0], lum_xv[1]);
                lum_skm_mma_{wn}(lum_acc, {buf}[lum_u][2], {buf}[lum_u][6], {buf}[lum_u][3], {buf}[lum_u][7], lum_xv[2], lum_xv[3]);
            }}
"#
        )
    };
    // The sum `lum_s` stored at output index `lum_i`, with the residual added.
    let store_c = if residual {
        store(c, Val::Float, "lum_s + lum_res[lum_i]")
    } else {
        store(c, Val::Float, "lum_s")
    };
    let residual_param = if residual {
        ", const float* __restrict__ lum_res"
    } else {
        ""
    };
    let text = format!(
        r#"{helpers}LUM_EXTERN_C __global__ void LUM_SKM_BOUNDS KERNEL({ct}* out0, {ct}* out1, {ct}* out2, const unsigned short* __restrict__ w0, const unsigned short* __restrict__ w1, const unsigned short* __restrict__ w2, const {xt}* __restrict__ x{norm_param}{residual_param}, long long lum_m, long long lum_k, long long lum_ldb, long long lum_ob, long long lum_rows0, long long lum_lda0, long long lum_ldc0, long long lum_oa0, long long lum_oc0, long long lum_rows1, long long lum_lda1, long long lum_ldc1, long long lum_oa1, long long lum_oc1, long long lum_rows2, long long lum_lda2, long long lum_ldc2, long long lum_oa2, long long lum_oc2, long long lum_unused) {{
    const long long lum_t0 = (lum_rows0 + 15) / 16, lum_t1 = (lum_rows1 + 15) / 16;
    const long long lum_tiles = lum_t0 + lum_t1 + (lum_rows2 + 15) / 16;
    (void)lum_unused;
    /* Tile T's product: its rows, strides, offsets, output and weight, and the tile's first
       row (both branches). */
    long long lum_row0 = 0, lum_rows = 0, lum_lda = 0, lum_ldc = 0, lum_oa = 0, lum_oc = 0;
    {ct}* lum_out = out0;
    const unsigned short* lum_w = w0;
#define LUM_SKM_PICK(T) {{ \
        long long lum_r = (T); \
        if (lum_r < lum_t0) {{ lum_rows = lum_rows0; lum_lda = lum_lda0; lum_ldc = lum_ldc0; lum_oa = lum_oa0; lum_oc = lum_oc0; lum_out = out0; lum_w = w0; }} \
        else if (lum_r < lum_t0 + lum_t1) {{ lum_r -= lum_t0; lum_rows = lum_rows1; lum_lda = lum_lda1; lum_ldc = lum_ldc1; lum_oa = lum_oa1; lum_oc = lum_oc1; lum_out = out1; lum_w = w1; }} \
        else {{ lum_r -= lum_t0 + lum_t1; lum_rows = lum_rows2; lum_lda = lum_lda2; lum_ldc = lum_ldc2; lum_oa = lum_oa2; lum_oc = lum_oc2; lum_out = out2; lum_w = w2; }} \
        lum_row0 = 16 * lum_r; }}
#ifdef __CUDACC_RTC__
    const int lum_lane = (int)(threadIdx.x & 31), lum_warp = (int)(threadIdx.x >> 5);
    const int lum_g = lum_lane >> 2, lum_q = lum_lane & 3;
    const int lum_kk = (int)lum_k, lum_ks = lum_kk + 32;
    /* Chunks of 32 a warp takes, as many for every warp (the last ones zeros where the row
       has fewer): `mma` is called alike by all. */
    const int lum_batches = ((lum_kk + 255) / 256 + LUM_SKM_U - 1) / LUM_SKM_U;
    __shared__ float4 lum_xs4[LUM_SKM_STAGE / 8];
    __shared__ float lum_parts[LUM_SK_WARPS][16][LUM_SK_M];
    unsigned short* lum_xs = (unsigned short*)lum_xs4;
    unsigned lum_ra[LUM_SKM_U][8], lum_rb[LUM_SKM_U][8];
    long long lum_tile = blockIdx.x;
    /* The lane's rows g and g + 8 of the tile (the last row where the tile has fewer:
       loaded, not stored). */
    const unsigned short *lum_wa = w0, *lum_wb = w0;
#define LUM_SKM_TILE(T) {{ \
        LUM_SKM_PICK(T) \
        lum_wa = lum_w + lum_oa + (lum_row0 + lum_g < lum_rows ? lum_row0 + lum_g : lum_rows - 1) * lum_lda; \
        lum_wb = lum_w + lum_oa + (lum_row0 + lum_g + 8 < lum_rows ? lum_row0 + lum_g + 8 : lum_rows - 1) * lum_lda; }}
    if (lum_tile < lum_tiles) {{
        LUM_SKM_TILE(lum_tile)
        {load_a0}    }}
{norm_gpu}    /* The activations, rounded to the weight's type, once per block (every thread takes
       part: no return before the barrier). */
    for (int lum_i = (int)threadIdx.x; lum_i < (int)lum_m * (lum_kk / 4); lum_i += (int)blockDim.x) {{
        const int lum_n = lum_i / (lum_kk / 4), lum_e = 4 * (lum_i % (lum_kk / 4));
        const {xt}* lum_xr = x + lum_ob + lum_n * lum_ldb + lum_e;
        unsigned lum_h[4];
#pragma unroll
        for (int lum_j = 0; lum_j < 4; ++lum_j) lum_h[lum_j] = {x_bits};
        unsigned* lum_d = (unsigned*)(lum_xs + lum_n * lum_ks + lum_e);
        lum_d[0] = lum_h[0] | (lum_h[1] << 16);
        lum_d[1] = lum_h[2] | (lum_h[3] << 16);
    }}
    __syncthreads();
    while (lum_tile < lum_tiles) {{
        float lum_acc[4] = {{0.f, 0.f, 0.f, 0.f}};
        for (int lum_b = 0; lum_b < lum_batches; lum_b += 2) {{
            if (lum_b + 1 < lum_batches) {{
                {load_b}            }}
            {use_a}            if (lum_b + 1 >= lum_batches) break;
            if (lum_b + 2 < lum_batches) {{
                {load_a}            }}
            {use_b}        }}
        /* Row g's sums for activation rows 2q, 2q + 1 (and row g + 8's): this warp's part. */
#pragma unroll
        for (int lum_i = 0; lum_i < 4; ++lum_i) {{
            const int lum_n = 2 * lum_q + (lum_i & 1);
            if (lum_n < lum_m) lum_parts[lum_warp][lum_g + 8 * (lum_i >> 1)][lum_n] = lum_acc[lum_i];
        }}
        const long long lum_cur0 = lum_row0, lum_cur_rows = lum_rows, lum_cur_ldc = lum_ldc, lum_cur_oc = lum_oc;
        {ct}* lum_cur_out = lum_out;
        /* The next tile's first loads in flight while the parts are added. */
        lum_tile += gridDim.x;
        if (lum_tile < lum_tiles) {{
            LUM_SKM_TILE(lum_tile)
            {load_a0}        }}
        __syncthreads();
        if ((int)threadIdx.x < 16 * (int)lum_m) {{
            const int lum_r = (int)threadIdx.x & 15, lum_n = (int)threadIdx.x >> 4;
            float lum_s = 0.f;
            for (int lum_p = 0; lum_p < LUM_SK_WARPS; ++lum_p) lum_s += lum_parts[lum_p][lum_r][lum_n];
            const long long lum_i = lum_cur_oc + lum_cur0 + lum_r + lum_n * lum_cur_ldc;
            if (lum_cur0 + lum_r < lum_cur_rows) lum_cur_out[lum_i] = {store_c};
        }}
        __syncthreads();
    }}
#undef LUM_SKM_TILE
#else
    /* One thread a row of each of the block's tiles, summing in order. */
    if (threadIdx.x < 16) {{
        for (long long lum_tile = blockIdx.x; lum_tile < lum_tiles; lum_tile += gridDim.x) {{
            LUM_SKM_PICK(lum_tile)
            const long long lum_row = lum_row0 + threadIdx.x;
            if (lum_row >= lum_rows) continue;
            for (long long lum_n = 0; lum_n < lum_m; ++lum_n) {{
                const {xt}* lum_xr = x + lum_ob + lum_n * lum_ldb;
{norm_host}                float lum_s = 0.f;
                for (long long lum_e = 0; lum_e < lum_k; ++lum_e) lum_s += {half}(lum_w[lum_oa + lum_row * lum_lda + lum_e]) * {x_val_host};
                const long long lum_i = lum_oc + lum_row + lum_n * lum_ldc;
                lum_out[lum_i] = {store_c};
            }}
        }}
    }}
#endif
#undef LUM_SKM_PICK
}}
"#,
        helpers = skinny_helpers(),
        x_val_host = x_val
            .replace("lum_xr[0]", "lum_xr[lum_e]")
            .replace("lum_e + 0", "lum_e")
            .replace("lum_rn[lum_n]", "lum_rn"),
        load_a0 = load("lum_ra", "0"),
        load_a = load("lum_ra", "(lum_b + 2)"),
        load_b = load("lum_rb", "(lum_b + 1)"),
        use_a = consume("lum_ra", "lum_b"),
        use_b = consume("lum_rb", "(lum_b + 1)"),
    );
    let tag = format!(
        "mma_{}{}{wn}_{}_{}",
        if norm.is_some() { "norm_" } else { "" },
        if residual { "res_" } else { "" },
        x.name(),
        c.name(),
    );
    let hs = "unsigned short";
    let mut buffer_types = vec![ct, ct, ct, hs, hs, hs, xt];
    // The norm's weight, then the residual (f32 each).
    let extra = usize::from(norm.is_some_and(|n| n.weight)) + usize::from(residual);
    buffer_types.extend(std::iter::repeat_n("float", extra));
    Some(skinny_named(&tag, &text, buffer_types))
}

/// A skinny kernel of source `text` (its name `KERNEL`) named `lum_skinny_<tag>_<hash>`, with
/// [`skinny_kernel`]'s scalars after `buffer_types`.
fn skinny_named(tag: &str, text: &str, buffer_types: Vec<&'static str>) -> Kernel {
    let name = format!("lum_skinny_{tag}_{:016x}", fnv1a(text));
    Kernel {
        source: text.replace("KERNEL", &name),
        name,
        buffer_types,
        error_flag: false,
        dims: vec![],
        cooperative: true,
        scalars: Some(5 + 5 * SKINNY_GROUPS),
    }
}

/// The frame every skinny kernel shares: the parameters ([`skinny_kernel`]'s), the warp's
/// product and row, `lum_live` and the accumulators; on a GPU the activations staged into
/// shared memory (`lum_xs`, `lum_stage`) when `stage.0` holds, each element `stage.1` (of
/// `xr[lum_e]`), with `prefetch` (the first weight loads) before it, then `gpu` (the row's
/// products into `lum_acc`), the warp butterflies and the stores; in the host emulator's
/// branch, `host` for lane 0 of a live warp. `STORE_C` in the bodies is the accumulator
/// stored as the output type; `bounds` names the launch bounds (`LUM_SK_BOUNDS_<bounds>`).
/// Named `lum_skinny_<tag>_<hash>`.
fn skinny_source(
    tag: &str,
    (wt, xt, c): (&'static str, &'static str, DType),
    stage: (&str, &str),
    (prefetch, gpu): (&str, &str),
    host: &str,
    bounds: &str,
) -> Kernel {
    let ct = c_type(c).expect("a float type");
    let store_c = store(c, Val::Float, "lum_acc[lum_j]");
    let (stage_if, stage_value) = stage;
    let text = format!(
        r#"{helpers}LUM_EXTERN_C __global__ void LUM_SK_BOUNDS_{bounds} KERNEL({ct}* out0, {ct}* out1, {ct}* out2, const {wt}* __restrict__ w0, const {wt}* __restrict__ w1, const {wt}* __restrict__ w2, const {xt}* __restrict__ x, long long lum_m, long long lum_k, long long lum_ldb, long long lum_ob, long long lum_rows0, long long lum_lda0, long long lum_ldc0, long long lum_oa0, long long lum_oc0, long long lum_rows1, long long lum_lda1, long long lum_ldc1, long long lum_oa1, long long lum_oc1, long long lum_rows2, long long lum_lda2, long long lum_ldc2, long long lum_oa2, long long lum_oc2, long long lum_split) {{
    const int lum_lane = (int)(threadIdx.x & 31), lum_warp = (int)(threadIdx.x >> 5);
    const long long lum_k_len = ((lum_k + lum_split - 1) / lum_split + 7) / 8 * 8;
#ifdef __CUDACC_RTC__
    /* The activations, rounded once per block into shared memory when they fit (every
       thread of the block takes part: no early return before the barrier). */
    __shared__ float4 lum_xs4[LUM_SK_STAGE / 4];
    float* lum_xs = (float*)lum_xs4;
    const int lum_stage = {stage_if};
#endif
    /* The block's warps take the launch's (row, part) pairs SKINNY_WARPS at a time, the grid
       striding over them (every warp of a block iterates as often: barriers stay uniform). */
    const long long lum_total = (lum_rows0 + lum_rows1 + lum_rows2) * lum_split;
    for (long long lum_base = (long long)blockIdx.x * LUM_SK_WARPS; lum_base < lum_total; lum_base += (long long)gridDim.x * LUM_SK_WARPS) {{
    /* The warp's product, row and part of the row: `lum_split` consecutive warps (of one
       block) share a row, each taking [lum_k_lo, lum_k_hi) of it (multiples of 8). */
    const long long lum_wg = lum_base + lum_warp;
    const long long lum_part = lum_wg % lum_split;
    const long long lum_k_lo = lum_part * lum_k_len < lum_k ? lum_part * lum_k_len : lum_k;
    const long long lum_k_hi = lum_k_lo + lum_k_len < lum_k ? lum_k_lo + lum_k_len : lum_k;
    long long lum_row = lum_wg / lum_split, lum_rows = lum_rows0, lum_lda = lum_lda0, lum_ldc = lum_ldc0, lum_oa = lum_oa0, lum_oc = lum_oc0;
    {ct}* out = out0;
    const {wt}* w = w0;
    if (lum_row >= lum_rows0) {{
        lum_row -= lum_rows0;
        lum_rows = lum_rows1; lum_lda = lum_lda1; lum_ldc = lum_ldc1; lum_oa = lum_oa1; lum_oc = lum_oc1; out = out1; w = w1;
        if (lum_row >= lum_rows1) {{
            lum_row -= lum_rows1;
            lum_rows = lum_rows2; lum_lda = lum_lda2; lum_ldc = lum_ldc2; lum_oa = lum_oa2; lum_oc = lum_oc2; out = out2; w = w2;
        }}
    }}
    const int lum_live = lum_row < lum_rows;
    float lum_acc[LUM_SK_M];
    for (int lum_j = 0; lum_j < LUM_SK_M; ++lum_j) lum_acc[lum_j] = 0.f;
#ifdef __CUDACC_RTC__
{prefetch}    if (lum_stage && lum_base == (long long)blockIdx.x * LUM_SK_WARPS) {{
        for (long long lum_i = threadIdx.x; lum_i < lum_m * lum_k; lum_i += blockDim.x) {{
            const long long lum_e = lum_i % lum_k;
            const {xt}* xr = x + lum_ob + (lum_i / lum_k) * lum_ldb;
            lum_xs[lum_i] = {stage_value};
        }}
        __syncthreads();
    }}
{gpu}    /* Every lane takes part in the butterflies (no early return). */
#pragma unroll
    for (int lum_j = 0; lum_j < LUM_SK_M; ++lum_j)
        if (lum_j < lum_m)
            for (int lum_o = 16; lum_o > 0; lum_o >>= 1) lum_acc[lum_j] += __shfl_xor_sync(0xffffffffu, lum_acc[lum_j], lum_o);
    if (lum_split > 1) {{
        /* The parts' sums through shared memory, added in order by the row's first warp. */
        __shared__ float lum_parts[LUM_SK_WARPS][LUM_SK_M];
        if (lum_lane == 0)
            for (int lum_j = 0; lum_j < LUM_SK_M; ++lum_j) lum_parts[lum_warp][lum_j] = lum_acc[lum_j];
        __syncthreads();
        if (lum_part == 0)
            for (int lum_j = 0; lum_j < LUM_SK_M; ++lum_j)
                for (int lum_p = 1; lum_p < lum_split; ++lum_p) lum_acc[lum_j] += lum_parts[lum_warp + lum_p][lum_j];
        __syncthreads(); /* read before the next rows' parts are written */
    }}
#pragma unroll
    for (int lum_j = 0; lum_j < LUM_SK_M; ++lum_j)
        if (lum_j < lum_m && lum_live && lum_lane == 0 && lum_part == 0) out[lum_oc + lum_row + lum_j * lum_ldc] = {store_c};
#else
    if (lum_live && lum_lane == 0 && lum_part == 0) {{
{host}    }}
#endif
    }}
}}
"#,
        host = host.replace("STORE_C", &store_c),
        helpers = skinny_helpers(),
    );
    skinny_named(tag, &text, vec![ct, ct, ct, wt, wt, wt, xt])
}

/// Conversions and 8-element loads of [`skinny_kernel`] (once per module): on a GPU the PTX
/// `cvt` instructions (rounding, round to nearest even as the prelude's) and 16-byte vector
/// loads, in C the prelude's conversions element by element; f16 weights widened by integer
/// operations in both (the H200 run with a `cvt` per weight and per activation element
/// streamed a 1B model's weights at a third of the bandwidth: conversions, not memory).
pub(crate) fn skinny_helpers() -> &'static str {
    static HELPERS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HELPERS.get_or_init(|| {
        // For tuning on a device: `LUMINAL_CUDA_SKINNY_U` pieces a lane requests at once per
        // buffer for half weights (f32: half as many); `LUMINAL_CUDA_SKINNY_BLOCKS` and
        // `_QBLOCKS` the blocks an SM must fit (a register bound for half and block weights;
        // 0: the compiler's choice).
        let env = |name: &str, default: u32| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        let u = env("LUMINAL_CUDA_SKINNY_U", 2).clamp(1, 8);
        let mma_u = env("LUMINAL_CUDA_SKINNY_MMA_U", 4).clamp(1, 8);
        let mma_bounds = match env("LUMINAL_CUDA_SKINNY_MMA_BLOCKS", 2).min(8) {
            0 => String::new(),
            blocks => format!("__launch_bounds__(256, {blocks})"),
        };
        let bounds = |name: &str| match env(name, 4).min(8) {
            0 => String::new(),
            blocks => format!("__launch_bounds__(256, {blocks})"),
        };
        let (bounds, qbounds) = (
            bounds("LUMINAL_CUDA_SKINNY_BLOCKS"),
            bounds("LUMINAL_CUDA_SKINNY_QBLOCKS"),
        );
        SKINNY_HELPERS.replace(
            "LUM_SK_TUNING\n",
            &format!(
                "/* Pieces of 8 weights a lane requests at once, per buffer (two buffers in flight). */
#define LUM_SK_U_f16 {u}
#define LUM_SK_U_bf16 {u}
#define LUM_SK_U_f32 {}
/* Chunks of 32 a warp of the tensor-core kernel requests at once, per buffer. */
#define LUM_SKM_U {mma_u}
/* Half and block weights: at most 64 registers a thread by default, so four blocks of 8
   warps fit on an SM (f32 weights would spill more, and keep the compiler's choice). */
#ifdef __CUDA_ARCH__
#define LUM_SK_BOUNDS_f16 {bounds}
#define LUM_SK_BOUNDS_bf16 {bounds}
#define LUM_SK_BOUNDS_q {qbounds}
#define LUM_SKM_BOUNDS {mma_bounds}
#else
#define LUM_SKM_BOUNDS
#define LUM_SK_BOUNDS_f16
#define LUM_SK_BOUNDS_bf16
#define LUM_SK_BOUNDS_q
#endif
",
                u.div_ceil(2)
            ),
        )
    })
}

const SKINNY_HELPERS: &str = r#"#ifndef LUM_SKINNY_HELPERS
#define LUM_SKINNY_HELPERS
/* Floats of activations a block stages in shared memory (32 KiB). */
#define LUM_SK_STAGE 8192
/* The most activation rows (crate::gemm::SKINNY_ROWS), warps a block (SKINNY_WARPS). */
#define LUM_SK_M 4
#define LUM_SK_WARPS 8
/* Halves of activations the tensor-core kernel stages (crate::codegen::SKINNY_MMA_STAGE). */
#define LUM_SKM_STAGE 16512
/* Whether a block-quantized product's rows (of `bytes`-byte blocks) all start 16-byte aligned. */
LUM_DEV int lum_sk_q_aligned(const unsigned char* w, long long rows, long long lda, long long oa, long long bytes) {
    return rows == 0 || ((((unsigned long long)w + (unsigned long long)((oa / 32) * bytes)) | (unsigned long long)((lda / 32) * bytes)) & 15) == 0;
}
LUM_SK_TUNING
#define LUM_SK_BOUNDS_f32
/* The two halves of a word as f32 by integer operations and one exact product by 2^112
   (normal and subnormal halves exactly, zeros with their sign; infinities and NaNs, which
   weights do not hold, become large finite values): far cheaper on a GPU than one cvt each. */
LUM_DEV float lum_sk_lo(unsigned u) { return lum_u2f(((u << 16) & 0x80000000u) | ((u << 13) & 0x0fffe000u)) * 0x1p112f; }
LUM_DEV float lum_sk_hi(unsigned u) { return lum_u2f((u & 0x80000000u) | ((u >> 3) & 0x0fffe000u)) * 0x1p112f; }
#ifdef __CUDA_ARCH__
LUM_DEV float lum_sk_h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
LUM_DEV float lum_sk_round_f16(float v) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v)); return lum_sk_h2f(h); }
LUM_DEV float lum_sk_round_bf16(float v) { unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v)); return lum_bf16_to_f32(h); }
LUM_DEV void lum_sk_words4(const unsigned short* p, unsigned* u) { const uint4 v = *(const uint4*)p; u[0] = v.x; u[1] = v.y; u[2] = v.z; u[3] = v.w; }
LUM_DEV void lum_sk_store4(unsigned short* p, const unsigned* u) { *(uint4*)p = make_uint4(u[0], u[1], u[2], u[3]); }
LUM_DEV void lum_sk_load8_f32(const float* p, float* o) {
    const float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
    o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w; o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
}
#else
typedef struct { float x, y, z, w; } float4;
LUM_DEV float lum_sk_h2f(unsigned short h) { return lum_f16_to_f32(h); }
LUM_DEV float lum_sk_round_f16(float v) { return lum_f16_to_f32(lum_f32_to_f16(v)); }
LUM_DEV float lum_sk_round_bf16(float v) { return lum_bf16_to_f32(lum_f32_to_bf16(v)); }
LUM_DEV void lum_sk_words4(const unsigned short* p, unsigned* u) { memcpy(u, p, 16); }
LUM_DEV void lum_sk_store4(unsigned short* p, const unsigned* u) { memcpy(p, u, 16); }
LUM_DEV void lum_sk_load8_f32(const float* p, float* o) { for (int i = 0; i < 8; ++i) o[i] = p[i]; }
#endif
/* A piece of 8 weights as raw 32-bit words (loaded), then as floats (converted). */
#define LUM_SK_RAW_f16 4
#define LUM_SK_RAW_bf16 4
#define LUM_SK_RAW_f32 8
LUM_DEV void lum_sk_raw_f16(const unsigned short* p, unsigned* u) { lum_sk_words4(p, u); }
LUM_DEV void lum_sk_raw_bf16(const unsigned short* p, unsigned* u) { lum_sk_words4(p, u); }
LUM_DEV void lum_sk_raw_f32(const float* p, unsigned* u) { lum_sk_words4((const unsigned short*)p, u); lum_sk_words4((const unsigned short*)(p + 4), u + 4); }
LUM_DEV void lum_sk_cvt_f16(const unsigned* u, float* o) {
    for (int i = 0; i < 4; ++i) { o[2 * i] = lum_sk_lo(u[i]); o[2 * i + 1] = lum_sk_hi(u[i]); }
}
LUM_DEV void lum_sk_cvt_bf16(const unsigned* u, float* o) {
    for (int i = 0; i < 4; ++i) { o[2 * i] = lum_u2f(u[i] << 16); o[2 * i + 1] = lum_u2f(u[i] & 0xffff0000u); }
}
LUM_DEV void lum_sk_cvt_f32(const unsigned* u, float* o) { for (int i = 0; i < 8; ++i) o[i] = lum_u2f(u[i]); }
LUM_DEV void lum_sk_load8_f16(const unsigned short* p, float* o) { unsigned u[4]; lum_sk_raw_f16(p, u); lum_sk_cvt_f16(u, o); }
LUM_DEV void lum_sk_load8_bf16(const unsigned short* p, float* o) { unsigned u[4]; lum_sk_raw_bf16(p, u); lum_sk_cvt_bf16(u, o); }
/* The tensor-core kernel: an f32 activation rounded to the weight's type (its bits), and
   d += A·B for one m16n8k16 tile (A 16×16 row-major, B 16×8 column-major, f32 d), each
   lane holding PTX's fragments (A: rows g, g + 8 and columns 2q.., 2q + 8..; B: column g,
   rows 2q.., 2q + 8..; d: rows g, g + 8 and columns 2q, 2q + 1). */
#ifdef __CUDA_ARCH__
LUM_DEV unsigned lum_skm_bits_f16(float v) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v)); return h; }
LUM_DEV unsigned lum_skm_bits_bf16(float v) { unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v)); return h; }
LUM_DEV void lum_skm_mma_f16(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
LUM_DEV void lum_skm_mma_bf16(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#else
LUM_DEV unsigned lum_skm_bits_f16(float v) { return lum_f32_to_f16(v); }
LUM_DEV unsigned lum_skm_bits_bf16(float v) { return lum_f32_to_bf16(v); }
#ifdef __CUDACC_RTC__
/* The cooperative emulator: every thread of the block stores its fragments between two
   barriers, then computes its four sums from its warp's (each of 16 products in order). */
static unsigned lum_skm_a[1024][4], lum_skm_b[1024][2];
LUM_DEV float lum_skm_half(unsigned w, int k, int bf) {
    const unsigned short h = (unsigned short)((k & 1) ? w >> 16 : w & 0xffffu);
    return bf ? lum_bf16_to_f32(h) : lum_f16_to_f32(h);
}
LUM_DEV void lum_skm_mma(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1, int bf) {
    const unsigned t = threadIdx.x, base = t & ~31u, lane = t & 31u, g = lane >> 2, q = lane & 3u;
    _Pragma("omp barrier")
    lum_skm_a[t][0] = a0; lum_skm_a[t][1] = a1; lum_skm_a[t][2] = a2; lum_skm_a[t][3] = a3;
    lum_skm_b[t][0] = b0; lum_skm_b[t][1] = b1;
    _Pragma("omp barrier")
    for (int i = 0; i < 4; ++i) {
        const unsigned row = g + (i >= 2 ? 8u : 0u), col = 2u * q + (unsigned)(i & 1);
        float s = 0.f;
        for (int k = 0; k < 16; ++k) {
            const unsigned al = base + (row % 8u) * 4u + (unsigned)(k % 8) / 2u, ar = (row >= 8u ? 1u : 0u) + (k >= 8 ? 2u : 0u);
            const unsigned bl = base + col * 4u + (unsigned)(k % 8) / 2u, br = k >= 8 ? 1u : 0u;
            s += lum_skm_half(lum_skm_a[al][ar], k, bf) * lum_skm_half(lum_skm_b[bl][br], k, bf);
        }
        d[i] += s;
    }
}
#define lum_skm_mma_f16(d, a0, a1, a2, a3, b0, b1) lum_skm_mma(d, a0, a1, a2, a3, b0, b1, 0)
#define lum_skm_mma_bf16(d, a0, a1, a2, a3, b0, b1) lum_skm_mma(d, a0, a1, a2, a3, b0, b1, 1)
#endif
#endif
#endif
"#;

#[cfg(test)]
mod tests {
    #[test]
    fn kernel_constants_follow_the_plan() {
        // The C side's row and warp counts are the plan's (it sizes grids and picks products
        // by them).
        let h = super::skinny_helpers();
        assert!(h.contains(&format!("#define LUM_SK_M {}\n", crate::gemm::SKINNY_ROWS)));
        assert!(h.contains(&format!("#define LUM_SK_WARPS {}\n", super::SKINNY_WARPS)));
        assert!(!h.contains("LUM_SK_TUNING"));
        assert!(h.contains(&format!(
            "#define LUM_SKM_STAGE {}\n",
            super::SKINNY_MMA_STAGE
        )));
    }
}
