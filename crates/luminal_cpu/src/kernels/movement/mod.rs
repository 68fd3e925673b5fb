//! Direct kernels: ops whose work is moving data, not arithmetic, run as row copies instead
//! of the per-element fallback or the block interpreter.
//!
//! - **gather** (`Op::Gather`, embedding lookup): indices are read and range-checked first
//!   (the reference's `IndexOutOfRange`, nothing written on error), then whole table rows
//!   are copied (`copy_from_slice` when a row is contiguous), in parallel over indices;
//! - **iota**: an index expression affine in `z` (`arange`, strided offsets) is written as
//!   `start + z * step`; any other expression is evaluated per element, in parallel;
//! - **concat**: `concat` is built from pads and adds; an `Add` tree whose leaves are views
//!   masked along one common axis with windows that provably chain (`hi` of one is `lo` of
//!   the next) is copied piece by piece, one contiguous run per piece and outer index. If the
//!   windows overlap at run time (odd dims of a non-concat graph), an exact per-element path
//!   computes the sums as the reference does.
//!
//! The kernels are generic over the element type ([`Elem`]): a new storage variant needs one
//! `Elem` impl and one arm in [`with_elem!`].

pub(crate) mod write;

use crate::kernel::{BufId, CpuKernel, Fused, Kernel, RunCtx};
use crate::kernels::fused::task_len;
use crate::storage::{BufRef, Storage};
use crate::view::{DimNames, DimValues, LaunchExpr, ResolvedView, ViewExprs};
use luminal::graph::{Edge, GraphData, NodeId};
use luminal::op::{BinaryOp, Op};
use luminal::shape::CompiledExpression;
use luminal::{DType, Expression, LuminalError, Result};
use std::collections::HashMap;
use std::sync::Mutex;

pub(crate) use crate::storage::Elem;

/// Runs `$body` with `$o` bound to the output storage's data (a `&mut Vec<T>` of its element
/// type); the body calls generic code. The one place a new storage variant adds an arm.
macro_rules! with_elem {
    ($out:expr, |$o:ident| $body:expr) => {
        match $out {
            Storage::F32($o) => $body,
            Storage::F16($o) => $body,
            Storage::BF16($o) => $body,
            Storage::F64($o) => $body,
            Storage::Bytes(_) => unreachable!("no kernel writes a weight buffer"),
        }
    };
}

fn kind_error(what: &str) -> LuminalError {
    LuminalError::Backend(format!(
        "{what}: input and output buffers hold different element types"
    ))
}

impl CpuKernel for GatherKernel {
    fn reads(&self) -> Vec<BufId> {
        vec![self.table.buf, self.ids.buf]
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        self.table.buf = map(self.table.buf);
        self.ids.buf = map(self.ids.buf);
    }
    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        self.gather(cx.bufs, out, cx.n, cx.dims)
    }
    fn flops(&self, _n: usize) -> usize {
        0
    }
    fn weight_input(&self) -> Option<BufId> {
        self.weight.map(|_| self.table.buf)
    }
}

impl CpuKernel for IotaKernel {
    fn reads(&self) -> Vec<BufId> {
        vec![]
    }
    fn remap(&mut self, _map: &dyn Fn(BufId) -> BufId) {}
    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        with_elem!(out, |o| self.write(&mut o[..cx.n], cx.dims))
    }
    fn flops(&self, _n: usize) -> usize {
        0
    }
}

impl CpuKernel for ConcatKernel {
    fn reads(&self) -> Vec<BufId> {
        self.pieces.iter().map(|p| p.buf).collect()
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        self.pieces.iter_mut().for_each(|p| p.buf = map(p.buf));
    }
    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        self.concat(cx.bufs, out, cx.n, cx.dims)
    }
    fn flops(&self, _n: usize) -> usize {
        0
    }
}

