//! Flash attention on f16 tensor cores, for calls whose keys and values are f16 (an f16 KV
//! cache; `q` is f32, scaled and rounded to f16 once, as a block loads it: `q·scale` overflows
//! f16 only past 65504): `mma.m16n8k16` with f32 accumulation for `q·kᵀ` and for `p·v`, the
//! online softmax in f32 on the accumulators, and the probabilities rounded to f16 in
//! registers (the score tile's accumulator layout is the A operand's layout of the next
//! product, so they never go through shared memory).
//!
//! A block of 4 warps takes 64 query rows (16 a warp) of one batch index and one key split.
//! It walks the split's keys in tiles of 64, double-buffered: key and value rows copied as
//! 16-byte pieces (`cp.async`) while the previous tile computes, into rows of `d + 8` halves
//! (the 8 rows an `ldmatrix` reads fall in distinct banks); `ldmatrix` gives the keys' B
//! fragments and, transposing, the values'. The bias (padding) is read per accumulator
//! element, as the tf32 kernel reads it; a tile whose
//! bias is `-inf` for the whole block is skipped. A causal mask
//! ([`luminal::patterns::causal_limit`], `AttnCall::causal`) is not read: the kernel computes
//! it from the indices and stops at the block's last visible key. The grid is 1-D: blocks run
//! the last query tiles first (under a causal mask they have the most keys).
//!
//! The kernels are C that both NVRTC and the cooperative host emulator
//! ([`crate::HostEmulatorCooperative`]) compile: there each `mma` and shuffle is an exchange
//! through memory between barriers (every thread calls them alike), so the fragment
//! layouts, the staging and the online softmax are checked without a GPU.

use super::{cdiv, AttnCall, MAX_BATCH_DIMS};
use crate::codegen::Kernel;
use std::mem::offset_of;

/// Query rows a block.
pub const ROWS: i64 = 64;
/// Keys a tile.
pub const KEYS: i64 = 64;
/// Threads a block.
pub const THREADS: u32 = 128;
/// Threads a block of the split-KV combine.
pub const COMBINE_THREADS: u32 = 256;

/// Dynamic shared memory of the kernel for [`dmax`] `dmax`, in bytes: two buffers of a key
/// and a value tile, [`KEYS`] rows of `dmax + 8` halves each.
pub fn shared_bytes(dmax: i64) -> u32 {
    (4 * KEYS * (dmax + 8) * 2) as u32
}

/// Whether the f16 kernel can run `c`: f16 keys and values, head dims up to 128, and a 1-D
/// grid of every query tile, batch index and split (at most 1024) within `i32`.
pub fn eligible(c: &AttnCall) -> bool {
    c.k_f16 != 0
        && c.v_f16 != 0
        && c.d <= 128
        && cdiv(c.s, ROWS) * c.batches() * 1024 <= i32::MAX as i64
}

/// Columns of shared memory a call's kernel keeps: 64 or 128.
pub fn dmax(c: &AttnCall) -> i64 {
    if c.d <= 64 {
        64
    } else {
        128
    }
}

/// Packs grouped queries, then splits `c`'s keys when its blocks would not fill `sms`
/// multiprocessors twice over (at least two tiles a split; sets `c.splits` and
/// `c.keys_per_split`, a multiple of [`KEYS`]). Returns the grid's blocks.
///
/// Grouped-query attention is a batch dim just before `s` along which k, v and the bias do
/// not move (stride 0) while q's rows run on (stride `s · q_s`): its `groups · s` query rows
/// then form one sequence over the same keys ([`AttnCall::group_rows`]), so a block's rows
/// share each key tile it loads and a decode step takes a block per kv head, not per query
/// head. Idempotent (a packed call has no such dim left).
pub fn plan(c: &mut AttnCall, sms: i64) -> u32 {
    let j = super::MAX_BATCH_DIMS - 1;
    let groups = c.batch[j];
    // One query row a group (decoding): the rows' stride is the group dim's.
    let rows_follow = c.q_b[j] == c.s * c.q_s || c.s == 1;
    if groups > 1
        && c.q_b[j] > 0
        && c.k_b[j] == 0
        && c.v_b[j] == 0
        && (c.has_bias == 0 || c.b_b[j] == 0)
        && rows_follow
        && c.group_rows == 0
    {
        c.q_s = c.q_b[j] / c.s;
        c.group_rows = c.s;
        c.s *= groups;
        c.batch[j] = 1;
        c.q_b[j] = 0;
    }
    let qtiles = cdiv(c.s, ROWS);
    let blocks = qtiles * c.batches();
    let tiles = cdiv(c.t, KEYS);
    let want = cdiv(2 * sms.max(1), blocks.max(1));
    let splits = want.min(tiles / 2).clamp(1, max_splits());
    c.keys_per_split = cdiv(tiles, splits) * KEYS;
    c.splits = cdiv(c.t, c.keys_per_split);
    (blocks * c.splits) as u32
}

