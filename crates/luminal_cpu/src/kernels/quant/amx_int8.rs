//! Wide products (prefill, `M > 8`) with block-quantized weights on AMX-INT8 tiles
//! (Sapphire Rapids and later), for every format the int8 path unpacks.
//!
//! `tdpbssd` multiplies a tile of 16 rows of signed bytes (activations) by a tile of
//! weights in the quad-interleaved layout (row `p` holds the four bytes `k = 4p .. 4p + 4`
//! of each of 16 columns) into a 16 × 16 tile of int32 sums. Block-quantized weights carry one scale per
//! 16 or 32 values, so the kernel runs one tile product per *step* of `S` values of K
//! (`S` = 32 where the format's scale and bias hold over 32 values, 16 for Q2_K, Q3_K, Q6_K),
//! stores the 16 × 16 sums and scales them into 16 f32 accumulator vectors with AVX-512:
//! `acc[r] += P[r] · (dw · da[r]) (+ bw · sx[r])`. Two tiles alternate, so the next step's
//! tile product runs while this step's sums are scaled. On the 2-vCPU Xeon host of
//! `benches/README.md` a whole product (quantization and weight panels included) runs at
//! ~0.30 ns per 64 multiply-adds per activation row, one thread, against ~1.07 on the
//! AVX-512 VNNI span path (`span_dot.rs`; `timing::amx_int8_parts` below).
//!
//! Operands:
//! - activations quantized per block of 32 (`amax / 127`, as llama.cpp's `Q8_0`
//!   activations; the VNNI path's blocks are 16), row-major, rows padded to a multiple of
//!   16 with zeros; a tile is 16 rows read `k` bytes apart;
//! - weights unpacked (`unpack.rs`: `w = a · u + b` per group of 16) 16 rows at a time into
//!   a panel of K/4 rows of 64 bytes (the tile layout). Where `b = −c · a` for a constant
//!   `c` (Q4_0 8, Q5_0 16, Q3_K 4, Q6_K 32; Q8_0 is signed already), the quants are stored
//!   as `u − c` and the bias vanishes; otherwise (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) the bias
//!   adds `b · Σ x` per group, with `Σ x` the sum of the dequantized activations of the step.
//!
//! Non-finite activations are left to the VNNI kernel (which falls back to the reference
//! quantizer), so the caller runs that instead when [`wide`] returns false.

use super::int8::DotPath;
use super::span_acts::Aligned;
use super::{legacy_dot, prefetch, unpack, WeightRef};
use crate::kernels::matmul::skinny::OutPtr;
use luminal::DType;
use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Activation values per quantization block (one scale each).
const ABLOCK: usize = 32;

/// Whether wide int8 products run here: AVX-512 VNNI is the current path (the ISA cap
/// allows AVX-512) and AMX-INT8 is available and not turned off (`LUMINAL_AMX=0`).
pub(crate) fn takes(path: DotPath) -> bool {
    path == DotPath::Vnni512 && crate::kernels::matmul::amx::int8_available()
}

/// Values of K per tile product: 32 where the format's scale and bias are constant over 32
/// values, 16 otherwise.
fn step(dtype: DType) -> usize {
    match dtype {
        DType::Q2_K | DType::Q3_K | DType::Q6_K => 16,
        _ => 32,
    }
}

/// `c` with `b = −c · a` for every group of an unpacked row of `dtype` (the quants are then
/// stored as `u − c`, signed, and the bias vanishes), or `None` for formats with a bias of
/// their own. Q8_0's unpacked quants are signed bytes with `b = 0`.
fn offset(dtype: DType) -> Option<u8> {
    match dtype {
        DType::Q8_0 => Some(0),
        DType::Q4_0 => Some(8),
        DType::Q5_0 => Some(16),
        DType::Q3_K => Some(4),
        DType::Q6_K => Some(32),
        _ => None,
    }
}

