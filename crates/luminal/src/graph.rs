//! The graph: nodes (ops) and edges (data + view), and the `GraphTensor` handle.

use crate::backend::{Backend, CompileOptions};
use crate::dtype::DType;
use crate::dtype::HostData;
use crate::error::{LuminalError, Result};
use crate::op::Op;
use crate::shape::{Expression, ShapeTracker};
use std::cell::{Ref, RefCell, RefMut};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

/// An input of a node: which node's output, read through which view.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Edge {
    pub node: NodeId,
    pub view: ShapeTracker,
}

/// One op with its inputs. The node's output is a contiguous row-major buffer of `shape`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    pub op: Op,
    pub inputs: Vec<Edge>,
    pub dtype: DType,
    pub shape: Vec<Expression>,
}

/// What a user handle refers to: a node's output seen through a view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    pub node: NodeId,
    pub view: ShapeTracker,
    pub dtype: DType,
    /// Human-readable name for errors (the input name, or `op#id`).
    pub label: String,
}

/// The graph proper, as passes and backends see it.
///
/// Nodes are never renumbered: a removed node leaves `None`, so `NodeId`s, and the user
/// handles (`tensors`) that point at them, stay valid across passes.
#[derive(Clone, Debug, Default)]
pub struct GraphData {
    /// Identity of the `Graph` this came from (handles from other graphs are rejected).
    pub graph_id: u64,
    pub nodes: Vec<Option<Node>>,
    pub tensors: Vec<TensorEntry>,
    /// Nodes whose buffers must be readable after `run()`.
    pub outputs: BTreeSet<NodeId>,
    /// Nodes that recompute a checkpointed segment in the backward pass (see
    /// [`Graph::checkpoint`]), with the number of their recomputation: common-subexpression
    /// elimination never merges them with the forward nodes they copy (that would keep the
    /// activations the checkpoint exists to drop).
    pub recompute: HashMap<NodeId, u32>,
    /// Nodes made by [`GraphTensor::detach`](crate::GraphTensor::detach): autograd treats
    /// them as constants (no gradient flows through them).
    pub no_grad: HashSet<NodeId>,
    /// Gradients of attention that [`crate::autograd::Autograd`] built in one piece (see
    /// [`crate::patterns::AttentionGrad`]): the node stacking `dq, dk, dv`, with the tensors
    /// it was built from. A hint for backends with a fused kernel; the nodes themselves are
    /// the semantics (a backend checks the hint against them before using it).
    pub attention_grads: HashMap<NodeId, crate::patterns::AttentionGrad>,
    /// Gradients of layer norms that autograd built as one expression (see
    /// [`crate::patterns::LayerNormGrad`]): a hint like `attention_grads`.
    pub layer_norm_grads: HashMap<NodeId, crate::patterns::LayerNormGrad>,
}