/// The most key splits a call takes: 1024, or `LUMINAL_CUDA_ATTN_SPLITS` (for tuning on a
/// device; 1: never split, no combine launch). Read once.
fn max_splits() -> i64 {
    static MAX: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("LUMINAL_CUDA_ATTN_SPLITS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1024)
            .clamp(1, 1024)
    })
}

/// The attention kernel for calls of [`dmax`] `dmax`. Buffers: the parameter table (the
/// call at word `lum_at`, the scalar), the output, the split-KV scratch, q, k, v, the bias
/// (any buffer when the call has none). [`THREADS`] a block, [`plan`]'s blocks.
pub fn kernel(dmax: i64) -> Kernel {
    assert!(
        dmax == 64 || dmax == 128,
        "f16 attention: head dims up to 64 or 128, not {dmax}"
    );
    let name = format!("lum_attn_h16_{dmax}");
    Kernel {
        source: format!(
            "{}{}",
            header(),
            KERNEL
                .replace("@D@", &dmax.to_string())
                .replace("@NAME@", &name)
        ),
        name,
        buffer_types: vec![
            "long long",
            "float",
            "float",
            "float",
            "unsigned short",
            "unsigned short",
            "float",
        ],
        error_flag: false,
        dims: vec![],
        cooperative: true,
        scalars: Some(1),
    }
}

/// The split-KV combine of every attention kernel (this one's and [`super::CUDA_SOURCE`]'s:
/// the same partial-result layout): `out = Σ o·w / Σ l·w` over a row's splits,
/// `w = 2^((m − M)·log2 e)`.
/// Buffers: the parameter table (the call at word `lum_at`), the output, the scratch. One
/// thread an output element, [`COMBINE_THREADS`] a block.
pub fn combine_kernel() -> Kernel {
    let name = "lum_attn_combine".to_string();
    Kernel {
        source: format!("{}{}", header(), COMBINE.replace("@NAME@", &name)),
        name,
        buffer_types: vec!["long long", "float", "float"],
        error_flag: false,
        dims: vec![],
        cooperative: false,
        scalars: Some(1),
    }
}

