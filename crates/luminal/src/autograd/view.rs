//! Gradients through views (the `ShapeTracker` on an edge).
//!
//! A view maps each logical element to one buffer element (or to padding), so its gradient
//! is the transpose of that map: every buffer element receives the sum of the gradients of
//! the logical elements that read it, padding receives nothing. This file builds that
//! transpose from views and sums only (no scatter primop is needed):
//!
//! 1. masked (padded / sliced-padding) elements are sliced away: they read no data;
//! 2. stride-0 (expanded) dims are summed; size-1 dims dropped;
//! 3. the remaining dims are sorted by stride; when each stride is a multiple of the next
//!    and the dims do not overlap, the view is "a slice of a reshape" of the buffer, so the
//!    gradient is the same tensor padded back to the virtual shape and reshaped to the buffer;
//! 4. overlapping dims (`unfold` windows) are split along the smaller dim into runs that do
//!    not overlap (a window of 3 at step 2: positions {0, 1} and {2}; at step 1, one
//!    position each), each piece being a non-overlapping view, and the pieces are added.
//!
//! The contiguous case (the vast majority of edges) costs nothing. Views with symbolic
//! strides or offsets are supported only when they are contiguous or a pure
//! permute/expand of a contiguous buffer; others panic naming the view.

use crate::graph::GraphTensor;
use crate::shape::{Expression, ShapeTracker};

/// Most pieces one overlapping view may be split into before we give up (a guard against
/// pathological views; a 7x7 conv window is 49).
const MAX_SPLIT_TERMS: usize = 4096;

/// The gradient of a node's buffer (shape `node_shape`, row-major) given `factors`, whose
/// elementwise product (all of the view's logical shape) is the gradient of the view.
/// Multiplying lazily lets a broadcast dim be reduced as the last axis of the product:
/// that is the matmul pattern backends recognise, so the gradient of a matmul is a matmul.
pub(crate) fn view_transpose<'g>(
    factors: Vec<GraphTensor<'g>>,
    view: &ShapeTracker,
    node_shape: &[Expression],
) -> GraphTensor<'g> {
    assert!(!factors.is_empty(), "view_transpose: no gradient factors");
    let dims = view.dims();
    for f in &factors {
        assert_eq!(
            f.shape(),
            dims,
            "Autograd: gradient of shape {:?} for a view of shape {dims:?}",
            f.shape()
        );
    }
    let product = |fs: &[GraphTensor<'g>]| fs[1..].iter().fold(fs[0], |acc, &f| acc * f);
    let (factors, view) = if view.is_masked() {
        match strip_mask(product(&factors), view) {
            Some((g, v)) => (vec![g], v),
            None => {
                let dtype = factors[0].dtype();
                return factors[0]
                    .graph
                    .constant_of(0.0, dtype)
                    .expand_to(node_shape.to_vec());
            }
        }
    } else {
        (factors, view.clone())
    };
    // Reduce broadcast dims first, on the lazy product, with those dims moved last.
    let (dims, strides) = (view.dims(), view.strides());
    let broadcast: Vec<usize> = (0..dims.len())
        .filter(|&i| strides[i].is_zero() && dims[i].as_constant() != Some(1))
        .collect();
    let (g, rest) = if broadcast.is_empty() {
        (product(&factors), view)
    } else {
        let keep: Vec<usize> = (0..dims.len()).filter(|i| !broadcast.contains(i)).collect();
        let order: Vec<usize> = keep.iter().chain(&broadcast).copied().collect();
        let mut permuted: Vec<GraphTensor<'g>> =
            factors.iter().map(|f| f.permute(&order)).collect();
        let mut summed = broadcast.len();
        if summed > 1 {
            // Several broadcast dims (a batched matmul's weight gradient sums over batch and
            // rows): merge them into one when every factor allows it without a copy, so the
            // product reduces one axis, which is the matmul pattern.
            let mut merged: Vec<Expression> = keep.iter().map(|&i| dims[i].clone()).collect();
            merged.push(broadcast.iter().map(|&i| dims[i].clone()).product());
            let free = permuted.iter().all(|f| f.view().reshape(merged.clone()));
            if free {
                permuted = permuted.iter().map(|f| f.reshape(merged.clone())).collect();
                summed = 1;
            }
        }
        let mut g = product(&permuted);
        for _ in 0..summed {
            g = g.sum(g.rank() as i64 - 1);
        }
        let mut rest = view;
        for &i in broadcast.iter().rev() {
            // An unmasked stride-0 dim: narrowing it to one element and dropping it changes
            // no buffer index.
            rest.slice(i, Expression::zero(), Expression::one());
            rest.squeeze(i);
        }
        (g, rest)
    };
    if rest.is_contiguous() {
        return contiguous_prefix(g, &rest, node_shape);
    }
    // Pure permutation of a contiguous buffer (symbolic dims allowed).
    if rest.offset().is_zero() {
        if let Some(perm) = permutation_of_contiguous(&rest, node_shape) {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            return g.permute(&inverse).contiguous();
        }
    }
    let n: i64 = node_shape
        .iter()
        .map(|d| constant(d, "node dim", &rest))
        .product();
    let v = StaticView::of(&rest);
    scatter(g, v, n, &rest, &mut 0).reshape(node_shape.to_vec())
}