/// The data-movement kernel for node `id` when one applies, with its name. Gather and Iota
/// always apply; an `Add` applies when it is a concatenation (see [`concat_kernel`]).
pub fn lower(
    g: &GraphData,
    id: NodeId,
    uses: &HashMap<NodeId, usize>,
    names: &DimNames,
) -> Result<Option<(String, Box<dyn CpuKernel>)>> {
    let node = g.node(id);
    Ok(match &node.op {
        Op::Gather if node.inputs[0].view.rank() == 2 => {
            let mut table = node.inputs[0].clone();
            // Rows of `w.dequantize()` for a quantized or half weight read whole: decoded
            // from the weight's blocks in place.
            let weight = crate::kernels::quant::dequantized_weight(g, &table).filter(|_| {
                table.view.is_contiguous() && table.view.dims() == g.node(table.node).shape
            });
            if let Some((w, _)) = weight {
                table.node = w;
            }
            let mut k = GatherKernel::new(&table, &node.inputs[1], names)?;
            k.weight = weight.map(|(_, dt)| dt);
            Some(("gather".into(), Box::new(k)))
        }
        Op::Iota { expr } => {
            let k = IotaKernel::new(expr, node.dtype, names)?;
            let name = if k.affine.is_some() {
                "iota(affine)"
            } else {
                "iota"
            };
            Some((name.into(), Box::new(k)))
        }
        Op::Binary(BinaryOp::Add) => concat_kernel(g, id, uses, names)?.map(|k| {
            (
                format!("concat({})", k.axis),
                Box::new(k) as Box<dyn CpuKernel>,
            )
        }),
        _ => None,
    })
}

/// Replaces the f32 elementwise kernels that are concatenations by direct concat kernels.
/// Runs after row fusion, so a concatenation merged into a row kernel stays there.
pub fn replace_concats(
    g: &GraphData,
    kernels: Vec<Kernel>,
    uses: &HashMap<NodeId, usize>,
    names: &DimNames,
) -> Result<Vec<Kernel>> {
    kernels
        .into_iter()
        .map(|mut k| {
            if matches!(k.kind.fused(), Some(Fused::Elementwise(_)))
                && g.node(k.node).op == Op::Binary(BinaryOp::Add)
            {
                if let Some(c) = concat_kernel(g, k.node, uses, names)?.filter(|c| !c.short_runs) {
                    k.name = format!("concat({})", c.axis);
                    k.kind = Box::new(c);
                }
            }
            Ok(k)
        })
        .collect()
}

// ---------------------------------------------------------------- reading through views

/// Fewest elements a parallel task of a copy kernel covers: below ~1 MiB a copy is over
/// before a pool hand-off pays (measured: a 300 KB gather ran 2-3x slower split in two).
const MIN_COPY_TASK: usize = 1 << 18;

/// Elements per parallel task of a copy of `n` elements made of `unit`-element pieces
/// (a multiple of `unit`).
fn copy_task_len(n: usize, unit: usize) -> usize {
    let unit = unit.max(1);
    let units = (n / unit).max(1);
    task_len(units, unit).max(MIN_COPY_TASK.div_ceil(unit)) * unit
}

/// Most dims a view may have for the odometer copies (deeper views go element by element).
const MAX_RANK: usize = 16;

/// A buffer read through a view: compiled expressions and their values for this launch.
#[derive(Clone, Debug)]
struct ViewInput {
    buf: BufId,
    exprs: ViewExprs,
    view: ResolvedView,
}

impl ViewInput {
    fn new(e: &Edge, names: &DimNames) -> Result<ViewInput> {
        Ok(ViewInput {
            buf: BufId::of(e.node),
            exprs: ViewExprs::new(&e.view, names)?,
            view: ResolvedView::default(),
        })
    }

    /// Evaluates the view for the current dims and checks it against its buffer.
    fn prepare(&mut self, dims: &DimValues, bufs: &[Storage]) -> Result<()> {
        self.exprs.resolve(dims, &mut self.view)?;
        self.view.check_bounds(bufs[self.buf].len())
    }
}