/// Word indices of [`AttnCall`]'s fields (the kernels read the call as `long long`s), the
/// constants and the helpers both kernels use, with the skinny kernels' `mma` and f16
/// rounding; guarded, so a module may hold both kernels.
fn header() -> String {
    let w = |off: usize| off / 8;
    let fields = [
        ("batch", w(offset_of!(AttnCall, batch))),
        ("s", w(offset_of!(AttnCall, s))),
        ("t", w(offset_of!(AttnCall, t))),
        ("d", w(offset_of!(AttnCall, d))),
        ("q_off", w(offset_of!(AttnCall, q_off))),
        ("k_off", w(offset_of!(AttnCall, k_off))),
        ("v_off", w(offset_of!(AttnCall, v_off))),
        ("b_off", w(offset_of!(AttnCall, b_off))),
        ("q_b", w(offset_of!(AttnCall, q_b))),
        ("k_b", w(offset_of!(AttnCall, k_b))),
        ("v_b", w(offset_of!(AttnCall, v_b))),
        ("b_b", w(offset_of!(AttnCall, b_b))),
        ("q_s", w(offset_of!(AttnCall, q_s))),
        ("k_t", w(offset_of!(AttnCall, k_t))),
        ("v_t", w(offset_of!(AttnCall, v_t))),
        ("b_s", w(offset_of!(AttnCall, b_s))),
        ("b_t", w(offset_of!(AttnCall, b_t))),
        ("has_bias", w(offset_of!(AttnCall, has_bias))),
        ("scale_bits", w(offset_of!(AttnCall, scale_bits))),
        ("splits", w(offset_of!(AttnCall, splits))),
        ("keys_per_split", w(offset_of!(AttnCall, keys_per_split))),
        ("causal", w(offset_of!(AttnCall, causal))),
        ("causal_lt", w(offset_of!(AttnCall, causal_lt))),
        ("group_rows", w(offset_of!(AttnCall, group_rows))),
    ];
    let mut s = String::from("#ifndef LUM_H16_HEADER\n#define LUM_H16_HEADER\n");
    for (f, i) in fields {
        s.push_str(&format!("#define LUM_HP_{f} {i}\n"));
    }
    s.push_str(&format!(
        "#define LUM_H_BATCH_DIMS {MAX_BATCH_DIMS}\n#define LUM_HQ {ROWS}\n#define LUM_HK {KEYS}\n"
    ));
    s.push_str(HELPERS);
    s.push_str("#endif\n");
    format!("{}{s}", crate::codegen::skinny_helpers())
}

const HELPERS: &str = r#"#define LUM_H_NEG_INF lum_u2f(0xff800000u)
#define LUM_H_LOG2E 1.4426950408889634f
/* Shared memory: dynamic on a GPU (over 48 KiB with 128 columns), a static array in the
   emulator. ldmatrix: four 8x8 tiles of halves, lane L giving the address of row L % 8 of
   tile L / 8; each lane gets (row lane / 4, columns 2(lane % 4), +1) of every tile, or with
   `trans` (rows 2(lane % 4), +1, column lane / 4): the B fragment of rows stored as keys. A
   16-byte copy global -> shared (zeros when `full` is 0), asynchronous on a GPU. */
