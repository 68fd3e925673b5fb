//! The span layout of the wide int8 products (`span_dot.rs`): quantized activations and
//! unpacked weight rows rearranged so that one 32-bit lane accumulates one whole group of
//! 16 products (see [`span_transpose`]).
//!
//! A row of `k` values is `full = k / 256` spans, then (when `k` is not a multiple of 256) a
//! tail of `gt < 16` groups. Tails are packed: when `gt` divides 16, the tails of `p = 16 /
//! gt` consecutive activation rows share one span (row `r`'s tail groups in slots `(r % p) ·
//! gt ..`), and a weight row's tail is repeated `p` times in its own tail span, so one span
//! product serves `p` rows (on SmolLM2, `k = 576`: two spans and a tail of four groups, four
//! rows a tail span, instead of padding every row to 768). Otherwise `p = 1`: each row's
//! tail is a span of its own, padded with zeros.

use super::int8::quantize_row;
use super::unpack::GROUP;
use std::cell::RefCell;

/// Values of a span: 16 groups of 16 (see [`span_transpose`]).
pub(crate) const SPAN: usize = 256;

/// Rearranges one span of 256 bytes (16 groups of 16 values, natural order) into the span
/// layout: byte `64t + 4g + j` holds value `16g + 4t + j` (`t, j < 4`, `g < 16`). In that
/// layout the 32-bit lane `g` of each of the four 64-byte vectors `t` holds four values of
/// group `g`, so four `vpdpbusd` accumulate each group's whole integer dot in lane `g`: one
/// conversion and one scale per group, not per four lanes (`span_dot.rs`). A dot product is
/// the same under any permutation applied to both operands.
pub(crate) fn span_transpose(span: &mut [u8]) {
    assert_eq!(span.len(), SPAN);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of x86_64; the 256 bytes are in bounds (asserted).
    unsafe {
        use std::arch::x86_64::*;
        let p = span.as_mut_ptr();
        // Group g's four words (16 bytes) as a row; four 4 × 4 word transposes.
        let rows: [__m128i; 16] =
            std::array::from_fn(|g| _mm_loadu_si128(p.add(16 * g) as *const _));
        for c in 0..4 {
            let r = &rows[4 * c..4 * c + 4];
            let (t0, t1) = (
                _mm_unpacklo_epi32(r[0], r[1]),
                _mm_unpacklo_epi32(r[2], r[3]),
            );
            let (t2, t3) = (
                _mm_unpackhi_epi32(r[0], r[1]),
                _mm_unpackhi_epi32(r[2], r[3]),
            );
            let out = [
                _mm_unpacklo_epi64(t0, t1),
                _mm_unpackhi_epi64(t0, t1),
                _mm_unpacklo_epi64(t2, t3),
                _mm_unpackhi_epi64(t2, t3),
            ];
            for (t, o) in out.into_iter().enumerate() {
                _mm_storeu_si128(p.add(64 * t + 16 * c) as *mut _, o);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    span_transpose_words(span);
}

/// [`span_transpose`] word by word (the reference; other architectures).
#[cfg_attr(all(target_arch = "x86_64", not(test)), allow(dead_code))]
fn span_transpose_words(span: &mut [u8]) {
    let mut words = [0u32; 64];
    for (w, b) in words.iter_mut().zip(span.chunks_exact(4)) {
        *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    for (i, b) in span.chunks_exact_mut(4).enumerate() {
        let (t, g) = (i / 16, i % 16);
        b.copy_from_slice(&words[4 * g + t].to_le_bytes());
    }
}

/// One cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Element types any bit pattern is a valid value of, aligned to at most 64 bytes.
///
/// # Safety
/// Implementors must be such types ([`Aligned`] hands out raw lines as `T`).
pub(crate) unsafe trait Plain: Copy {}
// SAFETY: plain numbers, every bit pattern valid, alignment ≤ 4.
unsafe impl Plain for u8 {}
// SAFETY: as above.
unsafe impl Plain for i8 {}
// SAFETY: as above.
unsafe impl Plain for f32 {}
// SAFETY: as above.
unsafe impl Plain for u16 {}

/// A buffer of `T` aligned to a cache line (the kernels' 64-byte loads never split lines);
/// grows, never shrinks.
pub(crate) struct Aligned<T: Plain> {
    lines: Vec<Line>,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

impl<T: Plain> Default for Aligned<T> {
    fn default() -> Self {
        Aligned {
            lines: Vec::new(),
            len: 0,
            _t: std::marker::PhantomData,
        }
    }
}

impl<T: Plain> Aligned<T> {
    /// `len` elements: the first `len` of the lines, zero when first allocated, else what
    /// was last written there (the callers overwrite what they read).
    pub(crate) fn resize(&mut self, len: usize) {
        let lines = (len * std::mem::size_of::<T>()).div_ceil(64);
        if self.lines.len() < lines {
            self.lines.resize(lines, Line([0; 64]));
        }
        self.len = len;
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        // SAFETY: the lines hold at least `len` values of `T` (`resize`); any bytes are a
        // valid `T` (`Plain`); a line's alignment is a multiple of `T`'s.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const T, self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as `as_slice`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut T, self.len) }
    }
}

/// How rows of `k` values lie in spans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub k: usize,
    /// Whole spans a row.
    pub full: usize,
    /// Groups of the tail (0: none).
    pub gt: usize,
    /// Rows a tail span holds.
    pub p: usize,
}

impl Layout {
    /// The layout of rows of `k` values (a multiple of 32: `gt` is even, `p ≤ 8`).
    pub(crate) fn new(k: usize) -> Layout {
        let (full, gt) = (k / SPAN, k % SPAN / GROUP);
        let p = if gt > 0 && 16 % gt == 0 { 16 / gt } else { 1 };
        Layout { k, full, gt, p }
    }

    /// Spans of a weight row in the panel (the tail span included).
    pub(crate) fn spans(&self) -> usize {
        self.full + (self.gt > 0) as usize
    }
}

/// Weight row `u`, `a`, `b` for the panel: on entry the unpacked row (`unpack.rs`, natural
/// order) fills the first `k` bytes / `k / 16` groups; on exit the spans (`l.spans()`) are
/// in the span layout, the tail repeated `l.p` times, the rest zero. `signed`: the quants
/// are signed bytes (Q8_0), stored offset by 128 for `vpdpbusd` (`b = −128 · a`; the
/// integer sums stay below 2²⁴, exact in f32).
pub(crate) fn finish_row(l: Layout, signed: bool, u: &mut [u8], a: &mut [f32], b: &mut [f32]) {
    let (k, g) = (l.k, l.k / GROUP);
    let n = l.spans();
    assert!(
        u.len() == n * SPAN && a.len() == n * 16 && b.len() == n * 16,
        "span panel: {k} values into {} bytes",
        u.len()
    );
    if signed {
        u[..k].iter_mut().for_each(|v| *v ^= 0x80);
        for (b, &a) in b[..g].iter_mut().zip(&a[..g]) {
            *b = -128.0 * a;
        }
    }
    u[k..].fill(0);
    a[g..].fill(0.0);
    b[g..].fill(0.0);
    let (tu, tg) = (l.full * SPAN, l.full * 16);
    for r in 1..l.p {
        u.copy_within(tu..tu + 16 * l.gt, tu + 16 * r * l.gt);
        a.copy_within(tg..tg + l.gt, tg + r * l.gt);
        b.copy_within(tg..tg + l.gt, tg + r * l.gt);
    }
    u.chunks_exact_mut(SPAN).for_each(span_transpose);
}

/// One weight row of the panel (`l.spans()` spans): quants, per group `a` and `b`.
#[derive(Clone, Copy)]
pub(crate) struct SpanRow<'a> {
    pub u: &'a [u8],
    pub a: &'a [f32],
    pub b: &'a [f32],
}

/// Activation rows quantized per group of 16 (as `int8::QActs`) in the span layout; kept
/// and reused (no allocation once grown).
#[derive(Default)]
pub(crate) struct SpanActs {
    l: Option<Layout>,
    /// Whole spans: row `i`'s span `s` at `(i · full + s) · 256`, its groups at `· 16`.
    q: Aligned<i8>,
    dg: Aligned<f32>,
    sg: Aligned<f32>,
    /// Tail spans: pack `i / p` at `· 256` / `· 16`.
    tq: Aligned<i8>,
    tdg: Aligned<f32>,
    tsg: Aligned<f32>,
}

/// The buffers of [`SpanActs`], shared by the tasks quantizing disjoint packs of rows.
struct Parts {
    q: *mut i8,
    dg: *mut f32,
    sg: *mut f32,
    tq: *mut i8,
    tdg: *mut f32,
    tsg: *mut f32,
}

// SAFETY: only used to hand disjoint rows and packs to tasks (see `SpanActs::quantize`).
unsafe impl Sync for Parts {}

thread_local! {
    /// A row's tail quantized in natural order (one task's scratch).
    static TAIL: RefCell<([i8; SPAN], [f32; 16], [f32; 16])> =
        const { RefCell::new(([0; SPAN], [0.0; 16], [0.0; 16])) };
}

impl SpanActs {
    /// Quantizes `m` rows (row `i` is `row(i)`) in layout `l`, in parallel over packs of
    /// rows when `parallel`.
    pub(crate) fn quantize<'x>(
        &mut self,
        l: Layout,
        m: usize,
        row: impl Fn(usize) -> &'x [f32] + Sync,
        parallel: bool,
    ) {
        let (kf, gf) = (l.full * SPAN, l.full * 16);
        let packs = if l.gt > 0 { m.div_ceil(l.p) } else { 0 };
        self.l = Some(l);
        self.q.resize(m * kf);
        self.dg.resize(m * gf);
        self.sg.resize(m * gf);
        self.tq.resize(packs * SPAN);
        self.tdg.resize(packs * 16);
        self.tsg.resize(packs * 16);
        let parts = Parts {
            q: self.q.as_mut_slice().as_mut_ptr(),
            dg: self.dg.as_mut_slice().as_mut_ptr(),
            sg: self.sg.as_mut_slice().as_mut_ptr(),
            tq: self.tq.as_mut_slice().as_mut_ptr(),
            tdg: self.tdg.as_mut_slice().as_mut_ptr(),
            tsg: self.tsg.as_mut_slice().as_mut_ptr(),
        };
        use std::slice::from_raw_parts_mut as part;
        // Rows `u · p ..` (one pack, or one row without a tail).
        let unit = |u: usize| {
            let parts = &parts;
            let rows = u * l.p..((u + 1) * l.p).min(m);
            // SAFETY: the buffers hold `m` rows and `packs` packs (resized above) and outlive
            // the loop; each unit writes only its own rows and pack.
            unsafe {
                if l.gt > 0 {
                    part(parts.tq.add(u * SPAN), SPAN).fill(0);
                    part(parts.tdg.add(u * 16), 16).fill(0.0);
                    part(parts.tsg.add(u * 16), 16).fill(0.0);
                }
                for i in rows {
                    let x = &row(i)[..l.k];
                    let q = part(parts.q.add(i * kf), kf);
                    quantize_row(
                        &x[..kf],
                        q,
                        part(parts.dg.add(i * gf), gf),
                        part(parts.sg.add(i * gf), gf),
                    );
                    for span in q.chunks_exact_mut(SPAN) {
                        span_transpose(&mut *(span as *mut [i8] as *mut [u8]));
                    }
                    if l.gt == 0 {
                        continue;
                    }
                    let slot = (i % l.p) * l.gt;
                    TAIL.with(|t| {
                        let (tq, tdg, tsg) = &mut *t.borrow_mut();
                        let (qt, gt) = (16 * l.gt, l.gt);
                        quantize_row(&x[kf..], &mut tq[..qt], &mut tdg[..gt], &mut tsg[..gt]);
                        part(parts.tq.add(u * SPAN + 16 * slot), qt).copy_from_slice(&tq[..qt]);
                        part(parts.tdg.add(u * 16 + slot), gt).copy_from_slice(&tdg[..gt]);
                        part(parts.tsg.add(u * 16 + slot), gt).copy_from_slice(&tsg[..gt]);
                    });
                }
                if l.gt > 0 {
                    let t = part(parts.tq.add(u * SPAN), SPAN);
                    span_transpose(&mut *(t as *mut [i8] as *mut [u8]));
                }
            }
        };
        let units = m.div_ceil(l.p);
        let tasks = if parallel {
            crate::exec::par::threads().min(units)
        } else {
            1
        };
        let per = units.div_ceil(tasks.max(1));
        crate::exec::par::for_each(units.div_ceil(per), |t| {
            (t * per..((t + 1) * per).min(units)).for_each(&unit)
        });
    }

    /// Rows `i .. i + rows` (`i` a multiple of the layout's `p`).
    pub(crate) fn rows(&self, i: usize, rows: usize) -> SpanRows<'_> {
        let l = self.l.expect("span activations: not quantized");
        assert!(i.is_multiple_of(l.p), "span activations: rows from {i}");
        let (kf, gf) = (l.full * SPAN, l.full * 16);
        let (p0, p1) = if l.gt > 0 {
            (i / l.p, (i + rows).div_ceil(l.p))
        } else {
            (0, 0)
        };
        SpanRows {
            l,
            rows,
            q: &self.q.as_slice()[i * kf..(i + rows) * kf],
            dg: &self.dg.as_slice()[i * gf..(i + rows) * gf],
            sg: &self.sg.as_slice()[i * gf..(i + rows) * gf],
            tq: &self.tq.as_slice()[p0 * SPAN..p1 * SPAN],
            tdg: &self.tdg.as_slice()[p0 * 16..p1 * 16],
            tsg: &self.tsg.as_slice()[p0 * 16..p1 * 16],
        }
    }
}

/// Consecutive activation rows of [`SpanActs`] (from a multiple of `l.p`) and their tail
/// packs.
#[derive(Clone, Copy)]
pub(crate) struct SpanRows<'a> {
    pub l: Layout,
    pub rows: usize,
    pub q: &'a [i8],
    pub dg: &'a [f32],
    pub sg: &'a [f32],
    pub tq: &'a [i8],
    pub tdg: &'a [f32],
    pub tsg: &'a [f32],
}

