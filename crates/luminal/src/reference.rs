//! The reference runtime: every primop evaluated one element at a time on exact `f64`
//! values, rounded to the node's dtype. Simple and obviously correct; speed is not its job.
//! Every fast backend is tested against it.

use crate::backend::{Backend, CompileOptions, Runtime};
use crate::dtype::HostData;
use crate::error::{LuminalError, Result};
use crate::graph::{Edge, GraphData, NodeId, TensorRef};
use crate::op::{ConstValue, Op};
use crate::passes::live_nodes;
use crate::shape::{CompiledExpression, Expression, ShapeTracker};
use std::collections::{BTreeSet, HashMap};

#[derive(Clone, Copy, Debug, Default)]
pub struct ReferenceBackend;

impl Backend for ReferenceBackend {
    type Runtime = ReferenceRuntime;
    fn compile(&self, graph: GraphData, _: &CompileOptions) -> Result<ReferenceRuntime> {
        Ok(ReferenceRuntime::new(graph))
    }
}

pub struct ReferenceRuntime {
    graph: GraphData,
    /// Nodes the outputs need, inputs before consumers.
    order: Vec<NodeId>,
    /// Dynamic dims the needed nodes use.
    needed_dims: BTreeSet<String>,
    inputs: HashMap<NodeId, Vec<f64>>,
    results: HashMap<NodeId, Vec<f64>>,
    dims: HashMap<String, i64>,
}

/// Reads logical elements of a view over a buffer.
struct ViewReader {
    index: CompiledExpression,
    valid: Option<CompiledExpression>,
}

impl ViewReader {
    fn new(view: &ShapeTracker, dims: &HashMap<String, i64>) -> Result<ViewReader> {
        let bound = view.substitute_all(&|name| dims.get(name).map(|&v| Expression::from(v)));
        let compile = |e: Expression| {
            e.compile(&["z"])
                .map_err(|e| LuminalError::Expression(e.to_string()))
        };
        let valid = bound.valid_expression();
        Ok(ViewReader {
            index: compile(bound.index_expression())?,
            valid: if valid.as_constant() == Some(1) {
                None
            } else {
                Some(compile(valid)?)
            },
        })
    }
    fn read(&self, buf: &[f64], z: usize) -> Result<f64> {
        let err = |e: crate::shape::ExprError| LuminalError::Expression(e.to_string());
        if let Some(v) = &self.valid {
            if v.eval(&[z as i64]).map_err(err)? == 0 {
                return Ok(0.0);
            }
        }
        let i = self.index.eval(&[z as i64]).map_err(err)?;
        usize::try_from(i)
            .ok()
            .and_then(|i| buf.get(i).copied())
            .ok_or_else(|| {
                LuminalError::Backend(format!(
                    "view reads element {i} of a buffer of {}",
                    buf.len()
                ))
            })
    }
}

impl ReferenceRuntime {
    pub fn new(graph: GraphData) -> ReferenceRuntime {
        let live = live_nodes(&graph);
        let order: Vec<NodeId> = graph
            .toposort()
            .into_iter()
            .filter(|id| live.contains(id))
            .collect();
        let mut sub = graph.clone();
        sub.nodes.iter_mut().enumerate().for_each(|(i, n)| {
            if !live.contains(&NodeId(i as u32)) {
                *n = None;
            }
        });
        let needed_dims = sub.dynamic_dims();
        ReferenceRuntime {
            graph,
            order,
            needed_dims,
            inputs: HashMap::new(),
            results: HashMap::new(),
            dims: HashMap::new(),
        }
    }

    /// The compiled graph (after the generic passes).
    pub fn graph(&self) -> &GraphData {
        &self.graph
    }

