//! Views resolved to integers at launch, and the loaders that read a block of logical
//! elements through them.
//!
//! Every expression of a view (dims, strides, offset, mask window, validity factor) is
//! compiled once at compile time over the graph's dynamic dims, and evaluated into plain
//! `i64`s before each run, so the per-element work is integer adds only.

use crate::storage::BufRef;
use luminal::shape::CompiledExpression;
use luminal::{Expression, LuminalError, Result, ShapeTracker};

/// Most dynamic dims a graph may use (their values live in a fixed array, to keep launches
/// allocation-free).
pub const MAX_DYN_DIMS: usize = 31;

/// Views whose last dim is at most this long load f32 data row by row with O(1) work per
/// row (`ResolvedView::load_short_rows`).
const SHORT_ROW: i64 = 8;

/// Values of the dynamic dims, in the order of [`DimNames`].
pub type DimValues = [i64; MAX_DYN_DIMS + 1];

/// The names of the graph's dynamic dims, in the order their values are passed to compiled
/// expressions (slot 0 is reserved for the flat index `z`).
#[derive(Clone, Debug, Default)]
pub struct DimNames(pub Vec<String>);

impl DimNames {
    /// Compiles `e` over `[z, dims...]`.
    pub fn compile(&self, e: &Expression) -> Result<CompiledExpression> {
        let mut vars: Vec<&str> = vec!["z"];
        vars.extend(self.0.iter().map(|s| s.as_str()));
        e.compile(&vars)
            .map_err(|e| LuminalError::Expression(e.to_string()))
    }

    /// The slot of [`DimValues`] that variable `name` is read from in compiled expressions.
    pub fn slot(&self, name: &str) -> Option<usize> {
        if name == "z" {
            return Some(0);
        }
        self.0.iter().position(|n| n == name).map(|i| i + 1)
    }
}

/// An expression evaluated with the current dim values (z = 0).
pub fn eval(e: &CompiledExpression, dims: &DimValues) -> Result<i64> {
    e.eval(dims)
        .map_err(|e| LuminalError::Expression(e.to_string()))
}

/// An expression evaluated at every launch: most are constants, which skip the
/// interpreter (a decode step resolves thousands of view expressions).
#[derive(Clone, Debug)]
pub enum LaunchExpr {
    Const(i64),
    Compiled(CompiledExpression),
}

impl LaunchExpr {
    pub fn new(e: &Expression, names: &DimNames) -> Result<LaunchExpr> {
        Ok(match e.as_constant() {
            Some(c) => LaunchExpr::Const(c),
            None => LaunchExpr::Compiled(names.compile(e)?),
        })
    }

    #[inline]
    pub fn eval(&self, dims: &DimValues) -> Result<i64> {
        match self {
            LaunchExpr::Const(c) => Ok(*c),
            LaunchExpr::Compiled(e) => eval(e, dims),
        }
    }
}

/// A view's expressions, compiled.
#[derive(Clone, Debug)]
pub struct ViewExprs {
    dims: Vec<LaunchExpr>,
    strides: Vec<LaunchExpr>,
    offset: LaunchExpr,
    lo: Vec<LaunchExpr>,
    hi: Vec<LaunchExpr>,
    /// Validity at the window's low corner: captures the view's index-independent factor.
    valid: LaunchExpr,
    masked: bool,
    /// Every expression is a constant: the resolved view is the same at every launch (so
    /// its gather table is built once).
    fixed: bool,
    /// The dim slots (bit `i`: slot `i` of [`DimValues`]) its expressions read: a launch
    /// whose values of those slots are the last resolve's reuses its result.
    reads: u32,
    /// The symbolic view itself (fusion passes match patterns on it).
    pub view: ShapeTracker,
}

/// A view with every expression evaluated.
#[derive(Clone, Debug, Default)]
pub struct ResolvedView {
    pub dims: Vec<i64>,
    pub strides: Vec<i64>,
    pub offset: i64,
    pub lo: Vec<i64>,
    pub hi: Vec<i64>,
    /// False when the view reads only padding.
    pub any_valid: bool,
    pub masked: bool,
    /// Identity over the buffer: element z reads buffer element z.
    pub contiguous: bool,
    /// Unmasked row-major: element z reads buffer element `offset + z`.
    pub linear: bool,
    /// Offsets of the view's trailing elements, for views that [`ResolvedView::load`]
    /// would otherwise walk a few elements at a time (built once for fixed views).
    pub table: Option<std::sync::Arc<GatherTable>>,
    /// The dim values (those its expressions read; the others 0) it was last resolved
    /// with, if any.
    resolved_for: Option<DimValues>,
}

