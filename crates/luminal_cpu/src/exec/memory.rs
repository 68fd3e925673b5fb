//! The static memory plan: which physical buffer each value of a lowered kernel list lives
//! in. Inputs own their buffers; each kernel output takes a free buffer of its storage kind,
//! and buffers return to the free list after the last read of the value they hold. Outputs
//! are never reused, so they stay readable after the run; a kernel that writes a state input
//! in place (`WriteSlice`) has that input's buffer as its result.
//!
//! A value and the results written in place over it share one buffer (an alias class):
//! the buffer is free only after the last read of any of them. The values an in-place
//! write reads (the new rows of a KV cache) are freed like any other after their last read:
//! before, a value whose last reader was an in-place write was never freed, so each layer's
//! new keys and values kept a buffer of their own for the whole run (69 buffers for
//! SmolLM2 where at most 9 values are live at once). [`check`] replays every plan and
//! refuses one that reuses a buffer while its value is still to be read.

use crate::kernel::{BufId, Kernel};
use crate::storage::{Storage, StorageKind};
use luminal::graph::{GraphData, NodeId};
use luminal::op::Op;
use luminal::prelude::DType;
use luminal::{LuminalError, Result};
use std::collections::{HashMap, HashSet};

pub(crate) struct MemoryPlan {
    /// The physical buffers (empty; they grow at the first run).
    pub bufs: Vec<Storage>,
    /// Physical buffer of every live input node, in launch order of the inputs.
    pub inputs: Vec<(NodeId, BufId)>,
}

/// Assigns buffers to the values of `kernels` (named by `BufId::of(node)` while lowering),
/// checks the assignment ([`check`]) and remaps every kernel onto them.
pub(crate) fn plan(
    graph: &GraphData,
    order: &[NodeId],
    kernels: &mut [Kernel],
) -> Result<MemoryPlan> {
    let a = assign(graph, order, kernels);
    check(kernels, &a.reads, &a.phys, &a.inputs)?;
    for k in kernels.iter_mut() {
        let map = |v: BufId| a.phys[&v];
        k.out = map(k.out);
        k.side = k.side.map(map);
        k.kind.remap(&map);
    }
    Ok(MemoryPlan {
        bufs: a.bufs,
        inputs: a.inputs,
    })
}

/// A buffer assignment before the kernels are remapped onto it.
struct Assignment {
    bufs: Vec<Storage>,
    /// Buffer of every value.
    phys: HashMap<BufId, BufId>,
    inputs: Vec<(NodeId, BufId)>,
    /// What each kernel reads (sorted, no duplicates).
    reads: Vec<Vec<BufId>>,
}

fn assign(graph: &GraphData, order: &[NodeId], kernels: &[Kernel]) -> Assignment {
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
    // Alias classes: a result written in place lives in the buffer of the value it
    // overwrites; `root` names the class by its first value.
    let mut root: HashMap<BufId, BufId> = HashMap::new();
    let root_of = |root: &HashMap<BufId, BufId>, v: BufId| root.get(&v).copied().unwrap_or(v);
    for k in kernels.iter() {
        if let Some(dest) = k.kind.in_place_of() {
            let r = root_of(&root, dest);
            root.insert(k.out, r);
        }
    }
    // A class's buffer is kept for the whole run when any of its values is an input or an
    // output (read by the caller after the run).
    let mut pinned: HashSet<BufId> = HashSet::new();
    for &(id, _) in &inputs {
        pinned.insert(root_of(&root, BufId::of(id)));
    }
    for k in kernels.iter() {
        if graph.outputs.contains(&k.node) {
            pinned.insert(root_of(&root, k.out));
        }
    }
    // Last kernel reading any value of each class.
    let mut last_read: HashMap<BufId, usize> = HashMap::new();
    for (i, r) in reads.iter().enumerate() {
        for &b in r {
            last_read.insert(root_of(&root, b), i);
        }
    }
    let mut free: Vec<BufId> = vec![];
    for (i, k) in kernels.iter().enumerate() {
        if let Some(dest) = k.kind.in_place_of() {
            // Written in place: the result is the overwritten value's own buffer.
            phys.insert(k.out, phys[&dest]);
        } else {
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
        }
        if let Some(side) = k.side {
            // A side output (f32, never a graph output: see `lower::side_outputs`) takes
            // a free buffer like the result, after it.
            let slot = free
                .iter()
                .position(|&b| bufs[b.idx()].kind() == StorageKind::of(DType::F32));
            let buf = match slot {
                Some(p) => free.swap_remove(p),
                None => new_buf(&mut bufs, DType::F32),
            };
            phys.insert(side, buf);
        }
        // Classes read for the last time (once each, whichever of their values was read),
        // and a result nothing reads, return their buffers. The output was placed first,
        // so it never shares a buffer with what its own kernel reads.
        let mut done: Vec<BufId> = vec![];
        for &r in reads[i]
            .iter()
            .chain(std::iter::once(&k.out))
            .chain(&k.side)
        {
            let c = root_of(&root, r);
            let last = last_read.get(&c);
            let finished =
                last == Some(&i) || (last.is_none() && (r == k.out || Some(r) == k.side));
            if finished && !pinned.contains(&c) && !done.contains(&c) {
                done.push(c);
                free.push(phys[&r]);
            }
        }
    }
    Assignment {
        bufs,
        phys,
        inputs,
        reads,
    }
}