/// Buffer index of logical element `z` of `v`, or `None` where it reads padding.
#[inline]
fn element_at(v: &ResolvedView, z: usize) -> Option<usize> {
    if v.linear {
        return Some((v.offset + z as i64) as usize);
    }
    if !v.any_valid {
        return None;
    }
    let mut rem = z as i64;
    let mut phys = v.offset;
    for i in (0..v.dims.len()).rev() {
        // Dim 0 takes the rest (as `ShapeTracker::index_expression` does).
        let c = if i == 0 { rem } else { rem % v.dims[i] };
        rem /= v.dims[i].max(1);
        if v.masked && (c < v.lo[i] || c >= v.hi[i]) {
            return None;
        }
        phys += c * v.strides[i];
    }
    Some(phys as usize)
}

#[inline(always)]
fn put<T: Elem, const PLUS_ZERO: bool>(x: T) -> T {
    if PLUS_ZERO {
        x.plus_zero()
    } else {
        x
    }
}

/// Copies logical elements `z0 .. z0 + out.len()` of `v` from `src`, ignoring the view's
/// mask: the caller knows they are all valid (and `check_bounds` passed). `PLUS_ZERO`
/// applies [`Elem::plus_zero`] to each value.
fn copy_run<T: Elem, const PLUS_ZERO: bool>(v: &ResolvedView, src: &[T], z0: usize, out: &mut [T]) {
    let n = out.len();
    if n == 0 {
        return;
    }
    let r = v.dims.len();
    let unmasked_linear = v.linear || {
        // `linear` is false for masked views; their valid part may still be row-major.
        let mut expected = 1i64;
        (0..r).rev().all(|i| {
            let ok = v.dims[i] == 1 || v.strides[i] == expected;
            expected *= v.dims[i];
            ok
        })
    };
    if unmasked_linear {
        let start = (v.offset + z0 as i64) as usize;
        let s = &src[start..start + n];
        if PLUS_ZERO {
            out.iter_mut().zip(s).for_each(|(o, &x)| *o = x.plus_zero());
        } else {
            out.copy_from_slice(s);
        }
        return;
    }
    if r > MAX_RANK {
        for (j, o) in out.iter_mut().enumerate() {
            let mut rem = (z0 + j) as i64;
            let mut phys = v.offset;
            for i in (0..r).rev() {
                let c = if i == 0 { rem } else { rem % v.dims[i] };
                rem /= v.dims[i].max(1);
                phys += c * v.strides[i];
            }
            *o = put::<T, PLUS_ZERO>(src[phys as usize]);
        }
        return;
    }
    // Odometer over the logical index, one run along the last dim at a time.
    let mut idx = [0i64; MAX_RANK];
    let mut rem = z0 as i64;
    for i in (0..r).rev() {
        idx[i] = if i == 0 { rem } else { rem % v.dims[i] };
        rem /= v.dims[i].max(1);
    }
    let last = r - 1;
    let (s, d) = (v.strides[last], v.dims[last]);
    let mut pos = 0;
    while pos < n {
        let run = ((d - idx[last]) as usize).min(n - pos);
        let outer: i64 = idx[..last].iter().zip(&v.strides).map(|(i, s)| i * s).sum();
        let base = v.offset + outer + idx[last] * s;
        let dst = &mut out[pos..pos + run];
        if s == 1 {
            let b = base as usize;
            if PLUS_ZERO {
                dst.iter_mut()
                    .zip(&src[b..b + run])
                    .for_each(|(o, &x)| *o = x.plus_zero());
            } else {
                dst.copy_from_slice(&src[b..b + run]);
            }
        } else if s == 0 {
            dst.fill(put::<T, PLUS_ZERO>(src[base as usize]));
        } else {
            for (j, o) in dst.iter_mut().enumerate() {
                *o = put::<T, PLUS_ZERO>(src[(base + j as i64 * s) as usize]);
            }
        }
        pos += run;
        idx[last] += run as i64;
        let mut i = last;
        while i > 0 && idx[i] >= v.dims[i] {
            idx[i] = 0;
            idx[i - 1] += 1;
            i -= 1;
        }
    }
}

// ---------------------------------------------------------------- gather

/// `out[s, w] = table[ids[s], w]` for a `[rows, width]` table view.
#[derive(Debug)]
pub struct GatherKernel {
    table: ViewInput,
    ids: ViewInput,
    /// The table row of each index in this launch (grows to the largest count, then is
    /// reused: launches allocate nothing).
    picked: Vec<usize>,
    /// The table is a quantized or half weight whose rows are decoded (see `quant/`).
    weight: Option<luminal::DType>,
}

