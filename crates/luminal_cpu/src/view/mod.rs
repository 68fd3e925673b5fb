//! Views resolved to integers at launch, and the loaders that read a block of logical
//! elements through them.
//!
//! Every expression of a view (dims, strides, offset, mask window, validity factor) is
//! compiled once at compile time over the graph's dynamic dims, and evaluated into plain
//! `i64`s before each run, so the per-element work is integer adds only.

use crate::storage::BufRef;
use luminal::shape::CompiledExpression;
use luminal::{Expression, LuminalError, Result, ShapeTracker};
pub use table::GatherTable;

/// Most dynamic dims a graph may use (their values live in a fixed array, to keep launches
/// allocation-free).
pub const MAX_DYN_DIMS: usize = 31;

/// Views whose last dim is at most this long load f32 data row by row with O(1) work per
/// row (`ResolvedView::load_short_rows`).
const SHORT_ROW: i64 = 8;

mod table;
#[cfg(test)]
mod tests;

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
