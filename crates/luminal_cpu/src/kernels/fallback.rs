//! The generic kernel: any primop of any dtype, with exactly the reference semantics
//! (exact `f64` arithmetic, rounded to the node dtype with `DType::round`, integer ops via
//! the primops' own `apply`). It is what makes every graph run; the fast paths replace it
//! wherever they apply.

use crate::kernel::{BufId, CpuKernel, RunCtx};
use crate::storage::{BufRef, Storage};
use crate::view::{eval, DimNames, DimValues};
use luminal::graph::Node;
use luminal::op::{ConstValue, Op};
use luminal::shape::CompiledExpression;
use luminal::{DType, LuminalError, Result};

/// One input read through its view: element `z` is at `index(z)` when `valid(z) != 0`.
#[derive(Clone, Debug)]
struct Reader {
    buf: BufId,
    index: CompiledExpression,
    valid: Option<CompiledExpression>,
}

#[derive(Debug)]
pub struct FallbackKernel {
    op: Op,
    dtype: DType,
    /// Dtype of the first input (integer semantics of binary ops depend on it).
    in_dtype: DType,
    inputs: Vec<Reader>,
    /// Expressions the op needs besides views: Iota's / Constant's expression, the reduced
    /// length and inner size of a Reduce, the rows and width of a Gather table.
    aux: Vec<CompiledExpression>,
}

fn expr_err(e: luminal::shape::ExprError) -> LuminalError {
    LuminalError::Expression(e.to_string())
}

impl FallbackKernel {
    pub fn new(
        node: &Node,
        in_bufs: &[BufId],
        in_dtype: DType,
        names: &DimNames,
    ) -> Result<FallbackKernel> {
        let inputs = node
            .inputs
            .iter()
            .zip(in_bufs)
            .map(|(e, &buf)| {
                let valid = e.view.valid_expression();
                Ok(Reader {
                    buf,
                    index: names.compile(&e.view.index_expression())?,
                    valid: if valid.as_constant() == Some(1) {
                        None
                    } else {
                        Some(names.compile(&valid)?)
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let aux = match &node.op {
            Op::Iota { expr } => vec![names.compile(expr)?],
            Op::Constant {
                value: ConstValue::Expr(e),
            } => vec![names.compile(e)?],
            Op::Reduce { axis, .. } => {
                let dims = node.inputs[0].view.dims();
                let inner: luminal::Expression = dims[axis + 1..].iter().product();
                vec![names.compile(&dims[*axis])?, names.compile(&inner)?]
            }
            Op::Gather => {
                let dims = node.inputs[0].view.dims();
                vec![names.compile(&dims[0])?, names.compile(&dims[1])?]
            }
            _ => vec![],
        };
        Ok(FallbackKernel {
            op: node.op.clone(),
            dtype: node.dtype,
            in_dtype,
            inputs,
            aux,
        })
    }

    /// Computes the node's `n` output elements.
    fn compute(
        &self,
        bufs: &[Storage],
        out: &mut Storage,
        n: usize,
        dims: &DimValues,
    ) -> Result<()> {
        let mut vars = *dims;
        let dt = self.dtype;
        let read = |i: usize, z: usize, vars: &mut DimValues| -> Result<f64> {
            let r = &self.inputs[i];
            vars[0] = z as i64;
            if let Some(v) = &r.valid {
                if v.eval(vars).map_err(expr_err)? == 0 {
                    return Ok(0.0);
                }
            }
            let idx = r.index.eval(vars).map_err(expr_err)?;
            let buf: BufRef = bufs[r.buf].as_ref();
            usize::try_from(idx)
                .ok()
                .filter(|&i| i < buf.len())
                .map(|i| buf.get_f64(i))
                .ok_or_else(|| {
                    LuminalError::Backend(format!(
                        "view reads element {idx} of a buffer of {}",
                        buf.len()
                    ))
                })
        };
        let mut write = |z: usize, v: f64| out.set_f64(z, v);
        match &self.op {
            Op::Input { .. } => {}
            Op::WriteSlice { .. } => unreachable!("WriteSlice has its own kernel"),
            Op::Constant { value } => {
                let v = match value {
                    ConstValue::Float(v) => *v,
                    ConstValue::Expr(_) => eval(&self.aux[0], dims)? as f64,
                };
                for z in 0..n {
                    write(z, dt.round(v));
                }
            }
            Op::Iota { .. } => {
                for z in 0..n {
                    vars[0] = z as i64;
                    let v = self.aux[0].eval(&vars).map_err(expr_err)?;
                    write(z, dt.round(v as f64));
                }
            }
            Op::Unary(u) => {
                for z in 0..n {
                    write(z, dt.round(u.apply(read(0, z, &mut vars)?)));
                }
            }
            Op::Binary(b) => {
                for z in 0..n {
                    let x = read(0, z, &mut vars)?;
                    let y = read(1, z, &mut vars)?;
                    write(z, dt.round(b.apply(x, y, self.in_dtype)));
                }
            }
            Op::Contiguous | Op::Cast(_) => {
                for z in 0..n {
                    write(z, dt.round(read(0, z, &mut vars)?));
                }
            }
            Op::Reduce { op, .. } => {
                let len = eval(&self.aux[0], dims)?.max(0) as usize;
                let inner = (eval(&self.aux[1], dims)?.max(0) as usize).max(1);
                for o in 0..n {
                    let (outer, inn) = (o / inner, o % inner);
                    let mut acc = op.identity(dt);
                    for k in 0..len {
                        acc = op.combine(acc, read(0, (outer * len + k) * inner + inn, &mut vars)?);
                    }
                    write(o, dt.round(acc));
                }
            }
            Op::Gather => {
                let rows = eval(&self.aux[0], dims)?;
                let width = eval(&self.aux[1], dims)?.max(0) as usize;
                for s in 0..n / width.max(1) {
                    let id = read(1, s, &mut vars)? as i64;
                    if id < 0 || id >= rows {
                        return Err(LuminalError::IndexOutOfRange {
                            op: "Gather".into(),
                            index: id,
                            size: rows,
                        });
                    }
                    for w in 0..width {
                        let v = read(0, id as usize * width + w, &mut vars)?;
                        write(s * width + w, v);
                    }
                }
            }
        }
        Ok(())
    }
}

impl CpuKernel for FallbackKernel {
    fn reads(&self) -> Vec<BufId> {
        self.inputs.iter().map(|r| r.buf).collect()
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        self.inputs.iter_mut().for_each(|r| r.buf = map(r.buf));
    }
    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        self.compute(cx.bufs, out, cx.n, cx.dims)
    }
    fn flops(&self, n: usize) -> usize {
        n
    }
}