impl GatherKernel {
    fn new(table: &Edge, ids: &Edge, names: &DimNames) -> Result<GatherKernel> {
        Ok(GatherKernel {
            table: ViewInput::new(table, names)?,
            ids: ViewInput::new(ids, names)?,
            picked: vec![],
            weight: None,
        })
    }

    fn gather(
        &mut self,
        bufs: &[Storage],
        out: &mut Storage,
        n: usize,
        dims: &DimValues,
    ) -> Result<()> {
        self.table.prepare(dims, bufs)?;
        self.ids.prepare(dims, bufs)?;
        let rows = self.table.view.dims[0];
        let width = self.table.view.dims[1].max(0) as usize;
        if width == 0 || n == 0 {
            return Ok(());
        }
        let n_ids = n / width;
        // Read and check every index before writing anything (the reference's error, and
        // no partial output).
        self.picked.resize(n_ids, 0);
        let ids: BufRef = bufs[self.ids.buf].as_ref();
        for (s, slot) in self.picked.iter_mut().enumerate() {
            let id = match element_at(&self.ids.view, s) {
                Some(p) => ids.get_f64(p) as i64,
                None => 0,
            };
            if id < 0 || id >= rows {
                return Err(LuminalError::IndexOutOfRange {
                    op: "Gather".into(),
                    index: id,
                    size: rows,
                });
            }
            *slot = id as usize;
        }
        let (table, picked) = (&self.table, &self.picked[..]);
        if let Some(dtype) = self.weight {
            let w =
                crate::kernels::quant::WeightRef::of(&bufs[table.buf], dtype, rows as usize, width);
            let (Some(w), Storage::F32(o)) = (w, out) else {
                return Err(kind_error("gather of a weight"));
            };
            crate::kernels::quant::gather_rows(w, picked, &mut o[..n_ids * width]);
            return Ok(());
        }
        with_elem!(out, |o| gather_rows(
            table,
            bufs,
            picked,
            &mut o[..n_ids * width],
            width
        ))
    }
}

/// Copies table rows `picked[s]` into `out` (`picked.len()` rows of `width`), in parallel
/// over rows when there is enough data.
fn gather_rows<T: Elem>(
    table: &ViewInput,
    bufs: &[Storage],
    picked: &[usize],
    out: &mut [T],
    width: usize,
) -> Result<()> {
    let src = T::of(&bufs[table.buf]).ok_or_else(|| kind_error("gather"))?;
    let v = &table.view;
    // Whole rows are contiguous runs of the buffer: one `copy_from_slice` per row.
    let contiguous_rows = !v.masked && (v.strides[1] == 1 || width == 1);
    let rows_per_task = copy_task_len(out.len(), width) / width;
    crate::exec::par::for_each_chunk(out, rows_per_task * width, |t, chunk| {
        for (j, dst) in chunk.chunks_mut(width).enumerate() {
            let r = picked[t * rows_per_task + j];
            if contiguous_rows {
                let start = (v.offset + r as i64 * v.strides[0]) as usize;
                dst.copy_from_slice(&src[start..start + width]);
            } else {
                gather_row_strided(v, src, r, dst);
            }
        }
    });
    Ok(())
}

/// One row of a masked or strided table view; padding reads zero.
fn gather_row_strided<T: Elem>(v: &ResolvedView, src: &[T], r: usize, dst: &mut [T]) {
    let width = dst.len();
    let (r_i, w) = (r as i64, width as i64);
    let row_valid = v.any_valid && (!v.masked || (v.lo[0] <= r_i && r_i < v.hi[0]));
    if !row_valid {
        dst.fill(T::ZERO);
        return;
    }
    let (lo, hi) = if v.masked {
        (v.lo[1].clamp(0, w) as usize, v.hi[1].clamp(0, w) as usize)
    } else {
        (0, width)
    };
    let hi = hi.max(lo);
    dst[..lo].fill(T::ZERO);
    dst[hi..].fill(T::ZERO);
    copy_run::<T, false>(v, src, r * width + lo, &mut dst[lo..hi]);
}

