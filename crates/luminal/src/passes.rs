//! Graph-to-graph passes. Each implements [`Pass`]; they compose as tuples and with
//! [`Looped`]. Passes keep `NodeId`s stable and re-point user handles when they replace a
//! node, so handles made before compiling stay valid.

use crate::graph::{Edge, GraphData, Node, NodeId};
use crate::op::{BinaryOp, ConstValue, Op, ReduceOp, UnaryOp};
use std::collections::{HashMap, HashSet};

pub trait Pass {
    /// Rewrites the graph; returns whether anything changed.
    fn run(&mut self, graph: &mut GraphData) -> bool;
}

macro_rules! tuple_pass {
    ($($p:ident $i:tt),+) => {
        impl<$($p: Pass),+> Pass for ($($p,)+) {
            fn run(&mut self, graph: &mut GraphData) -> bool {
                let mut changed = false;
                $(changed |= self.$i.run(graph);)+
                changed
            }
        }
    };
}
tuple_pass!(A 0);
tuple_pass!(A 0, B 1);
tuple_pass!(A 0, B 1, C 2);
tuple_pass!(A 0, B 1, C 2, D 3);
tuple_pass!(A 0, B 1, C 2, D 3, E 4);
tuple_pass!(A 0, B 1, C 2, D 3, E 4, F 5);

/// Runs a pass until it changes nothing (at most 100 rounds).
#[derive(Default, Clone, Debug)]
pub struct Looped<P>(pub P);

impl<P: Pass> Pass for Looped<P> {
    fn run(&mut self, graph: &mut GraphData) -> bool {
        let mut changed = false;
        for _ in 0..100 {
            if !self.0.run(graph) {
                break;
            }
            changed = true;
        }
        changed
    }
}

/// The backend-independent passes every compile runs by default.
pub type GenericPasses = Looped<(ConstantFold, ArithmeticSimplify, Cse, DeadNodeElimination)>;

/// Common-subexpression elimination: structurally identical nodes (same op, same input
/// edges with the same views, same dtype and shape) are merged.
#[derive(Default, Clone, Copy, Debug)]
pub struct Cse;

impl Pass for Cse {
    fn run(&mut self, graph: &mut GraphData) -> bool {
        use std::hash::BuildHasher;
        // A recomputed (checkpointed) node is only merged with copies of the same
        // recomputation, never with the forward node it copies. Nodes are keyed by their
        // hash (no copy of each node), equal hashes compared in full.
        let hasher = std::collections::hash_map::RandomState::new();
        let mut seen: HashMap<(u64, Option<u32>), Vec<NodeId>> = HashMap::new();
        let mut forward: HashMap<NodeId, NodeId> = HashMap::new();
        for id in graph.toposort() {
            let tag = graph.recompute.get(&id).copied();
            forward_inputs(graph, id, &forward);
            let node = graph.node(id);
            if matches!(node.op, Op::Input { .. }) {
                continue;
            }
            let same = seen.entry((hasher.hash_one(node), tag)).or_default();
            match same.iter().find(|&&other| graph.node(other) == node) {
                Some(&first) => {
                    forward.insert(id, first);
                }
                None => same.push(id),
            }
        }
        graph.replace_nodes(&forward);
        !forward.is_empty()
    }
}

/// Points the inputs of node `id` at their replacements in `forward` (a pass that visits
/// nodes in topological order and replaces them at the end, in one
/// [`GraphData::replace_nodes`], keeps the nodes it has seen up to date this way).
fn forward_inputs(graph: &mut GraphData, id: NodeId, forward: &HashMap<NodeId, NodeId>) {
    if forward.is_empty() {
        return;
    }
    for e in &mut graph.node_mut(id).inputs {
        if let Some(&to) = forward.get(&e.node) {
            e.node = to;
        }
    }
}

/// Removes nodes that no output depends on (inputs are kept so `set` keeps working).
#[derive(Default, Clone, Copy, Debug)]
pub struct DeadNodeElimination;