/// The gradient through a contiguous view (offset 0, row-major): the view reads the first
/// `m` elements of the buffer (all of them, or a prefix: a slice from 0 of the first dim), so
/// the gradient is `g` flattened and padded with zeros to the buffer's length.
fn contiguous_prefix<'g>(
    g: GraphTensor<'g>,
    view: &ShapeTracker,
    node_shape: &[Expression],
) -> GraphTensor<'g> {
    if view.dims().as_slice() == node_shape {
        return g;
    }
    let (m, n) = (view.n_elements(), node_shape.iter().product::<Expression>());
    if m == n {
        return g.reshape(node_shape.to_vec());
    }
    g.reshape(vec![m.clone()])
        .pad_axis(0, Expression::zero(), &n - &m)
        .reshape(node_shape.to_vec())
}

/// If `view` reads a row-major buffer of `node_shape` with its dims permuted, the
/// permutation (`view dim i` = `buffer dim perm[i]`).
fn permutation_of_contiguous(view: &ShapeTracker, node_shape: &[Expression]) -> Option<Vec<usize>> {
    let (dims, strides) = (view.dims(), view.strides());
    if dims.len() != node_shape.len() {
        return None;
    }
    let mut row_major = vec![Expression::one(); node_shape.len()];
    for i in (0..node_shape.len().saturating_sub(1)).rev() {
        row_major[i] = &row_major[i + 1] * &node_shape[i + 1];
    }
    let mut used = vec![false; dims.len()];
    let mut perm = vec![];
    for (d, s) in dims.iter().zip(&strides) {
        let p = (0..node_shape.len())
            .find(|&j| !used[j] && node_shape[j] == *d && row_major[j] == *s)?;
        used[p] = true;
        perm.push(p);
    }
    Some(perm)
}

fn constant(e: &Expression, what: &str, view: &ShapeTracker) -> i64 {
    e.as_constant().unwrap_or_else(|| {
        panic!("Autograd: the gradient through view {view} needs a constant {what}, got {e}")
    })
}

/// A view with constant dims, strides and offset, and no mask.
#[derive(Clone, Debug)]
struct StaticView {
    dims: Vec<i64>,
    strides: Vec<i64>,
    offset: i64,
}

impl StaticView {
    /// Constant form of an unmasked view.
    fn of(v: &ShapeTracker) -> StaticView {
        let orig = v;
        StaticView {
            dims: v.dims().iter().map(|d| constant(d, "dim", orig)).collect(),
            strides: v
                .strides()
                .iter()
                .map(|s| constant(s, "stride", orig))
                .collect(),
            offset: constant(&v.offset(), "offset", orig),
        }
    }
}

/// Scatter-adds `g` (the logical shape of the unmasked view `v`) into a flat buffer
/// of `n` elements. `pieces` counts the non-overlapping pieces built so far.
fn scatter<'g>(
    g: GraphTensor<'g>,
    mut v: StaticView,
    n: i64,
    orig: &ShapeTracker,
    pieces: &mut usize,
) -> GraphTensor<'g> {
    let cx = g.graph;
    let dtype = g.dtype();
    let zeros = || {
        cx.constant_of(0.0, dtype)
            .expand_to(vec![Expression::from(n)])
    };
    let mut g = g;
    // Stride-0 and size-1 dims: sum or drop (highest first so indices stay valid).
    for i in (0..v.dims.len()).rev() {
        if v.strides[i] == 0 || v.dims[i] == 1 {
            if v.dims[i] == 0 {
                return zeros();
            }
            g = if v.dims[i] == 1 {
                g.squeeze(i as i64)
            } else {
                g.sum(i as i64)
            };
            v.dims.remove(i);
            v.strides.remove(i);
        }
    }
    assert!(
        v.strides.iter().all(|&s| s > 0),
        "Autograd: negative strides in view {orig} are not supported"
    );
    if v.dims.contains(&0) {
        return zeros();
    }
    // Sort dims by stride, largest first.
    let mut order: Vec<usize> = (0..v.dims.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(v.strides[i]));
    if order.iter().enumerate().any(|(k, &i)| k != i) {
        g = g.permute(&order);
        v.dims = order.iter().map(|&i| v.dims[i]).collect();
        v.strides = order.iter().map(|&i| v.strides[i]).collect();
    }
    match decompose(&v, n) {
        Ok((virt, offs)) => {
            // g: [d_0 .. d_{r-1}] -> unsqueeze a last dim for the inner remainder -> pad each
            // dim to the virtual shape -> flatten -> the first n elements.
            let r = v.dims.len();
            let mut t = g.unsqueeze(r as i64);
            let ext: Vec<i64> = v.dims.iter().copied().chain([1]).collect();
            for k in 0..=r {
                let after = virt[k] - offs[k] - ext[k];
                if offs[k] != 0 || after != 0 {
                    t = t.pad_axis(k, offs[k] as usize, after as usize);
                }
            }
            *pieces += 1;
            let total: i64 = virt.iter().product();
            let flat = t.reshape(vec![Expression::from(total)]);
            if total == n {
                flat
            } else {
                flat.slice(0, 0, n).contiguous()
            }
        }
        Err((split, run)) => {
            let d = v.dims[split];
            // Pieces of `run` positions, the first one cut short so that every piece starts
            // at a multiple of `run` in the virtual shape (where it fits without overlap).
            let run = run.max(1);
            let first = (run - (v.offset / v.strides[split]).rem_euclid(run)).min(d);
            let starts: Vec<i64> = std::iter::once(0)
                .chain((first..d).step_by(run as usize))
                .collect();
            assert!(
                *pieces + starts.len() <= MAX_SPLIT_TERMS,
                "Autograd: the gradient through view {orig} needs more than \
                 {MAX_SPLIT_TERMS} pieces"
            );
            let mut acc: Option<GraphTensor<'g>> = None;
            for (j, &t) in starts.iter().enumerate() {
                let len = starts.get(j + 1).copied().unwrap_or(d) - t;
                let mut pv = v.clone();
                pv.offset += t * v.strides[split];
                let piece = if len == 1 {
                    pv.dims.remove(split);
                    pv.strides.remove(split);
                    g.slice(split as i64, t, t + 1).squeeze(split as i64)
                } else {
                    pv.dims[split] = len;
                    g.slice(split as i64, t, t + len)
                };
                let s = scatter(piece, pv, n, orig, pieces);
                acc = Some(match acc {
                    None => s,
                    Some(a) => a + s,
                });
            }
            acc.expect("a dim of size > 1 was split")
        }
    }
}