impl ViewExprs {
    pub fn new(view: &ShapeTracker, names: &DimNames) -> Result<ViewExprs> {
        let c = |e: &Expression| LaunchExpr::new(e, names);
        let mask = view.mask();
        let lo_exprs: Vec<Expression> = mask.iter().map(|(l, _)| l.max(0)).collect();
        let constant = |e: &Expression| e.as_constant().is_some();
        let fixed = view.dims().iter().all(constant)
            && view.strides().iter().all(constant)
            && constant(&view.offset())
            && mask.iter().all(|(l, h)| constant(l) && constant(h))
            && constant(&view.valid_expression_nd(&lo_exprs));
        let mut reads = 0u32;
        let exprs = view
            .dims()
            .into_iter()
            .chain(view.strides())
            .chain([view.offset(), view.valid_expression_nd(&lo_exprs)])
            .chain(mask.iter().flat_map(|(l, h)| [l.clone(), h.clone()]));
        for e in exprs {
            for v in e.variables() {
                match names.slot(&v) {
                    Some(i) if i <= MAX_DYN_DIMS => reads |= 1 << i,
                    // An unknown name fails to compile below; no caching regardless.
                    _ => reads = u32::MAX,
                }
            }
        }
        Ok(ViewExprs {
            fixed,
            reads,
            dims: view.dims().iter().map(c).collect::<Result<_>>()?,
            strides: view.strides().iter().map(c).collect::<Result<_>>()?,
            offset: c(&view.offset())?,
            lo: mask.iter().map(|(l, _)| c(l)).collect::<Result<_>>()?,
            hi: mask.iter().map(|(_, h)| c(h)).collect::<Result<_>>()?,
            valid: c(&view.valid_expression_nd(&lo_exprs))?,
            masked: view.is_masked(),
            view: view.clone(),
        })
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Evaluates into `out` (whose vectors already have the view's rank: no allocation).
    pub fn resolve(&self, dims: &DimValues, out: &mut ResolvedView) -> Result<()> {
        let mut key = [0i64; MAX_DYN_DIMS + 1];
        for (i, k) in key.iter_mut().enumerate() {
            if self.reads >> i & 1 == 1 {
                *k = dims[i];
            }
        }
        if out.resolved_for == Some(key) {
            return Ok(());
        }
        out.resolved_for = None;
        let r = self.rank();
        out.dims.resize(r, 0);
        out.strides.resize(r, 0);
        out.lo.resize(r, 0);
        out.hi.resize(r, 0);
        for i in 0..r {
            out.dims[i] = self.dims[i].eval(dims)?;
            out.strides[i] = self.strides[i].eval(dims)?;
            out.lo[i] = self.lo[i].eval(dims)?.max(0);
            out.hi[i] = self.hi[i].eval(dims)?.min(out.dims[i]);
        }
        out.offset = self.offset.eval(dims)?;
        out.masked = self.masked;
        let windows_nonempty = (0..r).all(|i| out.lo[i] < out.hi[i]);
        out.any_valid = !self.masked || (windows_nonempty && self.valid.eval(dims)? != 0);
        let mut expected = 1i64;
        let mut row_major = true;
        for i in (0..r).rev() {
            if out.dims[i] != 1 && out.strides[i] != expected {
                row_major = false;
            }
            expected *= out.dims[i];
        }
        out.linear = !self.masked && row_major;
        out.contiguous = out.linear && out.offset == 0;
        if !self.fixed {
            out.table = None;
        } else if out.table.is_none() && !out.linear && out.any_valid {
            out.table = GatherTable::of(out).map(std::sync::Arc::new);
        }
        out.resolved_for = Some(key);
        Ok(())
    }
}

/// Logical elements per gather table at most (16 KB of offsets).
const TABLE_MAX: i64 = 4096;

/// A view's trailing dims flattened into a table of buffer offsets: element `j` of each
/// outer index reads `base + offs[j]` (or padding where `offs[j]` is `i32::MIN`), so a
/// block loads with one gather per element whatever the view's shape (a convolution's
/// window copies and gradient pieces: runs of 2–3 elements, masks in the middle dims), and
/// the outer dims are walked once per table length.
#[derive(Debug)]
pub struct GatherTable {
    offs: Vec<i32>,
    offset: i64,
    /// The outer dims (row-major), their strides and valid windows.
    outer: Vec<(i64, i64, i64, i64)>,
    /// The table as pairs of adjacent values, where it is one (see [`Pairs`]).
    pairs: Option<Pairs>,
    /// `(a, b, stride)` where the table is a transpose: entry `i·b + j` reads offset
    /// `i + j·stride` (a row-major block read down its columns: a convolution's output
    /// permuted to channels first, a product's operand transposed), `a` and `b`
    /// multiples of 16. Whole rows of 16 load as register-transposed tiles.
    transpose: Option<(usize, usize, i64)>,
}

/// A table whose entries pair up (`2i`, `2i + 1`) into adjacent buffer values — both
/// (offsets `o`, `o + 1`), only the first or the second, or neither — loaded one 8-byte
/// gather per pair: gathers cost per lane, so pairs (a stride-2 convolution's gradient
/// pieces: runs of 2) load at twice the rate (AMD Zen 5: 0.17 against 0.35 ns a value).
/// A half-valid pair reads its neighbour too, masked off after the load: pairs are used
/// only where those neighbours lie in the buffer (`lo`, `hi`).
#[derive(Debug)]
struct Pairs {
    /// Offset of each pair's first value (of its second minus one where only that is
    /// valid; `lo` where neither is).
    first: Vec<i32>,
    /// Bit `j` (of word `j / 64`): entry `j` is valid. One word of slack at the end.
    valid: Vec<u64>,
    /// Least and greatest `first`: the pairs read offsets `lo ..= hi + 1`.
    lo: i32,
    hi: i32,
}

impl Pairs {
    /// `None` unless every pair is adjacent values or half (or all) padding: then half the
    /// lanes load the same values, whatever the share of padding.
    fn of(offs: &[i32]) -> Option<Pairs> {
        if offs.len() % 2 != 0 {
            return None;
        }
        let none = i32::MIN;
        let mut first = Vec::with_capacity(offs.len() / 2);
        for pair in offs.chunks_exact(2) {
            first.push(match (pair[0], pair[1]) {
                (a, b) if a != none && b != none => {
                    if a.checked_add(1) != Some(b) {
                        return None;
                    }
                    a
                }
                (a, _) if a != none => a,
                (_, b) if b != none => b.checked_sub(1).filter(|&f| f != none)?,
                _ => none,
            });
        }
        let read = first.iter().filter(|&&o| o != none);
        let (lo, hi) = (*read.clone().min()?, *read.max()?);
        hi.checked_add(1)?;
        for o in &mut first {
            if *o == none {
                *o = lo;
            }
        }
        let mut valid = vec![0u64; offs.len() / 64 + 2];
        for (j, &o) in offs.iter().enumerate() {
            if o != none {
                valid[j / 64] |= 1 << (j % 64);
            }
        }
        Some(Pairs {
            first,
            valid,
            lo,
            hi,
        })
    }

    /// Validity bits of entries `j .. j + 16`.
    #[inline(always)]
    fn mask16(&self, j: usize) -> u16 {
        let (w, b) = (j / 64, j % 64);
        let bits = if b == 0 {
            self.valid[w]
        } else {
            self.valid[w] >> b | self.valid[w + 1] << (64 - b)
        };
        bits as u16
    }
}

impl GatherTable {
    /// The table of a resolved view whose rows are short or strided (long contiguous rows
    /// already load as copies), when its offsets fit in `i32`.
    fn of(v: &ResolvedView) -> Option<GatherTable> {
        let f = Flat::of(v)?;
        let last = f.r - 1;
        let (d, st) = (f.dims[last], f.strides[last]);
        // Long contiguous rows (masked or not) load as row copies, long unmasked broadcast
        // rows as fills.
        if d >= 32 && (st == 1 || st == 0 && !f.masked) {
            return None;
        }
        // The longest run of trailing dims that fits the table.
        let mut s = f.r;
        let mut len = 1i64;
        while s > 0 && len * f.dims[s - 1] <= TABLE_MAX {
            len *= f.dims[s - 1];
            s -= 1;
        }
        if s == f.r || len < 16 {
            return None;
        }
        let mut offs = Vec::with_capacity(len as usize);
        let mut idx = [0i64; MAX_FLAT_RANK];
        for _ in 0..len {
            let mut off = 0i64;
            let mut ok = true;
            for i in s..f.r {
                off += idx[i] * f.strides[i];
                ok &= idx[i] >= f.lo[i] && idx[i] < f.hi[i];
            }
            if ok {
                offs.push(i32::try_from(off).ok().filter(|&o| o != i32::MIN)?);
            } else {
                offs.push(i32::MIN);
            }
            let mut i = f.r;
            while i > s {
                i -= 1;
                idx[i] += 1;
                if idx[i] < f.dims[i] {
                    break;
                }
                idx[i] = 0;
            }
        }
        let transpose = (f.r - s == 2
            && f.strides[s] == 1
            && f.strides[s + 1] >= 16
            && f.dims[s] % 16 == 0
            && f.dims[s + 1] % 16 == 0
            && (s..f.r).all(|i| f.lo[i] == 0 && f.hi[i] == f.dims[i]))
        .then(|| (f.dims[s] as usize, f.dims[s + 1] as usize, f.strides[s + 1]));
        Some(GatherTable {
            transpose,
            pairs: Pairs::of(&offs),
            offs,
            offset: f.offset,
            outer: (0..s)
                .map(|i| (f.dims[i], f.strides[i], f.lo[i], f.hi[i]))
                .collect(),
        })
    }

    /// Loads logical elements `z0 .. z0 + out.len()` of the view from `v`.
    fn load(&self, v: &[f32], z0: usize, out: &mut [f32]) {
        let p = self.offs.len();
        let mut z = z0;
        let mut pos = 0;
        while pos < out.len() {
            let (q, j0) = (z / p, z % p);
            let take = (p - j0).min(out.len() - pos);
            let dst = &mut out[pos..pos + take];
            // Base and validity of outer index `q`.
            let (mut base, mut ok, mut rem) = (self.offset, true, q as i64);
            for &(d, st, lo, hi) in self.outer.iter().rev() {
                let c = rem % d;
                rem /= d;
                base += c * st;
                ok &= c >= lo && c < hi;
            }
            if !ok {
                dst.fill(0.0);
            } else if !self.load_pairs(v, base, j0, dst) && !self.load_transposed(v, base, j0, dst)
            {
                gather(v, base, &self.offs[j0..j0 + take], dst);
            }
            pos += take;
            z += take;
        }
    }
}

impl GatherTable {
    /// Entries `j0 ..` of the table (`dst.len()` of them) at `base`, by pairs (see
    /// [`Pairs`]); false (nothing written) where the table has no pairs, the ISA no
    /// 8-byte gathers, or a half-valid pair's neighbour may lie outside `v`.
    fn load_pairs(&self, v: &[f32], base: i64, j0: usize, dst: &mut [f32]) -> bool {
        let Some(pr) = &self.pairs else {
            return false;
        };
        let inside = base + pr.lo as i64 >= 0 && base + (pr.hi as i64) + 1 < v.len() as i64;
        #[cfg(target_arch = "x86_64")]
        if inside && crate::simd::isa() == crate::simd::Isa::Avx512 {
            // SAFETY: AVX-512 is allowed; every pair reads `base + first .. + 2`, inside
            // `v` (`lo` and `hi` bound `first`, checked above).
            unsafe { load_pairs_avx512(v, base, pr, j0, dst) };
            return true;
        }
        let _ = inside;
        false
    }
}

impl GatherTable {
    /// Entries `j0 ..` of a transposing table ([`GatherTable::transpose`]) at `base` as
    /// 16 × 16 tiles transposed in registers, where they are whole groups of 16 rows
    /// (false, nothing written, elsewhere and without AVX-512).
    fn load_transposed(&self, v: &[f32], base: i64, j0: usize, dst: &mut [f32]) -> bool {
        let Some((a, b, sb)) = self.transpose else {
            return false;
        };
        let rows = 16 * b;
        let whole = j0 % rows == 0 && dst.len() % rows == 0 && j0 + dst.len() <= a * b;
        #[cfg(target_arch = "x86_64")]
        if whole && crate::simd::isa() == crate::simd::Isa::Avx512 {
            let i0 = j0 / b;
            for ti in (0..dst.len() / b).step_by(16) {
                for tj in (0..b).step_by(16) {
                    let at = base + (i0 + ti) as i64 + tj as i64 * sb;
                    // SAFETY: AVX-512 is allowed; the table has no padding, and every value
                    // it reads lies in `v` (the view was bounds-checked); the tile's rows
                    // lie in `dst` (whole rows of 16, `b` apart).
                    unsafe {
                        crate::simd::transpose::tile_avx512(
                            v.as_ptr().offset(at as isize),
                            sb as usize,
                            dst.as_mut_ptr().add(ti * b + tj),
                            b,
                        )
                    };
                }
            }
            return true;
        }
        let _ = whole;
        false
    }
}

/// [`GatherTable::load_pairs`] on AVX-512: 8 pairs (16 values) a gather, masked by the
/// entries' validity; an odd first entry and a short tail element by element.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn load_pairs_avx512(v: &[f32], base: i64, pr: &Pairs, j0: usize, dst: &mut [f32]) {
    use std::arch::x86_64::*;
    // `base` may lie before the buffer (padding first): only `base + first` is read.
    let ptr = v.as_ptr().wrapping_offset(base as isize) as *const i64;
    let one = |j: usize| -> f32 {
        if pr.valid[j / 64] >> (j % 64) & 1 == 0 {
            0.0
        } else {
            // The entry's offset: its pair's first, plus one for a second entry (whose
            // pair's first is its offset − 1 whether or not the first entry is valid).
            *v.as_ptr()
                .offset((base + pr.first[j / 2] as i64) as isize + (j % 2) as isize)
        }
    };
    let (n, mut k) = (dst.len(), 0);
    if j0 % 2 == 1 && n > 0 {
        dst[0] = one(j0);
        k = 1;
    }
    while k + 16 <= n {
        let j = j0 + k;
        let idx = _mm256_loadu_si256(pr.first.as_ptr().add(j / 2) as *const __m256i);
        let x = _mm512_i32gather_epi64::<4>(idx, ptr);
        let x = _mm512_maskz_mov_ps(pr.mask16(j), _mm512_castsi512_ps(x));
        _mm512_storeu_ps(dst.as_mut_ptr().add(k), x);
        k += 16;
    }
    while k < n {
        dst[k] = one(j0 + k);
        k += 1;
    }
}

/// `out[j] = v[base + offs[j]]`, or 0 where `offs[j]` is `i32::MIN`. Every index read
/// lies in `v` (the view was bounds-checked).
fn gather(v: &[f32], base: i64, offs: &[i32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa() == crate::simd::Isa::Avx512 {
        // SAFETY: AVX-512 is allowed (the ISA level never exceeds the detected one); the
        // indices read were bounds-checked with the view.
        unsafe { gather_avx512(v, base, offs, out) };
        return;
    }
    for (o, &off) in out.iter_mut().zip(offs) {
        *o = if off == i32::MIN {
            0.0
        } else {
            v[(base + off as i64) as usize]
        };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gather_avx512(v: &[f32], base: i64, offs: &[i32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = out.len();
    let ptr = v.as_ptr().wrapping_offset(base as isize);
    let invalid = _mm512_set1_epi32(i32::MIN);
    let mut j = 0;
    while j + 16 <= n {
        let idx = _mm512_loadu_si512(offs.as_ptr().add(j) as *const _);
        let m = _mm512_cmpneq_epi32_mask(idx, invalid);
        let x = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), m, idx, ptr);
        _mm512_storeu_ps(out.as_mut_ptr().add(j), x);
        j += 16;
    }
    for k in j..n {
        let off = offs[k];
        out[k] = if off == i32::MIN {
            0.0
        } else {
            v[(base + off as i64) as usize]
        };
    }
}

impl ResolvedView {
    /// Largest buffer index any valid element reads, or `None` when none is read; used to
    /// check views against buffer lengths once per launch.
    pub fn max_index(&self) -> Option<i64> {
        if !self.any_valid || self.dims.iter().any(|&d| d <= 0) {
            return None;
        }
        let mut m = self.offset;
        for i in 0..self.dims.len() {
            let (lo, hi) = if self.masked {
                (self.lo[i], self.hi[i] - 1)
            } else {
                (0, self.dims[i] - 1)
            };
            m += if self.strides[i] >= 0 {
                hi * self.strides[i]
            } else {
                lo * self.strides[i]
            };
        }
        Some(m)
    }

    /// Smallest buffer index a valid element reads.
    pub fn min_index(&self) -> Option<i64> {
        if !self.any_valid || self.dims.iter().any(|&d| d <= 0) {
            return None;
        }
        let mut m = self.offset;
        for i in 0..self.dims.len() {
            let (lo, hi) = if self.masked {
                (self.lo[i], self.hi[i] - 1)
            } else {
                (0, self.dims[i] - 1)
            };
            m += if self.strides[i] >= 0 {
                lo * self.strides[i]
            } else {
                hi * self.strides[i]
            };
        }
        Some(m)
    }

    /// Checks every valid element lies inside a buffer of `len` elements.
    pub fn check_bounds(&self, len: usize) -> Result<()> {
        match (self.min_index(), self.max_index()) {
            (Some(lo), Some(hi)) if lo < 0 || hi >= len as i64 => Err(LuminalError::Backend(
                format!("view reads elements {lo}..={hi} of a buffer of {len}"),
            )),
            _ => Ok(()),
        }
    }

    /// Where logical elements `z0 .. z0 + n` lie in the buffer when they are one contiguous
    /// run (so a kernel can read them in place): a linear view, or an unmasked view whose
    /// trailing dims are row-major with a unit last stride (its contiguous suffix: a mask
    /// `[t, t]` broadcast over batch and heads is one run of `t·t`) and whose block does not
    /// cross a run of that suffix. `check_bounds` must have passed for the buffer.
    #[inline]
    pub fn direct_start(&self, z0: usize, n: usize) -> Option<usize> {
        if self.linear {
            return Some((self.offset + z0 as i64) as usize);
        }
        let r = self.dims.len();
        if self.masked || r == 0 || self.strides[r - 1] != 1 || n == 0 {
            return None;
        }
        // The contiguous suffix: dims `j..r`, `run` elements.
        let (mut j, mut run) = (r - 1, self.dims[r - 1]);
        while j > 0 && self.strides[j - 1] == run {
            j -= 1;
            run *= self.dims[j];
        }
        let mut rem = z0 as i64;
        let c0 = rem % run;
        if c0 + n as i64 > run {
            return None;
        }
        let mut base = self.offset + c0;
        rem /= run;
        for i in (0..j).rev() {
            base += (rem % self.dims[i]) * self.strides[i];
            rem /= self.dims[i];
        }
        Some(base as usize)
    }

    /// Loads logical elements `z0 .. z0 + out.len()` into `out` (padding reads 0).
    pub fn load(&self, buf: BufRef<'_>, z0: usize, out: &mut [f32]) {
        let n = out.len();
        if n == 0 {
            return;
        }
        if self.contiguous {
            buf.copy_to_f32(z0, out);
            return;
        }
        if !self.any_valid {
            out.fill(0.0);
            return;
        }
        if self.dims.is_empty() {
            out[0] = buf.get_f32(self.offset as usize);
            return;
        }
        if let (Some(t), BufRef::F32(v)) = (&self.table, buf) {
            t.load(v, z0, out);
            return;
        }
        match Flat::of(self) {
            Some(f) => f.load(buf, z0, out),
            // Rare deep views: element-wise path.
            None => {
                for (j, o) in out.iter_mut().enumerate() {
                    *o = self.load_one(buf, z0 + j);
                }
            }
        }
    }
    /// One logical element (slow path for very deep views).
    pub fn load_one(&self, buf: BufRef<'_>, z: usize) -> f32 {
        let mut rem = z as i64;
        let mut phys = self.offset;
        let mut valid = self.any_valid;
        for i in (0..self.dims.len()).rev() {
            let c = rem % self.dims[i];
            rem /= self.dims[i];
            phys += c * self.strides[i];
            if self.masked && (c < self.lo[i] || c >= self.hi[i]) {
                valid = false;
            }
        }
        if valid {
            buf.get_f32(phys as usize)
        } else {
            0.0
        }
    }
}

/// Most dims a view may have for the block loaders (deeper views load element by element).
const MAX_FLAT_RANK: usize = 16;

/// A resolved view simplified for loading (same logical order, same elements): size-1 dims
/// dropped, and adjacent dims merged where the outer one steps over the whole inner one and
/// the inner one is not masked. Autograd's scatters and conv windows come with trailing
/// size-1 dims and split rows; merged, the loaders walk fewer and longer rows.
#[derive(Clone, Copy, Debug)]
struct Flat {
    r: usize,
    dims: [i64; MAX_FLAT_RANK],
    strides: [i64; MAX_FLAT_RANK],
    lo: [i64; MAX_FLAT_RANK],
    hi: [i64; MAX_FLAT_RANK],
    offset: i64,
    masked: bool,
}

impl Flat {
    /// `None` when the view is deeper than `MAX_FLAT_RANK` (after simplification). The view
    /// must have some valid element (`any_valid`), so every mask window is non-empty.
    #[inline]
    fn of(v: &ResolvedView) -> Option<Flat> {
        let mut f = Flat {
            r: 0,
            dims: [0; MAX_FLAT_RANK],
            strides: [0; MAX_FLAT_RANK],
            lo: [0; MAX_FLAT_RANK],
            hi: [0; MAX_FLAT_RANK],
            offset: v.offset,
            masked: false,
        };
        for i in 0..v.dims.len() {
            let (d, s) = (v.dims[i], v.strides[i]);
            let (lo, hi) = if v.masked { (v.lo[i], v.hi[i]) } else { (0, d) };
            if d == 1 {
                // Its one index is valid (any_valid): it moves nothing.
                continue;
            }
            let full = lo == 0 && hi == d;
            if f.r > 0 && full && f.strides[f.r - 1] == s * d {
                let t = f.r - 1;
                f.dims[t] *= d;
                f.strides[t] = s;
                f.lo[t] *= d;
                f.hi[t] *= d;
                continue;
            }
            if f.r == MAX_FLAT_RANK {
                return None;
            }
            f.dims[f.r] = d;
            f.strides[f.r] = s;
            f.lo[f.r] = lo;
            f.hi[f.r] = hi;
            f.r += 1;
        }
        if f.r == 0 {
            f.dims[0] = 1;
            f.hi[0] = 1;
            f.r = 1;
        }
        f.masked = (0..f.r).any(|i| f.lo[i] != 0 || f.hi[i] != f.dims[i]);
        Some(f)
    }

    fn load(&self, buf: BufRef<'_>, z0: usize, out: &mut [f32]) {
        let n = out.len();
        let r = self.r;
        // Odometer over the logical index, one run along the last dim at a time.
        let mut idx = [0i64; MAX_FLAT_RANK];
        let mut rem = z0 as i64;
        for i in (0..r).rev() {
            idx[i] = rem % self.dims[i];
            rem /= self.dims[i];
        }
        let last = r - 1;
        if let (BufRef::F32(v), true) = (buf, self.dims[last] <= SHORT_ROW) {
            self.load_short_rows(v, idx, out);
            return;
        }
        let (s, d) = (self.strides[last], self.dims[last]);
        let (lo, hi) = (self.lo[last], self.hi[last]);
        let mut pos = 0usize;
        while pos < n {
            let run = ((d - idx[last]) as usize).min(n - pos);
            let dst = &mut out[pos..pos + run];
            let mut row_valid = true;
            let mut base = self.offset;
            for i in 0..last {
                base += idx[i] * self.strides[i];
                if self.masked && (idx[i] < self.lo[i] || idx[i] >= self.hi[i]) {
                    row_valid = false;
                }
            }
            if !row_valid {
                dst.fill(0.0);
            } else {
                let c0 = idx[last];
                // The valid part of this run along the last dim.
                let (vlo, vhi) = if self.masked {
                    (
                        (lo - c0).clamp(0, run as i64),
                        (hi - c0).clamp(0, run as i64),
                    )
                } else {
                    (0, run as i64)
                };
                let (vlo, vhi) = (vlo as usize, vhi.max(vlo) as usize);
                dst[..vlo].fill(0.0);
                dst[vhi..].fill(0.0);
                let start = base + (c0 + vlo as i64) * s;
                let seg = &mut dst[vlo..vhi];
                if seg.is_empty() {
                    // The run reads only padding (its start may lie outside the buffer).
                } else if s == 0 {
                    seg.fill(buf.get_f32(start as usize));
                } else if s == 1 {
                    buf.copy_to_f32(start as usize, seg);
                } else {
                    for (j, o) in seg.iter_mut().enumerate() {
                        *o = buf.get_f32((start + j as i64 * s) as usize);
                    }
                }
            }
            pos += run;
            idx[last] += run as i64;
            let mut i = last;
            while i > 0 && idx[i] >= self.dims[i] {
                idx[i] = 0;
                idx[i - 1] += 1;
                i -= 1;
            }
        }
    }

    /// `load` from f32 data when the last dim is short (an interleave, a stack along a new
    /// last axis, RoPE's pairs): runs along the last dim are a few elements, so rows are
    /// walked two dims at a time: along the second-to-last dim the row base just advances
    /// by its stride, and the outer dims' base and validity change only when it wraps.
    /// `idx` is the logical index of `out[0]`.
    fn load_short_rows(&self, v: &[f32], mut idx: [i64; MAX_FLAT_RANK], out: &mut [f32]) {
        let r = self.r;
        let last = r - 1;
        let d = self.dims[last] as usize;
        let s = self.strides[last];
        // Which positions of a row are valid along the last dim.
        let mut keep = [false; SHORT_ROW as usize];
        for (c, k) in keep.iter_mut().enumerate().take(d) {
            *k = !self.masked || (c as i64 >= self.lo[last] && (c as i64) < self.hi[last]);
        }
        let keep = &keep[..d];
        let single = (keep.iter().filter(|&&k| k).count() == 1)
            .then(|| keep.iter().position(|&k| k))
            .flatten();
        // The second-to-last dim (a length-1 dim when the view is 1-D).
        let (rd, rs, rlo, rhi) = if last > 0 {
            let i = last - 1;
            (self.dims[i], self.strides[i], self.lo[i], self.hi[i])
        } else {
            (1, 0, 0, 1)
        };
        let outer = last.saturating_sub(1);
        let n = out.len();
        let mut pos = 0usize;
        // A partial first row.
        let c0 = idx[last] as usize;
        let (mut base, mut ok) = self.outer_base(&idx, outer);
        let mut ri = if last > 0 { idx[last - 1] } else { 0 };
        if c0 > 0 {
            let row_ok = ok && (!self.masked || (ri >= rlo && ri < rhi));
            let b = base + ri * rs;
            let run = (d - c0).min(n);
            for (j, o) in out[..run].iter_mut().enumerate() {
                let c = c0 + j;
                *o = if row_ok && keep[c] {
                    v[(b + c as i64 * s) as usize]
                } else {
                    0.0
                };
            }
            pos = run;
            ri += 1;
        }
        while pos < n {
            if ri >= rd {
                // Wrap: advance the outer dims.
                ri = 0;
                let mut i = outer;
                while i > 0 {
                    i -= 1;
                    idx[i] += 1;
                    if idx[i] < self.dims[i] {
                        break;
                    }
                    idx[i] = 0;
                }
                (base, ok) = self.outer_base(&idx, outer);
            }
            // Whole rows along the second-to-last dim, while they fit.
            let rows = ((rd - ri) as usize).min((n - pos) / d);
            if rows == 0 {
                // A partial last row.
                let row_ok = ok && (!self.masked || (ri >= rlo && ri < rhi));
                let b = base + ri * rs;
                for (c, o) in out[pos..].iter_mut().enumerate() {
                    *o = if row_ok && keep[c] {
                        v[(b + c as i64 * s) as usize]
                    } else {
                        0.0
                    };
                }
                break;
            }
            let dst = &mut out[pos..pos + rows * d];
            let row_range = (ri.max(rlo), (ri + rows as i64).min(rhi));
            if let (0, Some(p), true) = (
                s,
                single,
                !self.masked || row_range == (ri, ri + rows as i64),
            ) {
                // A stacked piece: one valid position per row, the same value across it
                // (stride 0), every row valid.
                if ok {
                    let b = base + ri * rs;
                    for (q, row) in dst.chunks_exact_mut(d).enumerate() {
                        let x = v[(b + q as i64 * rs) as usize];
                        for (c, o) in row.iter_mut().enumerate() {
                            *o = if c == p { x } else { 0.0 };
                        }
                    }
                } else {
                    dst.fill(0.0);
                }
                pos += rows * d;
                ri += rows as i64;
                continue;
            }
            for (q, row) in dst.chunks_exact_mut(d).enumerate() {
                let i = ri + q as i64;
                if ok && (!self.masked || (i >= rlo && i < rhi)) {
                    let b = base + i * rs;
                    for (c, o) in row.iter_mut().enumerate() {
                        *o = if keep[c] {
                            v[(b + c as i64 * s) as usize]
                        } else {
                            0.0
                        };
                    }
                } else {
                    row.fill(0.0);
                }
            }
            pos += rows * d;
            ri += rows as i64;
        }
    }

    /// Base offset and validity of the first `k` dims at `idx`.
    #[inline]
    fn outer_base(&self, idx: &[i64; MAX_FLAT_RANK], k: usize) -> (i64, bool) {
        let (mut base, mut ok) = (self.offset, true);
        for (i, &c) in idx.iter().enumerate().take(k) {
            base += c * self.strides[i];
            ok &= !self.masked || (c >= self.lo[i] && c < self.hi[i]);
        }
        (base, ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A resolved view is reused only while the dims its expressions read keep their
    /// values: changing a dim it reads re-resolves it, changing one it does not read keeps
    /// the (still right) result.
    #[test]
    fn resolved_views_follow_the_dims_they_read() {
        let names = DimNames(vec!["s".into(), "p".into(), "unused".into()]);
        let (s, p) = (Expression::var("s"), Expression::var("p"));
        // A slice starting at row p of a [p + s + 4, 8] buffer: dims depend on s, the offset
        // on p.
        let mut view = ShapeTracker::new(vec![p.clone() + s.clone() + 4, Expression::from(8)]);
        view.slice(0, p.clone(), p.clone() + s.clone());
        let exprs = ViewExprs::new(&view, &names).unwrap();
        let mut out = ResolvedView::default();
        let mut dims = [0i64; MAX_DYN_DIMS + 1];
        let check = |out: &ResolvedView, s: i64, p: i64| {
            assert_eq!(out.dims, vec![s, 8], "s = {s}, p = {p}");
            assert_eq!(out.offset, p * 8, "s = {s}, p = {p}");
        };
        for (sv, pv, unused) in [
            (1, 0, 0),
            (1, 5, 0),
            (3, 5, 0),
            (3, 5, 9),
            (2, 7, 9),
            (2, 7, 1),
        ] {
            dims[1] = sv;
            dims[2] = pv;
            dims[3] = unused;
            exprs.resolve(&dims, &mut out).unwrap();
            check(&out, sv, pv);
        }
        // Only `s` and `p` are keys. A marked result survives a change of the unused dim
        // (reused, not re-evaluated) and is replaced when `p` changes.
        assert_eq!(exprs.reads, 0b110);
        out.offset = -1;
        dims[3] = 4;
        exprs.resolve(&dims, &mut out).unwrap();
        assert_eq!(
            out.offset, -1,
            "re-resolved although no dim it reads changed"
        );
        dims[2] = 11;
        exprs.resolve(&dims, &mut out).unwrap();
        check(&out, 2, 11);
    }

    /// Tables that pair up (`Pairs`: adjacent values, or half or all padding) load by
    /// 8-byte gathers: the same values as element loads, from odd starts and in short
    /// pieces, and where a half-valid pair's neighbour lies past the buffer's end (the
    /// buffer ends at the view's last value: those pieces load element by element).
    #[test]
    fn paired_tables_match_element_loads() {
        let view = |dims: Vec<i64>, strides: Vec<i64>, offset: i64, lo: Vec<i64>, hi: Vec<i64>| {
            let masked = lo
                .iter()
                .zip(&hi)
                .zip(&dims)
                .any(|((&l, &h), &d)| l != 0 || h != d);
            ResolvedView {
                any_valid: true,
                dims,
                strides,
                offset,
                lo,
                hi,
                masked,
                ..Default::default()
            }
        };
        let views = [
            // Whole pairs and rows of padding (a stride-2 convolution's gradient piece).
            view(
                vec![6, 5, 2],
                vec![40, 7, 1],
                0,
                vec![0, 1, 0],
                vec![6, 4, 2],
            ),
            // First values only (a stride-0 last dim cut to one).
            view(
                vec![6, 5, 2],
                vec![40, 7, 0],
                3,
                vec![0, 0, 0],
                vec![6, 5, 1],
            ),
            // Second values only.
            view(
                vec![6, 5, 2],
                vec![40, 7, 1],
                0,
                vec![0, 0, 1],
                vec![6, 5, 2],
            ),
            // A padded copy: rows of 8 between two padding values.
            view(vec![12, 10], vec![8, 1], -1, vec![0, 1], vec![12, 9]),
        ];
        let mut seed = 7u64;
        let mut next = |m: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m as u64) as usize
        };
        for (i, v) in views.iter().enumerate() {
            let t = GatherTable::of(v).expect("a gather table");
            assert!(t.pairs.is_some(), "view {i}: no pairs");
            let end = v.max_index().unwrap() as usize + 1;
            for len in [end, end + 5] {
                let buf: Vec<f32> = (0..len).map(|x| x as f32 + 0.25).collect();
                let n: usize = v.dims.iter().product::<i64>() as usize;
                let want: Vec<f32> = (0..n).map(|z| v.load_one(BufRef::F32(&buf), z)).collect();
                for _ in 0..20 {
                    let mut got = vec![f32::NAN; n];
                    let mut z = 0;
                    while z < n {
                        let take = (1 + next(40)).min(n - z);
                        t.load(&buf, z, &mut got[z..z + take]);
                        z += take;
                    }
                    assert_eq!(got, want, "view {i}, buffer of {len}");
                }
            }
        }
    }

    /// Transposing tables (a row-major block read down its columns) load whole groups of
    /// 16 rows as register-transposed tiles: the same values as element loads, in whole
    /// tables, in groups of rows, and in pieces that fall back to gathers.
    #[test]
    fn transposing_tables_match_element_loads() {
        // Three blocks of 48 rows of 40 values (32 read), read as [3, 32, 48].
        let v = ResolvedView {
            any_valid: true,
            dims: vec![3, 32, 48],
            strides: vec![2000, 1, 40],
            offset: 5,
            lo: vec![0, 0, 0],
            hi: vec![3, 32, 48],
            ..Default::default()
        };
        let t = GatherTable::of(&v).expect("a gather table");
        assert_eq!(t.transpose, Some((32, 48, 40)));
        let buf: Vec<f32> = (0..6100).map(|x| x as f32 - 7.5).collect();
        let n = 3 * 32 * 48;
        let want: Vec<f32> = (0..n).map(|z| v.load_one(BufRef::F32(&buf), z)).collect();
        for piece in [32 * 48, 3 * 32 * 48, 16 * 48, 48, 7] {
            let mut got = vec![f32::NAN; n];
            let mut z = 0;
            while z < n {
                let take = piece.min(n - z);
                t.load(&buf, z, &mut got[z..z + take]);
                z += take;
            }
            assert_eq!(got, want, "pieces of {piece}");
        }
    }

    /// `load` (the odometer and the short-row paths) against `load_one` element by element,
    /// on random masked, strided, broadcast views and random block boundaries.
    #[test]
    fn block_loads_match_element_loads() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |m: i64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m.max(1) as u64) as i64
        };
        let buf: Vec<f32> = (0..200_000).map(|i| i as f32 + 0.5).collect();
        let mut tables = 0;
        for case in 0..3000 {
            let r = 1 + next(if case % 3 == 0 { 6 } else { 4 }) as usize;
            let dims: Vec<i64> = (0..r)
                .map(|i| {
                    if i == r - 1 {
                        1 + next(9)
                    } else if next(4) == 0 {
                        1
                    } else {
                        1 + next(6)
                    }
                })
                .collect();
            // Every third case: strides that chain (row-major pieces, broadcasts), so the
            // loaders' dim merging and size-1 dropping are exercised.
            let strides: Vec<i64> = if case % 3 == 0 {
                let mut st = vec![0i64; r];
                let mut acc = 1 + next(3);
                for i in (0..r).rev() {
                    st[i] = if next(5) == 0 { 0 } else { acc };
                    acc *= dims[i] + next(2);
                }
                st
            } else {
                (0..r)
                    .map(|_| if next(4) == 0 { 0 } else { 1 + next(40) })
                    .collect()
            };
            let masked = case % 4 != 0;
            let (lo, hi): (Vec<i64>, Vec<i64>) = dims
                .iter()
                .map(|&d| {
                    if masked {
                        let a = next(d + 1);
                        (a, a + next(d - a + 1))
                    } else {
                        (0, d)
                    }
                })
                .unzip();
            let v = ResolvedView {
                any_valid: lo.iter().zip(&hi).all(|(l, h)| l < h),
                dims: dims.clone(),
                strides,
                offset: next(100),
                lo,
                hi,
                masked,
                contiguous: false,
                linear: false,
                table: None,
                resolved_for: None,
            };
            let n: usize = dims.iter().product::<i64>() as usize;
            let want: Vec<f32> = (0..n).map(|z| v.load_one(BufRef::F32(&buf), z)).collect();
            let mut got = vec![f32::NAN; n];
            let mut z = 0;
            while z < n {
                let len = (1 + next(n as i64) as usize).min(n - z);
                v.load(BufRef::F32(&buf), z, &mut got[z..z + len]);
                z += len;
            }
            assert_eq!(got, want, "case {case}: {v:?}");
            // The same view through its gather table, where it gets one.
            if v.any_valid {
                let mut vt = v.clone();
                vt.table = GatherTable::of(&vt).map(std::sync::Arc::new);
                if vt.table.is_some() {
                    tables += 1;
                    let mut got = vec![f32::NAN; n];
                    let mut z = 0;
                    while z < n {
                        let len = (1 + next(n as i64) as usize).min(n - z);
                        vt.load(BufRef::F32(&buf), z, &mut got[z..z + len]);
                        z += len;
                    }
                    assert_eq!(got, want, "case {case} (gather table): {v:?}");
                }
            }
        }
        assert!(
            tables > 300,
            "only {tables} random views got a gather table"
        );
        // Padding before the buffer's start: a [7, 3, 1] view whose first two rows are
        // padding (offset -6) merges into one masked dim, and a block of padding only must
        // not touch the buffer.
        let v = ResolvedView {
            dims: vec![7, 3, 1],
            strides: vec![3, 1, 1],
            offset: -6,
            lo: vec![2, 0, 0],
            hi: vec![7, 3, 1],
            any_valid: true,
            masked: true,
            contiguous: false,
            linear: false,
            table: None,
            resolved_for: None,
        };
        for z0 in 0..21 {
            for n in 1..=21 - z0 {
                let want: Vec<f32> = (z0..z0 + n)
                    .map(|z| v.load_one(BufRef::F32(&buf), z))
                    .collect();
                let mut got = vec![f32::NAN; n];
                v.load(BufRef::F32(&buf), z0, &mut got);
                assert_eq!(got, want, "z0 {z0} n {n}");
            }
        }
    }
}
