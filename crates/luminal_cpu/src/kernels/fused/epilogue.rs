//! Fused epilogues: a program run in place over a kernel's output (a product's bias,
//! residual, GELU), block by block, or row by row in place when it is a chain of simple
//! steps ([`Program::affine`]).

use super::*;

/// Runs `prog` in place over `data`: element `z` of the program's row register 0 is
/// `data[z]` before the call, and `data[z]` becomes the program's value at `z` (a fused
/// epilogue of the kernel that produced `data`). Each block is copied aside first, so the
/// program may read its input anywhere in the block while the block is overwritten.
pub fn run_epilogue(prog: &Program, bufs: &[Storage], data: &mut [f32]) {
    let chunk = task_len(data.len(), prog.work_per_element()).next_multiple_of(BLOCK);
    crate::exec::par::for_each_chunk(data, chunk, |t, c| {
        prog.with_regs(|mut regs| {
            simd::run(EpilogueTask {
                prog,
                bufs,
                z0: t * chunk,
                src: None,
                data: c,
                regs: &mut regs,
            })
        })
    })
}

/// [`run_epilogue`] over one piece of the data (logical elements `z0 ..`), on the calling
/// thread.
pub fn epilogue_chunk(prog: &Program, bufs: &[Storage], z0: usize, data: &mut [f32]) {
    prog.with_regs(|mut regs| {
        simd::run(EpilogueTask {
            prog,
            bufs,
            z0,
            src: None,
            data,
            regs: &mut regs,
        })
    })
}

/// `dst[z] = prog(src)[z]`: `prog` as an epilogue (row register 0 is `src`) over one piece
/// of a kernel's result (logical elements `z0 ..`), into another buffer (a side output,
/// `Kernel::side`), on the calling thread.
pub fn epilogue_into(prog: &Program, bufs: &[Storage], z0: usize, src: &[f32], dst: &mut [f32]) {
    prog.with_regs(|mut regs| {
        simd::run(EpilogueTask {
            prog,
            bufs,
            z0,
            src: Some(src),
            data: dst,
            regs: &mut regs,
        })
    })
}

/// An operand of an [`affine`](Program::affine) epilogue: a leaf, a constant, or a
/// recognised function of a leaf (`f(leaf)`: the GELU derivative a product's gradient is
/// multiplied by).
#[derive(Clone, Copy, Debug)]
pub enum AffineSrc {
    Leaf(usize),
    Const(usize),
    FnLeaf(simd::FnOp, usize),
}

/// One step of an [`affine`](Program::affine) epilogue on the running value.
#[derive(Clone, Copy, Debug)]
pub enum EpiStep {
    /// `acc op v`.
    Bin(BinaryOp, AffineSrc),
    /// `f(acc)` (a GELU after the bias).
    Apply(simd::FnOp),
}

impl Program {
    /// This program as an epilogue of the kernel that computes leaf `leaf`'s buffer: every
    /// read of that leaf reads row register 0 instead (the kernel's value at the same
    /// logical index: the leaf must read it through the identity view), the leaf removed.
    pub fn over_result_of(&self, leaf: usize) -> Program {
        let renumber = |l: usize| if l > leaf { l - 1 } else { l };
        let instrs = self
            .instrs
            .iter()
            .map(|i| match i {
                Instr::Load(l) if *l == leaf => Instr::RowReg(0),
                Instr::Load(l) => Instr::Load(renumber(*l)),
                other => other.clone(),
            })
            .collect();
        let mut leaves = self.leaves.clone();
        leaves.remove(leaf);
        Program {
            instrs,
            leaves,
            consts: self.consts.clone(),
            ..Program::default()
        }
    }