impl GraphData {
    pub fn node(&self, id: NodeId) -> &Node {
        self.nodes[id.0 as usize]
            .as_ref()
            .unwrap_or_else(|| panic!("node {} was removed", id.0))
    }
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id.0 as usize]
            .as_mut()
            .unwrap_or_else(|| panic!("node {} was removed", id.0))
    }
    pub fn try_node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id.0 as usize).and_then(|n| n.as_ref())
    }
    pub fn add_node(&mut self, node: Node) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Some(node));
        id
    }
    /// Live node ids in creation order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.is_some())
            .map(|(i, _)| NodeId(i as u32))
    }
    pub fn remove_node(&mut self, id: NodeId) {
        self.nodes[id.0 as usize] = None;
        self.recompute.remove(&id);
        self.no_grad.remove(&id);
        self.attention_grads.remove(&id);
        self.layer_norm_grads.remove(&id);
    }

    /// Points every use of `old` (edges, user handles, outputs) at `new`, which must have the
    /// same shape and dtype, then removes `old`.
    pub fn replace_node(&mut self, old: NodeId, new: NodeId) {
        self.replace_nodes(&HashMap::from([(old, new)]));
    }

    /// [`GraphData::replace_node`] for every `old → new` pair of `map` in one pass over the
    /// graph (a compile's CSE replaced thousands of nodes one full pass each). A `new` that is
    /// itself replaced is followed to the end of its chain.
    pub fn replace_nodes(&mut self, map: &HashMap<NodeId, NodeId>) {
        let resolve = |mut id: NodeId| {
            let mut steps = 0;
            while let Some(&next) = map.get(&id) {
                if next == id || steps > map.len() {
                    break;
                }
                id = next;
                steps += 1;
            }
            id
        };
        if map.iter().all(|(old, new)| old == new) {
            return;
        }
        for node in self.nodes.iter_mut().flatten() {
            for edge in &mut node.inputs {
                edge.node = resolve(edge.node);
            }
        }
        for t in &mut self.tensors {
            t.node = resolve(t.node);
        }
        let outputs = std::mem::take(&mut self.outputs);
        self.outputs = outputs.into_iter().map(resolve).collect();
        let hints = std::mem::take(&mut self.attention_grads);
        self.attention_grads = hints
            .into_iter()
            .map(|(id, mut h)| {
                h.remap(&resolve);
                (resolve(id), h)
            })
            .collect();
        let hints = std::mem::take(&mut self.layer_norm_grads);
        self.layer_norm_grads = hints
            .into_iter()
            .map(|(id, mut h)| {
                for e in [&mut h.x, &mut h.xhat, &mut h.dy] {
                    e.node = resolve(e.node);
                }
                (resolve(id), h)
            })
            .collect();
        for &old in map.keys() {
            if resolve(old) != old {
                self.remove_node(old);
            }
        }
    }

    /// Number of consumers (edges) of each node.
    pub fn use_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.nodes.len()];
        for node in self.nodes.iter().flatten() {
            for e in &node.inputs {
                counts[e.node.0 as usize] += 1;
            }
        }
        counts
    }

    /// Live nodes in an order where every node comes after its inputs.
    pub fn toposort(&self) -> Vec<NodeId> {
        // Nodes are only ever added after their inputs, and replacements point to existing
        // nodes; but a replacement may point an early node's edge at a later node, so do a
        // real DFS rather than trusting creation order.
        let n = self.nodes.len();
        let mut state = vec![0u8; n]; // 0 new, 1 on stack, 2 done
        let mut order = Vec::with_capacity(n);
        for start in self.node_ids() {
            if state[start.0 as usize] != 0 {
                continue;
            }
            let mut stack = vec![(start, 0usize)];
            state[start.0 as usize] = 1;
            while let Some((id, i)) = stack.pop() {
                let node = self.node(id);
                if i < node.inputs.len() {
                    stack.push((id, i + 1));
                    let child = node.inputs[i].node;
                    match state[child.0 as usize] {
                        0 => {
                            state[child.0 as usize] = 1;
                            stack.push((child, 0));
                        }
                        1 => panic!("graph has a cycle through node {}", child.0),
                        _ => {}
                    }
                } else {
                    state[id.0 as usize] = 2;
                    order.push(id);
                }
            }
        }
        order
    }

    /// The entry of a user handle, if it belongs to this graph and existed when compiled.
    pub fn tensor_entry(&self, t: impl Into<TensorRef>) -> Result<&TensorEntry> {
        let t: TensorRef = t.into();
        let same = t.graph_id == self.graph_id;
        self.tensors
            .get(t.id.0 as usize)
            .filter(|_| same)
            .ok_or(LuminalError::UnknownTensor(t.id.0 as usize))
    }

    /// The checks every runtime's `set` makes: the handle is a whole input of this graph, the
    /// dtype matches, and the length matches when `dims` already bind the shape (runtimes check
    /// again at `run`). Returns the input node.
    pub fn check_input(
        &self,
        t: impl Into<TensorRef>,
        data: &HostData,
        dims: &HashMap<String, i64>,
    ) -> Result<NodeId> {
        self.check_input_as(t, data.dtype(), data.len(), dims)
    }

    /// [`GraphData::check_input`] for `len` values of `dtype` (data not yet in a `HostData`).
    pub fn check_input_as(
        &self,
        t: impl Into<TensorRef>,
        dtype: DType,
        len: usize,
        dims: &HashMap<String, i64>,
    ) -> Result<NodeId> {
        let entry = self.tensor_entry(t)?;
        let node = self.node(entry.node);
        let is_input = matches!(node.op, Op::Input { .. });
        if !is_input || !entry.view.is_contiguous() || entry.view.dims() != node.shape {
            return Err(LuminalError::NotAnInput(entry.label.clone()));
        }
        self.check_input_data(entry, dtype, len, dims)?;
        Ok(entry.node)
    }

    /// The data part of [`GraphData::check_input_as`] (dtype, and length where `dims` bind
    /// the shape) for an entry already known to be a whole input. Allocates nothing.
    pub fn check_input_data(
        &self,
        entry: &TensorEntry,
        dtype: DType,
        len: usize,
        dims: &HashMap<String, i64>,
    ) -> Result<()> {
        if dtype != entry.dtype {
            return Err(LuminalError::WrongDType {
                tensor: entry.label.clone(),
                expected: entry.dtype,
                got: dtype,
                access: crate::error::DataAccess::Set,
            });
        }
        let known = self
            .node(entry.node)
            .shape
            .iter()
            .try_fold(1usize, |acc, d| {
                d.eval_with(&|n| dims.get(n).copied())
                    .map(|v| acc * v.max(0) as usize)
            });
        if let Ok(n) = known {
            if n != len {
                return Err(LuminalError::WrongLength {
                    tensor: entry.label.clone(),
                    expected: n,
                    got: len,
                });
            }
        }
        Ok(())
    }

    /// How errors name a tensor: its label (an input's name, a name given with
    /// [`GraphTensor::named`], else `op#node`) and its shape.
    pub fn describe_tensor(&self, t: impl Into<TensorRef>) -> String {
        match self.tensor_entry(t) {
            Ok(e) => format!("{} (shape {:?})", e.label, e.view.dims()),
            Err(_) => "(unknown tensor)".to_string(),
        }
    }

    /// The checks every runtime's `get` makes: the handle is an output read as a whole.
    pub fn check_output(&self, t: impl Into<TensorRef>) -> Result<&TensorEntry> {
        let entry = self.tensor_entry(t)?;
        let node = self.node(entry.node);
        if !self.outputs.contains(&entry.node)
            || !entry.view.is_contiguous()
            || entry.view.dims() != node.shape
        {
            return Err(LuminalError::NotAnOutput(entry.label.clone()));
        }
        Ok(entry)
    }

    /// Variables (dynamic dim names) used anywhere in the live graph.
    pub fn dynamic_dims(&self) -> BTreeSet<String> {
        self.dynamic_dims_of(self.node_ids())
    }

    /// Variables (dynamic dim names) used by the nodes `ids` (their shapes, ops and input
    /// edges).
    pub fn dynamic_dims_of(&self, ids: impl IntoIterator<Item = NodeId>) -> BTreeSet<String> {
        let mut vars = BTreeSet::new();
        for node in ids.into_iter().map(|id| self.node(id)) {
            for d in &node.shape {
                vars.extend(d.variables());
            }
            match &node.op {
                Op::Iota { expr } => vars.extend(expr.variables().into_iter().filter(|v| v != "z")),
                Op::WriteSlice { start, .. } => vars.extend(start.variables()),
                Op::Constant {
                    value: crate::op::ConstValue::Expr(e),
                } => vars.extend(e.variables()),
                _ => {}
            }
            for e in &node.inputs {
                for d in e.view.dims().iter().chain(e.view.strides().iter()) {
                    vars.extend(d.variables());
                }
                vars.extend(e.view.offset().variables());
                vars.extend(
                    e.view
                        .valid_expression()
                        .variables()
                        .into_iter()
                        .filter(|v| v != "z"),
                );
            }
        }
        vars
    }
}

