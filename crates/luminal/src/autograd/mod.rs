//! Reverse-mode automatic differentiation as graph building.
//!
//! [`Autograd::new`] walks the graph from a scalar loss back to the requested tensors and
//! adds the backward graph next to the forward one: each primop's gradient rule (in
//! [`rules`]), then the transpose of the view its input was read through (in `view.rs`),
//! and an addition wherever a tensor fans out to several consumers. A recognised attention
//! is differentiated as one piece instead (flash-attention's backward, see `attention.rs`),
//! so its forward keeps nothing but q, k and v. Nothing runs: the
//! gradients are ordinary tensors of the same graph, so they can be outputs, feed an
//! optimizer's update, or be differentiated again (gradients of gradients).
//!
//! ```
//! use luminal::prelude::*;
//! use luminal::autograd::Autograd;
//! let cx = Graph::new();
//! let w = cx.tensor("w", 3);
//! let loss = (w * w).sum(0); // d/dw = 2w
//! let grads = Autograd::new(&[w], loss);
//! let dw = grads.grad(w).output();
//! let mut rt = cx.compile(ReferenceBackend, CompileOptions::default()).unwrap();
//! rt.set(w, &[1f32, -2., 0.5]).unwrap();
//! rt.run().unwrap();
//! assert_eq!(rt.get::<f32>(dw).unwrap(), vec![2., -4., 1.]);
//! ```

mod attention;
pub mod rules;
mod view;

pub use attention::attention_backward;

use crate::graph::{GraphTensor, NodeId, TensorEntry};
use crate::patterns::{GeluFn, GeluMatch, LayerNormMatch};
use crate::shape::ShapeTracker;
use std::collections::HashMap;

/// The gradients of a scalar with respect to a set of tensors (see the module docs).
pub struct Autograd<'g> {
    params: Vec<NodeId>,
    grads: HashMap<NodeId, GraphTensor<'g>>,
    graph: &'g crate::graph::Graph,
}

impl<'g> Autograd<'g> {
    /// Builds the gradients of `loss` (a tensor with one element) with respect to each of
    /// `params`. A parameter must be a whole tensor (an input, or any op's output as made,
    /// not a view of it). Parameters the loss does not depend on get a zero gradient.
    pub fn new(params: &[GraphTensor<'g>], loss: GraphTensor<'g>) -> Autograd<'g> {
        let n = loss.n_elements();
        assert!(
            n.as_constant() == Some(1),
            "Autograd::new: the loss must have one element, got shape {:?} (use \
             Autograd::with_seed for a vector-Jacobian product)",
            loss.shape()
        );
        let seed = loss
            .graph
            .constant_of(1.0, loss.dtype())
            .expand_to(loss.shape());
        Self::with_seed(params, loss, seed)
    }