// ---------------------------------------------------------------- iota

/// `out[z] = expr(z)`, rounded to the node's dtype.
#[derive(Clone, Debug)]
pub struct IotaKernel {
    dtype: DType,
    expr: CompiledExpression,
    /// `expr(z) = start + z * step` with `start`, `step` free of `z`.
    affine: Option<(LaunchExpr, LaunchExpr)>,
}

impl IotaKernel {
    fn new(expr: &Expression, dtype: DType, names: &DimNames) -> Result<IotaKernel> {
        let z = Expression::var("z");
        // Canonical forms make `expr(z + 1) - expr(z)` free of `z` exactly when the
        // expression is affine in `z` (no `/`, `%`, `min`, ... of z).
        let step = expr.substitute("z", &(z + 1)) - expr.clone();
        let affine = if step.variables().contains("z") {
            None
        } else {
            let start = expr.substitute("z", &Expression::zero());
            Some((
                LaunchExpr::new(&start, names)?,
                LaunchExpr::new(&step, names)?,
            ))
        };
        Ok(IotaKernel {
            dtype,
            expr: names.compile(expr)?,
            affine,
        })
    }

    fn write<T: Elem>(&self, out: &mut [T], dims: &DimValues) -> Result<()> {
        if out.is_empty() {
            // Like the reference, evaluate nothing (no expression error) for no elements.
            return Ok(());
        }
        let dt = self.dtype;
        let chunk = task_len(out.len(), 4);
        if let Some((start, step)) = &self.affine {
            let (start, step) = (start.eval(dims)?, step.eval(dims)?);
            crate::exec::par::for_each_chunk(out, chunk, |t, c| {
                let mut v = start.wrapping_add(((t * chunk) as i64).wrapping_mul(step));
                for o in c {
                    *o = T::from_f64(dt.round(v as f64));
                    v = v.wrapping_add(step);
                }
            });
            return Ok(());
        }
        let first_error: Mutex<Option<LuminalError>> = Mutex::new(None);
        crate::exec::par::for_each_chunk(out, chunk, |t, c| {
            let mut vars = *dims;
            for (j, o) in c.iter_mut().enumerate() {
                vars[0] = (t * chunk + j) as i64;
                match self.expr.eval(&vars) {
                    Ok(v) => *o = T::from_f64(dt.round(v as f64)),
                    Err(e) => {
                        if let Ok(mut slot) = first_error.lock() {
                            slot.get_or_insert(LuminalError::Expression(e.to_string()));
                        }
                        return;
                    }
                }
            }
        });
        match first_error.into_inner() {
            Ok(None) => Ok(()),
            Ok(Some(e)) => Err(e),
            Err(_) => Err(LuminalError::Backend("iota: a worker panicked".into())),
        }
    }
}

// ---------------------------------------------------------------- concat

/// One step of the `Add` tree in postfix order (for the exact path).
#[derive(Clone, Copy, Debug)]
enum TreeOp {
    Piece(usize),
    Add,
}

/// An `Add` tree of views masked along `axis` (a concatenation; see the module docs).
#[derive(Clone, Debug)]
pub struct ConcatKernel {
    axis: usize,
    dtype: DType,
    pieces: Vec<ViewInput>,
    tree: Vec<TreeOp>,
    /// Evaluation stack of the exact path (sized at compile time).
    stack: Vec<f64>,
    /// Some piece's runs (its window along the axis times the inner size) are known to be
    /// shorter than `SHORT_RUN` elements.
    short_runs: bool,
}

/// Concatenations with runs shorter than this (interleaves such as RoPE's pairs) stay in
/// the fused elementwise kernel, whose loader handles short rows with O(1) work per row;
/// the copy kernel's per-run setup would dominate.
const SHORT_RUN: i64 = 16;