impl Pass for DeadNodeElimination {
    fn run(&mut self, graph: &mut GraphData) -> bool {
        let live = live_nodes(graph);
        let dead: Vec<NodeId> = graph
            .node_ids()
            .filter(|id| !live.contains(id) && !matches!(graph.node(*id).op, Op::Input { .. }))
            .collect();
        for &id in &dead {
            graph.remove_node(id);
        }
        !dead.is_empty()
    }
}

/// Nodes the outputs depend on (the outputs included).
pub fn live_nodes(graph: &GraphData) -> HashSet<NodeId> {
    let mut live: HashSet<NodeId> = HashSet::new();
    let mut stack: Vec<NodeId> = graph.outputs.iter().copied().collect();
    while let Some(id) = stack.pop() {
        if live.insert(id) {
            stack.extend(graph.node(id).inputs.iter().map(|e| e.node));
        }
    }
    live
}

/// The live nodes ([`live_nodes`]) in topological order, and the dynamic dims they use:
/// what every runtime works out before it plans a graph.
pub fn live_order(graph: &GraphData) -> (Vec<NodeId>, std::collections::BTreeSet<String>) {
    let live = live_nodes(graph);
    let order: Vec<NodeId> = graph
        .toposort()
        .into_iter()
        .filter(|id| live.contains(id))
        .collect();
    let dims = graph.dynamic_dims_of(order.iter().copied());
    (order, dims)
}

/// The scalar every element of `edge` reads, when that is one number.
fn uniform_value(graph: &GraphData, edge: &Edge) -> Option<f64> {
    let node = graph.node(edge.node);
    let Op::Constant { value } = &node.op else {
        return None;
    };
    let v = value.as_float()?;
    // A masked view reads 0 in its padding: uniform only if the constant is 0 too.
    (!edge.view.is_masked() || v == 0.0).then_some(v)
}

/// The edge reads its node's whole buffer in order (so the node can stand in for a consumer
/// of the same shape).
fn is_identity(graph: &GraphData, edge: &Edge, shape: &[crate::shape::Expression]) -> bool {
    edge.view.is_contiguous() && edge.view.dims() == shape && graph.node(edge.node).shape == shape
}

fn known_non_negative(graph: &GraphData, edge: &Edge) -> bool {
    match &graph.node(edge.node).op {
        Op::Unary(UnaryOp::Exp2) | Op::Unary(UnaryOp::Sqrt) => true,
        _ => uniform_value(graph, edge).is_some_and(|v| v >= 0.0),
    }
}

fn constant_node(graph: &mut GraphData, like: NodeId, value: f64) -> NodeId {
    let node = graph.node(like);
    let (dtype, shape) = (node.dtype, node.shape.clone());
    graph.add_node(Node {
        op: Op::Constant {
            value: ConstValue::Float(dtype.round(value)),
        },
        inputs: vec![],
        dtype,
        shape,
    })
}

/// Algebraic identities: x+0, x·1, x·0 (→ 0, like fast-math), 1/(1/x), log2(exp2 x),
/// exp2(log2 x) for x known ≥ 0, double negation (x·−1)·−1, and a copy of a whole node.
#[derive(Default, Clone, Copy, Debug)]
pub struct ArithmeticSimplify;