    fn eval_dim(&self, e: &Expression) -> Result<i64> {
        e.eval_with(&|name| self.dims.get(name).copied())
            .map_err(|err| match err {
                crate::shape::ExprError::UnboundVariable(v) => LuminalError::UnboundDim(v),
                other => LuminalError::Expression(other.to_string()),
            })
    }
    fn numel(&self, shape: &[Expression]) -> Result<usize> {
        shape
            .iter()
            .try_fold(1usize, |acc, d| Ok(acc * self.eval_dim(d)?.max(0) as usize))
    }

    fn buffer(&self, id: NodeId) -> &[f64] {
        self.inputs
            .get(&id)
            .or_else(|| self.results.get(&id))
            .map(|v| v.as_slice())
            .unwrap_or(&[])
    }

    fn reader(&self, e: &Edge) -> Result<ViewReader> {
        ViewReader::new(&e.view, &self.dims)
    }

    /// Computes one node's output buffer.
    fn compute(&self, id: NodeId) -> Result<Vec<f64>> {
        let node = self.graph.node(id);
        let n = self.numel(&node.shape)?;
        let dt = node.dtype;
        let input = |i: usize| -> Result<(ViewReader, &[f64])> {
            let e = &node.inputs[i];
            Ok((self.reader(e)?, self.buffer(e.node)))
        };
        let mut out = Vec::with_capacity(n);
        match &node.op {
            Op::Input { .. } => unreachable!("inputs are not computed"),
            Op::Constant { value } => {
                let v = match value {
                    ConstValue::Float(v) => *v,
                    ConstValue::Expr(e) => self.eval_dim(e)? as f64,
                };
                out.resize(n, dt.round(v));
            }
            Op::Iota { expr } => {
                let bound =
                    expr.substitute_all(&|name| self.dims.get(name).map(|&v| Expression::from(v)));
                let f = bound
                    .compile(&["z"])
                    .map_err(|e| LuminalError::Expression(e.to_string()))?;
                for z in 0..n {
                    let v = f
                        .eval(&[z as i64])
                        .map_err(|e| LuminalError::Expression(e.to_string()))?;
                    out.push(dt.round(v as f64));
                }
            }
            Op::Unary(u) => {
                let (r, buf) = input(0)?;
                for z in 0..n {
                    out.push(dt.round(u.apply(r.read(buf, z)?)));
                }
            }
            Op::Binary(b) => {
                let (ra, a) = input(0)?;
                let (rb, bb) = input(1)?;
                let in_dt = self.graph.node(node.inputs[0].node).dtype;
                for z in 0..n {
                    out.push(dt.round(b.apply(ra.read(a, z)?, rb.read(bb, z)?, in_dt)));
                }
            }
            Op::Contiguous | Op::Cast(_) => {
                let (r, buf) = input(0)?;
                for z in 0..n {
                    out.push(dt.round(r.read(buf, z)?));
                }
            }
            Op::Reduce { op, axis } => {
                let (r, buf) = input(0)?;
                let dims = node.inputs[0].view.dims();
                let len = self.eval_dim(&dims[*axis])?.max(0) as usize;
                let inner = self.numel(&dims[axis + 1..])?;
                for o in 0..n {
                    let (outer, inn) = (o / inner.max(1), o % inner.max(1));
                    let mut acc = op.identity(dt);
                    for k in 0..len {
                        acc = op.combine(acc, r.read(buf, (outer * len + k) * inner + inn)?);
                    }
                    out.push(dt.round(acc));
                }
            }
            Op::WriteSlice { axis, start } => {
                let dest = self.buffer(node.inputs[0].node);
                let (rs, src) = input(1)?;
                let dims = node.inputs[1].view.dims();
                let len = self.eval_dim(&dims[*axis])?.max(0) as usize;
                let size = self.eval_dim(&node.shape[*axis])?;
                let start = self.eval_dim(start)?;
                if start < 0 || start + len as i64 > size {
                    return Err(LuminalError::IndexOutOfRange {
                        op: "WriteSlice".into(),
                        index: start + len as i64 - 1,
                        size,
                    });
                }
                let inner = self.numel(&dims[axis + 1..])?;
                out.extend_from_slice(&dest[..n.min(dest.len())]);
                let src_n = self.numel(&dims)?;
                for z in 0..src_n {
                    let (outer, rest) = (z / (len * inner).max(1), z % (len * inner).max(1));
                    let at = (outer * size as usize + start as usize) * inner + rest;
                    out[at] = rs.read(src, z)?;
                }
            }
            Op::Gather => {
                let (rt, table) = input(0)?;
                let (ri, ids) = input(1)?;
                let tdims = node.inputs[0].view.dims();
                let rows = self.eval_dim(&tdims[0])?;
                let width = self.eval_dim(&tdims[1])?.max(0) as usize;
                for s in 0..n / width.max(1) {
                    let id = ri.read(ids, s)? as i64;
                    if id < 0 || id >= rows {
                        return Err(LuminalError::IndexOutOfRange {
                            op: "Gather".into(),
                            index: id,
                            size: rows,
                        });
                    }
                    for w in 0..width {
                        out.push(rt.read(table, id as usize * width + w)?);
                    }
                }
            }
        }
        Ok(out)
    }
}