/// Activation rows quantized for the tiles (kept and reused: no allocation once grown).
#[derive(Default)]
struct Acts {
    /// `mp × k` signed quants, row-major (`mp`: rows padded to 16).
    q: Aligned<i8>,
    /// Per row and block of 32: the scale.
    da: Vec<f32>,
    /// Per row and step: `da · Σ q` over the step (used by formats with a bias).
    sx: Vec<f32>,
}

/// A task's weight panel: 16 rows' quants in the tile layout, per step the 16 scales and
/// biases, and the rows unpacked in natural order.
#[derive(Default)]
struct Panel {
    tiles: Aligned<u8>,
    dw: Aligned<f32>,
    bw: Aligned<f32>,
    u: Vec<u8>,
    a: Vec<f32>,
    b: Vec<f32>,
}

thread_local! {
    static ACTS: RefCell<Acts> = RefCell::new(Acts::default());
    static PANEL: RefCell<Panel> = RefCell::new(Panel::default());
}

/// Quantizes row `x` (`k` values, a multiple of [`ABLOCK`]) into `q`, `da` (per 32) and
/// `sx` (per step `s`). Returns false when a value or a block's inverse scale is not finite.
///
/// # Safety
/// AVX-512 F/BW/VL/DQ; `q.len() == k`, `da.len() == k / 32`, `sx.len() == k / s`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn quantize_row(x: &[f32], q: &mut [i8], da: &mut [f32], sx: &mut [f32], s: usize) -> bool {
    for blk in 0..da.len() {
        let p = x.as_ptr().add(ABLOCK * blk);
        let (v0, v1) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        // Unordered when either lane is NaN (`max` above may have dropped a NaN).
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v0, v1) != 0;
        if !id.is_finite() || !amax.is_finite() || nan {
            return false;
        }
        let idv = _mm512_set1_ps(id);
        let q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, idv));
        let q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, idv));
        let dst = q.as_mut_ptr().add(ABLOCK * blk);
        _mm_storeu_si128(dst as *mut __m128i, _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128(dst.add(16) as *mut __m128i, _mm512_cvtsepi32_epi8(q1));
        da[blk] = d;
        if s == 32 {
            sx[blk] = d * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)) as f32;
        } else {
            sx[2 * blk] = d * _mm512_reduce_add_epi32(q0) as f32;
            sx[2 * blk + 1] = d * _mm512_reduce_add_epi32(q1) as f32;
        }
    }
    true
}

/// Raw pointers to the activation buffers, handed to the quantizing tasks (each writes its
/// own rows).
struct ActParts {
    q: *mut i8,
    da: *mut f32,
    sx: *mut f32,
}
// SAFETY: tasks write disjoint rows only (see `Acts::quantize`).
unsafe impl Sync for ActParts {}