#ifdef __CUDA_ARCH__
#define LUM_H_BOUNDS __launch_bounds__(128)
#define LUM_H_SMEM(name, count) extern __shared__ __align__(16) unsigned short name[]
/* Whether v is set in any thread of the block (a block barrier). */
LUM_DEV int lum_h_any(int v) { return __syncthreads_or(v); }
LUM_DEV void lum_h_ldsm(unsigned* r, const unsigned short* row, int trans) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
LUM_DEV void lum_h_copy16(unsigned short* dst, const unsigned short* src, int full) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(a), "l"(src), "r"(full ? 16 : 0) : "memory");
}
LUM_DEV void lum_h_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* Waits for every group but the newest one. */
LUM_DEV void lum_h_wait_all_but_one(void) { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
#else
#define LUM_H_BOUNDS
#define LUM_H_SMEM(name, count) static _Alignas(16) unsigned short name[count]
/* The cooperative emulator: a slot a thread between two barriers (every thread calls these
   alike). */
static int lum_h_any_slots[1024];
LUM_DEV int lum_h_any(int v) {
    _Pragma("omp barrier")
    lum_h_any_slots[threadIdx.x] = v;
    _Pragma("omp barrier")
    int r = 0;
    for (unsigned i = 0; i < blockDim.x; ++i) r |= lum_h_any_slots[i];
    return r;
}
static const unsigned short* lum_h_rows[1024];
LUM_DEV void lum_h_ldsm(unsigned* r, const unsigned short* row, int trans) {
    const unsigned t = threadIdx.x, base = t & ~31u, lane = t & 31u;
    _Pragma("omp barrier")
    lum_h_rows[t] = row;
    _Pragma("omp barrier")
    for (unsigned m = 0; m < 4; ++m) {
        unsigned short lo, hi;
        if (trans) {
            lo = lum_h_rows[base + 8 * m + 2 * (lane % 4)][lane / 4];
            hi = lum_h_rows[base + 8 * m + 2 * (lane % 4) + 1][lane / 4];
        } else {
            lo = lum_h_rows[base + 8 * m + lane / 4][2 * (lane % 4)];
            hi = lum_h_rows[base + 8 * m + lane / 4][2 * (lane % 4) + 1];
        }
        r[m] = (unsigned)lo | ((unsigned)hi << 16);
    }
}
LUM_DEV void lum_h_copy16(unsigned short* dst, const unsigned short* src, int full) {
    if (full) memcpy(dst, src, 16); else memset(dst, 0, 16);
}
LUM_DEV void lum_h_commit(void) {}
LUM_DEV void lum_h_wait_all_but_one(void) {}
#endif
/* Element offsets of batch index bi in q, k, v and the bias. */
LUM_DEV void lum_h_offsets(const long long* p, long long bi, long long* o) {
    o[0] = p[LUM_HP_q_off]; o[1] = p[LUM_HP_k_off]; o[2] = p[LUM_HP_v_off]; o[3] = p[LUM_HP_b_off];
    for (int j = LUM_H_BATCH_DIMS - 1; j >= 0; --j) {
        const long long n = p[LUM_HP_batch + j], i = bi % n;
        bi /= n;
        o[0] += i * p[LUM_HP_q_b + j]; o[1] += i * p[LUM_HP_k_b + j];
        o[2] += i * p[LUM_HP_v_b + j]; o[3] += i * p[LUM_HP_b_b + j];
    }
}
LUM_DEV long long lum_h_batches(const long long* p) {
    long long n = 1;
    for (int j = 0; j < LUM_H_BATCH_DIMS; ++j) n *= p[LUM_HP_batch + j];
    return n;
}
"#;

/// The attention kernel; `@D@` is the columns it keeps (64 or 128), `@NAME@` its name.
/// Fragments of `mma.m16n8k16` (row.col), g = lane / 4, c = lane % 4: A (16×16) a0 (row g,
/// k 2c, 2c+1), a1 (row g+8, same k), a2 (row g, k 2c+8, 2c+9), a3 (row g+8, same k); B
/// (16×8) b0 (k 2c, 2c+1, column g), b1 (k 2c+8, 2c+9, column g); C (16×8) c0, c1 (row g,
/// columns 2c, 2c+1), c2, c3 (row g+8). Every barrier, `mma` and shuffle is reached by every
/// thread of the block (loop bounds depend on the block's indices only).
const KERNEL: &str = r#"
LUM_EXTERN_C __global__ void LUM_H_BOUNDS @NAME@(const long long* lum_table, float* out, float* part, const float* q, const unsigned short* k, const unsigned short* v, const float* bias, long long lum_at) {
    /* Two buffers of a key tile and a value tile, each [key][column], rows of @D@ + 8 halves
       (16-byte aligned; the 8 rows of an ldmatrix tile fall in distinct banks). */
    LUM_H_SMEM(lum_h_smem, 4 * LUM_HK * (@D@ + 8));
    const int RS = @D@ + 8, TILE = LUM_HK * (@D@ + 8);
    const long long* p = lum_table + lum_at;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const long long s = p[LUM_HP_s], t = p[LUM_HP_t], d = p[LUM_HP_d];
    const long long batches = lum_h_batches(p), splits = p[LUM_HP_splits], kps = p[LUM_HP_keys_per_split];
    const long long qtiles = (s + LUM_HQ - 1) / LUM_HQ, per = batches * splits, bid = blockIdx.x;
    const long long qt = qtiles - 1 - bid / per, bi = (bid % per) % batches, split = (bid % per) / batches;
    const long long q0 = qt * LUM_HQ, k_begin = split * kps;
    const long long k_end = (k_begin + kps < t) ? k_begin + kps : t;
    const float scale = lum_u2f((unsigned)p[LUM_HP_scale_bits]);
    const int has_bias = p[LUM_HP_has_bias] != 0, causal = p[LUM_HP_causal] != 0;
    const long long lt = p[LUM_HP_causal_lt];
    /* Packed grouped queries: row r is query position r % group_rows. */
    const long long gr = p[LUM_HP_group_rows] > 0 ? p[LUM_HP_group_rows] : s;
    const long long q_s = p[LUM_HP_q_s], k_t = p[LUM_HP_k_t], v_t = p[LUM_HP_v_t], b_s = p[LUM_HP_b_s], b_t = p[LUM_HP_b_t];
    long long off[4];
    lum_h_offsets(p, bi, off);
    const long long qo = off[0], ko = off[1], vo = off[2], bo = off[3];
    /* 16-byte pieces of key and value rows (copied asynchronously), else element copies. */
    const int vec = ((d | ko | vo | k_t | v_t) & 7) == 0;
    const long long r0 = q0 + warp * 16 + g, r1 = r0 + 8;
    /* This warp's 16 query rows times the scale as A fragments, rounded to f16 (zeros past s
       and d). */
    unsigned qa[@D@ / 16][4];
    for (int ks = 0; ks < @D@ / 16; ++ks)
        for (int h = 0; h < 2; ++h)
            for (int rr = 0; rr < 2; ++rr) {
                const long long c = ks * 16 + 2 * tg + 8 * h, row = rr ? r1 : r0;
                float x0 = 0.0f, x1 = 0.0f;
                if (row < s && c < d) x0 = q[qo + row * q_s + c] * scale;
                if (row < s && c + 1 < d) x1 = q[qo + row * q_s + c + 1] * scale;
                qa[ks][2 * h + rr] = lum_skm_bits_f16(x0) | (lum_skm_bits_f16(x1) << 16);
            }
    float o[@D@ / 8][4];
    for (int nt = 0; nt < @D@ / 8; ++nt)
        for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;
    float m0 = LUM_H_NEG_INF, m1 = LUM_H_NEG_INF, l0 = 0.0f, l1 = 0.0f;
    /* Under a causal mask (key j visible from row i where j - i < lt) the keys from the
       block's last row + lt on are hidden from all its rows. */
    long long k_stop = k_end;
    if (causal) {
        /* The block's last query position: of its last row, or gr - 1 when its rows cross
           into another group. */
        const long long last_row = ((q0 + LUM_HQ < s) ? q0 + LUM_HQ : s) - 1;
        const long long last = (q0 / gr == last_row / gr) ? last_row % gr : gr - 1;
        if (last + lt < k_stop) k_stop = last + lt;
    }
    /* The tile at key kt into buffer b as 16-byte pieces, a thread's pieces along a row (zeros
       past k_end and d). */
#define LUM_H_ISSUE(kt, b) \
    for (int i = tid; i < LUM_HK * (@D@ / 8); i += 128) { \
        const int j = i / (@D@ / 8), c = (i % (@D@ / 8)) * 8; \
        const int live = (kt) + j < k_end && c < d; \
        const long long key = live ? (kt) + j : k_begin; \
        lum_h_copy16(lum_h_smem + (2 * (b)) * TILE + j * RS + c, k + ko + key * k_t + (live ? c : 0), live); \
        lum_h_copy16(lum_h_smem + (2 * (b) + 1) * TILE + j * RS + c, v + vo + key * v_t + (live ? c : 0), live); \
    }
    if (vec && k_begin < k_stop) LUM_H_ISSUE(k_begin, 0)
    lum_h_commit();
    int buf = 0;
    for (long long kt = k_begin; kt < k_stop; kt += LUM_HK, buf ^= 1) {
        /* This thread's bias values in the accumulators' layout (a causal mask computed from
           the indices), -inf outside the rows and keys; the tile is skipped when the whole
           block's are -inf. */
        float sc[LUM_HK / 8][4];
        int vis = 0;
        for (int nt = 0; nt < LUM_HK / 8; ++nt)
            for (int e = 0; e < 4; ++e) {
                const long long row = (e < 2) ? r0 : r1, key = kt + nt * 8 + 2 * tg + (e & 1);
                float b = LUM_H_NEG_INF;
                if (row < s && key < k_end) {
                    const long long pos = row % gr;
                    if (causal) b = (key - pos < lt) ? 0.0f : LUM_H_NEG_INF;
                    else if (has_bias) b = bias[bo + pos * b_s + key * b_t];
                    else b = 0.0f;
                }
                sc[nt][e] = b;
                vis |= (b != LUM_H_NEG_INF);
            }
        /* Also the barrier after the previous tile's reads of the other buffer, which the
           next tile's copies then fill while this one computes. */
        const int any = lum_h_any(vis);
        unsigned short* sk = lum_h_smem + 2 * buf * TILE;
        unsigned short* sv = sk + TILE;
        if (vec) {
            if (kt + LUM_HK < k_stop) LUM_H_ISSUE(kt + LUM_HK, buf ^ 1)
            lum_h_commit();
            lum_h_wait_all_but_one();
        } else if (any) {
            for (int i = tid; i < LUM_HK * @D@; i += 128) {
                const int j = i / @D@, c = i % @D@;
                const int live = kt + j < k_end && c < d;
                sk[j * RS + c] = live ? k[ko + (kt + j) * k_t + c] : (unsigned short)0;
                sv[j * RS + c] = live ? v[vo + (kt + j) * v_t + c] : (unsigned short)0;
            }
        }
        __syncthreads(); /* this tile's keys and values, from every thread, are in place */
        if (!any) continue;
        /* S = Q·Kᵀ: 16 rows x 64 keys a warp. Lane L addresses key row 8 nt + L % 8 (and
           8 (nt + 1) + L % 8 from lane 16), columns 16 ks + 8 ((L / 8) % 2): b0, b1 of key
           tiles nt and nt + 1. */
        float acc[LUM_HK / 8][4];
        for (int nt = 0; nt < LUM_HK / 8; ++nt)
            for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
        for (int ks = 0; ks < @D@ / 16; ++ks)
            for (int nt = 0; nt < LUM_HK / 8; nt += 2) {
                unsigned b[4];
                lum_h_ldsm(b, sk + (8 * nt + 8 * (lane >> 4) + (lane & 7)) * RS + 16 * ks + 8 * ((lane >> 3) & 1), 0);
                lum_skm_mma_f16(acc[nt], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b[0], b[1]);
                lum_skm_mma_f16(acc[nt + 1], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b[2], b[3]);
            }
        /* Online softmax over rows r0 (e 0, 1) and r1 (e 2, 3); a row's keys are spread over
           the 4 threads of a group. */
        float mx0 = m0, mx1 = m1;
        for (int nt = 0; nt < LUM_HK / 8; ++nt)
            for (int e = 0; e < 4; ++e) {
                const float b = sc[nt][e];
                const float x = (b == LUM_H_NEG_INF) ? LUM_H_NEG_INF : acc[nt][e] + b;
                sc[nt][e] = x;
                if (e < 2) mx0 = fmaxf(mx0, x); else mx1 = fmaxf(mx1, x);
            }
        for (int sh = 1; sh < 4; sh <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, sh));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, sh));
        }
        const float base0 = (mx0 == LUM_H_NEG_INF) ? 0.0f : mx0, base1 = (mx1 == LUM_H_NEG_INF) ? 0.0f : mx1;
        const float corr0 = exp2f((m0 - base0) * LUM_H_LOG2E), corr1 = exp2f((m1 - base1) * LUM_H_LOG2E);
        /* The probabilities as A fragments of P·V: keys 16j .. 16j + 15 are the score tiles
           2j (a0, a1) and 2j + 1 (a2, a3). */
        unsigned pa[LUM_HK / 16][4];
        float sum0 = 0.0f, sum1 = 0.0f;
        for (int j = 0; j < LUM_HK / 16; ++j)
            for (int h = 0; h < 2; ++h) {
                const int nt = 2 * j + h;
                const float p0 = exp2f((sc[nt][0] - base0) * LUM_H_LOG2E), p1 = exp2f((sc[nt][1] - base0) * LUM_H_LOG2E);
                const float p2 = exp2f((sc[nt][2] - base1) * LUM_H_LOG2E), p3 = exp2f((sc[nt][3] - base1) * LUM_H_LOG2E);
                sum0 += p0 + p1;
                sum1 += p2 + p3;
                pa[j][2 * h] = lum_skm_bits_f16(p0) | (lum_skm_bits_f16(p1) << 16);
                pa[j][2 * h + 1] = lum_skm_bits_f16(p2) | (lum_skm_bits_f16(p3) << 16);
            }
        for (int sh = 1; sh < 4; sh <<= 1) {
            sum0 += __shfl_xor_sync(0xffffffffu, sum0, sh);
            sum1 += __shfl_xor_sync(0xffffffffu, sum1, sh);
        }
        l0 = l0 * corr0 + sum0;
        l1 = l1 * corr1 + sum1;
        m0 = mx0;
        m1 = mx1;
        for (int nt = 0; nt < @D@ / 8; ++nt) {
            o[nt][0] *= corr0; o[nt][1] *= corr0;
            o[nt][2] *= corr1; o[nt][3] *= corr1;
        }
        /* O += P·V: 16 rows x @D@ columns a warp. Lane L addresses value row 16 j + L % 8
           (+ 8 for lanes 8-15 and 24-31), columns 8 nt (+ 8 from lane 16), read transposed:
           b0, b1 of column tiles nt and nt + 1. */
        for (int j = 0; j < LUM_HK / 16; ++j)
            for (int nt = 0; nt < @D@ / 8; nt += 2) {
                unsigned b[4];
                lum_h_ldsm(b, sv + (16 * j + 8 * ((lane >> 3) & 1) + (lane & 7)) * RS + 8 * nt + 8 * (lane >> 4), 1);
                lum_skm_mma_f16(o[nt], pa[j][0], pa[j][1], pa[j][2], pa[j][3], b[0], b[1]);
                lum_skm_mma_f16(o[nt + 1], pa[j][0], pa[j][1], pa[j][2], pa[j][3], b[2], b[3]);
            }
    }
