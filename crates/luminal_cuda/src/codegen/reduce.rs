//! The body of reduction kernels: one thread per output, or on a GPU several.

/// The most threads one output of a reduction gets (its block's size; the kernels are
/// compiled with `__launch_bounds__` of this many threads, so a launch never asks for more
/// registers than a multiprocessor has).
pub const MAX_THREADS_PER_OUTPUT: u32 = 512;

/// The pieces of a reduction kernel's body ([`reduce_body`]), as C text.
pub(super) struct ReduceParts<'a> {
    /// The reduced axis' length and the product of the dims after it.
    pub(super) len: &'a str,
    pub(super) inner: &'a str,
    /// The accumulator's type and identity, and the statement folding `a` into `lum_acc`.
    pub(super) acc_t: &'a str,
    pub(super) ident: &'a str,
    pub(super) combine: &'a str,
    /// The declaration of `a` and the statements reading element `lum_k` of the output's
    /// row into it.
    pub(super) decl: &'a str,
    pub(super) read: &'a str,
    /// `lum_acc` as stored into the output.
    pub(super) store: &'a str,
}

/// The body of a reduction kernel. Under NVRTC (`__CUDACC_RTC__`) `lum_t` threads compute
/// each output (`lum_t` a power of two up to [`MAX_THREADS_PER_OUTPUT`], chosen by the plan
/// at launch, [`crate::plan::threads_per_output`]): lane `l` folds elements `l, l + lum_t, …`
/// of the row (consecutive lanes read consecutive elements), the lanes of a warp combine
/// with a `__shfl_xor_sync` butterfly, the warps of a block through shared memory, and lane
/// 0 stores. With `lum_t == 1` that is the sequential loop, in the same order. No thread
/// returns early when `lum_t > 1` (every lane of a warp takes part in its shuffles and every
/// thread of a block in its barrier); threads past the last output fold nothing and store
/// nothing. The host emulator (no cross-thread cooperation) compiles the `#else` branch:
/// one thread per output, looping over the reduced axis.
pub(super) fn reduce_body(p: ReduceParts) -> String {
    let ReduceParts {
        len,
        inner,
        acc_t,
        ident,
        combine,
        decl,
        read,
        store,
    } = p;
    format!(
        r#"#ifdef __CUDACC_RTC__
    const long long lum_g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long lum_i = lum_g / lum_t, lum_lane = lum_g % lum_t;
    const bool lum_live = lum_i < lum_n;
    if (lum_t == 1 && !lum_live) return;
    const long long lum_len = {len};
    const long long lum_inner = lum_max({inner}, 1);
    const long long lum_outer = lum_i / lum_inner, lum_rest = lum_i % lum_inner;
    {acc_t} lum_acc = {ident};
#pragma unroll 4
    for (long long lum_k = lum_live ? lum_lane : lum_len; lum_k < lum_len; lum_k += lum_t) {{
        {decl}
        {read}
        {combine}
    }}
    for (int lum_o = (lum_t < 32 ? (int)lum_t : 32) >> 1; lum_o > 0; lum_o >>= 1) {{
        const {acc_t} a = __shfl_xor_sync(0xffffffffu, lum_acc, lum_o);
        {combine}
    }}
    if (lum_t > 32) {{
        __shared__ {acc_t} lum_part[32];
        const int lum_w = (int)(threadIdx.x >> 5), lum_l = (int)(threadIdx.x & 31u);
        const int lum_nw = (int)(lum_t >> 5), lum_first = (int)(threadIdx.x / lum_t) * lum_nw;
        if (lum_l == 0) lum_part[lum_w] = lum_acc;
        __syncthreads();
        lum_acc = lum_l < lum_nw ? lum_part[lum_first + lum_l] : {ident};
        for (int lum_o = 16; lum_o > 0; lum_o >>= 1) {{
            const {acc_t} a = __shfl_xor_sync(0xffffffffu, lum_acc, lum_o);
            {combine}
        }}
    }}
    if (lum_live && lum_lane == 0) out[lum_i] = {store};
#else
    const long long lum_i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    (void)lum_t;
    if (lum_i >= lum_n) return;
    const long long lum_len = {len};
    const long long lum_inner = lum_max({inner}, 1);
    const long long lum_outer = lum_i / lum_inner, lum_rest = lum_i % lum_inner;
    {acc_t} lum_acc = {ident};
    for (long long lum_k = 0; lum_k < lum_len; ++lum_k) {{
        {decl}
        {read}
        {combine}
    }}
    out[lum_i] = {store};
#endif
"#
    )
}