static NEXT_GRAPH_ID: AtomicU64 = AtomicU64::new(1);

/// A computation graph under construction. Tensors are recorded, nothing runs until the
/// graph is compiled with a backend and the runtime's `run()` is called.
pub struct Graph {
    data: RefCell<GraphData>,
    /// Dtypes `tensor()` gives the named inputs instead of f32 (see [`Graph::set_tensor_dtype`]).
    tensor_dtypes: RefCell<HashMap<String, DType>>,
    /// Node-id ranges built inside [`Graph::checkpoint`], in order.
    checkpoints: RefCell<Vec<std::ops::Range<u32>>>,
}

impl Default for Graph {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.data.borrow();
        write!(f, "Graph(#{}, {} nodes)", d.graph_id, d.node_ids().count())
    }
}

impl Graph {
    pub fn new() -> Graph {
        Graph {
            data: RefCell::new(GraphData {
                graph_id: NEXT_GRAPH_ID.fetch_add(1, Ordering::Relaxed),
                ..Default::default()
            }),
            tensor_dtypes: RefCell::new(HashMap::new()),
            checkpoints: RefCell::new(Vec::new()),
        }
    }

    /// Gradient checkpointing: the nodes `f` builds form a segment whose activations the
    /// backward pass does not keep. [`crate::autograd::Autograd`] recomputes the segment from
    /// its inputs (the tensors it reads that were built before) when the backward pass
    /// reaches it, so only the segment's inputs and outputs stay alive between the forward
    /// and the backward pass: less memory for one more forward of the segment (PyTorch's
    /// `torch.utils.checkpoint`). Without autograd, or for a segment no gradient flows
    /// through, it changes nothing.
    ///
    /// ```
    /// use luminal::prelude::*;
    /// use luminal::autograd::Autograd;
    /// let cx = Graph::new();
    /// let (x, w) = (cx.tensor("x", (2, 3)), cx.tensor("w", (3, 3)));
    /// let h = cx.checkpoint(|| x.matmul(w).relu().matmul(w).relu());
    /// let loss = h.sum(0).sum(0);
    /// let dw = Autograd::new(&[w], loss).grad(w).output();
    /// # let _ = dw;
    /// ```
    pub fn checkpoint<'g, T>(&'g self, f: impl FnOnce() -> T) -> T {
        let start = self.data.borrow().nodes.len() as u32;
        let out = f();
        let end = self.data.borrow().nodes.len() as u32;
        if end > start {
            // A segment inside this one (a nested call) is recomputed as part of it.
            let mut ranges = self.checkpoints.borrow_mut();
            ranges.retain(|r| !(r.start >= start && r.end <= end));
            ranges.push(start..end);
        }
        out
    }

    /// The node-id ranges of the checkpointed segments.
    pub(crate) fn checkpoint_ranges(&self) -> Vec<std::ops::Range<u32>> {
        self.checkpoints.borrow().clone()
    }

    /// A process-unique id; a compiled runtime uses it to reject handles of other graphs.
    pub fn id(&self) -> u64 {
        self.data.borrow().graph_id
    }

    pub(crate) fn data(&self) -> Ref<'_, GraphData> {
        self.data.borrow()
    }
    pub(crate) fn data_mut(&self) -> RefMut<'_, GraphData> {
        self.data.borrow_mut()
    }
    /// A snapshot of the graph as passes and backends see it.
    pub fn snapshot(&self) -> GraphData {
        self.data.borrow().clone()
    }

    /// Adds a node and returns a handle to its (contiguous) output.
    pub fn add_op(
        &self,
        op: Op,
        inputs: Vec<Edge>,
        dtype: DType,
        shape: Vec<Expression>,
    ) -> GraphTensor<'_> {
        let mut d = self.data.borrow_mut();
        // Quantized data is storage only: the ops that read it are a cast to a float type
        // and a write of new blocks into a quantized state (a KV cache).
        for e in &inputs {
            let src = d.node(e.node);
            let reads_blocks = matches!(op, Op::Cast(t) if t.is_float())
                || matches!(op, Op::WriteSlice { .. } if dtype == src.dtype);
            assert!(
                !src.dtype.is_quantized() || reads_blocks,
                "{}: input of shape {:?} is {}; quantized tensors are only read through \
                 .dequantize() (a cast to a float type) or written with write_slice",
                op.name(),
                e.view.dims(),
                src.dtype
            );
        }
        let label = match &op {
            Op::Input { name } => name.clone(),
            _ => format!("{}#{}", op.name(), d.nodes.len()),
        };
        let view = ShapeTracker::new(shape.clone());
        let node = d.add_node(Node {
            op,
            inputs,
            dtype,
            shape,
        });
        drop(d);
        self.new_handle(TensorEntry {
            node,
            view,
            dtype,
            label,
        })
    }

    pub(crate) fn new_handle(&self, entry: TensorEntry) -> GraphTensor<'_> {
        let mut d = self.data.borrow_mut();
        let id = TensorId(d.tensors.len() as u32);
        d.tensors.push(entry);
        GraphTensor { id, graph: self }
    }

    /// An input named `name` (a weight or an activation set at run time): `f32`, unless a
    /// loader chose another storage dtype for it with [`Graph::set_tensor_dtype`].
    pub fn tensor(&self, name: &str, shape: impl ToShape) -> GraphTensor<'_> {
        let dtype = self.tensor_dtypes.borrow().get(name).copied();
        self.input(name, shape, dtype.unwrap_or(DType::F32))
    }

    /// Makes a later `tensor(name, ..)` an input of `dtype` instead of f32: how a loader
    /// keeps weights in the file's storage (a quantized or half matrix), while layers built
    /// with `tensor()` stay unchanged (they read weights through `.dequantize()`).
    pub fn set_tensor_dtype(&self, name: &str, dtype: DType) {
        self.tensor_dtypes
            .borrow_mut()
            .insert(name.to_string(), dtype);
    }

    /// An input of any dtype. Named dims in `shape` (e.g. `("seq", 64)`) are dynamic and are
    /// bound at run time with `set_dim`.
    pub fn input(&self, name: &str, shape: impl ToShape, dtype: DType) -> GraphTensor<'_> {
        {
            let d = self.data.borrow();
            let taken = d
                .node_ids()
                .any(|id| matches!(&d.node(id).op, Op::Input { name: n } if n == name));
            assert!(
                !taken,
                "Graph::input: an input named '{name}' already exists"
            );
        }
        let shape = shape.to_shape();
        if dtype.is_quantized() {
            let last = shape.last().and_then(|d| d.as_constant());
            assert!(
                last.is_some_and(|n| n > 0 && n as usize % dtype.block_size() == 0),
                "Graph::input '{name}': a {dtype} tensor needs a constant last dimension that is \
                 a multiple of {} (its block size), got shape {shape:?}",
                dtype.block_size()
            );
        }
        self.add_op(
            Op::Input {
                name: name.to_string(),
            },
            vec![],
            dtype,
            shape,
        )
    }

    /// Compiles the graph: generic passes (unless disabled), then the backend's lowering.
    /// Handles made before this call can be used with the returned runtime.
    pub fn compile<B: Backend>(&self, backend: B, options: CompileOptions) -> Result<B::Runtime> {
        let mut data = self.snapshot();
        if options.optimize {
            use crate::passes::Pass;
            crate::passes::GenericPasses::default().run(&mut data);
        }
        backend.compile(data, &options)
    }

    /// Graphviz source of the graph as built (op names, shapes, dtypes, non-trivial views).
    pub fn to_dot(&self) -> String {
        crate::display::to_dot(&self.data.borrow())
    }
}