impl Acts {
    /// Quantizes rows `0 .. m` (`row(i)`), zero rows up to `mp`; in parallel when asked.
    /// Returns false when some row holds a non-finite value.
    fn quantize<'x>(
        &mut self,
        k: usize,
        s: usize,
        m: usize,
        row: impl Fn(usize) -> &'x [f32] + Sync,
        parallel: bool,
    ) -> bool {
        let mp = m.next_multiple_of(16);
        let (nb, ns) = (k / ABLOCK, k / s);
        self.q.resize(mp * k);
        self.da.resize(mp * nb, 0.0);
        self.sx.resize(mp * ns, 0.0);
        self.q.as_mut_slice()[m * k..].fill(0);
        self.da[m * nb..].fill(0.0);
        self.sx[m * ns..].fill(0.0);
        let parts = ActParts {
            q: self.q.as_mut_slice().as_mut_ptr(),
            da: self.da.as_mut_ptr(),
            sx: self.sx.as_mut_ptr(),
        };
        let ok = std::sync::atomic::AtomicBool::new(true);
        let tasks = if parallel {
            crate::exec::par::threads().min(m)
        } else {
            1
        };
        let per = m.div_ceil(tasks.max(1));
        crate::exec::par::for_each(m.div_ceil(per), |t| {
            let parts = &parts;
            for i in t * per..((t + 1) * per).min(m) {
                use std::slice::from_raw_parts_mut as part;
                // SAFETY: AVX-512 is the current ISA (`takes`); the buffers hold `mp ≥ m` rows
                // (resized above) and outlive the loop; each task writes only its rows.
                let done = unsafe {
                    quantize_row(
                        &row(i)[..k],
                        part(parts.q.add(i * k), k),
                        part(parts.da.add(i * nb), nb),
                        part(parts.sx.add(i * ns), ns),
                        s,
                    )
                };
                if !done {
                    ok.store(false, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
            }
        });
        ok.into_inner()
    }
}

/// The tile configuration for step `s`: tiles 0–1 the 16 × 16 int32 sums, 4–5 activation
/// tiles (16 rows × `s` bytes), 6–7 weight tiles (`s / 4` rows × 64 bytes).
#[repr(C, align(64))]
struct Config([u8; 64]);

const fn config(s: usize) -> Config {
    let mut c = [0u8; 64];
    c[0] = 1;
    let (colsb, rows) = (
        [64, 64, 0, 0, s, s, 64, 64],
        [16, 16, 0, 0, 16, 16, s / 4, s / 4],
    );
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = colsb[t] as u8;
        c[48 + t] = rows[t] as u8;
        t += 1;
    }
    Config(c)
}

static CONFIG16: Config = config(16);
static CONFIG32: Config = config(32);

/// Fills the panel with weight rows `j0 .. j0 + 16` (those `< n`; the rest zero).
///
/// # Safety
/// AVX-512 F.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn fill_panel(p: &mut Panel, w: WeightRef, j0: usize, s: usize) {
    let (n, k) = (w.n, w.k);
    let (g, ns) = (k / unpack::GROUP, k / s);
    let rb = w.row_bytes();
    let off = offset(w.dtype);
    // 64 bytes past the last row: the transpose reads whole 64-byte chunks.
    p.u.resize(16 * k + 64, 0);
    p.a.resize(g, 0.0);
    p.b.resize(g, 0.0);
    p.tiles.resize(16 * k);
    p.dw.resize(16 * ns);
    p.bw.resize(16 * ns);
    let per = s / unpack::GROUP;
    let (dw, bw) = (p.dw.as_mut_slice(), p.bw.as_mut_slice());
    for c in 0..16 {
        let j = j0 + c;
        let u = &mut p.u[c * k..(c + 1) * k];
        if j >= n {
            u.fill(0);
            for t in 0..ns {
                dw[16 * t + c] = 0.0;
                bw[16 * t + c] = 0.0;
            }
            continue;
        }
        prefetch(w.bytes, (j + 16) * rb, rb);
        let row = &w.bytes[j * rb..(j + 1) * rb];
        let (a, b) = (&mut p.a[..], &mut p.b[..]);
        if !(legacy_dot::has_fused_dot(w.dtype) && legacy_dot::unpack_row(w.dtype, row, u, a, b)) {
            unpack::unpack(w.dtype, row, u, a, b);
        }
        if let Some(o) = off.filter(|&o| o > 0) {
            u.iter_mut().for_each(|v| *v = v.wrapping_sub(o));
        }
        debug_assert!((0..g).all(|x| a[x] == a[x / per * per] && b[x] == b[x / per * per]));
        debug_assert!(off.is_none_or(|o| (0..g).all(|x| b[x] == -(o as f32) * a[x])));
        for t in 0..ns {
            dw[16 * t + c] = a[t * per];
            bw[16 * t + c] = if off.is_some() { 0.0 } else { b[t * per] };
        }
    }
    // Tile layout: panel row `r` (K values 4r .. 4r + 4) holds word `r` of each of the 16
    // rows: a 16 × (k/4) transpose of 32-bit words, 16 × 16 at a time.
    let tiles = p.tiles.as_mut_slice().as_mut_ptr() as *mut u32;
    let src = p.u.as_ptr() as *const u32;
    let kw = k / 4;
    let idx: [[__m512i; 2]; 4] = std::array::from_fn(|r| {
        std::array::from_fn(|h| _mm512_loadu_si512(TRANSPOSE[r][h].as_ptr() as *const _))
    });
    for w0 in (0..kw).step_by(16) {
        let rows: [__m512i; 16] =
            std::array::from_fn(|c| _mm512_loadu_si512(src.add(c * kw + w0) as *const _));
        let cols = transpose16(rows, &idx);
        for (r, v) in cols.iter().enumerate() {
            if w0 + r < kw {
                _mm512_storeu_si512(tiles.add((w0 + r) * 16) as *mut _, *v);
            }
        }
    }
}

