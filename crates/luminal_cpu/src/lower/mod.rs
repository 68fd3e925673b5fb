//! Lowering: the primop graph becomes a list of kernels in launch order.
//!
//! - A producer is inlined into its consumer's fused tree when it is an f32 elementwise op
//!   with a single consumer, is not an output, and the edge reads it through the identity
//!   view (so element `z` of the consumer needs element `z` of the producer).
//! - Constants read through an unmasked view become immediate values of the tree.
//! - `SumReduce(last)` over an inlined `Mul` with the matmul broadcast pattern becomes a
//!   `gemm` call.
//!   The same pattern in f16 or bf16 runs on the f32 paths through scratch (`halves.rs`).
//!   An f32 elementwise consumer of a private product runs as its in-place epilogue.
//! - Casts to f16 / bf16 (from f32, f16, bf16) are direct conversion kernels; casts to f32
//!   are fused (a leaf widens the half data as it loads it).
//! - Everything else that is f32 becomes a fused elementwise or reduce kernel; so do f16 /
//!   bf16 ops (computed in f32, each result rounded to its half type by an `Instr::Round`;
//!   half reductions accumulate in f64, see `halves.rs`), and a cast to a half type fuses
//!   into the trees that read it. Gathers, iota and concatenations (pad + add trees) become
//!   direct data-movement kernels (`direct.rs`); anything else not float (ints, bools, casts
//!   between halves and ints) runs the reference-semantics fallback.

mod attention;
mod passes;
mod terms;

pub(crate) use terms::{with_matmul_knobs, with_terms, MatmulKnobs};

use crate::kernel::{BufId, CpuKernel, Kernel};
use crate::kernels::fallback::FallbackKernel;
use crate::kernels::fused::kernel::{ElementwiseKernel, ReduceKernel};
use crate::kernels::fused::{ConstSrc, Instr, Leaf, Program};
use crate::kernels::matmul::MatmulKernel;
use crate::kernels::movement::write::WriteSliceKernel;
use crate::simd::half::HalfKind;
use crate::view::{DimNames, ResolvedView, ViewExprs};
use luminal::graph::{Edge, GraphData, NodeId};
use luminal::op::{BinaryOp, ConstValue, Op, ReduceOp};
use luminal::{DType, Expression, Result, ShapeTracker};
use passes::{absorb_shared, epilogues, order_state_writes, side_outputs};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};

/// Can this node be evaluated inside an f32 fused tree? Values are f32; `Bool` nodes hold
/// exact 0/1.
fn fusable(g: &GraphData, id: NodeId) -> bool {
    let node = g.node(id);
    let in_dt = |i: usize| g.node(node.inputs[i].node).dtype;
    match (&node.op, node.dtype) {
        (Op::Unary(_), DType::F32) => in_dt(0) == DType::F32,
        // Bools are exact 0/1 in f32: comparisons of floats or bools, AND (`Mul`) and OR
        // (`Add`, then `!= 0`) of bools.
        (Op::Binary(BinaryOp::LessThan), DType::Bool) => {
            matches!(in_dt(0), DType::F32 | DType::Bool)
        }
        (Op::Binary(BinaryOp::Add | BinaryOp::Mul), DType::Bool) => {
            in_dt(0) == DType::Bool && in_dt(1) == DType::Bool
        }
        (Op::Binary(b), DType::F32) => *b != BinaryOp::LessThan && in_dt(0) == DType::F32,
        // Every dtype embeds exactly in f64 and a leaf rounds f64 -> f32 once, which is the
        // reference cast; bools, halves are exact in f32.
        (Op::Cast(DType::F32), DType::F32) => !in_dt(0).is_quantized(),
        (Op::Cast(DType::Bool), DType::Bool) => in_dt(0) != DType::I32,
        (Op::Contiguous, DType::F32) => in_dt(0) == DType::F32,
        (Op::Contiguous, DType::Bool) => in_dt(0) == DType::Bool,
        (Op::Constant { .. }, DType::F32) => true,
        _ => false,
    }
}

use luminal::patterns::flat_identity_edge;

fn is_one(d: &Expression) -> bool {
    d.as_constant() == Some(1)
}

/// A consumer view that only broadcasts its producer (the `keepdim` + expand pattern of
/// softmax and norms): consumer dims are the producer's non-1 dims in order, row-major,
/// plus stride-0 (or size-1) dims. A producer read this way is recomputed per consumer
/// element by rewriting its leaves' views with the same broadcast.
#[derive(Clone, Debug)]
struct Broadcast {
    p_shape: Vec<Expression>,
    v_dims: Vec<Expression>,
    new_dim: Vec<bool>,
}

impl Broadcast {
    fn of(v: &ShapeTracker, p_shape: &[Expression]) -> Option<Broadcast> {
        let new_dim = luminal::patterns::broadcast_of(v, p_shape)?;
        Some(Broadcast {
            p_shape: p_shape.to_vec(),
            v_dims: v.dims(),
            new_dim,
        })
    }

    /// A view over the producer's shape, rewritten over the consumer's dims.
    fn apply(&self, u: &ShapeTracker) -> Option<ShapeTracker> {
        let mut u = u.clone();
        if u.dims() != self.p_shape && !u.reshape(self.p_shape.clone()) {
            return None;
        }
        for i in (0..self.p_shape.len()).rev() {
            if is_one(&self.p_shape[i]) {
                u.squeeze(i);
            }
        }
        for (j, &new) in self.new_dim.iter().enumerate() {
            if new {
                u.expand(j, self.v_dims[j].clone());
            }
        }
        Some(u)
    }
}

