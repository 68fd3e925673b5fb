//! The static memory plan: which physical buffer each value of a lowered kernel list lives
//! in. Inputs own their buffers; each kernel output takes a free buffer of its storage kind,
//! and buffers return to the free list after their last read. Outputs are never reused, so
//! they stay readable after the run; a kernel that writes a state input in place
//! (`WriteSlice`) has that input's buffer as its result.

use crate::kernel::{BufId, Kernel};
use crate::storage::{Storage, StorageKind};
use luminal::graph::{GraphData, NodeId};
use luminal::op::Op;
use std::collections::HashMap;

pub(crate) struct MemoryPlan {
    /// The physical buffers (empty; they grow at the first run).
    pub bufs: Vec<Storage>,
    /// Physical buffer of every live input node, in launch order of the inputs.
    pub inputs: Vec<(NodeId, BufId)>,
}

/// Assigns buffers to the values of `kernels` (named by `BufId::of(node)` while lowering)
/// and remaps every kernel onto them.
pub(crate) fn plan(graph: &GraphData, order: &[NodeId], kernels: &mut [Kernel]) -> MemoryPlan {
    let mut bufs: Vec<Storage> = vec![];
    let mut phys: HashMap<BufId, BufId> = HashMap::new();
    let mut inputs = vec![];
    let new_buf = |bufs: &mut Vec<Storage>, dtype| {
        bufs.push(Storage::empty(dtype));
        BufId(bufs.len() as u32 - 1)
    };
    for &id in order {
        let node = graph.node(id);
        if let Op::Input { .. } = node.op {
            let b = new_buf(&mut bufs, node.dtype);
            phys.insert(BufId::of(id), b);
            inputs.push((id, b));
        }
    }
    let reads: Vec<Vec<BufId>> = kernels
        .iter()
        .map(|k| {
            let mut r = k.reads();
            r.sort_unstable();
            r.dedup();
            r
        })
        .collect();
    let mut last_read: HashMap<BufId, usize> = HashMap::new();
    for (i, r) in reads.iter().enumerate() {
        for &b in r {
            last_read.insert(b, i);
        }
    }
    // Values never returned to the free list: inputs, outputs, and results written in
    // place into an input's buffer.
    let mut in_place = std::collections::HashSet::new();
    let mut free: Vec<BufId> = vec![];
    for (i, k) in kernels.iter().enumerate() {
        if let Some(dest) = k.kind.in_place_of() {
            // Written in place: the result is the state input's own buffer.
            phys.insert(k.out, phys[&dest]);
            in_place.insert(k.out);
            continue;
        }
        let pinned = |v: BufId| {
            let n = NodeId(v.0);
            matches!(graph.node(n).op, Op::Input { .. })
                || graph.outputs.contains(&n)
                || in_place.contains(&v)
        };
        let kind = StorageKind::of(k.dtype);
        let slot = if graph.outputs.contains(&k.node) {
            None
        } else {
            free.iter().position(|&b| bufs[b.idx()].kind() == kind)
        };
        let buf = match slot {
            Some(p) => free.swap_remove(p),
            None => new_buf(&mut bufs, k.dtype),
        };
        phys.insert(k.out, buf);
        for &r in &reads[i] {
            if last_read.get(&r) == Some(&i) && !pinned(r) {
                free.push(phys[&r]);
            }
        }
    }
    for k in kernels.iter_mut() {
        let map = |v: BufId| phys[&v];
        k.out = map(k.out);
        k.kind.remap(&map);
    }
    MemoryPlan { bufs, inputs }
}