/// For dims sorted by decreasing stride: the virtual shape `[V_0, .., V_{r-1}, V_r]` (with
/// `V_k = s_{k-1} / s_k` and `V_r = s_{r-1}`) whose row-major layout covers the buffer, and
/// the view's start in it, when the view is a plain slice of it. Otherwise the dim to split
/// and the length of its pieces: runs of `s_{k-1} / s_k` consecutive window positions do
/// not overlap (a stride-2 window of 3 splits into {0, 1} and {2}, not three single
/// positions), single positions when the strides do not divide.
fn decompose(v: &StaticView, n: i64) -> Result<(Vec<i64>, Vec<i64>), (usize, i64)> {
    let r = v.dims.len();
    if r == 0 {
        let total = n.max(v.offset + 1);
        return Ok((vec![total], vec![v.offset]));
    }
    let s = &v.strides;
    let mut virt = vec![0i64; r + 1];
    let mut offs = vec![0i64; r + 1];
    virt[r] = s[r - 1];
    offs[r] = v.offset % s[r - 1];
    for k in (1..r).rev() {
        if s[k - 1] % s[k] != 0 || v.dims[k] * s[k] > s[k - 1] {
            // Overlapping or misaligned pair: split the smaller of the two dims.
            return Err(if v.dims[k] <= v.dims[k - 1] {
                (
                    k,
                    if s[k - 1] % s[k] == 0 {
                        s[k - 1] / s[k]
                    } else {
                        1
                    },
                )
            } else {
                (k - 1, 1)
            });
        }
        virt[k] = s[k - 1] / s[k];
        offs[k] = (v.offset / s[k]) % virt[k];
        if offs[k] + v.dims[k] > virt[k] {
            return Err((k, 1));
        }
    }
    offs[0] = v.offset / s[0];
    virt[0] = (offs[0] + v.dims[0]).max((n + s[0] - 1) / s[0]);
    Ok((virt, offs))
}

/// Applies a view's mask to the gradient: logical elements outside the validity window read
/// padding, so they pass no gradient. Returns the narrowed gradient and view.
fn strip_mask<'g>(
    g: GraphTensor<'g>,
    view: &ShapeTracker,
) -> Option<(GraphTensor<'g>, ShapeTracker)> {
    let valid = view.valid();
    if valid.as_constant() == Some(0) {
        return None;
    }
    assert!(
        valid.as_constant() == Some(1),
        "Autograd: the gradient through view {view} needs a constant validity factor"
    );
    let mut g = g;
    let mut v = view.clone();
    let (dims, mask) = (view.dims(), view.mask());
    for (i, (lo, hi)) in mask.iter().enumerate() {
        if lo.is_zero() && *hi == dims[i] {
            continue;
        }
        let (l, h) = (
            constant(lo, "mask bound", view),
            constant(hi, "mask bound", view),
        );
        if h <= l {
            return None;
        }
        g = g.slice(i as i64, l, h);
        v.slice(i, Expression::from(l), Expression::from(h));
    }
    Some((g, v))
}