/// A handle to a tensor that does not borrow the graph: what a runtime needs to `set` or
/// `get` it. Lets a struct own both a `Graph` and its compiled runtime (a model does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorRef {
    pub graph_id: u64,
    pub id: TensorId,
}

impl From<GraphTensor<'_>> for TensorRef {
    fn from(t: GraphTensor<'_>) -> TensorRef {
        t.handle()
    }
}
impl From<&GraphTensor<'_>> for TensorRef {
    fn from(t: &GraphTensor<'_>) -> TensorRef {
        t.handle()
    }
}

/// A handle to a tensor in a graph: a node's output seen through a view. Small and `Copy`;
/// all ops take it by value and return new handles.
#[derive(Clone, Copy)]
pub struct GraphTensor<'g> {
    pub id: TensorId,
    pub graph: &'g Graph,
}

impl std::fmt::Debug for GraphTensor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = self.entry();
        write!(
            f,
            "GraphTensor({}, {:?}, {})",
            e.label,
            e.view.dims(),
            e.dtype
        )
    }
}

impl<'g> GraphTensor<'g> {
    /// The lifetime-free handle runtimes accept.
    pub fn handle(&self) -> TensorRef {
        TensorRef {
            graph_id: self.graph.id(),
            id: self.id,
        }
    }
    pub fn entry(&self) -> TensorEntry {
        self.graph.data().tensors[self.id.0 as usize].clone()
    }
    pub fn node(&self) -> NodeId {
        self.graph.data().tensors[self.id.0 as usize].node
    }
    pub fn view(&self) -> ShapeTracker {
        self.graph.data().tensors[self.id.0 as usize].view.clone()
    }
    pub fn shape(&self) -> Vec<Expression> {
        self.view().dims()
    }
    pub fn dims(&self) -> Vec<Expression> {
        self.shape()
    }
    pub fn rank(&self) -> usize {
        self.view().rank()
    }
    pub fn dtype(&self) -> DType {
        self.graph.data().tensors[self.id.0 as usize].dtype
    }
    pub fn n_elements(&self) -> Expression {
        self.view().n_elements()
    }
    /// The edge a consumer of this tensor gets.
    pub(crate) fn edge(&self) -> Edge {
        let e = self.entry();
        Edge {
            node: e.node,
            view: e.view,
        }
    }
    /// A new handle on the same node with another view.
    pub(crate) fn with_view(self, view: ShapeTracker) -> GraphTensor<'g> {
        let e = self.entry();
        self.graph.new_handle(TensorEntry { view, ..e })
    }
    /// Shape as constants, panicking with `op` in the message when a dim is symbolic.
    pub(crate) fn static_dims(&self, op: &str) -> Vec<usize> {
        self.shape()
            .iter()
            .map(|d| {
                d.as_constant().unwrap_or_else(|| {
                    panic!("{op}: needs static dims, got shape {:?}", self.shape())
                }) as usize
            })
            .collect()
    }
    /// Checks both handles come from the same graph.
    pub(crate) fn same_graph(&self, other: &GraphTensor, op: &str) {
        assert!(
            std::ptr::eq(self.graph, other.graph),
            "{op}: tensors belong to different graphs"
        );
    }

    /// Marks this tensor as a result to read after `run()`. A non-trivial view (permuted,
    /// sliced, padded, broadcast) is first materialised; this handle (and the returned one,
    /// the same tensor) then reads the materialised result, so `rt.get(t)` works whichever
    /// of the two is used.
    pub fn output(self) -> GraphTensor<'g> {
        let e = self.entry();
        let node_shape = self.graph.data().node(e.node).shape.clone();
        let t = if e.view.is_contiguous() && e.view.dims() == node_shape {
            self
        } else {
            let c = self.contiguous();
            // Same values, now a whole node: point this handle at it, keeping its label.
            let mut d = self.graph.data_mut();
            let mut entry = d.tensors[c.id.0 as usize].clone();
            entry.label = e.label.clone();
            d.tensors[self.id.0 as usize] = entry;
            c
        };
        let node = t.node();
        self.graph.data_mut().outputs.insert(node);
        t
    }

    /// Names this handle in error messages (e.g. `rt.get` of a wrong dtype says
    /// `tensor logits …` instead of `tensor Add#57 …`). Returns a handle to the same tensor
    /// (the graph is unchanged); an input keeps its input name for `set`.
    pub fn named(self, name: &str) -> GraphTensor<'g> {
        let mut entry = self.entry();
        let is_input = matches!(
            self.graph.data().node(entry.node).op,
            crate::op::Op::Input { .. }
        );
        if !is_input {
            entry.label = name.to_string();
        }
        self.graph.new_handle(entry)
    }
}