/// Collects the pieces of the `Add` tree rooted at `id` (through single-use, identity-read
/// `Add`s of the same dtype) in postfix order.
fn collect_adds<'g>(
    g: &'g GraphData,
    id: NodeId,
    uses: &HashMap<NodeId, usize>,
    pieces: &mut Vec<&'g Edge>,
    tree: &mut Vec<TreeOp>,
) {
    let node = g.node(id);
    for e in &node.inputs {
        let p = g.node(e.node);
        let inner_add = p.op == Op::Binary(BinaryOp::Add)
            && p.dtype == node.dtype
            && uses.get(&e.node) == Some(&1)
            && !g.outputs.contains(&e.node)
            && e.view.is_contiguous()
            && e.view.n_elements() == p.shape.iter().product::<Expression>();
        if inner_add {
            collect_adds(g, e.node, uses, pieces, tree);
        } else {
            tree.push(TreeOp::Piece(pieces.len()));
            pieces.push(e);
        }
    }
    tree.push(TreeOp::Add);
}

/// `min(max(x, 0), dim)`: how a window bound is clamped at launch.
fn clamped(x: &Expression, dim: &Expression) -> Expression {
    Expression::min(&Expression::max(x, 0), dim.clone())
}

/// The concat kernel for the `Add` node `id`, when its tree is a concatenation: every leaf
/// is a view of the node's shape masked along one common axis only, and the windows along
/// it form one chain (each window's end is the next one's start, compared symbolically),
/// so they are disjoint for any dims.
fn concat_kernel(
    g: &GraphData,
    id: NodeId,
    uses: &HashMap<NodeId, usize>,
    names: &DimNames,
) -> Result<Option<ConcatKernel>> {
    let node = g.node(id);
    let (mut pieces, mut tree) = (vec![], vec![]);
    collect_adds(g, id, uses, &mut pieces, &mut tree);
    if pieces.len() < 2 {
        return Ok(None);
    }
    let mut axis = None;
    for e in &pieces {
        let dims = e.view.dims();
        if !e.view.is_masked() || dims != node.shape || g.node(e.node).dtype != node.dtype {
            return Ok(None);
        }
        for (i, (lo, hi)) in e.view.mask().iter().enumerate() {
            if lo.is_zero() && *hi == dims[i] {
                continue;
            }
            match axis {
                None => axis = Some(i),
                Some(a) if a == i => {}
                Some(_) => return Ok(None),
            }
        }
    }
    let Some(axis) = axis else {
        return Ok(None);
    };
    let dim = &node.shape[axis];
    let windows: Vec<(Expression, Expression)> =
        pieces.iter().map(|e| e.view.mask()[axis].clone()).collect();
    let meets = |a: usize, b: usize| {
        windows[a].1 == windows[b].0 || clamped(&windows[a].1, dim) == clamped(&windows[b].0, dim)
    };
    // Follow the chain from the piece no other piece ends at.
    let k = pieces.len();
    let Some(first) = (0..k).find(|&b| !(0..k).any(|a| a != b && meets(a, b))) else {
        return Ok(None);
    };
    let (mut at, mut seen) = (first, 1);
    while let Some(next) = (0..k).find(|&b| b != at && b != first && meets(at, b)) {
        at = next;
        seen += 1;
        if seen > k {
            return Ok(None);
        }
    }
    if seen != k {
        return Ok(None);
    }
    let inner: Expression = node.shape[axis + 1..].iter().product();
    let short_runs = windows.iter().any(|(lo, hi)| {
        let width = clamped(hi, dim) - clamped(lo, dim);
        (width * inner.clone())
            .as_constant()
            .is_some_and(|w| w < SHORT_RUN)
    });
    Ok(Some(ConcatKernel {
        short_runs,
        axis,
        dtype: node.dtype,
        pieces: pieces
            .iter()
            .map(|e| ViewInput::new(e, names))
            .collect::<Result<_>>()?,
        stack: Vec::with_capacity(tree.len()),
        tree,
    }))
}

/// The valid window of a piece along the axis, or `None` when it reads only padding.
#[inline]
fn window(v: &ResolvedView, axis: usize) -> Option<(i64, i64)> {
    (v.any_valid && v.lo[axis] < v.hi[axis]).then(|| (v.lo[axis], v.hi[axis]))
}