impl SpanRows<'_> {
    /// Whether the slices hold every value the rows address.
    pub(crate) fn is_valid(&self) -> bool {
        let l = self.l;
        let packs = if l.gt > 0 { self.rows.div_ceil(l.p) } else { 0 };
        self.rows >= 1
            && self.q.len() == self.rows * l.full * SPAN
            && self.dg.len() == self.rows * l.full * 16
            && self.sg.len() == self.dg.len()
            && self.tq.len() == packs * SPAN
            && self.tdg.len() == packs * 16
            && self.tsg.len() == packs * 16
    }

    /// Row `r`'s span `s`: quants, group scales, group sums.
    #[inline(always)]
    pub(crate) fn span(&self, r: usize, s: usize) -> (*const i8, *const f32, *const f32) {
        let i = r * self.l.full + s;
        (
            self.q.as_ptr().wrapping_add(i * SPAN),
            self.dg.as_ptr().wrapping_add(i * 16),
            self.sg.as_ptr().wrapping_add(i * 16),
        )
    }

    /// Tail pack `t`: quants, group scales, group sums.
    #[inline(always)]
    pub(crate) fn pack(&self, t: usize) -> (*const i8, *const f32, *const f32) {
        (
            self.tq.as_ptr().wrapping_add(t * SPAN),
            self.tdg.as_ptr().wrapping_add(t * 16),
            self.tsg.as_ptr().wrapping_add(t * 16),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_transpose_matches_the_word_reference() {
        let mut a: Vec<u8> = (0..SPAN).map(|i| (i * 37 % 251) as u8).collect();
        let mut b = a.clone();
        span_transpose(&mut a);
        span_transpose_words(&mut b);
        assert_eq!(a, b);
        // Byte 64t + 4g + j holds value 16g + 4t + j.
        let orig: Vec<u8> = (0..SPAN).map(|i| (i * 37 % 251) as u8).collect();
        for (t, g, j) in
            (0..4).flat_map(|t| (0..16).flat_map(move |g| (0..4).map(move |j| (t, g, j))))
        {
            assert_eq!(a[64 * t + 4 * g + j], orig[16 * g + 4 * t + j]);
        }
    }
}