impl Pass for ArithmeticSimplify {
    fn run(&mut self, graph: &mut GraphData) -> bool {
        let mut forward: HashMap<NodeId, NodeId> = HashMap::new();
        for id in graph.toposort() {
            forward_inputs(graph, id, &forward);
            let node = graph.node(id);
            if !matches!(node.op, Op::Binary(_) | Op::Unary(_) | Op::Contiguous) {
                continue;
            }
            let node = node.clone();
            let shape = node.shape.clone();
            let mut replacement: Option<NodeId> = None;
            match &node.op {
                Op::Binary(op @ (BinaryOp::Add | BinaryOp::Mul)) => {
                    let (a, b) = (&node.inputs[0], &node.inputs[1]);
                    for (x, c) in [(a, b), (b, a)] {
                        let Some(v) = uniform_value(graph, c) else {
                            continue;
                        };
                        let identity = if *op == BinaryOp::Add { 0.0 } else { 1.0 };
                        if v == identity && is_identity(graph, x, &shape) {
                            replacement = Some(x.node);
                        } else if *op == BinaryOp::Mul && v == 0.0 {
                            replacement = Some(constant_node(graph, id, 0.0));
                        } else if *op == BinaryOp::Mul && v == -1.0 && is_identity(graph, x, &shape)
                        {
                            // (y · −1) · −1 → y
                            let inner = graph.node(x.node);
                            if let Op::Binary(BinaryOp::Mul) = inner.op {
                                for (y, c2) in [
                                    (&inner.inputs[0], &inner.inputs[1]),
                                    (&inner.inputs[1], &inner.inputs[0]),
                                ] {
                                    if uniform_value(graph, c2) == Some(-1.0)
                                        && is_identity(graph, y, &shape)
                                    {
                                        replacement = Some(y.node);
                                        break;
                                    }
                                }
                            }
                        }
                        if replacement.is_some() {
                            break;
                        }
                    }
                }
                Op::Unary(outer) => {
                    let x = &node.inputs[0];
                    let inner = graph.node(x.node);
                    if let (Op::Unary(inner_op), true) = (&inner.op, is_identity(graph, x, &shape))
                    {
                        let y = &inner.inputs[0];
                        let cancels = match (outer, inner_op) {
                            (UnaryOp::Recip, UnaryOp::Recip) | (UnaryOp::Log2, UnaryOp::Exp2) => {
                                true
                            }
                            (UnaryOp::Exp2, UnaryOp::Log2) => known_non_negative(graph, y),
                            _ => false,
                        };
                        if cancels && is_identity(graph, y, &shape) {
                            replacement = Some(y.node);
                        }
                    }
                }
                // A copy of a whole node (`detach` makes them; autograd has used them by
                // the time a graph is compiled) is the node itself.
                Op::Contiguous if is_identity(graph, &node.inputs[0], &shape) => {
                    replacement = Some(node.inputs[0].node);
                }
                _ => {}
            }
            if let Some(new) = replacement {
                forward.insert(id, new);
            }
        }
        graph.replace_nodes(&forward);
        !forward.is_empty()
    }
}

/// Evaluates ops whose inputs are all uniform constants into a constant node.
#[derive(Default, Clone, Copy, Debug)]
pub struct ConstantFold;

impl Pass for ConstantFold {
    fn run(&mut self, graph: &mut GraphData) -> bool {
        let mut forward: HashMap<NodeId, NodeId> = HashMap::new();
        for id in graph.toposort() {
            forward_inputs(graph, id, &forward);
            let node = graph.node(id);
            // A quantized value is a block's encoding, not a constant of its own.
            if node.inputs.is_empty() || node.dtype.is_quantized() {
                continue;
            }
            let Some(values) = node
                .inputs
                .iter()
                .map(|e| uniform_value(graph, e))
                .collect::<Option<Vec<f64>>>()
            else {
                continue;
            };
            let in_dtype = graph.node(node.inputs[0].node).dtype;
            let folded = match &node.op {
                Op::Unary(u) => Some(u.apply(values[0])),
                Op::Binary(b) => Some(b.apply(values[0], values[1], in_dtype)),
                Op::Cast(_) | Op::Contiguous => Some(values[0]),
                Op::Reduce {
                    op: ReduceOp::Max,
                    axis,
                } => {
                    let n = node.inputs[0].view.dims()[*axis].as_constant();
                    n.filter(|&n| n > 0).map(|_| values[0])
                }
                Op::Reduce {
                    op: ReduceOp::Sum,
                    axis,
                } => {
                    let n = node.inputs[0].view.dims()[*axis].as_constant();
                    // n copies of one dtype value sum exactly in f64, as the reference does.
                    n.map(|n| values[0] * n as f64)
                }
                _ => None,
            };
            if let Some(v) = folded {
                let c = constant_node(graph, id, v);
                forward.insert(id, c);
            }
        }
        graph.replace_nodes(&forward);
        !forward.is_empty()
    }
}