#undef LUM_H_ISSUE
    /* Rows r0 (e 0, 1) and r1 (e 2, 3): the output, or the split's partial result. */
    const long long nbs = batches * s;
    for (int hf = 0; hf < 2; ++hf) {
        const long long row = hf ? r1 : r0;
        if (row >= s) continue;
        const float l = hf ? l1 : l0, m = hf ? m1 : m0;
        const long long at = split * nbs + bi * s + row;
        for (int nt = 0; nt < @D@ / 8; ++nt)
            for (int e = 0; e < 2; ++e) {
                const long long col = nt * 8 + 2 * tg + e;
                if (col >= d) continue;
                const float x = o[nt][2 * hf + e];
                if (splits <= 1) out[(bi * s + row) * d + col] = x / l;
                else part[at * d + col] = x;
            }
        if (splits > 1 && tg == 0) {
            part[splits * nbs * d + at * 2] = m;
            part[splits * nbs * d + at * 2 + 1] = l;
        }
    }
}
"#;

/// The split-KV combine (`@NAME@`): a thread an output element.
const COMBINE: &str = r#"
LUM_EXTERN_C __global__ void @NAME@(const long long* lum_table, float* out, const float* part, long long lum_at) {
    const long long* p = lum_table + lum_at;
    const long long d = p[LUM_HP_d], splits = p[LUM_HP_splits], nbs = lum_h_batches(p) * p[LUM_HP_s];
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nbs * d) return;
    const long long r = i / d, col = i % d;
    const float* ml = part + splits * nbs * d;
    float mx = LUM_H_NEG_INF;
    for (long long sp = 0; sp < splits; ++sp) mx = fmaxf(mx, ml[(sp * nbs + r) * 2]);
    const float base = (mx == LUM_H_NEG_INF) ? 0.0f : mx;
    float num = 0.0f, den = 0.0f;
    for (long long sp = 0; sp < splits; ++sp) {
        const float w = exp2f((ml[(sp * nbs + r) * 2] - base) * LUM_H_LOG2E);
        num += part[(sp * nbs + r) * d + col] * w;
        den += ml[(sp * nbs + r) * 2 + 1] * w;
    }
    out[i] = num / den;
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_cover_every_key_once() {
        for (s, t, batches) in [
            (1, 1000, 32),
            (1, 40, 8),
            (7, 3000, 4),
            (1024, 1024, 32),
            (300, 300, 1),
        ] {
            // Heads of their own keys (not grouped).
            let mut c = AttnCall {
                batch: [1, 1, 1, batches],
                s,
                t,
                d: 64,
                q_s: 64,
                q_b: [0, 0, 0, s * 64],
                k_b: [0, 0, 0, t * 64],
                v_b: [0, 0, 0, t * 64],
                ..Default::default()
            };
            let blocks = plan(&mut c, 132);
            assert_eq!(c.group_rows, 0);
            assert!(c.keys_per_split % KEYS == 0 && c.splits >= 1);
            assert!(c.splits * c.keys_per_split >= t && (c.splits - 1) * c.keys_per_split < t);
            assert_eq!(blocks as i64, cdiv(s, ROWS) * batches * c.splits);
        }
        // Prefill fills the device without splitting.
        let mut c = AttnCall {
            batch: [1, 1, 1, 32],
            s: 1024,
            t: 1024,
            d: 128,
            ..Default::default()
        };
        plan(&mut c, 132);
        assert_eq!(c.splits, 1);
    }

    #[test]
    fn grouped_queries_are_packed_into_one_sequence_a_kv_head() {
        // q [1, kv 2, groups 4, s, 64] (contiguous), k and v broadcast over the groups.
        for s in [1, 7, 100] {
            let mut c = AttnCall {
                batch: [1, 1, 2, 4],
                s,
                t: 500,
                d: 64,
                q_s: 64,
                q_b: [0, 0, 4 * s * 64, s * 64],
                k_b: [0, 0, 500 * 64, 0],
                v_b: [0, 0, 500 * 64, 0],
                causal: 1,
                causal_lt: 500 - s + 1,
                ..Default::default()
            };
            let blocks = plan(&mut c, 132);
            assert_eq!(
                (c.s, c.group_rows, c.batch, c.q_s),
                (4 * s, s, [1, 1, 2, 1], 64)
            );
            assert_eq!(blocks as i64, cdiv(4 * s, ROWS) * 2 * c.splits);
            let planned = c;
            plan(&mut c, 132);
            assert_eq!(c, planned, "idempotent");
        }
        // Decoding, q's row stride 0 (one row): the group dim's stride becomes the rows'.
        let mut c = AttnCall {
            batch: [1, 1, 2, 4],
            s: 1,
            t: 30,
            d: 64,
            q_b: [0, 0, 256, 64],
            k_b: [0, 0, 30 * 64, 0],
            v_b: [0, 0, 30 * 64, 0],
            ..Default::default()
        };
        plan(&mut c, 132);
        assert_eq!((c.s, c.q_s, c.group_rows), (4, 64, 1));
        // A bias that moves along the group dim (per head) keeps the groups apart.
        let mut c = AttnCall {
            batch: [1, 1, 2, 4],
            s: 3,
            t: 30,
            d: 64,
            q_s: 64,
            q_b: [0, 0, 768, 192],
            has_bias: 1,
            b_b: [0, 0, 0, 90],
            ..Default::default()
        };
        plan(&mut c, 132);
        assert_eq!((c.s, c.group_rows), (3, 0));
    }

    #[test]
    fn the_header_names_the_calls_fields_at_their_words() {
        let h = header();
        let c = AttnCall {
            s: 11,
            keys_per_split: 22,
            scale_bits: 33,
            ..Default::default()
        };
        let at = |f: &str| -> usize {
            let line = h
                .lines()
                .find(|l| l.starts_with(&format!("#define LUM_HP_{f} ")))
                .unwrap();
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        assert_eq!(c.words()[at("s")], 11);
        assert_eq!(c.words()[at("keys_per_split")], 22);
        assert_eq!(c.words()[at("scale_bits")], 33);
    }
}