/// The permutations of [`transpose16`]: per round (distances 8, 4, 2, 1), the lanes of the
/// lower row's and the upper row's result.
const fn transpose_indices() -> [[[i32; 16]; 2]; 4] {
    let mut out = [[[0i32; 16]; 2]; 4];
    let mut round = 0;
    while round < 4 {
        let d = 8 >> round;
        let mut l = 0;
        while l < 16 {
            let (blk, o) = (l / (2 * d), l % (2 * d));
            // Lower row: its own first `d` lanes of each block, then the other row's first.
            // Upper row: the lower row's last `d` lanes, then its own last.
            if o < d {
                out[round][0][l] = (blk * 2 * d + o) as i32;
                out[round][1][l] = (blk * 2 * d + o + d) as i32;
            } else {
                out[round][0][l] = 16 + (blk * 2 * d + o - d) as i32;
                out[round][1][l] = 16 + (blk * 2 * d + o) as i32;
            }
            l += 1;
        }
        round += 1;
    }
    out
}

static TRANSPOSE: [[[i32; 16]; 2]; 4] = transpose_indices();

/// The 16 × 16 transpose of 32-bit words (`out[r]` lane `c` = `rows[c]` lane `r`): four
/// rounds of exchanges between rows `d` apart (`d` = 8, 4, 2, 1) of blocks of `d` lanes.
///
/// # Safety
/// AVX-512 F.
#[inline(always)]
unsafe fn transpose16(rows: [__m512i; 16], idx: &[[__m512i; 2]; 4]) -> [__m512i; 16] {
    let mut v = rows;
    for (round, [li, hi]) in idx.iter().enumerate() {
        let d = 8 >> round;
        for r in 0..16 {
            if r % (2 * d) < d {
                let (a, b) = (v[r], v[r + d]);
                v[r] = _mm512_permutex2var_epi32(a, *li, b);
                v[r + d] = _mm512_permutex2var_epi32(a, *hi, b);
            }
        }
    }
    v
}