    /// Vector-Jacobian product: the gradients of `sum(output * seed)` with respect to
    /// `params` (`seed` has `output`'s shape).
    pub fn with_seed(
        params: &[GraphTensor<'g>],
        output: GraphTensor<'g>,
        seed: GraphTensor<'g>,
    ) -> Autograd<'g> {
        let cx = output.graph;
        for p in params {
            p.same_graph(&output, "Autograd");
            let e = p.entry();
            let node_shape = cx.data().node(e.node).shape.clone();
            assert!(
                e.view.is_contiguous() && e.view.dims() == node_shape,
                "Autograd: parameter {} is a view (shape {:?}) of a node of shape \
                 {node_shape:?}; pass the whole tensor",
                e.label,
                e.view.dims()
            );
            assert!(
                p.dtype().is_float(),
                "Autograd: parameter {} is {}; only float tensors have gradients",
                e.label,
                p.dtype()
            );
        }
        assert_eq!(
            seed.shape(),
            output.shape(),
            "Autograd::with_seed: seed shape {:?} differs from output shape {:?}",
            seed.shape(),
            output.shape()
        );
        let param_nodes: Vec<NodeId> = params.iter().map(|p| p.node()).collect();
        let (order, nodes) = {
            let d = cx.data();
            let order = d.toposort();
            let len = d.nodes.len();
            // Nodes that depend on a parameter ...
            let mut from_param = vec![false; len];
            for &p in &param_nodes {
                from_param[p.0 as usize] = true;
            }
            for &id in &order {
                // A detached node is a constant to autograd.
                if !d.no_grad.contains(&id)
                    && d.node(id)
                        .inputs
                        .iter()
                        .any(|e| from_param[e.node.0 as usize])
                {
                    from_param[id.0 as usize] = true;
                }
            }
            // ... and that the output depends on.
            let mut to_output = vec![false; len];
            to_output[output.node().0 as usize] = true;
            for &id in order.iter().rev() {
                if to_output[id.0 as usize] {
                    for e in &d.node(id).inputs {
                        to_output[e.node.0 as usize] = true;
                    }
                }
            }
            let relevant: Vec<NodeId> = order
                .iter()
                .copied()
                .filter(|id| from_param[id.0 as usize] && to_output[id.0 as usize])
                .collect();
            let nodes: HashMap<NodeId, crate::graph::Node> = relevant
                .iter()
                .map(|&id| (id, d.node(id).clone()))
                .collect();
            (relevant, nodes)
        };
        // Edges reading each node, for the attention matcher's "read only inside" check.
        let uses: HashMap<NodeId, usize> = {
            let d = cx.data();
            let mut uses = HashMap::new();
            for id in d.node_ids() {
                for e in &d.node(id).inputs {
                    *uses.entry(e.node).or_insert(0) += 1;
                }
            }
            uses
        };
        let mut recompute = Recompute::new(cx);
        let mut grads: HashMap<NodeId, GraphTensor<'g>> = HashMap::new();
        let out_entry = output.entry();
        if nodes.contains_key(&out_entry.node) {
            let shape = nodes[&out_entry.node].shape.clone();
            let g = view::view_transpose(vec![seed], &out_entry.view, &shape);
            grads.insert(out_entry.node, g);
        }
        for &id in order.iter().rev() {
            let node = &nodes[&id];
            let Some(&g) = grads.get(&id) else { continue };
            if !node.dtype.is_float() || node.inputs.is_empty() {
                continue;
            }
            let handle = |node_id: NodeId, view: ShapeTracker| {
                let dtype = cx.data().node(node_id).dtype;
                cx.new_handle(TensorEntry {
                    node: node_id,
                    view,
                    dtype,
                    label: format!("autograd#{}", node_id.0),
                })
            };
            // Inside a checkpointed segment the rule reads the segment's recomputed values.
            let seg = recompute.segment_of(id);
            // A recognised function of one tensor `x` is differentiated as one expression
            // instead of its primops' rules one by one: a layer norm from `x` alone, the
            // recomputed statistics kept apart from the forward's (`layer_norm_grad`); a
            // `gelu_tanh` as `dy · gelu_tanh'(x)` (see `GeluMatch`). Its inner nodes get no
            // gradient from this path (any other reader of them adds its own).
            let one_piece = {
                let d = cx.data();
                LayerNormMatch::find(&d, id)
                    .map(|m| (m.x, Some(m.eps)))
                    .or_else(|| {
                        GeluMatch::find(&d, id)
                            .filter(|m| m.f == GeluFn::Tanh)
                            .map(|m| (m.x, None))
                    })
            };
            if let Some((xe, eps)) = one_piece {
                if nodes.contains_key(&xe.node) {
                    let x = handle(recompute.resolve(seg, xe.node), xe.view.clone());
                    let dx = match eps {
                        Some(eps) => {
                            let xhat = handle(
                                recompute.resolve(seg, id),
                                ShapeTracker::new(node.shape.clone()),
                            );
                            let start = cx.data().nodes.len() as u32;
                            let dx = x.layer_norm_grad(xhat, g, eps);
                            attention::tag_recomputation(cx, start);
                            let e = dx.entry();
                            if e.view.is_contiguous() && e.view.dims() == node.shape {
                                let hint = crate::patterns::LayerNormGrad {
                                    x: x.edge(),
                                    xhat: xhat.edge(),
                                    dy: g.edge(),
                                    eps,
                                };
                                cx.data_mut().layer_norm_grads.insert(e.node, hint);
                            }
                            dx
                        }
                        None => g * x.gelu_tanh_grad(),
                    };
                    let shape = &nodes[&xe.node].shape;
                    add_grad(&mut grads, xe.node, shape, vec![dx], &xe.view);
                }
                continue;
            }
            let out = handle(
                recompute.resolve(seg, id),
                ShapeTracker::new(node.shape.clone()),
            );
            // A recognised attention: its gradient in one piece (see `attention.rs`).
            let found = if attention_grads_enabled() {
                let d = cx.data();
                attention::recognise(&d, &uses, id, &|n| nodes.contains_key(&n))
            } else {
                None
            };
            if let Some(a) = found {
                let mut operand = |(n, view): (NodeId, ShapeTracker)| {
                    (handle(recompute.resolve(seg, n), view), n)
                };
                let (q, k, v) = (operand(a.q), operand(a.k), operand(a.v));
                let bias = a.bias.map(&mut operand);
                let (stacked, parts) =
                    attention::build(cx, (q.0, k.0, v.0, bias.map(|b| b.0)), g, a.scale);
                let (qv, kv, vv) = (q.0.entry().view, k.0.entry().view, v.0.entry().view);
                let one_node = q.1 == k.1 && k.1 == v.1 && nodes.contains_key(&q.1);
                if let Some(view) = one_node
                    .then(|| attention::stacked_view((&qv, &kv, &vv)))
                    .flatten()
                {
                    let n = q.1;
                    add_grad(&mut grads, n, &nodes[&n].shape, vec![stacked], &view);
                    continue;
                }
                for ((t, n), gi) in [q, k, v].into_iter().zip(parts) {
                    if !nodes.contains_key(&n) {
                        continue;
                    }
                    add_grad(&mut grads, n, &nodes[&n].shape, vec![gi], &t.entry().view);
                }
                continue;
            }
            let inputs: Vec<GraphTensor<'g>> = node
                .inputs
                .iter()
                .map(|e| handle(recompute.resolve(seg, e.node), e.view.clone()))
                .collect();
            let wanted: Vec<bool> = node
                .inputs
                .iter()
                .map(|e| nodes.contains_key(&e.node))
                .collect();
            let local = rules::input_grads(node, out, &inputs, g, &wanted);
            for ((edge, factors), wanted) in node.inputs.iter().zip(local).zip(wanted) {
                let Some(factors) = factors else { continue };
                if !wanted {
                    continue;
                }
                let shape = &nodes[&edge.node].shape;
                add_grad(&mut grads, edge.node, shape, factors, &edge.view);
            }
        }
        Autograd {
            params: param_nodes,
            grads,
            graph: cx,
        }
    }

