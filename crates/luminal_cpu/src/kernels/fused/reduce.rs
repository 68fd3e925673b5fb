//! Reduction kernels over a fused program's values: along the last axis, or along a
//! middle one (a column sum of a row-major buffer, split by rows over the threads).

use super::*;

/// Column reductions of at most this many outputs split their rows over the threads
/// (partial results on the stack, at most [`MAX_PARTS`] of them).
const COLUMN_PARTS_MAX: usize = 512;
const MAX_PARTS: usize = 8;

/// Shape of a reduction: `outer` rows of `len` reduced elements, `inner` apart.
#[derive(Clone, Copy, Debug)]
pub struct ReduceShape {
    pub outer: usize,
    pub len: usize,
    pub inner: usize,
}

/// A reduction kernel over the program's values (laid out as `[outer, len, inner]`).
pub fn run_reduce(op: ReduceOp, prog: &Program, bufs: &[Storage], out: &mut [f32], s: ReduceShape) {
    let n_out = s.outer * s.inner;
    let out = &mut out[..n_out];
    if s.len == 0 {
        out.fill(reduce_identity(op));
        return;
    }
    if n_out == 0 {
        return;
    }
    if s.inner == 1 {
        let chunk = task_len(n_out, s.len);
        crate::exec::par::for_each_chunk(out, chunk, |t, c| {
            prog.with_regs(|mut regs| {
                simd::run(ReduceRowsTask {
                    op,
                    prog,
                    bufs,
                    o0: t * chunk,
                    out: c,
                    len: s.len,
                    regs: &mut regs,
                })
            })
        });
    } else if s.outer == 1
        && s.inner <= COLUMN_PARTS_MAX
        && crate::exec::par::threads() > 1
        && s.len >= 64 * crate::exec::par::threads()
    {
        // A column sum over a short row-major buffer (a bias gradient: `[tokens, 64..512]`
        // summed over tokens): tasks take contiguous runs of rows into partial results,
        // which are then combined in order. (Split by columns instead, every row's cache
        // lines would be shared by the cores.)
        let parts = crate::exec::par::threads().min(MAX_PARTS);
        let per = s.len.div_ceil(parts);
        let mut partial = [0f32; MAX_PARTS * COLUMN_PARTS_MAX];
        let stride = COLUMN_PARTS_MAX;
        crate::exec::par::for_each_chunk(&mut partial[..parts * stride], stride, |t, c| {
            let (l0, l1) = ((t * per).min(s.len), ((t + 1) * per).min(s.len));
            let sub = ReduceShape {
                outer: 1,
                len: l1 - l0,
                inner: s.inner,
            };
            let c = &mut c[..s.inner];
            if sub.len == 0 {
                c.fill(reduce_identity(op));
                return;
            }
            prog.with_regs(|mut regs| {
                simd::run(ReduceMiddleTask {
                    op,
                    prog,
                    bufs,
                    q0: 0,
                    z_base: l0 * s.inner,
                    out: c,
                    s: sub,
                    regs: &mut regs,
                })
            })
        });
        out.copy_from_slice(&partial[..s.inner]);
        for t in 1..parts {
            simd::combine(op, out, &partial[t * stride..t * stride + s.inner]);
        }
    } else {
        let threads = crate::exec::par::threads();
        let chunk = if s.inner >= 512 && s.outer < 2 * threads {
            // Few long output rows (a column sum over a row-major buffer): tasks split the
            // columns, in pieces of at least 256 (each evaluation amortises its dispatch).
            n_out.div_ceil(2 * threads).max(256).next_multiple_of(16)
        } else {
            // Whole outer rows per task.
            task_len(s.outer, s.len * s.inner) * s.inner
        };
        crate::exec::par::for_each_chunk(out, chunk, |t, c| {
            prog.with_regs(|mut regs| {
                simd::run(ReduceMiddleTask {
                    op,
                    prog,
                    bufs,
                    q0: t * chunk,
                    z_base: 0,
                    out: c,
                    s,
                    regs: &mut regs,
                })
            })
        });
    }
}

/// Reduces rows `o0 .. o0 + out.len()` of the last axis (inner == 1). A block may span
/// several short rows or a part of a long one; accumulators carry across blocks.
struct ReduceRowsTask<'a, 'r, 's> {
    op: ReduceOp,
    prog: &'a Program,
    bufs: &'a [Storage],
    o0: usize,
    out: &'a mut [f32],
    len: usize,
    regs: &'r mut Regs<'s>,
}

impl Task for ReduceRowsTask<'_, '_, '_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let ReduceRowsTask {
            op,
            prog,
            bufs,
            o0,
            out,
            len,
            regs,
        } = self;
        crate::with_reduce!(op, |MAX| reduce_rows::<F, MAX>(
            prog, bufs, o0, out, len, regs
        ))
    }
}