/// One 16 × 16 block of the product: activation rows `i0 .. i0 + 16` (`q`: the first's
/// quants, rows `k` bytes apart; `da`, `sx` their scales and sums) against the panel;
/// returns the 16 rows of 16 results.
///
/// # Safety
/// AMX-INT8 with the tile configuration of step `S` loaded; AVX-512 F; the pointers address
/// 16 whole rows and the whole panel.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn block<const S: usize, const BIAS: bool>(
    q: *const i8,
    da: *const f32,
    sx: *const f32,
    k: usize,
    p: &Panel,
) -> [__m512; 16] {
    // Two 16 × 16 int32 buffers for the stored sums, each written by a tile store before
    // it is read (so left uninitialised, and only reached through raw pointers).
    #[repr(C, align(64))]
    struct Sums([[i32; 256]; 2]);
    let mut sums = std::mem::MaybeUninit::<Sums>::uninit();
    let b0 = sums.as_mut_ptr() as *mut i32;
    let b1 = b0.add(256);
    let ns = k / S;
    let (nb, tiles) = (k / ABLOCK, p.tiles.as_slice().as_ptr());
    let (dw, bw) = (p.dw.as_slice().as_ptr(), p.bw.as_slice().as_ptr());
    // Step t's tiles: activation columns t·S.., weight panel rows t·S/4.. (64 bytes each).
    let a_at = |t: usize| q.add(t * S);
    let b_at = |t: usize| tiles.add(t * S * 16);
    macro_rules! product {
        ($c:literal, $a:literal, $b:literal, $t:expr) => {
            asm!(
                concat!("tilezero tmm", $c),
                concat!("tileloadd tmm", $a, ", [{a} + {sa}*1]"),
                concat!("tileloadd tmm", $b, ", [{b} + {sb}*1]"),
                concat!("tdpbssd tmm", $c, ", tmm", $a, ", tmm", $b),
                a = in(reg) a_at($t),
                sa = in(reg) k,
                b = in(reg) b_at($t),
                sb = in(reg) 64usize,
                options(nostack, readonly)
            )
        };
    }
    let mut acc = [_mm512_setzero_ps(); 16];
    // Step t's sums (in `buf`) scaled into the accumulators.
    let scale = |acc: &mut [__m512; 16], buf: *const i32, t: usize| {
        let w = _mm512_load_ps(dw.add(16 * t));
        let b = if BIAS {
            _mm512_load_ps(bw.add(16 * t))
        } else {
            w
        };
        let blk = t * S / ABLOCK;
        for (r, acc) in acc.iter_mut().enumerate() {
            let pv = _mm512_cvtepi32_ps(_mm512_load_si512(buf.add(16 * r) as *const _));
            let scale = _mm512_mul_ps(w, _mm512_set1_ps(*da.add(r * nb + blk)));
            *acc = _mm512_fmadd_ps(pv, scale, *acc);
            if BIAS {
                *acc = _mm512_fmadd_ps(b, _mm512_set1_ps(*sx.add(r * ns + t)), *acc);
            }
        }
    };
    product!("0", "4", "6", 0);
    let mut t = 0;
    // Two steps a round: tile 0 holds the even steps, tile 1 the odd ones; each step's
    // successor is issued before its sums are scaled. (Three steps ahead in four tiles,
    // stored a step before their scaling, measured no faster.)
    while t < ns {
        asm!("tilestored [{0} + {1}*1], tmm0", in(reg) b0, in(reg) 64usize, options(nostack));
        if t + 1 < ns {
            product!("1", "5", "7", t + 1);
        }
        scale(&mut acc, b0, t);
        t += 1;
        if t == ns {
            break;
        }
        asm!("tilestored [{0} + {1}*1], tmm1", in(reg) b1, in(reg) 64usize, options(nostack));
        if t + 1 < ns {
            product!("0", "4", "6", t + 1);
        }
        scale(&mut acc, b1, t);
        t += 1;
    }
    acc
}