impl Runtime for ReferenceRuntime {
    fn set_data(&mut self, tensor: impl Into<TensorRef>, data: HostData) -> Result<()> {
        let node = self.graph.check_input(tensor, &data, &self.dims)?;
        self.inputs.insert(node, data.to_f64());
        Ok(())
    }

    fn set_dim(&mut self, name: &str, value: usize) {
        match self.dims.get_mut(name) {
            Some(v) => *v = value as i64,
            None => {
                self.dims.insert(name.to_string(), value as i64);
            }
        }
    }

    fn run(&mut self) -> Result<()> {
        if let Some(d) = self
            .needed_dims
            .iter()
            .find(|d| !self.dims.contains_key(*d))
        {
            return Err(LuminalError::UnboundDim(d.clone()));
        }
        for &id in &self.order {
            let node = self.graph.node(id);
            if let Op::Input { name } = &node.op {
                let data = self
                    .inputs
                    .get(&id)
                    .ok_or_else(|| LuminalError::MissingInput(name.clone()))?;
                let n = self.numel(&node.shape)?;
                if data.len() != n {
                    return Err(LuminalError::WrongLength {
                        tensor: name.clone(),
                        expected: n,
                        got: data.len(),
                    });
                }
            }
        }
        // Free each intermediate after its last consumer.
        let mut last_use: HashMap<NodeId, usize> = HashMap::new();
        for (step, &id) in self.order.iter().enumerate() {
            for e in &self.graph.node(id).inputs {
                last_use.insert(e.node, step);
            }
        }
        self.results.clear();
        for (step, &id) in self.order.clone().iter().enumerate() {
            if matches!(self.graph.node(id).op, Op::Input { .. }) {
                continue;
            }
            let out = self.compute(id)?;
            if let Op::WriteSlice { .. } = self.graph.node(id).op {
                // The destination input is state: it keeps the written value.
                let dest = self.graph.node(id).inputs[0].node;
                self.inputs.insert(dest, out.clone());
            }
            self.results.insert(id, out);
            for e in &self.graph.node(id).inputs {
                if last_use.get(&e.node) == Some(&step) && !self.graph.outputs.contains(&e.node) {
                    self.results.remove(&e.node);
                }
            }
        }
        Ok(())
    }

    fn graph_data(&self) -> &GraphData {
        &self.graph
    }

    fn get_data(&self, tensor: impl Into<TensorRef>) -> Result<HostData> {
        let entry = self.graph.check_output(tensor)?;
        let buf = self
            .inputs
            .get(&entry.node)
            .or_else(|| self.results.get(&entry.node))
            .ok_or_else(|| LuminalError::NotComputed(entry.label.clone()))?;
        Ok(HostData::from_f64(entry.dtype, buf))
    }
}
