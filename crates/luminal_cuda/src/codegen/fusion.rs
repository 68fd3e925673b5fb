//! Which elementwise nodes are computed inside their reader's kernel.

use super::c_type;
use luminal::graph::{GraphData, NodeId};
use luminal::op::{Op, UnaryOp};
use luminal::ShapeTracker;
use std::collections::{HashMap, HashSet};

/// Which nodes [`fused_nodes`] fuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Fusion {
    /// One kernel and one buffer per node.
    Off,
    /// Elementwise nodes of one reader that does not read them through a broadcast.
    #[default]
    On,
    /// Also through broadcasts (the node recomputed for each element that reads it).
    Broadcast,
}

impl Fusion {
    /// The mode `LUMINAL_CUDA_FUSION` names (`0`/`off`, `broadcast`; else [`Fusion::On`]).
    pub fn from_env() -> Fusion {
        match std::env::var("LUMINAL_CUDA_FUSION").as_deref() {
            Ok("0") | Ok("off") => Fusion::Off,
            Ok("broadcast") => Fusion::Broadcast,
            _ => Fusion::On,
        }
    }
}

/// Whether `view` reads some element more than once along a broadcast (stride 0) dim.
fn broadcasts(view: &ShapeTracker) -> bool {
    view.strides()
        .iter()
        .zip(view.dims())
        .any(|(s, d)| s.as_constant() == Some(0) && d.as_constant() != Some(1))
}

/// Whether `op` computes each output element from the same element of its inputs (read
/// through their views) alone, so that it can be computed inside its consumer's kernel.
fn elementwise(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_)
            | Op::Binary(_)
            | Op::Cast(_)
            | Op::Contiguous
            | Op::Constant { .. }
            | Op::Iota { .. }
    )
}

/// The nodes of `order` (the live nodes, inputs first) that are computed inside their
/// consumer's kernel instead of into a buffer of their own: elementwise nodes (Unary, Binary,
/// Cast, Contiguous, Constant, Iota) that are not graph outputs, are read by exactly one
/// edge, not through a broadcast (so that no element is computed more often than the
/// unfused plan reads it; constants and iotas: by any number of edges, any view), and neither
/// they nor that consumer are in `barriers` (the products cuBLAS may
/// compute, whose operands must be buffers). A consumer reads such a node through its edge's
/// view by computing the node's element at the view's index (0 where the view pads), so
/// chains and trees of them, and a reduction's, gather's or write-slice's elementwise input,
/// become one kernel with no intermediate buffers.
pub fn fused_nodes(
    graph: &GraphData,
    order: &[NodeId],
    barriers: &HashSet<NodeId>,
    mode: Fusion,
) -> HashSet<NodeId> {
    if mode == Fusion::Off {
        return HashSet::new();
    }
    // Per node: its readers (edges), and whether one of them is a barrier or reads it
    // through a broadcast.
    let mut uses: HashMap<NodeId, (usize, bool, bool)> = HashMap::new();
    for &id in order {
        for e in &graph.node(id).inputs {
            let u = uses.entry(e.node).or_insert((0, false, false));
            u.0 += 1;
            u.1 |= barriers.contains(&id);
            u.2 |= broadcasts(&e.view);
        }
    }
    // Per node: the operations one element of it costs when computed in its reader (its own
    // and its fused producers'; a buffer or constant read counts one), or `None` when that
    // includes a transcendental (`Sin`, `Exp2`, `Log2`: RoPE tables, exponentials).
    let mut cost: HashMap<NodeId, Option<usize>> = HashMap::new();
    let mut fused = HashSet::new();
    for &id in order {
        let node = graph.node(id);
        let own = match node.op {
            Op::Unary(UnaryOp::Sin | UnaryOp::Exp2 | UnaryOp::Log2) => None,
            _ => Some(1),
        };
        let c = own.and_then(|own| {
            node.inputs.iter().try_fold(own, |acc, e| {
                Some(
                    acc + if fused.contains(&e.node) {
                        cost[&e.node]?
                    } else {
                        1
                    },
                )
            })
        });
        cost.insert(id, c);
        let leaf = matches!(node.op, Op::Constant { .. } | Op::Iota { .. });
        let fuse = elementwise(&node.op)
            && !graph.outputs.contains(&id)
            && !barriers.contains(&id)
            && c_type(node.dtype).is_ok()
            && uses.get(&id).is_some_and(|&(n, barrier, broadcast)| {
                // Constants and iotas read nothing: recomputed in each of their readers. A
                // node read through a broadcast is recomputed for every element that reads
                // it: only when that is a few cheap operations (a row's normalisation factor,
                // `1/sqrt(Σx²/n + ε)`), or in the broadcast mode.
                let cheap = c.is_some_and(|c| c <= MAX_BROADCAST_COST);
                !barrier && (leaf || (n == 1 && (!broadcast || cheap || mode == Fusion::Broadcast)))
            });
        if fuse {
            fused.insert(id);
        }
    }
    fused
}

/// The most operations per element a node read through a broadcast may cost to be fused in
/// [`Fusion::On`] (see [`fused_nodes`]).
pub const MAX_BROADCAST_COST: usize = 8;