/// `maximum(x, y)` as the core builds it: `MaxReduce` over a last axis of length 2 of a
/// private `Add` of `x` and `y`, each unsqueezed and padded into one of the two slots.
/// Returns the operand edges re-viewed over the reduce's output shape (slot 0 first), so
/// the pair lowers to one elementwise `Max` and its operands fuse like any others.
fn pair_max(g: &GraphData, id: NodeId, uses: &HashMap<NodeId, usize>) -> Option<[Edge; 2]> {
    let node = g.node(id);
    let Op::Reduce {
        op: ReduceOp::Max,
        axis,
    } = node.op
    else {
        return None;
    };
    let e = &node.inputs[0];
    let pair = g.node(e.node);
    let dims = e.view.dims();
    // f32, or f16 / bf16 throughout (the maximum of two halves is one of them: exact).
    if !node.dtype.is_float()
        || pair.dtype != node.dtype
        || pair.op != Op::Binary(BinaryOp::Add)
        || axis + 1 != dims.len()
        || dims[axis].as_constant() != Some(2)
        || !e.view.is_contiguous()
        || dims != pair.shape
        || uses.get(&e.node) != Some(&1)
        || g.outputs.contains(&e.node)
        || pair
            .inputs
            .iter()
            .any(|x| g.node(x.node).dtype != node.dtype)
    {
        return None;
    }
    // Operand `x` restricted to slot `j` of the pair axis, that axis dropped.
    let slot = |x: &Edge, j: i64| {
        let mut v = x.view.clone();
        v.slice(axis, Expression::constant(j), Expression::constant(j + 1));
        let empty =
            v.mask()[axis].1.as_constant() == Some(0) || v.mask()[axis].0.as_constant() == Some(1);
        v.squeeze(axis);
        (v, empty)
    };
    let mut out: [Option<Edge>; 2] = [None, None];
    for x in &pair.inputs {
        let ((v0, e0), (v1, e1)) = (slot(x, 0), slot(x, 1));
        let (j, v) = match (e0, e1) {
            (false, true) => (0, v0),
            (true, false) => (1, v1),
            _ => return None,
        };
        if out[j].is_some() {
            return None;
        }
        out[j] = Some(Edge {
            node: x.node,
            view: v,
        });
    }
    let [a, b] = out;
    Some([a?, b?])
}

struct Lowering<'a> {
    g: &'a GraphData,
    uses: HashMap<NodeId, usize>,
    /// `maximum` pairs lowered as elementwise `Max` (see [`pair_max`]).
    pair_max: HashMap<NodeId, [Edge; 2]>,
    /// Nodes that are a recognised function of one value (`GeluMatch`), evaluated as
    /// one `Instr::Fn` of the value read through the edge (the `functions` pass).
    fns: HashMap<NodeId, (crate::simd::FnOp, Edge)>,
    /// Layer-norm gradients (`LayerNormGrad`, every operand read one to one) that get the
    /// `layer_norm` rule's kernel: never inlined into a consumer (an accumulating sum).
    ln_grads: HashMap<NodeId, luminal::patterns::LayerNormGrad>,
    /// Layer norms (their root) that get the `layer_norm` rule's kernel: never inlined into
    /// a consumer, even a single one (an affine weight and bias, then run as the kernel's
    /// epilogue by the `epilogues` pass), where the row fusion would compute them stage by
    /// stage.
    ln_roots: HashSet<NodeId>,
    /// While lowering an f32 elementwise root: whether it may absorb a matmul producer as
    /// its epilogue, and the matmul (with its reads) once it did.
    epilogue_ok: Cell<bool>,
    epilogue: RefCell<Option<MatmulKernel>>,
    names: &'a DimNames,
    threads: usize,
    dots: crate::QuantDots,
    /// Rules and passes switched off.
    disabled: &'a [&'a str],
    /// Fusable nodes read by several consumers, all inlined into one fused root: the root
    /// they are computed in, once (see [`absorb_shared`]).
    absorbed: HashMap<NodeId, NodeId>,
    /// The fused root being emitted, and the instruction of each absorbed node emitted so
    /// far in its program.
    root: Cell<Option<NodeId>>,
    memo: RefCell<HashMap<NodeId, usize>>,
}