/// Replays a plan in launch order, tracking which value each physical buffer holds, and
/// refuses it if a kernel would read a value whose buffer another value has taken since
/// (a buffer reused while still live), or write in place over a value no longer there.
/// `reads[i]` are kernel `i`'s reads, `phys` maps values to buffers (not yet remapped).
fn check(
    kernels: &[Kernel],
    reads: &[Vec<BufId>],
    phys: &HashMap<BufId, BufId>,
    inputs: &[(NodeId, BufId)],
) -> Result<()> {
    let mut holds: HashMap<BufId, BufId> =
        inputs.iter().map(|&(id, b)| (b, BufId::of(id))).collect();
    let fail = |i: usize, k: &Kernel, what: String| {
        Err(LuminalError::Backend(format!(
            "memory plan: kernel #{i} ({}, node #{}) {what}",
            k.name, k.node.0
        )))
    };
    for (i, k) in kernels.iter().enumerate() {
        let dest = k.kind.in_place_of();
        for &r in &reads[i] {
            let b = phys[&r];
            if holds.get(&b) != Some(&r) {
                return fail(
                    i,
                    k,
                    format!(
                        "reads value #{} from buffer #{} which holds {:?} by then",
                        r.0,
                        b.0,
                        holds.get(&b).map(|v| v.0)
                    ),
                );
            }
        }
        let out = phys[&k.out];
        match dest {
            Some(d) if phys[&d] != out => {
                return fail(i, k, "writes in place outside its state buffer".into())
            }
            None if reads[i].iter().any(|r| phys[r] == out) => {
                return fail(i, k, format!("writes buffer #{} that it reads", out.0))
            }
            _ => {}
        }
        holds.insert(out, k.out);
        if let Some(side) = k.side {
            let b = phys[&side];
            if b == out || reads[i].iter().any(|r| phys[r] == b) {
                return fail(
                    i,
                    k,
                    format!("writes its side output over buffer #{} that it uses", b.0),
                );
            }
            holds.insert(b, side);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::DimNames;
    use crate::CpuBackend;
    use luminal::passes::live_nodes;
    use luminal::prelude::*;

    /// Two KV-cache layers over `x: [s, 4]`, lowered: the graph, its live order and kernels.
    fn lowered() -> (GraphData, Vec<NodeId>, Vec<Kernel>) {
        let cx = Graph::new();
        let x = cx.input("x", ("s", 4), DType::F32);
        let mut h = x;
        for l in 0..2 {
            let cache = cx.input(&format!("cache{l}"), (16, 4), DType::F32);
            let written = cache.write_slice(0, "p", (h * 2.0).sin());
            let past = written.slice(0, 0, Expression::var("p") + Expression::var("s"));
            h = h + h.matmul(past.permute(&[1, 0])).softmax(1).matmul(past);
        }
        let _ = h.exp().output();
        let rt = cx
            .compile(CpuBackend::with_threads(1), CompileOptions::default())
            .unwrap();
        let g = rt.graph().clone();
        let live = live_nodes(&g);
        let order: Vec<NodeId> = g
            .toposort()
            .into_iter()
            .filter(|id| live.contains(id))
            .collect();
        let names = DimNames(g.dynamic_dims().into_iter().collect());
        let kernels =
            crate::lower::lower(&g, &order, &names, 1, crate::QuantDots::F32, &[]).unwrap();
        (g, order, kernels)
    }

    #[test]
    fn check_accepts_the_plan_and_refuses_a_buffer_reused_while_live() {
        let (g, order, kernels) = lowered();
        let a = assign(&g, &order, &kernels);
        check(&kernels, &a.reads, &a.phys, &a.inputs).unwrap();
        assert!(
            kernels.iter().any(|k| k.kind.in_place_of().is_some()),
            "the graph writes its caches in place"
        );
        // Give a value produced between another value's production and its last read
        // that other value's buffer: the replay must refuse it.
        let producer: HashMap<BufId, usize> = kernels
            .iter()
            .enumerate()
            .map(|(i, k)| (k.out, i))
            .collect();
        let mut tampered = 0;
        for (i, reads) in a.reads.iter().enumerate() {
            for r in reads {
                let Some(&j) = producer.get(r) else { continue };
                let Some(m) = (j + 1..i).find(|&m| kernels[m].kind.in_place_of().is_none()) else {
                    continue;
                };
                let mut phys = a.phys.clone();
                phys.insert(kernels[m].out, phys[r]);
                let err = check(&kernels, &a.reads, &phys, &a.inputs).unwrap_err();
                assert!(err.to_string().contains("memory plan"), "{err}");
                tampered += 1;
            }
        }
        assert!(tampered > 0, "no value is live across another kernel");
    }
}