/// `out[i·n + j] = Σ_k x_i[k] · W[j, k]` for `i < m`, `j < n` with the activation rows `rows(i)`
/// quantized per block of 32, on AMX tiles ([`takes`] must hold). Returns false, having
/// written nothing, when an activation is not finite (the caller then takes another path).
pub(crate) fn wide<'x>(
    w: WeightRef,
    rows: impl Fn(usize) -> &'x [f32] + Sync,
    out: OutPtr,
    m: usize,
    par: bool,
) -> bool {
    let (n, k) = (w.n, w.k);
    let s = step(w.dtype);
    let bias = offset(w.dtype).is_none();
    assert!(
        w.dtype.is_quantized() && k.is_multiple_of(ABLOCK),
        "AMX int8 product: {} weight with k = {k}",
        w.dtype
    );
    ACTS.with(|acts| {
        let mut acts = acts.borrow_mut();
        if !acts.quantize(k, s, m, rows, par) {
            return false;
        }
        let acts = &*acts;
        let (nb, ns) = (k / ABLOCK, k / s);
        let panels = n.div_ceil(16);
        let tasks = if par {
            (crate::exec::par::threads() * 4).min(panels)
        } else {
            1
        };
        let per = panels.div_ceil(tasks.max(1));
        let out = &out;
        crate::exec::par::for_each(panels.div_ceil(per), |t| {
            PANEL.with(|p| {
                let p = &mut *p.borrow_mut();
                let cfg = if s == 16 { &CONFIG16 } else { &CONFIG32 };
                // SAFETY: `takes` checked AMX-INT8 (the OS granted the tile state) and
                // AVX-512; every pointer below addresses the buffers sized above.
                unsafe {
                    asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
                    for jp in t * per..((t + 1) * per).min(panels) {
                        let j0 = jp * 16;
                        fill_panel(p, w, j0, s);
                        let cols = (n - j0).min(16);
                        let mask: __mmask16 = ((1u32 << cols) - 1) as __mmask16;
                        for i0 in (0..m).step_by(16) {
                            let q = acts.q.as_slice().as_ptr().add(i0 * k);
                            let (da, sx) =
                                (acts.da.as_ptr().add(i0 * nb), acts.sx.as_ptr().add(i0 * ns));
                            let res = match (s, bias) {
                                (16, false) => block::<16, false>(q, da, sx, k, p),
                                (16, true) => block::<16, true>(q, da, sx, k, p),
                                (_, false) => block::<32, false>(q, da, sx, k, p),
                                (_, true) => block::<32, true>(q, da, sx, k, p),
                            };
                            for (r, v) in res.iter().enumerate().take(m - i0) {
                                _mm512_mask_storeu_ps(out.0.add((i0 + r) * n + j0), mask, *v);
                            }
                        }
                    }
                    asm!("tilerelease", options(nostack, nomem));
                }
            })
        });
        true
    })
}

/// Where a wide AMX product's time goes (a measurement that asserts nothing, so ignored by
/// default): `cargo test --release -p luminal_cpu --lib amx_int8_parts -- --ignored
/// --nocapture`.
#[cfg(test)]
mod timing {
    use super::*;

    #[test]
    #[ignore]
    fn amx_int8_parts() {
        if !takes(DotPath::current()) {
            eprintln!("skipping: no AMX-INT8 here");
            return;
        }
        for (dtype, m, n, k) in [
            (DType::Q4_0, 128, 1536, 576),
            (DType::Q4_0, 128, 576, 1536),
            (DType::Q8_0, 128, 1536, 576),
            (DType::Q4_K, 128, 1536, 768),
            (DType::Q6_K, 128, 1536, 768),
        ] {
            let bytes = crate::kernels::quant::timing::timing_weight(dtype, n, k);
            let w = WeightRef {
                dtype,
                bytes: &bytes,
                n,
                k,
            };
            let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut out = vec![0f32; m * n];
            let best = |f: &mut dyn FnMut()| {
                let mut b = f64::MAX;
                for _ in 0..10 {
                    let t = std::time::Instant::now();
                    f();
                    b = b.min(t.elapsed().as_secs_f64());
                }
                b
            };
            let rows = |i: usize| &x[i * k..(i + 1) * k];
            let op = OutPtr(out.as_mut_ptr());
            let total = best(&mut || assert!(wide(w, rows, op, m, false)));
            let s = step(dtype);
            let mut acts = Acts::default();
            let quant = best(&mut || assert!(acts.quantize(k, s, m, rows, false)));
            let mut p = Panel::default();
            let fill = best(&mut || unsafe {
                for jp in 0..n / 16 {
                    fill_panel(&mut p, w, jp * 16, s);
                }
            });
            let macs = (m * n * k) as f64;
            println!(
                "{dtype} M={m} N={n} K={k}: total {:.1} us ({:.3} ns/64 MAC/row, {:.0} GOPS), quantize {:.1} us, panel fill {:.1} us ({:.2} ns per 64 weights), blocks ~{:.1} us",
                total * 1e6,
                total * 1e9 / (macs / 64.0),
                2.0 * macs / total / 1e9,
                quant * 1e6,
                fill * 1e6,
                fill * 1e9 / ((n * k) as f64 / 64.0),
                (total - quant - fill) * 1e6
            );
        }
    }
}