impl Lowering<'_> {
    fn fusable(&self, id: NodeId) -> bool {
        // A node the search made a fused term is that term's kernel, never inlined.
        (fusable(self.g, id)
            || crate::kernels::half::fusable(self.g, id)
            || self.pair_max.contains_key(&id)
            || self.fns.contains_key(&id))
            && !terms::is_term(id)
            && !self.ln_grads.contains_key(&id)
            && !self.ln_roots.contains(&id)
    }

    /// A fusable single-use producer that is not an output.
    fn private_fusable(&self, e: &Edge) -> bool {
        let p = self.g.node(e.node);
        !matches!(p.op, Op::Constant { .. })
            && self.fusable(e.node)
            && self.uses.get(&e.node) == Some(&1)
            && !self.g.outputs.contains(&e.node)
    }

    /// A single-use producer that is not an output, read through the identity view.
    fn private_identity(&self, e: &Edge) -> bool {
        self.uses.get(&e.node) == Some(&1)
            && !self.g.outputs.contains(&e.node)
            && flat_identity_edge(self.g, e)
    }

    fn inlinable(&self, e: &Edge) -> bool {
        self.private_fusable(e) && flat_identity_edge(self.g, e)
    }

    fn const_leaf(&self, e: &Edge) -> Option<ConstSrc> {
        let p = self.g.node(e.node);
        match &p.op {
            Op::Constant { value } if p.dtype == DType::F32 && !e.view.is_masked() => {
                Some(match value {
                    ConstValue::Float(v) => ConstSrc::Value(*v as f32),
                    ConstValue::Expr(x) => ConstSrc::Expr(self.names.compile(x).ok()?),
                })
            }
            Op::Constant {
                value: ConstValue::Float(v),
            } if p.dtype == DType::Bool && !e.view.is_masked() => {
                Some(ConstSrc::Value((*v != 0.0) as u8 as f32))
            }
            // A half constant: its value rounded once to its type, like the reference.
            Op::Constant { value } if HalfKind::of(p.dtype).is_some() && !e.view.is_masked() => {
                Some(match value {
                    ConstValue::Float(v) => ConstSrc::Value(p.dtype.round(*v) as f32),
                    ConstValue::Expr(x) => ConstSrc::HalfExpr(self.names.compile(x).ok()?, p.dtype),
                })
            }
            _ => None,
        }
    }

    /// Emits the value read through `e` into `prog` (views rewritten by the pending
    /// broadcasts `xfs`, innermost last); returns its instruction, or `None` when a view
    /// cannot be rewritten.
    fn emit_edge(
        &self,
        e: &Edge,
        prog: &mut Program,
        xfs: &mut Vec<Broadcast>,
    ) -> Result<Option<usize>> {
        if let Some(c) = self.const_leaf(e) {
            prog.consts.push(c);
            prog.instrs.push(Instr::Const(prog.consts.len() - 1));
            return Ok(Some(prog.instrs.len() - 1));
        }
        if xfs.is_empty() && self.epilogue_ok.get() && self.epilogue.borrow().is_none() {
            if let Some(mm) = self.epilogue_matmul(e)? {
                // The product's element `z` is the tree's element `z` (identity edges from
                // the root down): it arrives as row register 0 (see `run_epilogue`).
                *self.epilogue.borrow_mut() = Some(mm);
                prog.instrs.push(Instr::RowReg(0));
                return Ok(Some(prog.instrs.len() - 1));
            }
        }
        if xfs.is_empty()
            && self.root.get().is_some()
            && self.absorbed.get(&e.node) == self.root.get().as_ref()
            && flat_identity_edge(self.g, e)
        {
            // A shared producer computed once in this program.
            if let Some(&i) = self.memo.borrow().get(&e.node) {
                return Ok(Some(i));
            }
            let r = self.emit_node(e.node, prog, xfs)?;
            if let Some(i) = r {
                self.memo.borrow_mut().insert(e.node, i);
            }
            return Ok(r);
        }
        if self.inlinable(e) {
            return self.emit_node(e.node, prog, xfs);
        }
        if self.private_fusable(e) {
            if let Some(b) = Broadcast::of(&e.view, &self.g.node(e.node).shape) {
                let mark = (prog.instrs.len(), prog.leaves.len(), prog.consts.len());
                xfs.push(b);
                let r = self.emit_node(e.node, prog, xfs)?;
                xfs.pop();
                if r.is_some() {
                    return Ok(r);
                }
                prog.instrs.truncate(mark.0);
                prog.leaves.truncate(mark.1);
                prog.consts.truncate(mark.2);
            }
        }
        let mut view = e.view.clone();
        for b in xfs.iter().rev() {
            match b.apply(&view) {
                Some(v) => view = v,
                None => return Ok(None),
            }
        }
        // The same buffer through the same view already read by this program (a value used
        // several times, e.g. x in the GELU backward): load it once.
        let buf = BufId::of(e.node);
        if let Some(i) = prog.instrs.iter().position(|ins| {
            matches!(*ins, Instr::Load(l) if prog.leaves[l].buf == buf && prog.leaves[l].exprs.view == view)
        }) {
            return Ok(Some(i));
        }
        prog.leaves.push(Leaf {
            buf,
            exprs: ViewExprs::new(&view, self.names)?,
            view: ResolvedView::default(),
        });
        prog.instrs.push(Instr::Load(prog.leaves.len() - 1));
        Ok(Some(prog.instrs.len() - 1))
    }

    /// Emits a fusable node (and its inlined producers) into `prog`.
    fn emit_node(
        &self,
        id: NodeId,
        prog: &mut Program,
        xfs: &mut Vec<Broadcast>,
    ) -> Result<Option<usize>> {
        let node = self.g.node(id);
        let mut args = [0usize; 2];
        if let Some((f, x)) = self.fns.get(&id) {
            let Some(a) = self.emit_edge(x, prog, xfs)? else {
                return Ok(None);
            };
            prog.instrs.push(Instr::Fn(*f, a));
            return Ok(Some(prog.instrs.len() - 1));
        }
        if let Some(pair) = self.pair_max.get(&id) {
            for (i, e) in pair.iter().enumerate() {
                match self.emit_edge(e, prog, xfs)? {
                    Some(a) => args[i] = a,
                    None => return Ok(None),
                }
            }
            prog.instrs.push(Instr::Max(args[0], args[1]));
            return Ok(Some(prog.instrs.len() - 1));
        }
        for (i, e) in node.inputs.iter().enumerate().take(2) {
            match self.emit_edge(e, prog, xfs)? {
                Some(a) => args[i] = a,
                None => return Ok(None),
            }
        }
        if node.op == Op::Binary(BinaryOp::Add) && node.dtype == DType::Bool {
            // OR: 0/1 + 0/1, then `!= 0`.
            prog.instrs
                .push(Instr::Binary(BinaryOp::Add, args[0], args[1]));
            prog.instrs.push(Instr::NotZero(prog.instrs.len() - 1));
            return Ok(Some(prog.instrs.len() - 1));
        }
        let instr = match &node.op {
            Op::Unary(u) => Instr::Unary(*u, args[0]),
            Op::Binary(b) => Instr::Binary(*b, args[0], args[1]),
            Op::Cast(DType::Bool) => Instr::NotZero(args[0]),
            Op::Cast(_) | Op::Contiguous => Instr::Copy(args[0]),
            Op::Constant { .. } => {
                let e = Edge {
                    node: id,
                    view: ShapeTracker::new(node.shape.clone()),
                };
                return self.emit_edge(&e, prog, xfs);
            }
            other => unreachable!("{} is not fusable", other.name()),
        };
        prog.instrs.push(instr);
        if let Some(kind) = crate::kernels::half::rounds_to(self.g, id) {
            prog.instrs.push(Instr::Round(kind, prog.instrs.len() - 1));
        }
        Ok(Some(prog.instrs.len() - 1))
    }

    fn name_of(prog: &Program, prefix: &str) -> String {
        let ops: Vec<String> = prog
            .instrs
            .iter()
            .filter_map(|i| match i {
                Instr::Unary(u, _) => Some(u.name().to_string()),
                Instr::Binary(b, _, _) => Some(b.name().to_string()),
                Instr::NotZero(_) => Some("NotZero".into()),
                Instr::Max(..) => Some("Max".into()),
                Instr::Fn(f, _) => Some(f.name().into()),
                _ => None,
            })
            .collect();
        format!("{prefix}[{}]", ops.join(","))
    }

    /// In-place write into a state input's buffer. The new rows are evaluated straight into
    /// it when they are a private elementwise tree of the state's own float type (see
    /// `movement/write.rs`).
    fn write_slice(&self, id: NodeId) -> Result<Option<Lowered>> {
        let node = self.g.node(id);
        if !matches!(node.op, Op::WriteSlice { .. }) {
            return Ok(None);
        }
        let src = &node.inputs[1];
        let p = self.g.node(src.node);
        let fused = !self.disabled("fused_elementwise")
            && matches!(node.dtype, DType::F32 | DType::F16 | DType::BF16)
            && p.dtype == node.dtype
            && src.view.is_contiguous()
            && self.private_fusable(src);
        let prog = if fused {
            let mut prog = self
                .tree_program(src.node)?
                .expect("a root has no pending broadcast");
            // Rounded as it is stored (as a half root of a fused kernel).
            if let Some(&Instr::Round(kind, _)) = prog.instrs.last() {
                if HalfKind::of(node.dtype) == Some(kind) {
                    prog.instrs.pop();
                }
            }
            // A tree reading the state it is written into (an optimizer's `w - lr·g`)
            // keeps its own buffer: the state's old values are read through any view.
            let dest = BufId::of(node.inputs[0].node);
            let reads_dest = prog.reads().any(|b| b == dest);
            (!reads_dest).then_some(prog)
        } else {
            None
        };
        let name = match &prog {
            Some(prog) => Self::name_of(prog, "write_slice+"),
            None => "write_slice".into(),
        };
        let w = WriteSliceKernel::new(self.g, id, self.names, prog)?;
        Ok(Some((name, Box::new(w))))
    }

    /// A cast of a float tensor into a block-quantized type (a quantized KV cache's new
    /// rows): encoded block by block.
    fn encode(&self, id: NodeId) -> Result<Option<Lowered>> {
        let Some(k) = crate::kernels::encode::EncodeKernel::try_new(self.g, id, self.names)? else {
            return Ok(None);
        };
        let name = format!("encode[{}]", self.g.node(id).dtype);
        Ok(Some((name, Box::new(k))))
    }

    /// A cast of a quantized tensor read through any view: decoded, then cast.
    fn dequantize(&self, id: NodeId) -> Result<Option<Lowered>> {
        let Some(d) = crate::kernels::quant::DequantKernel::try_new(self.g, id, self.names)? else {
            return Ok(None);
        };
        let node = self.g.node(id);
        let from = self.g.node(node.inputs[0].node).dtype;
        let name = format!("dequantize[{from}->{}]", node.dtype);
        Ok(Some((name, Box::new(d))))
    }

    /// A fusable root with its inlined producers: one fused elementwise kernel, or the
    /// epilogue of the private f32 matmul it reads. A cast to a half type is left to
    /// [`Lowering::half_cast`] (it fuses into the trees that read it).
    fn fused_elementwise(&self, id: NodeId) -> Result<Option<Lowered>> {
        let node = self.g.node(id);
        let half_cast = matches!(node.op, Op::Cast(_)) && HalfKind::of(node.dtype).is_some();
        if !self.fusable(id) || half_cast {
            return Ok(None);
        }
        self.epilogue_ok
            .set(node.dtype == DType::F32 && !self.disabled("matmul"));
        let r = self.tree_program(id);
        self.epilogue_ok.set(false);
        let mut prog = r?.expect("a root has no pending broadcast");
        // A half root is rounded as it is stored: its own rounding step is redundant.
        if let Some(&Instr::Round(kind, _)) = prog.instrs.last() {
            if HalfKind::of(node.dtype) == Some(kind) {
                prog.instrs.pop();
            }
        }
        if let Some(mut mm) = self.epilogue.borrow_mut().take() {
            let name = Self::name_of(&prog, "matmul+");
            mm.epilogue = Some(prog);
            self.set_dots(&mut mm, id);
            return Ok(Some((name, Box::new(mm))));
        }
        let name = Self::name_of(&prog, "elementwise");
        Ok(Some((name, Box::new(ElementwiseKernel { prog }))))
    }

    /// Casts to f16 / bf16 convert in a kernel of their own (casts to f32 are fused: their
    /// consumers and row kernels read the half data directly).
    fn half_cast(&self, id: NodeId) -> Result<Option<Lowered>> {
        let Some(c) = crate::kernels::half::CastKernel::try_new(self.g, id, self.names)? else {
            return Ok(None);
        };
        let node = self.g.node(id);
        let from = self.g.node(node.inputs[0].node).dtype;
        Ok(Some((format!("cast[{from}->{}]", node.dtype), Box::new(c))))
    }

    /// The matmul pattern (see [`Lowering::try_matmul`]).
    fn matmul(&self, id: NodeId) -> Result<Option<Lowered>> {
        let Op::Reduce { op, axis } = self.g.node(id).op else {
            return Ok(None);
        };
        let Some(mut mm) = self.try_matmul(id, op, axis)? else {
            return Ok(None);
        };
        self.set_dots(&mut mm, id);
        Ok(Some(("matmul".into(), Box::new(mm))))
    }

    /// A reduction over a fused tree: f32, or f16 / bf16 accumulated in f64 (see
    /// `half::run_half_reduce`). A chain of reductions of the same op (`sum` over several
    /// axes: a bias gradient over batch and positions, a batch norm's statistics) is one
    /// kernel: see [`Lowering::reduce_chain`].
    fn fused_reduce(&self, id: NodeId) -> Result<Option<Lowered>> {
        let node = self.g.node(id);
        let Op::Reduce { op, axis } = node.op else {
            return Ok(None);
        };
        let float = node.dtype == DType::F32 || HalfKind::of(node.dtype).is_some();
        if !float || self.g.node(node.inputs[0].node).dtype != node.dtype {
            return Ok(None);
        }
        let chain = self.reduce_chain(id)?;
        if chain.2.len() > 1 {
            if let Some(k) = self.chain_reduce(id, chain)? {
                return Ok(Some(k));
            }
        }
        let e = &node.inputs[0];
        let mut prog = self.reduce_program(id, e)?;
        let dims = e.view.dims();
        let mut name = Self::name_of(&prog, &format!("{}({axis})", op.name()));
        let mut inner: Expression = dims[axis + 1..].iter().product();
        let mut no_rows = false;
        if let Some(j) = column_position(&prog, &dims, axis) {
            // Reduce across rows instead of along strided ones: the reduced axis moves in
            // front of the contiguous output dims (their order, hence the output layout,
            // is unchanged), and the kernel adds whole rows of contiguous loads.
            let mut perm: Vec<usize> = (0..j).collect();
            perm.push(axis);
            perm.extend(j..axis);
            perm.extend(axis + 1..dims.len());
            self.permute_leaves(&mut prog, &perm)?;
            inner = dims[j..axis].iter().chain(&dims[axis + 1..]).product();
            no_rows = true;
            name = Self::name_of(&prog, &format!("{}({axis}, across rows)", op.name()));
        }
        let k = ReduceKernel {
            op,
            prog,
            len: self.names.compile(&dims[axis])?,
            inner: self.names.compile(&inner)?,
            no_rows,
        };
        Ok(Some((name, Box::new(k))))
    }

    /// The fused tree read through `e` as the program of reduction `id`.
    fn reduce_program(&self, id: NodeId, e: &Edge) -> Result<Program> {
        let mut prog = Program::default();
        self.begin_root(id);
        let r = self.emit_edge(e, &mut prog, &mut vec![]);
        self.root.set(None);
        r?.expect("a root has no pending broadcast");
        Ok(prog)
    }

    /// Reads the program's values in the order `perm` of their dims (its leaves' views
    /// permuted alike; see [`permutable`]).
    fn permute_leaves(&self, prog: &mut Program, perm: &[usize]) -> Result<()> {
        for leaf in &mut prog.leaves {
            let mut v = leaf.exprs.view.clone();
            v.permute(perm);
            leaf.exprs = ViewExprs::new(&v, self.names)?;
        }
        Ok(())
    }

    /// The reductions `id` reads that it can absorb: the innermost reduction of the chain,
    /// the edge whose values it reduces, and the dims of that edge's shape reduced, in
    /// order. The chain goes on through each reduction of the same op and dtype read by
    /// it alone through the identity view of its own shape (not a reshape or an
    /// unsqueeze of it) and lowered as a plain reduction (not a product, a term, a
    /// layer-norm gradient or a `maximum` pair).
    fn reduce_chain(&self, id: NodeId) -> Result<(NodeId, &Edge, Vec<usize>)> {
        let node = self.g.node(id);
        let Op::Reduce { op, axis } = node.op else {
            unreachable!("reduce_chain of a non-reduction");
        };
        let (mut root, mut e, mut axes) = (id, &node.inputs[0], vec![axis]);
        // Half reductions round each one's result to their type: merged they would not.
        if self.disabled("reduce_chain") || node.dtype != DType::F32 {
            return Ok((root, e, axes));
        }
        loop {
            let p = self.g.node(e.node);
            let Op::Reduce { op: pop, axis: ia } = p.op else {
                break;
            };
            if pop != op
                || p.dtype != node.dtype
                || e.view.dims() != p.shape
                || !self.private_identity(e)
                || terms::is_term(e.node)
                || self.ln_grads.contains_key(&e.node)
                || self.pair_max.contains_key(&e.node)
                || self.try_matmul(e.node, pop, ia)?.is_some()
            {
                break;
            }
            // `axes` are dims of p's output; p's input has dim `ia` more.
            for a in &mut axes {
                *a += (*a >= ia) as usize;
            }
            axes.push(ia);
            axes.sort_unstable();
            (root, e) = (e.node, &p.inputs[0]);
        }
        Ok((root, e, axes))
    }

    /// Reduction `id` with the chain of reductions it reads (`reduce_chain`) as one
    /// kernel: adjacent reduced dims are one axis of their product (a bias gradient's
    /// tokens over batch and positions: a column sum when dims follow); otherwise the
    /// reduced dims move behind the kept ones, and each output's elements are one row.
    /// Sums then add in another order than one axis at a time. `None` where the tree
    /// cannot be permuted (row-kernel reads, a leaf over other dims).
    fn chain_reduce(
        &self,
        id: NodeId,
        (root, e, axes): (NodeId, &Edge, Vec<usize>),
    ) -> Result<Option<Lowered>> {
        let Op::Reduce { op, .. } = self.g.node(id).op else {
            unreachable!("chain_reduce of a non-reduction");
        };
        // The tree is the innermost reduction's: producers shared inside it are computed
        // once in it (`absorb_shared` placed them there).
        let mut prog = self.reduce_program(root, e)?;
        let dims = e.view.dims();
        let (lo, hi) = (axes[0], axes[axes.len() - 1] + 1);
        let len: Expression = axes.iter().map(|&a| dims[a].clone()).product();
        let inner: Expression = if hi - lo == axes.len() {
            dims[hi..].iter().product()
        } else {
            if !permutable(&prog, &dims) {
                return Ok(None);
            }
            let mut perm: Vec<usize> = (0..dims.len()).filter(|a| !axes.contains(a)).collect();
            perm.extend(&axes);
            self.permute_leaves(&mut prog, &perm)?;
            Expression::from(1)
        };
        let list: Vec<String> = axes.iter().map(|a| a.to_string()).collect();
        let name = Self::name_of(&prog, &format!("{}({})", op.name(), list.join("+")));
        let k = ReduceKernel {
            op,
            prog,
            len: self.names.compile(&len)?,
            inner: self.names.compile(&inner)?,
            no_rows: true,
        };
        Ok(Some((name, Box::new(k))))
    }

    /// Gather, iota and concatenation as data movement.
    fn movement(&self, id: NodeId) -> Result<Option<Lowered>> {
        crate::kernels::movement::lower(self.g, id, &self.uses, self.names)
    }

    /// Anything else, with the reference semantics.
    fn fallback(&self, id: NodeId) -> Result<Option<Lowered>> {
        let node = self.g.node(id);
        let in_bufs: Vec<BufId> = node.inputs.iter().map(|e| BufId::of(e.node)).collect();
        let in_dtype = node
            .inputs
            .first()
            .map(|e| self.g.node(e.node).dtype)
            .unwrap_or(node.dtype);
        let fb = FallbackKernel::new(node, &in_bufs, in_dtype, self.names)?;
        let name = format!("fallback[{}:{}]", node.op.name(), node.dtype);
        Ok(Some((name, Box::new(fb))))
    }

    /// Starts emitting the program of fused root `id`.
    fn begin_root(&self, id: NodeId) {
        self.root.set(Some(id));
        self.memo.borrow_mut().clear();
    }

    /// Node `id`'s fused tree as a program of its own (values at the node's flat indices);
    /// `None` when the tree leaves a broadcast pending at its root.
    fn tree_program(&self, id: NodeId) -> Result<Option<Program>> {
        let mut prog = Program::default();
        self.begin_root(id);
        let r = self.emit_node(id, &mut prog, &mut vec![]);
        self.root.set(None);
        Ok(r?.map(|_| prog))
    }

    /// A program of node `id`'s values at its flat indices: its fused tree where it is a
    /// fusable computed node ([`Lowering::tree_program`], `None` as there), else a read of
    /// its buffer (an attention bias or mask).
    fn node_program(&self, id: NodeId) -> Result<Option<Program>> {
        let node = self.g.node(id);
        if self.fusable(id) && !matches!(node.op, Op::Constant { .. }) {
            return self.tree_program(id);
        }
        let mut prog = Program::default();
        prog.leaves.push(Leaf {
            buf: BufId::of(id),
            exprs: ViewExprs::new(&ShapeTracker::new(node.shape.clone()), self.names)?,
            view: ResolvedView::default(),
        });
        prog.instrs.push(Instr::Load(0));
        Ok(Some(prog))
    }

    /// Whether the rule named `name` is switched off.
    fn disabled(&self, name: &str) -> bool {
        self.disabled.contains(&name)
    }

    /// The backend's activation policy for a product with a quantized weight: graph
    /// outputs (the logits) keep or refine f32 activations (see [`crate::QuantDots`]).
    fn set_dots(&self, mm: &mut MatmulKernel, id: NodeId) {
        let output = self.g.outputs.contains(&id);
        mm.exact = match self.dots {
            crate::QuantDots::F32 => true,
            crate::QuantDots::Int8 | crate::QuantDots::Int8RefineOutputs => false,
            crate::QuantDots::Int8ExceptOutputs => output,
        };
        if self.dots == crate::QuantDots::Int8RefineOutputs && output {
            mm.refine = crate::kernels::matmul::REFINE_TOP;
        }
    }

    /// The kernel of node `id`: the first rule of [`RULES`] that applies and is not
    /// switched off (`fallback` always applies).
    fn lower(&self, id: NodeId) -> Result<Kernel> {
        let node = self.g.node(id);
        for &(name, rule) in RULES {
            if name != "fallback" && self.disabled(name) {
                continue;
            }
            if let Some((kname, kind)) = rule(self, id)? {
                return Ok(Kernel {
                    name: kname,
                    node: id,
                    dtype: node.dtype,
                    out: BufId::of(id),
                    numel: self.names.compile(&node.shape.iter().product())?,
                    kind,
                    side: None,
                });
            }
        }
        unreachable!("the fallback rule applies to every node")
    }

    /// A layer norm over the last axis, or the gradient autograd builds for one, as one
    /// row loop (`kernels/norm.rs`). Every operand must be read one to one; a forward whose
    /// input is a private elementwise tree keeps the row fusion, which computes that tree
    /// inside its row kernel (a residual sum feeding the norm).
    fn layer_norm(&self, id: NodeId) -> Result<Option<Lowered>> {
        use crate::kernels::norm::LayerNormKernel;
        let node = self.g.node(id);
        if node.dtype != DType::F32 || node.shape.is_empty() {
            return Ok(None);
        }
        let len = self.names.compile(node.shape.last().unwrap())?;
        if let Some(h) = self.ln_grads.get(&id) {
            let [x, xh, dy] = [&h.x, &h.xhat, &h.dy].map(|e| BufId::of(e.node));
            let k = LayerNormKernel::grad(x, xh, dy, len, h.eps);
            return Ok(Some(("layer_norm_grad".into(), Box::new(k))));
        }
        let Some(m) = self.layer_norm_match(id) else {
            return Ok(None);
        };
        let k = LayerNormKernel::forward(BufId::of(m.x.node), len, m.eps);
        Ok(Some(("layer_norm".into(), Box::new(k))))
    }

    /// The layer norm whose root is `id`, where the `layer_norm` rule takes it: its input
    /// read one to one, and not a private elementwise tree (a residual sum feeding the norm
    /// is computed inside the row fusion's kernel instead).
    fn layer_norm_match(&self, id: NodeId) -> Option<luminal::patterns::LayerNormMatch> {
        let node = self.g.node(id);
        if node.dtype != DType::F32 || node.shape.is_empty() {
            return None;
        }
        let m = luminal::patterns::LayerNormMatch::find(self.g, id)?;
        (flat_identity_edge(self.g, &m.x) && !self.private_fusable(&m.x)).then_some(m)
    }

    /// A private f32 matmul read through the identity: the consumer can be its epilogue.
    fn epilogue_matmul(&self, e: &Edge) -> Result<Option<MatmulKernel>> {
        let p = self.g.node(e.node);
        let Op::Reduce { op, axis } = p.op else {
            return Ok(None);
        };
        if p.dtype != DType::F32
            || self.uses.get(&e.node) != Some(&1)
            || self.g.outputs.contains(&e.node)
            || !flat_identity_edge(self.g, e)
        {
            return Ok(None);
        }
        // The final product of an attention pattern is the fused attention kernel's.
        if !self.disabled("attention") && self.match_attention(e.node).is_some() {
            return Ok(None);
        }
        self.try_matmul(e.node, op, axis)
    }

    /// `SumReduce(last)` of an inlinable `Mul` whose views broadcast `a` along N and `b`
    /// along M: a gemm over the operands' own buffers and strides. f32, or f16 / bf16
    /// throughout (the half `Mul` is single-use and read through the identity view, like an
    /// inlined f32 one; its per-product rounding is skipped: products of halves are exact in
    /// the f32 accumulation).
    fn try_matmul(&self, id: NodeId, op: ReduceOp, axis: usize) -> Result<Option<MatmulKernel>> {
        let node = self.g.node(id);
        let e = &node.inputs[0];
        let r = e.view.rank();
        let mul = self.g.node(e.node);
        let dt = node.dtype;
        let half = matches!(dt, DType::F16 | DType::BF16);
        if op != ReduceOp::Sum
            || r < 3
            || axis != r - 1
            || mul.op != Op::Binary(BinaryOp::Mul)
            || !(dt == DType::F32 || half)
            || mul.dtype != dt
            || mul.inputs.iter().any(|x| self.g.node(x.node).dtype != dt)
            || !(self.inlinable(e) || half && self.private_identity(e))
        {
            return Ok(None);
        }
        let dims = e.view.dims();
        let Some((a, b)) = luminal::hl_ops::product_operands(&mul.inputs, &dims) else {
            return Ok(None);
        };
        // `b` = `w.dequantize()ᵀ` of a quantized or half weight read as the plain `Wᵀ`
        // (`[.., M, N, K]` with strides `[0.., 0, K, 1]`): read the blocks in place.
        let weight = crate::kernels::quant::dequantized_weight(self.g, b).filter(|&(w, _)| {
            let v = &b.view;
            let (st, shape) = (v.strides(), &self.g.node(w).shape);
            !v.is_masked()
                && v.offset().is_zero()
                && st[r - 1].as_constant() == Some(1)
                && st[r - 2] == shape[1]
                && dims[r - 2] == shape[0]
                && dims[r - 1] == shape[1]
                && st[..r - 2].iter().all(|s| s.is_zero())
        });
        let b_buf = BufId::of(weight.map_or(b.node, |(w, _)| w));
        // A weight product whose rows come from an RMSNorm computes the norm itself (see
        // `NormPrologue`), reading the norm's input through the same view: the pattern reads
        // that input's buffer as it is laid out (a flat identity view), so the norm's
        // buffer and it have one layout, and `a` reads whole rows along K.
        let norm = if weight.is_some() && !self.disabled("norm_prologue") {
            let sa = a.view.strides();
            luminal::patterns::RmsNormMatch::find(self.g, a.node)
                .filter(|_| !a.view.is_masked() && sa[r - 1].as_constant() == Some(1))
        } else {
            None
        };
        let a_buf = BufId::of(norm.as_ref().map_or(a.node, |m| m.x.node));
        let mut k = MatmulKernel::new(
            a_buf,
            b_buf,
            ViewExprs::new(&a.view, self.names)?,
            ViewExprs::new(&b.view, self.names)?,
            terms::matmul_threads(self.threads),
        );
        (k.split, k.tiles, k.precision) = terms::matmul_layout();
        k.weight = weight.map(|(_, dt)| dt);
        k.norm = norm.map(|m| crate::kernels::matmul::NormPrologue {
            weight: m.weight.map(|w| BufId::of(w.node)),
            scale: m.scale,
            eps: m.eps,
            shared: !matches!(self.g.node(m.x.node).op, Op::Input { .. }),
            node: a.node,
        });
        Ok(Some(k))
    }
}