impl ConcatKernel {
    fn concat(
        &mut self,
        bufs: &[Storage],
        out: &mut Storage,
        n: usize,
        dims: &DimValues,
    ) -> Result<()> {
        for p in &mut self.pieces {
            p.prepare(dims, bufs)?;
        }
        if n == 0 {
            return Ok(());
        }
        let axis = self.axis;
        let v0 = &self.pieces[0].view;
        // Only the axis may be windowed, and the windows must not overlap (they chain
        // symbolically, so only dims giving a window a negative length break this).
        let other_dims_full = self.pieces.iter().all(|p| {
            (0..p.view.dims.len())
                .all(|i| i == axis || (p.view.lo[i] == 0 && p.view.hi[i] == p.view.dims[i]))
        });
        let disjoint = self.pieces.iter().enumerate().all(|(i, a)| {
            self.pieces[i + 1..].iter().all(|b| {
                match (window(&a.view, axis), window(&b.view, axis)) {
                    (Some((l0, h0)), Some((l1, h1))) => h0 <= l1 || h1 <= l0,
                    _ => true,
                }
            })
        });
        let shape = Segments {
            axis_len: v0.dims[axis].max(0) as usize,
            inner: v0.dims[axis + 1..].iter().product::<i64>().max(0) as usize,
        };
        let exact = !(other_dims_full && disjoint);
        let (pieces, tree, stack, dtype) = (&self.pieces, &self.tree, &mut self.stack, self.dtype);
        with_elem!(out, |o| {
            let o = &mut o[..n];
            if !same_kind(o, pieces, bufs) {
                return Err(kind_error("concat"));
            }
            if exact {
                concat_exact(pieces, tree, stack, dtype, bufs, o);
            } else {
                concat_copy(pieces, axis, shape, bufs, o);
            }
        });
        Ok(())
    }
}

/// Every piece's buffer holds the output's element type.
fn same_kind<T: Elem>(_out: &[T], pieces: &[ViewInput], bufs: &[Storage]) -> bool {
    pieces.iter().all(|p| T::of(&bufs[p.buf]).is_some())
}

/// Output layout around the concat axis: `[outer, axis_len, inner]`.
#[derive(Clone, Copy)]
struct Segments {
    axis_len: usize,
    inner: usize,
}

/// Disjoint windows: each output run is one piece's values (`+ 0`, as the adds compute) or
/// zeros; parallel over output chunks.
fn concat_copy<T: Elem>(
    pieces: &[ViewInput],
    axis: usize,
    s: Segments,
    bufs: &[Storage],
    out: &mut [T],
) {
    let row = s.axis_len * s.inner;
    if row == 0 {
        return;
    }
    let chunk = copy_task_len(out.len(), 1);
    crate::exec::par::for_each_chunk(out, chunk, |t, c| {
        let (z0, z1) = (t * chunk, t * chunk + c.len());
        let mut z = z0;
        while z < z1 {
            let row_start = z - z % row;
            let a = ((z - row_start) / s.inner) as i64;
            let covering = pieces.iter().find_map(|p| {
                window(&p.view, axis)
                    .filter(|&(lo, hi)| lo <= a && a < hi)
                    .map(|(_, hi)| (p, hi))
            });
            match covering {
                Some((p, hi)) => {
                    let end = z1.min(row_start + hi as usize * s.inner);
                    // Kinds were checked before the launch.
                    if let Some(src) = T::of(&bufs[p.buf]) {
                        copy_run::<T, true>(&p.view, src, z, &mut c[z - z0..end - z0]);
                    }
                    z = end;
                }
                None => {
                    // A gap (padding in every piece): zeros up to the next window.
                    let next = pieces
                        .iter()
                        .filter_map(|p| window(&p.view, axis))
                        .map(|(lo, _)| lo)
                        .filter(|&lo| lo > a)
                        .min()
                        .unwrap_or(s.axis_len as i64);
                    let end = z1.min(row_start + next as usize * s.inner);
                    c[z - z0..end - z0].fill(T::ZERO);
                    z = end;
                }
            }
        }
    });
}

