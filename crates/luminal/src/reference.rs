//! The reference runtime: every primop evaluated one element at a time on exact `f64`
//! values, rounded to the node's dtype. Simple and obviously correct; speed is not its job.
//! Every fast backend is tested against it.

use crate::backend::{Backend, CompileOptions, Runtime};
use crate::dtype::HostData;
use crate::error::{LuminalError, Result};
use crate::graph::{Edge, GraphData, NodeId, TensorRef};
use crate::op::Op;
use crate::passes::live_order;
use crate::semantics::{eval_node, node_exprs, Operands};
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
    /// The blocks of block-quantized values (inputs, casts into a quantized type, writes
    /// into a quantized state), next to their decoded values: what `get_data` hands out.
    blocks: HashMap<NodeId, Vec<u8>>,
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
        let (order, needed_dims) = live_order(&graph);
        ReferenceRuntime {
            graph,
            order,
            needed_dims,
            inputs: HashMap::new(),
            results: HashMap::new(),
            blocks: HashMap::new(),
            dims: HashMap::new(),
        }
    }

    /// The compiled graph (after the generic passes).
    pub fn graph(&self) -> &GraphData {
        &self.graph
    }

    fn numel(&self, shape: &[Expression]) -> Result<usize> {
        crate::shape::numel_bound(shape, &self.dims)
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

    /// The blocks of a node of a block-quantized type, from its inputs' values and blocks:
    /// a cast encodes the values it reads (the same encoding [`crate::semantics`] decodes),
    /// a write copies whole blocks of the new rows over the destination's.
    fn compute_blocks(&self, id: NodeId) -> Result<Option<Vec<u8>>> {
        let node = self.graph.node(id);
        let dt = node.dtype;
        if !dt.is_quantized() {
            return Ok(None);
        }
        let (bs, bb) = (dt.block_size(), dt.block_bytes());
        match &node.op {
            Op::Cast(_) => {
                let e = &node.inputs[0];
                let (r, buf) = (self.reader(e)?, self.buffer(e.node));
                let n = self.numel(&node.shape)?;
                let x = (0..n)
                    .map(|z| r.read(buf, z).map(|v| v as f32))
                    .collect::<Result<Vec<f32>>>()?;
                let mut out = vec![0u8; n / bs * bb];
                crate::quant::encode(dt, &x, &mut out);
                Ok(Some(out))
            }
            Op::WriteSlice { .. } => {
                let exprs = node_exprs(node);
                let value = |k: usize| -> Result<i64> {
                    exprs[k]
                        .substitute_all(&|name| self.dims.get(name).map(|&v| Expression::from(v)))
                        .compile(&["z"])
                        .and_then(|c| c.eval(&[0]))
                        .map_err(|e| LuminalError::Expression(e.to_string()))
                };
                let (len, size, start, inner, src_n) =
                    (value(0)?, value(1)?, value(2)?, value(3)?, value(4)?);
                let (dest, src) = (node.inputs[0].node, node.inputs[1].node);
                let mut out = self.blocks.get(&dest).cloned().unwrap_or_default();
                let from = self.blocks.get(&src).map(|b| b.as_slice()).unwrap_or(&[]);
                let run = (len * inner).max(1) as usize;
                for z in (0..src_n.max(0) as usize).step_by(bs) {
                    let (outer, rest) = (z / run, z % run);
                    let at = (outer * size as usize + start as usize) * inner as usize + rest;
                    let (to, fr) = (at / bs * bb, z / bs * bb);
                    match (out.get_mut(to..to + bb), from.get(fr..fr + bb)) {
                        (Some(d), Some(s)) => d.copy_from_slice(s),
                        _ => {
                            return Err(LuminalError::Backend(format!(
                                "WriteSlice of {dt} blocks: block {} outside the buffers",
                                at / bs
                            )))
                        }
                    }
                }
                Ok(Some(out))
            }
            _ => Ok(None),
        }
    }

    /// Computes one node's output buffer (see [`crate::semantics`]).
    fn compute(&self, id: NodeId) -> Result<Vec<f64>> {
        let node = self.graph.node(id);
        let n = self.numel(&node.shape)?;
        let readers = node
            .inputs
            .iter()
            .map(|e| Ok((self.reader(e)?, self.buffer(e.node))))
            .collect::<Result<Vec<_>>>()?;
        let exprs = node_exprs(node)
            .iter()
            .map(|e| {
                e.substitute_all(&|name| self.dims.get(name).map(|&v| Expression::from(v)))
                    .compile(&["z"])
                    .map_err(|e| LuminalError::Expression(e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        let in_dtype = node
            .inputs
            .first()
            .map_or(node.dtype, |e| self.graph.node(e.node).dtype);
        let mut out = vec![0.0; n];
        let mut io = Io { readers, exprs };
        eval_node(node, in_dtype, n, &mut io, &mut |z, v| out[z] = v)?;
        Ok(out)
    }
}

/// The reference runtime's operands: views over its `f64` buffers, expressions with the
/// dims substituted.
struct Io<'a> {
    readers: Vec<(ViewReader, &'a [f64])>,
    exprs: Vec<CompiledExpression>,
}

impl Operands for Io<'_> {
    fn read(&mut self, i: usize, z: usize) -> Result<f64> {
        let (r, buf) = &self.readers[i];
        r.read(buf, z)
    }
    fn expr(&mut self, k: usize, z: usize) -> Result<i64> {
        self.exprs[k]
            .eval(&[z as i64])
            .map_err(|e| LuminalError::Expression(e.to_string()))
    }
}

impl Runtime for ReferenceRuntime {
    fn set_data(&mut self, tensor: impl Into<TensorRef>, data: HostData) -> Result<()> {
        let node = self.graph.check_input(tensor, &data, &self.dims)?;
        self.inputs.insert(node, data.to_f64());
        match &data {
            HostData::Bytes(b) if b.dtype().is_quantized() => {
                self.blocks.insert(node, b.as_slice().to_vec());
            }
            _ => {
                self.blocks.remove(&node);
            }
        }
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
        let inputs = &self.inputs;
        self.blocks.retain(|id, _| inputs.contains_key(id));
        // State written by `WriteSlice`s: the destination inputs take it after the run (their
        // other readers in this run see the values from before it).
        let mut state = vec![];
        for (step, &id) in self.order.clone().iter().enumerate() {
            if matches!(self.graph.node(id).op, Op::Input { .. }) {
                continue;
            }
            let out = self.compute(id)?;
            let blocks = self.compute_blocks(id)?;
            if let Op::WriteSlice { .. } = self.graph.node(id).op {
                let dest = self.graph.node(id).inputs[0].node;
                state.push((dest, out.clone(), blocks.clone()));
            }
            self.results.insert(id, out);
            if let Some(b) = blocks {
                self.blocks.insert(id, b);
            }
            for e in &self.graph.node(id).inputs {
                if last_use.get(&e.node) == Some(&step) && !self.graph.outputs.contains(&e.node) {
                    self.results.remove(&e.node);
                    if !self.inputs.contains_key(&e.node) {
                        self.blocks.remove(&e.node);
                    }
                }
            }
        }
        for (dest, values, blocks) in state {
            self.inputs.insert(dest, values);
            if let Some(b) = blocks {
                self.blocks.insert(dest, b);
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
        if let Some(b) = self.blocks.get(&entry.node) {
            let bytes = crate::quant::SharedBytes::from_vec(b.clone());
            return HostData::from_bytes(entry.dtype, bytes);
        }
        Ok(HostData::from_f64(entry.dtype, buf))
    }
}