/// A rule's result: the kernel's name and the kernel.
type Lowered = (String, Box<dyn CpuKernel>);

type Rule = fn(&Lowering<'_>, NodeId) -> Result<Option<Lowered>>;

/// The lowering rules, in the order they are tried for each node that needs a kernel; the
/// first that applies builds it. Any but `fallback` can be switched off
/// (`CpuBackend::disable_rules`), as can the passes that merge kernels afterwards
/// ([`PASSES`]): the graph then runs on what remains, with the same results.
const RULES: &[(&str, Rule)] = &[
    ("write_slice", |l, id| l.write_slice(id)),
    ("attention_grad", |l, id| l.attention_grad(id)),
    ("layer_norm", |l, id| l.layer_norm(id)),
    ("terms", |l, id| l.fused_term(id)),
    ("attention", |l, id| l.attention(id)),
    ("encode", |l, id| l.encode(id)),
    ("dequantize", |l, id| l.dequantize(id)),
    ("fused_elementwise", |l, id| l.fused_elementwise(id)),
    ("half_cast", |l, id| l.half_cast(id)),
    ("matmul", |l, id| l.matmul(id)),
    ("fused_reduce", |l, id| l.fused_reduce(id)),
    ("movement", |l, id| l.movement(id)),
    ("fallback", |l, id| l.fallback(id)),
];

/// Passes, in order: shared producers computed inside their one fused root (`shared`,
/// before lowering; see [`absorb_shared`]), then over the lowered kernel list: row fusion
/// (`kernels/fused/rows.rs`), concatenations found inside elementwise kernels
/// (`kernels/movement`), elementwise kernels as in-place epilogues of a layer norm
/// ([`epilogues`]), side outputs ([`side_outputs`]). `norm_prologue` is not a pass
/// but a choice of the matmul rule: an RMSNorm whose rows a weight product reads is
/// computed by the product (`NormPrologue`).
const PASSES: &[&str] = &[
    "shared",
    "reduce_chain",
    "rows",
    "concat",
    "norm_prologue",
    "functions",
    "epilogues",
    "side",
];

/// Whether the program's leaves can be permuted as its values' dims `dims` are: no row
/// kernel reads, and every leaf over exactly those dims (not a producer's own dims, inlined
/// through a reshape).
fn permutable(prog: &Program, dims: &[Expression]) -> bool {
    !prog
        .instrs
        .iter()
        .any(|i| matches!(i, Instr::RowReg(_) | Instr::RowScalar(_)))
        && prog.leaves.iter().all(|l| l.exprs.view.dims() == dims)
}

/// Where a reduction over the last axis `axis` should move that axis so that it sums whole
/// contiguous rows instead of strided ones (a bias or norm-weight gradient: a column sum of
/// a row-major `[tokens, features]` buffer, read as `[features, tokens]`): the first of the
/// trailing output dims that the program's first leaf reads row-major with unit stride, or
/// `None` when the axis is not last or is read with unit stride, the leaves cannot be
/// permuted ([`permutable`]), or the first leaf's dims and strides are not constants.
fn column_position(prog: &Program, dims: &[Expression], axis: usize) -> Option<usize> {
    let r = dims.len();
    if r < 2 || axis + 1 != r || prog.leaves.is_empty() {
        return None;
    }
    if !permutable(prog, dims) {
        return None;
    }
    let first = &prog.leaves[0].exprs.view;
    let d: Vec<i64> = first
        .dims()
        .iter()
        .map(|e| e.as_constant())
        .collect::<Option<_>>()?;
    let s: Vec<i64> = first
        .strides()
        .iter()
        .map(|e| e.as_constant())
        .collect::<Option<_>>()?;
    // The reduced axis is long and strided, the last output dim contiguous.
    if d[axis] < 8 || s[axis] == 1 || s[axis] == 0 || s[r - 2] != 1 {
        return None;
    }
    let mut j = r - 2;
    while j > 0 && d[j - 1] != 1 && s[j - 1] == s[j] * d[j] {
        j -= 1;
    }
    // Rows long enough for vector adds.
    let row: i64 = d[j..axis].iter().product();
    (row >= 16).then_some(j)
}

/// Lowers the live part of `g` (what the outputs need) into kernels in launch order.
pub fn lower(
    g: &GraphData,
    live_order: &[NodeId],
    names: &DimNames,
    threads: usize,
    dots: crate::QuantDots,
    disabled: &[&str],
) -> Result<Vec<Kernel>> {
    for d in disabled {
        if *d == "fallback" || !RULES.iter().any(|r| r.0 == *d) && !PASSES.contains(d) {
            return Err(luminal::LuminalError::Backend(format!(
                "no lowering rule or pass named {d:?} can be switched off (rules: {}; passes: {})",
                RULES[..RULES.len() - 1]
                    .iter()
                    .map(|r| r.0)
                    .collect::<Vec<_>>()
                    .join(", "),
                PASSES.join(", ")
            )));
        }
    }
    let mut uses: HashMap<NodeId, usize> = HashMap::new();
    for &id in live_order {
        for e in &g.node(id).inputs {
            *uses.entry(e.node).or_default() += 1;
        }
    }
    let pair_max = live_order
        .iter()
        .filter_map(|&id| Some((id, pair_max(g, id, &uses)?)))
        .collect();
    let fns = if disabled.contains(&"functions") {
        HashMap::new()
    } else {
        live_order
            .iter()
            .filter_map(|&id| {
                let m = luminal::patterns::GeluMatch::find(g, id)?;
                let f = match m.f {
                    luminal::patterns::GeluFn::Tanh => crate::simd::FnOp::GeluTanh,
                    luminal::patterns::GeluFn::TanhGrad => crate::simd::FnOp::GeluTanhGrad,
                    luminal::patterns::GeluFn::Erf => crate::simd::FnOp::GeluErf,
                };
                Some((id, (f, m.x)))
            })
            .collect()
    };
    let ln_grads = if disabled.contains(&"layer_norm") {
        HashMap::new()
    } else {
        live_order
            .iter()
            .filter_map(|&id| {
                let h = luminal::patterns::LayerNormGrad::find(g, id)?;
                let flat = [&h.x, &h.xhat, &h.dy]
                    .into_iter()
                    .all(|e| flat_identity_edge(g, e));
                (flat && g.node(id).dtype == DType::F32).then_some((id, h))
            })
            .collect()
    };
    let mut lw = Lowering {
        g,
        uses,
        pair_max,
        fns,
        ln_grads,
        ln_roots: HashSet::new(),
        epilogue_ok: Cell::new(false),
        epilogue: RefCell::new(None),
        names,
        threads,
        dots,
        disabled,
        absorbed: HashMap::new(),
        root: Cell::new(None),
        memo: RefCell::new(HashMap::new()),
    };
    if !lw.disabled("layer_norm") {
        let roots = live_order
            .iter()
            .copied()
            .filter(|&id| lw.layer_norm_match(id).is_some())
            .collect();
        lw.ln_roots = roots;
    }
    if !lw.disabled("shared") {
        lw.absorbed = absorb_shared(&lw, live_order);
    }
    // Walk consumers before producers: a node gets a kernel only if some kernel (or the
    // user) reads its buffer.
    let mut needed: HashSet<BufId> = g.outputs.iter().map(|&n| BufId::of(n)).collect();
    let mut kernels = vec![];
    for &id in live_order.iter().rev() {
        if !needed.contains(&BufId::of(id)) || matches!(g.node(id).op, Op::Input { .. }) {
            continue;
        }
        let k = lw.lower(id)?;
        needed.extend(k.reads());
        kernels.push(k);
    }
    kernels.reverse();
    if !lw.disabled("rows") {
        kernels = crate::kernels::fused::rows::fuse_rows(g, kernels, names)?;
    }
    if !lw.disabled("concat") {
        kernels = crate::kernels::movement::replace_concats(g, kernels, &lw.uses, names)?;
    }
    if !lw.disabled("epilogues") {
        kernels = epilogues(g, kernels);
    }
    let kernels = order_state_writes(kernels)?;
    Ok(if lw.disabled("side") {
        kernels
    } else {
        side_outputs(g, kernels)
    })
}
