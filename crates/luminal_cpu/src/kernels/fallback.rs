//! The generic kernel: any primop of any dtype, computed by the core's reference semantics
//! (`luminal::semantics`: exact `f64` arithmetic, rounded to the node dtype) over the
//! plan's buffers. It is what makes every graph run; the fast paths replace it wherever
//! they apply.

use crate::kernel::{BufId, CpuKernel, RunCtx};
use crate::storage::{BufRef, Storage};
use crate::view::{DimNames, DimValues};
use luminal::graph::Node;
use luminal::op::Op;
use luminal::semantics::{eval_node, node_exprs, Operands};
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
    node: Node,
    /// Dtype of the first input (integer semantics of binary ops depend on it).
    in_dtype: DType,
    inputs: Vec<Reader>,
    /// The expressions the semantics ask for ([`luminal::semantics::node_exprs`]).
    exprs: Vec<CompiledExpression>,
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
        let exprs = node_exprs(node)
            .iter()
            .map(|e| names.compile(e))
            .collect::<Result<Vec<_>>>()?;
        Ok(FallbackKernel {
            node: node.clone(),
            in_dtype,
            inputs,
            exprs,
        })
    }
}

/// The operands of one launch: the readers over the plan's buffers, the dims' values.
struct Io<'a> {
    k: &'a FallbackKernel,
    bufs: &'a [Storage],
    vars: DimValues,
}

impl Operands for Io<'_> {
    fn read(&mut self, i: usize, z: usize) -> Result<f64> {
        let r = &self.k.inputs[i];
        self.vars[0] = z as i64;
        if let Some(v) = &r.valid {
            if v.eval(&self.vars).map_err(expr_err)? == 0 {
                return Ok(0.0);
            }
        }
        let idx = r.index.eval(&self.vars).map_err(expr_err)?;
        let buf: BufRef = self.bufs[r.buf].as_ref();
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
    }
    fn expr(&mut self, k: usize, z: usize) -> Result<i64> {
        self.vars[0] = z as i64;
        self.k.exprs[k].eval(&self.vars).map_err(expr_err)
    }
}

impl CpuKernel for FallbackKernel {
    fn reads(&self) -> Vec<BufId> {
        self.inputs.iter().map(|r| r.buf).collect()
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        self.inputs.iter_mut().for_each(|r| r.buf = map(r.buf));
    }
    /// Computes the node's `n` output elements with the core's reference semantics.
    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        if matches!(self.node.op, Op::WriteSlice { .. }) {
            unreachable!("WriteSlice has its own kernel")
        }
        let mut io = Io {
            k: self,
            bufs: cx.bufs,
            vars: *cx.dims,
        };
        eval_node(&self.node, self.in_dtype, cx.n, &mut io, &mut |z, v| {
            out.set_f64(z, v)
        })
    }
    fn flops(&self, n: usize) -> usize {
        n
    }
}