/// Overlapping windows: the `Add` tree per element, each add rounded to the dtype as the
/// reference does (sequential; only odd non-concat graphs get here).
fn concat_exact<T: Elem>(
    pieces: &[ViewInput],
    tree: &[TreeOp],
    stack: &mut Vec<f64>,
    dtype: DType,
    bufs: &[Storage],
    out: &mut [T],
) {
    for (z, o) in out.iter_mut().enumerate() {
        stack.clear();
        for op in tree {
            match *op {
                TreeOp::Piece(k) => {
                    let p = &pieces[k];
                    let v = match (element_at(&p.view, z), T::of(&bufs[p.buf])) {
                        (Some(i), Some(src)) => src[i].to_f64(),
                        _ => 0.0,
                    };
                    stack.push(v);
                }
                TreeOp::Add => {
                    let b = stack.pop().unwrap_or(0.0);
                    let a = stack.pop().unwrap_or(0.0);
                    stack.push(dtype.round(BinaryOp::Add.apply(a, b, dtype)));
                }
            }
        }
        *o = T::from_f64(stack.pop().unwrap_or(0.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::MAX_DYN_DIMS;
    use luminal::ShapeTracker;

    /// A piece reading buffer `buf` through `view` (constant dims).
    fn piece(buf: u32, view: ShapeTracker) -> ViewInput {
        let mut p = ViewInput {
            buf: BufId(buf),
            exprs: ViewExprs::new(&view, &DimNames::default()).unwrap(),
            view: ResolvedView::default(),
        };
        p.exprs
            .resolve(&[0; MAX_DYN_DIMS + 1], &mut p.view)
            .unwrap();
        p
    }

    /// A `[3, 4]` view (of a `[3, 4]` buffer, or transposed of a `[4, 3]` one) padded
    /// along axis 1.
    fn padded(before: i64, after: i64, transposed: bool) -> ShapeTracker {
        let dims = if transposed { [4, 3] } else { [3, 4] };
        let mut v = ShapeTracker::new(dims.iter().map(|&d| Expression::from(d)).collect());
        if transposed {
            v.transpose(0, 1);
        }
        v.pad(1, before.into(), after.into());
        v
    }

    /// The copy path (disjoint windows with a gap) and the exact path agree, and the exact
    /// path sums overlapping windows.
    #[test]
    fn copy_and_exact_paths_agree() {
        let a: Vec<f32> = (0..12).map(|i| i as f32 - 0.5).collect();
        let b: Vec<f32> = (0..12).map(|i| 100.0 + i as f32).collect();
        let bufs = vec![Storage::F32(a.clone()), Storage::F32(b.clone())];
        let tree = [TreeOp::Piece(0), TreeOp::Piece(1), TreeOp::Add];
        for transposed in [false, true] {
            // Two [3, 4] pieces in [3, 10], columns 4..6 a gap.
            let pieces = [
                piece(0, padded(0, 6, transposed)),
                piece(1, padded(6, 0, transposed)),
            ];
            let shape = Segments {
                axis_len: 10,
                inner: 1,
            };
            let mut copied = vec![f32::NAN; 30];
            concat_copy(&pieces, 1, shape, &bufs, &mut copied);
            let mut exact = vec![f32::NAN; 30];
            concat_exact(&pieces, &tree, &mut vec![], DType::F32, &bufs, &mut exact);
            assert_eq!(copied, exact, "transposed {transposed}");
            let k = if transposed { 3 } else { 1 };
            let first_row = [
                a[0],
                a[k],
                a[2 * k],
                a[3 * k],
                0.0,
                0.0,
                b[0],
                b[k],
                b[2 * k],
                b[3 * k],
            ];
            assert_eq!(&copied[..10], &first_row);
        }
        // Overlapping windows [0, 4) and [2, 6) of [3, 6]: sums in the overlap.
        let pieces = [piece(0, padded(0, 2, false)), piece(1, padded(2, 0, false))];
        let mut exact = vec![f32::NAN; 18];
        concat_exact(&pieces, &tree, &mut vec![], DType::F32, &bufs, &mut exact);
        assert_eq!(
            &exact[..6],
            &[a[0], a[1], a[2] + b[0], a[3] + b[1], b[2], b[3]]
        );
    }
}