/// A dimension given in a shape: a constant, a named dynamic dim, or an expression.
pub trait IntoDim {
    fn into_dim(self) -> Expression;
}
impl IntoDim for usize {
    fn into_dim(self) -> Expression {
        Expression::from(self)
    }
}
impl IntoDim for i32 {
    fn into_dim(self) -> Expression {
        assert!(self >= 0, "negative dimension {self}");
        Expression::from(self)
    }
}
impl IntoDim for i64 {
    fn into_dim(self) -> Expression {
        assert!(self >= 0, "negative dimension {self}");
        Expression::from(self)
    }
}
impl IntoDim for &str {
    fn into_dim(self) -> Expression {
        Expression::var(self)
    }
}
impl IntoDim for Expression {
    fn into_dim(self) -> Expression {
        self
    }
}
impl IntoDim for &Expression {
    fn into_dim(self) -> Expression {
        self.clone()
    }
}

/// Anything that describes a shape: `()`, tuples of dims, arrays, vecs and slices.
pub trait ToShape {
    fn to_shape(self) -> Vec<Expression>;
}
impl ToShape for () {
    fn to_shape(self) -> Vec<Expression> {
        vec![]
    }
}
macro_rules! scalar_shape {
    ($($t:ty),*) => {$(
        /// A single dim: a 1-D shape.
        impl ToShape for $t {
            fn to_shape(self) -> Vec<Expression> {
                vec![self.into_dim()]
            }
        }
    )*};
}
scalar_shape!(usize, i32, i64, &str, Expression, &Expression);
impl<D: IntoDim> ToShape for Vec<D> {
    fn to_shape(self) -> Vec<Expression> {
        self.into_iter().map(IntoDim::into_dim).collect()
    }
}
impl<D: IntoDim + Clone> ToShape for &[D] {
    fn to_shape(self) -> Vec<Expression> {
        self.iter().cloned().map(IntoDim::into_dim).collect()
    }
}
impl<D: IntoDim + Clone> ToShape for &Vec<D> {
    fn to_shape(self) -> Vec<Expression> {
        self.iter().cloned().map(IntoDim::into_dim).collect()
    }
}
impl<D: IntoDim, const N: usize> ToShape for [D; N] {
    fn to_shape(self) -> Vec<Expression> {
        self.into_iter().map(IntoDim::into_dim).collect()
    }
}
macro_rules! tuple_shape {
    ($($t:ident $v:ident),+) => {
        impl<$($t: IntoDim),+> ToShape for ($($t,)+) {
            fn to_shape(self) -> Vec<Expression> {
                let ($($v,)+) = self;
                vec![$($v.into_dim()),+]
            }
        }
    };
}
tuple_shape!(A a);
tuple_shape!(A a, B b);
tuple_shape!(A a, B b, C c);
tuple_shape!(A a, B b, C c, D d);
tuple_shape!(A a, B b, C c, D d, E e);
tuple_shape!(A a, B b, C c, D d, E e, F f);