    /// The gradient of the loss with respect to `param` (one of the tensors given to
    /// `new`), of `param`'s shape and dtype; zeros where the loss does not depend on it.
    pub fn grad(&self, param: GraphTensor<'g>) -> GraphTensor<'g> {
        let node = param.node();
        assert!(
            self.params.contains(&node),
            "Autograd::grad: {:?} was not one of the parameters",
            param
        );
        match self.grads.get(&node) {
            Some(&g) => g,
            None => self
                .graph
                .constant_of(0.0, param.dtype())
                .expand_to(param.shape()),
        }
    }

    /// The gradients of all parameters, in the order given to `new`.
    pub fn grads(&self, params: &[GraphTensor<'g>]) -> Vec<GraphTensor<'g>> {
        params.iter().map(|&p| self.grad(p)).collect()
    }
}

/// The checkpointed segments of a graph ([`crate::graph::Graph::checkpoint`]) and their
/// recomputed copies, made when the backward pass first reads inside a segment.
struct Recompute<'g> {
    graph: &'g crate::graph::Graph,
    ranges: Vec<std::ops::Range<u32>>,
    /// Per segment: original node → its copy.
    copies: Vec<Option<HashMap<NodeId, NodeId>>>,
}

impl<'g> Recompute<'g> {
    fn new(graph: &'g crate::graph::Graph) -> Self {
        let ranges = graph.checkpoint_ranges();
        let copies = vec![None; ranges.len()];
        Recompute {
            graph,
            ranges,
            copies,
        }
    }

    /// The segment that built `id`, if any.
    fn segment_of(&self, id: NodeId) -> Option<usize> {
        self.ranges.iter().position(|r| r.contains(&id.0))
    }

    /// The node a gradient rule of a node in segment `seg` reads for `id`: the recomputed
    /// copy when `id` belongs to the same segment, else `id` itself (a segment's inputs and
    /// outputs are the forward values, kept alive anyway).
    fn resolve(&mut self, seg: Option<usize>, id: NodeId) -> NodeId {
        let Some(s) = seg else { return id };
        if !self.ranges[s].contains(&id.0) {
            return id;
        }
        if self.copies[s].is_none() {
            self.copies[s] = Some(self.copy_segment(s));
        }
        self.copies[s]
            .as_ref()
            .unwrap()
            .get(&id)
            .copied()
            .unwrap_or(id)
    }

    /// Copies every computing node of segment `s` (inputs stay shared), tagged so that CSE
    /// keeps the copies apart from the originals. Made at the point of the backward pass
    /// that first needs them, so the backend schedules the recomputation there.
    fn copy_segment(&self, s: usize) -> HashMap<NodeId, NodeId> {
        let mut d = self.graph.data_mut();
        let tag = d.recompute.values().copied().max().unwrap_or(0) + 1;
        let mut map = HashMap::new();
        for raw in self.ranges[s].clone() {
            let id = NodeId(raw);
            let Some(node) = d.try_node(id).cloned() else {
                continue;
            };
            if matches!(node.op, crate::op::Op::Input { .. }) {
                continue;
            }
            let mut copy = node;
            for e in &mut copy.inputs {
                if let Some(&c) = map.get(&e.node) {
                    e.node = c;
                }
            }
            let new = d.add_node(copy);
            d.recompute.insert(new, tag);
            map.insert(id, new);
        }
        map
    }
}

/// Adds to `node`'s gradient the gradient that reached it through `view` (the transpose of
/// the view applied to `factors`; `shape`: the node's), summing over its consumers.
fn add_grad<'g>(
    grads: &mut HashMap<NodeId, GraphTensor<'g>>,
    node: NodeId,
    shape: &[crate::shape::Expression],
    factors: Vec<GraphTensor<'g>>,
    view: &ShapeTracker,
) {
    let gi = view::view_transpose(factors, view, shape);
    let acc = match grads.get(&node) {
        Some(&prev) => prev + gi,
        None => gi,
    };
    grads.insert(node, acc);
}

thread_local! {
    static ATTENTION_GRADS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Whether autograd builds a recognised attention's gradient in one piece (see
/// `attention.rs`): on by default, off with `LUMINAL_ATTENTION_GRAD=0`, or as set on this
/// thread by [`set_attention_grads`].
fn attention_grads_enabled() -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    ATTENTION_GRADS.get().unwrap_or_else(|| {
        *ENV.get_or_init(|| std::env::var("LUMINAL_ATTENTION_GRAD").map_or(true, |v| v != "0"))
    })
}

/// Chooses, for graphs differentiated on the calling thread, whether a recognised
/// attention's gradient is built in one piece (`Some(true)`), rule by rule (`Some(false)`:
/// the forward then keeps its probabilities), or as the environment says (`None`: in one
/// piece unless `LUMINAL_ATTENTION_GRAD=0`).
pub fn set_attention_grads(on: Option<bool>) {
    ATTENTION_GRADS.set(on);
}

/// The gradients of the scalar `loss` with respect to `params`, in order.
pub fn gradients<'g>(params: &[GraphTensor<'g>], loss: GraphTensor<'g>) -> Vec<GraphTensor<'g>> {
    Autograd::new(params, loss).grads(params)
}

#[cfg(test)]
mod tests;