    /// When the program is a chain of steps on row register 0 (a product's value), each an
    /// f32 `Add` or `Mul` by a leaf, a constant or a recognised function of a leaf, or a
    /// recognised function of the running value (a bias, a residual, a scale, a GELU):
    /// those steps in order. Such an epilogue runs in place over rows
    /// ([`epilogue_rows`]), reading its leaves where they lie.
    pub fn affine(&self) -> Option<Vec<EpiStep>> {
        let mut acc = None;
        let mut ops = vec![];
        let operand = |i: usize| match self.instrs[i] {
            Instr::Load(l) => Some(AffineSrc::Leaf(l)),
            Instr::Const(c) => Some(AffineSrc::Const(c)),
            Instr::Fn(f, a) => match self.instrs[a] {
                Instr::Load(l) => Some(AffineSrc::FnLeaf(f, l)),
                _ => None,
            },
            _ => None,
        };
        for (i, ins) in self.instrs.iter().enumerate() {
            match *ins {
                Instr::RowReg(0) if acc.is_none() => acc = Some(i),
                Instr::Load(_) | Instr::Const(_) => {}
                Instr::Fn(f, a) if Some(a) == acc => {
                    ops.push(EpiStep::Apply(f));
                    acc = Some(i);
                }
                // A function of a leaf: an operand (checked where it is used).
                Instr::Fn(_, a) if matches!(self.instrs[a], Instr::Load(_)) => {}
                Instr::Binary(op @ (BinaryOp::Add | BinaryOp::Mul), a, b) => {
                    let other = match acc {
                        Some(x) if a == x => b,
                        Some(x) if b == x => a,
                        _ => return None,
                    };
                    ops.push(EpiStep::Bin(op, operand(other)?));
                    acc = Some(i);
                }
                _ => return None,
            }
        }
        (acc.is_some() && acc == self.instrs.len().checked_sub(1) && !ops.is_empty()).then_some(ops)
    }
}

/// An [`affine`](Program::affine) epilogue over `rows` rows of `len` values, row `r` at
/// `data[r·stride ..]` and at logical element `z0 + r·stride`, in place. Each leaf must be
/// an f32 buffer read either linearly (a residual) or as one row broadcast over every
/// other dim (a bias: unit stride along the last dim, zero elsewhere, each row segment
/// inside one of its runs); then its start in each row is exact without per-row index
/// arithmetic. Returns false, touching nothing, when a leaf is read any other way.
///
/// # Safety
/// `data` points at `rows` rows as described, which no other thread touches.
pub unsafe fn epilogue_rows(
    prog: &Program,
    ops: &[EpiStep],
    bufs: &[Storage],
    z0: usize,
    (rows, len, stride): (usize, usize, usize),
    data: *mut f32,
) -> bool {
    const MAX_OPS: usize = 8;
    if ops.len() > MAX_OPS {
        return false;
    }
    if rows == 0 || len == 0 {
        return true;
    }
    // Each leaf: its buffer, first start and step per row.
    let mut leaves: [(&[f32], usize, isize); MAX_OPS] = [(&[], 0, 0); MAX_OPS];
    for (j, step) in ops.iter().enumerate() {
        let l = match *step {
            EpiStep::Bin(_, AffineSrc::Leaf(l) | AffineSrc::FnLeaf(_, l)) => l,
            _ => continue,
        };
        let v = &prog.leaves[l].view;
        let Storage::F32(buf) = &bufs[prog.leaves[l].buf] else {
            return false;
        };
        let (s0, step) = if v.linear {
            ((v.offset + z0 as i64) as usize, stride as isize)
        } else {
            let r = v.dims.len();
            let run = v.dims.last().copied().unwrap_or(0).max(1) as usize;
            let bias = !v.masked
                && r > 0
                && v.strides[r - 1] == 1
                && (0..r - 1).all(|i| v.strides[i] == 0 || v.dims[i] == 1)
                && stride % run == 0
                && z0 % run + len <= run;
            if !bias {
                return false;
            }
            ((v.offset + (z0 % run) as i64) as usize, 0)
        };
        let last = s0 as isize + step * (rows as isize - 1);
        if last < 0 || last as usize + len > buf.len() || s0 + len > buf.len() {
            return false;
        }
        leaves[j] = (&buf[..], s0, step);
    }
    simd::run(AffineRows {
        prog,
        ops,
        leaves: &leaves[..ops.len()],
        rows,
        len,
        stride,
        data,
    });
    true
}