/// One axis, possibly negative (counted from the end).
pub trait IntoAxis {
    fn into_axis(self) -> i64;
}
macro_rules! into_axis {
    ($($t:ty),*) => {$(
        impl IntoAxis for $t {
            fn into_axis(self) -> i64 {
                self as i64
            }
        }
    )*};
}
into_axis!(i32, i64, isize, usize, u32);

/// One or several axes, possibly negative.
pub trait ToAxes {
    fn to_axes(self) -> Vec<i64>;
}
impl<A: IntoAxis> ToAxes for A {
    fn to_axes(self) -> Vec<i64> {
        vec![self.into_axis()]
    }
}
impl<A: IntoAxis + Copy, const N: usize> ToAxes for [A; N] {
    fn to_axes(self) -> Vec<i64> {
        self.iter().map(|a| a.into_axis()).collect()
    }
}
impl<A: IntoAxis + Copy> ToAxes for &[A] {
    fn to_axes(self) -> Vec<i64> {
        self.iter().map(|a| a.into_axis()).collect()
    }
}
impl<A: IntoAxis + Copy, const N: usize> ToAxes for &[A; N] {
    fn to_axes(self) -> Vec<i64> {
        self.iter().map(|a| a.into_axis()).collect()
    }
}
impl<A: IntoAxis + Copy> ToAxes for &Vec<A> {
    fn to_axes(self) -> Vec<i64> {
        self.iter().map(|a| a.into_axis()).collect()
    }
}
impl<A: IntoAxis + Copy> ToAxes for Vec<A> {
    fn to_axes(self) -> Vec<i64> {
        self.iter().map(|a| a.into_axis()).collect()
    }
}

/// Resolves a possibly negative axis against `rank`, panicking with the op name.
pub(crate) fn normalize_axis(axis: i64, rank: usize, op: &str, shape: &[Expression]) -> usize {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    assert!(
        (0..r).contains(&a),
        "{op}: axis {axis} is out of range for shape {shape:?} (rank {rank})"
    );
    a as usize
}

/// Resolves, deduplicates and sorts several axes.
pub(crate) fn normalize_axes(
    axes: impl ToAxes,
    rank: usize,
    op: &str,
    shape: &[Expression],
) -> Vec<usize> {
    let mut v: Vec<usize> = axes
        .to_axes()
        .into_iter()
        .map(|a| normalize_axis(a, rank, op, shape))
        .collect();
    v.sort_unstable();
    let n = v.len();
    v.dedup();
    assert_eq!(
        n,
        v.len(),
        "{op}: repeated axis in reduction over shape {shape:?}"
    );
    v
}