#[inline(always)]
fn reduce_rows<const F: bool, const MAX: bool>(
    prog: &Program,
    bufs: &[Storage],
    o0: usize,
    out: &mut [f32],
    len: usize,
    regs: &mut Regs<'_>,
) {
    let (z_start, z_end) = (o0 * len, (o0 + out.len()) * len);
    let mut z = z_start;
    let mut acc = Acc::<MAX>::new();
    let mut tmp = [0f32; BLOCK];
    if len <= SHORT_ROWS {
        // Short rows (attention scores, a layer's features, a convolution's bias gradient
        // summed one spatial axis at a time): whole rows per block, folded several at once
        // by `reduce_short_rows` (the accumulator's steps, identical).
        let block = BLOCK / len * len;
        while z < z_end {
            let n = block.min(z_end - z);
            let vals = match prog.eval(bufs, RowEnv::NONE, z, n, regs, &mut tmp) {
                Some(v) => v,
                None => &tmp[..n],
            };
            let first = z / len - o0;
            simd::reduce_short_rows::<MAX>(vals, len, &mut out[first..first + n / len]);
            z += n;
        }
        return;
    }
    while z < z_end {
        let n = BLOCK.min(z_end - z);
        let vals = match prog.eval(bufs, RowEnv::NONE, z, n, regs, &mut tmp) {
            Some(v) => v,
            None => &tmp[..n],
        };
        let mut p = 0;
        while p < n {
            let zz = z + p;
            let row = zz / len;
            let row_end = (row + 1) * len;
            let take = (row_end - zz).min(n - p);
            if take == 1 {
                acc.add_one(vals[p]);
            } else {
                acc.add_slice(&vals[p..p + take]);
            }
            p += take;
            if zz + take == row_end {
                out[row - o0] = acc.finish();
                acc = Acc::new();
            }
        }
        z += n;
    }
}

/// Reduces a middle axis: outputs `q0 .. q0 + out.len()`. Runs of whole outer rows are
/// one contiguous sweep over the program's values (each block's pieces combined into
/// their outputs); a piece of a row (a task that splits a long row by columns) adds, for
/// each of the `len` reduced positions, the matching contiguous piece of the values. Either
/// way each output combines its values in order of the reduced position.
struct ReduceMiddleTask<'a, 'r, 's> {
    op: ReduceOp,
    prog: &'a Program,
    bufs: &'a [Storage],
    q0: usize,
    /// Logical element of the program where the values start (a task of a column
    /// reduction split by rows).
    z_base: usize,
    out: &'a mut [f32],
    s: ReduceShape,
    regs: &'r mut Regs<'s>,
}

impl Task for ReduceMiddleTask<'_, '_, '_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let ReduceMiddleTask {
            op,
            prog,
            bufs,
            q0,
            z_base,
            out,
            s,
            regs,
        } = self;
        out.fill(reduce_identity(op));
        let mut tmp = [0f32; BLOCK];
        let mut q = 0;
        while q < out.len() {
            let (o, c0) = ((q0 + q) / s.inner, (q0 + q) % s.inner);
            let whole_rows = if c0 == 0 {
                (out.len() - q) / s.inner
            } else {
                0
            };
            if whole_rows > 0 {
                let piece = &mut out[q..q + whole_rows * s.inner];
                let (z_start, z_end) = (o * s.len * s.inner, (o + whole_rows) * s.len * s.inner);
                let mut z = z_start;
                while z < z_end {
                    let n = BLOCK.min(z_end - z);
                    let vals = match prog.eval(bufs, RowEnv::NONE, z_base + z, n, regs, &mut tmp) {
                        Some(v) => v,
                        None => &tmp[..n],
                    };
                    let mut p = 0;
                    while p < n {
                        let zz = z + p;
                        let (outer, inner) = (zz / (s.len * s.inner), zz % s.inner);
                        let take = (s.inner - inner).min(n - p);
                        let base = (outer - o) * s.inner + inner;
                        simd::combine(op, &mut piece[base..base + take], &vals[p..p + take]);
                        p += take;
                    }
                    z += n;
                }
                q += whole_rows * s.inner;
                continue;
            }
            let w = (s.inner - c0).min(out.len() - q);
            let piece = &mut out[q..q + w];
            for l in 0..s.len {
                let z = (o * s.len + l) * s.inner + c0;
                let mut p = 0;
                while p < w {
                    let n = BLOCK.min(w - p);
                    let at = z_base + z + p;
                    let vals = match prog.eval(bufs, RowEnv::NONE, at, n, regs, &mut tmp) {
                        Some(v) => v,
                        None => &tmp[..n],
                    };
                    simd::combine(op, &mut piece[p..p + n], vals);
                    p += n;
                }
            }
            q += w;
        }
    }
}