struct AffineRows<'a> {
    prog: &'a Program,
    ops: &'a [EpiStep],
    leaves: &'a [(&'a [f32], usize, isize)],
    rows: usize,
    len: usize,
    stride: usize,
    data: *mut f32,
}

impl Task for AffineRows<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let AffineRows {
            prog,
            ops,
            leaves,
            rows,
            len,
            stride,
            data,
        } = self;
        let mut tmp = [0f32; 256];
        for r in 0..rows {
            // SAFETY: the caller's contract (row `r` of `len` values at `r·stride`).
            let d = unsafe { std::slice::from_raw_parts_mut(data.add(r * stride), len) };
            for (&step, &(buf, s0, st)) in ops.iter().zip(leaves) {
                let at = (s0 as isize + st * r as isize) as usize;
                match step {
                    EpiStep::Bin(op, AffineSrc::Leaf(_)) => {
                        let v = &buf[at..at + len];
                        match op {
                            BinaryOp::Add => {
                                for i in 0..len {
                                    d[i] += v[i];
                                }
                            }
                            _ => {
                                for i in 0..len {
                                    d[i] *= v[i];
                                }
                            }
                        }
                    }
                    EpiStep::Bin(op, AffineSrc::Const(c)) => {
                        let c = prog.const_values[c];
                        match op {
                            BinaryOp::Add => d.iter_mut().for_each(|x| *x += c),
                            _ => d.iter_mut().for_each(|x| *x *= c),
                        }
                    }
                    EpiStep::Bin(op, AffineSrc::FnLeaf(f, _)) => {
                        // f(leaf) a piece at a time through the stack, then the op.
                        for (p, dp) in d.chunks_mut(tmp.len()).enumerate() {
                            let v = &buf[at + p * tmp.len()..at + p * tmp.len() + dp.len()];
                            let t = &mut tmp[..dp.len()];
                            simd::fn_slice::<F>(f, v, t);
                            match op {
                                BinaryOp::Add => {
                                    for i in 0..dp.len() {
                                        dp[i] += t[i];
                                    }
                                }
                                _ => {
                                    for i in 0..dp.len() {
                                        dp[i] *= t[i];
                                    }
                                }
                            }
                        }
                    }
                    EpiStep::Apply(f) => {
                        for dp in d.chunks_mut(tmp.len()) {
                            let t = &mut tmp[..dp.len()];
                            t.copy_from_slice(dp);
                            simd::fn_slice::<F>(f, t, dp);
                        }
                    }
                }
            }
        }
    }
}

/// The epilogue's block loop: `data`'s blocks become the program's values, row register 0
/// reading `src` (a side output) or, with none, `data` itself (each block copied aside
/// first, so the program may read its input anywhere in the block while it is
/// overwritten).
struct EpilogueTask<'a, 'o, 'r, 's> {
    prog: &'a Program,
    bufs: &'a [Storage],
    z0: usize,
    src: Option<&'o [f32]>,
    data: &'o mut [f32],
    regs: &'r mut Regs<'s>,
}

impl Task for EpilogueTask<'_, '_, '_, '_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let EpilogueTask {
            prog,
            bufs,
            z0,
            src,
            data,
            regs,
        } = self;
        let mut input = [0f32; BLOCK];
        let mut start = 0;
        while start < data.len() {
            let n = BLOCK.min(data.len() - start);
            let dst = &mut data[start..start + n];
            let from = match src {
                Some(s) => &s[start..start + n],
                None => {
                    input[..n].copy_from_slice(dst);
                    &input[..n]
                }
            };
            let row = RowEnv {
                scalars: &[],
                regs: from,
                len: n,
                base: z0 + start,
            };
            if let Some(v) = prog.eval(bufs, row, z0 + start, n, regs, dst) {
                dst.copy_from_slice(v);
            }
            start += n;
        }
    }
}
