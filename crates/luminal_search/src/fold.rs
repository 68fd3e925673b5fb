//! Identical subgraphs searched once.
//!
//! A model of 30 identical transformer layers encodes as 30 runs of terms that differ only
//! in which weights they read and which layer's output they start from. Seeding the e-graph
//! with all of them makes saturation and extraction 30 times the work of one layer, and a
//! node limit that one layer would never reach cuts the search of the whole model short.
//! So before the e-graph is seeded, [`find`] looks for the longest run of terms that repeats
//! with a fixed period (a *segment*, usually one layer, not necessarily aligned with where
//! the model's code starts a layer), checks that every instance reads its inputs the same
//! way, and builds a reduced encoding ([`Fold::reduced`]) that holds everything outside the
//! run once, plus **one** instance whose inputs from the previous instance are placeholder
//! leaves. The search saturates and extracts that; [`Fold::expand`] then instantiates the
//! extracted segment once per instance (its own weights, the previous instance's output as
//! input) and reconnects the terms after the run, giving a term DAG of the whole graph.
//!
//! How an instance's term reads a child (its *slot*), decided on instance 1 and checked on
//! every other instance:
//! - *internal*: a term of the same instance;
//! - *shared*: the same term for every instance, from before the run (constants, the mask,
//!   the rotary tables);
//! - *shifted*: instance 0 reads a term just before the run, instance k the same term of
//!   instance k − 1 (the residual stream);
//! - *param*: an opaque leaf of its own per instance, read by nothing else (a weight).
//!
//! Rewrites that would cross an instance's boundary are not seen (the placeholders are
//! opaque), so folding trades those for a search whose cost does not grow with depth.
//! `LUMINAL_SEARCH_FOLD=0` switches folding off.

use crate::terms::{Encoding, Info, TId, TNode, TermDag};
use luminal::graph::{GraphData, NodeId};
use luminal::op::Op;
use std::collections::{HashMap, HashSet};

/// Shortest segment worth folding, in terms.
pub const MIN_PERIOD: usize = 8;

/// How an instance's term finds one child (see the module docs).
#[derive(Clone, Debug, PartialEq)]
enum Slot {
    Internal(usize),
    Shared(TId),
    Shifted { first: TId, j: usize },
    Param(Vec<TId>),
}

/// What a root of the reduced encoding stands for.
#[derive(Clone, Copy, Debug)]
enum RootKind {
    /// A root of the source encoding outside the run.
    Graph,
    /// Term `j` of the segment (an instance's output that something outside it reads).
    Body(usize),
    /// A term before the run that instance 0 reads through a shifted slot.
    Prefix(TId),
}

/// A leaf placeholder of the reduced encoding.
#[derive(Clone, Copy, Debug)]
enum Placeholder {
    /// Instance 0 reads `first`; instance k ≥ 1 reads instance k − 1's body term `j`.
    Input { first: TId, j: usize },
    /// A term after the run reads instance `k`'s body term `j`.
    Output { k: usize, j: usize },
}

/// A repeated run found in an encoding, and the reduced encoding to search instead.
#[derive(Clone, Debug)]
pub struct Fold {
    /// First term of the run, terms per segment, instances.
    pub start: usize,
    pub period: usize,
    pub count: usize,
    /// Everything outside the run, one instance, and placeholders (see the module docs).
    pub reduced: Encoding,
    root_kinds: Vec<RootKind>,
    /// Opaque index `base + i` of the reduced encoding is placeholder `i`.
    base: u32,
    placeholders: Vec<Placeholder>,
    /// Per instance: opaque index of instance 0 → the instance's own.
    opaque_maps: Vec<HashMap<u32, u32>>,
    /// The source encoding's roots: outside the run (`None`), or instance k's body term j.
    source_roots: Vec<(NodeId, Option<(usize, usize)>)>,
}

impl Fold {
    /// Terms of the source encoding and of the reduced one.
    pub fn sizes(&self, source: &Encoding) -> (usize, usize) {
        let live = |d: &TermDag| d.reachable().iter().filter(|&&x| x).count();
        (live(&source.dag), live(&self.reduced.dag))
    }

    /// A term DAG of the whole graph (over the source encoding's tables) from `d`, a DAG
    /// over the reduced encoding whose roots are [`Fold::reduced`]'s (as
    /// [`crate::egraph::extract`] returns them). `None` if `d` does not fit.
    pub fn expand(&self, d: &TermDag) -> Option<TermDag> {
        if d.roots.len() != self.root_kinds.len() {
            return None;
        }
        let mut f = TermDag::default();
        let root_of = |kind: &dyn Fn(&RootKind) -> bool| -> Option<TId> {
            let i = self.root_kinds.iter().position(kind)?;
            Some(d.roots[i].1)
        };
        // Terms before the run that instance 0 reads.
        let mut outer: HashMap<TId, TId> = HashMap::new();
        let mut prefix: HashMap<TId, TId> = HashMap::new();
        for kind in &self.root_kinds {
            if let RootKind::Prefix(t) = *kind {
                let r = root_of(&|k| matches!(k, RootKind::Prefix(x) if *x == t))?;
                // No placeholder is reachable from a term before the run.
                let leaf = |o: u32| self.placeholder(o).map(|_| None);
                copy(d, &mut f, &[r], &mut outer, &leaf, None)?;
                prefix.insert(t, outer[&r]);
            }
        }
        // The instances, in order: each reads the previous one's outputs.
        let body: Vec<(usize, TId)> = self
            .root_kinds
            .iter()
            .zip(&d.roots)
            .filter_map(|(k, r)| match *k {
                RootKind::Body(j) => Some((j, r.1)),
                _ => None,
            })
            .collect();
        let body_roots: Vec<TId> = body.iter().map(|b| b.1).collect();
        let mut exports: Vec<HashMap<usize, TId>> = Vec::with_capacity(self.count);
        for k in 0..self.count {
            let mut memo = HashMap::new();
            let prev = exports.last();
            let leaf = |i: usize| -> Option<TId> {
                match self.placeholders[i] {
                    Placeholder::Input { first, .. } if k == 0 => prefix.get(&first).copied(),
                    Placeholder::Input { j, .. } => prev?.get(&j).copied(),
                    Placeholder::Output { .. } => None,
                }
            };
            copy(
                d,
                &mut f,
                &body_roots,
                &mut memo,
                &|o| self.placeholder(o).map(&leaf),
                Some(&self.opaque_maps[k]),
            )?;
            exports.push(body.iter().map(|&(j, r)| (j, memo[&r])).collect());
        }
        // Everything after the run, and the roots.
        let graph_roots: Vec<TId> = self
            .root_kinds
            .iter()
            .zip(&d.roots)
            .filter(|(k, _)| matches!(k, RootKind::Graph))
            .map(|(_, r)| r.1)
            .collect();
        let leaf = |i: usize| -> Option<TId> {
            match self.placeholders[i] {
                Placeholder::Output { k, j } => exports.get(k)?.get(&j).copied(),
                Placeholder::Input { .. } => None,
            }
        };
        copy(
            d,
            &mut f,
            &graph_roots,
            &mut outer,
            &|o| self.placeholder(o).map(&leaf),
            None,
        )?;
        let mut graph = self
            .root_kinds
            .iter()
            .zip(&d.roots)
            .filter(|(k, _)| matches!(k, RootKind::Graph));
        for &(node, at) in &self.source_roots {
            let t = match at {
                Some((k, j)) => *exports.get(k)?.get(&j)?,
                None => *outer.get(&graph.next()?.1 .1)?,
            };
            f.roots.push((node, t));
        }
        Some(f)
    }

    fn placeholder(&self, opaque: u32) -> Option<usize> {
        let i = opaque.checked_sub(self.base)? as usize;
        (i < self.placeholders.len()).then_some(i)
    }
}

/// Copies the terms of `d` that `roots` reach into `f` (memoised in `memo`): opaque index
/// `o` becomes `omap[o]` where mapped, and a placeholder leaf the term `leaf(o)` gives
/// (`Some(None)`: a placeholder this copy cannot resolve, the copy fails).
fn copy(
    d: &TermDag,
    f: &mut TermDag,
    roots: &[TId],
    memo: &mut HashMap<TId, TId>,
    leaf: &dyn Fn(u32) -> Option<Option<TId>>,
    omap: Option<&HashMap<u32, u32>>,
) -> Option<()> {
    let mut live = vec![false; d.nodes.len()];
    for &r in roots {
        *live.get_mut(r as usize)? = true;
    }
    for i in (0..d.nodes.len()).rev() {
        if live[i] && !memo.contains_key(&(i as TId)) {
            for c in d.nodes[i].children() {
                live[c as usize] = true;
            }
        }
    }
    let om = |o: u32| omap.and_then(|m| m.get(&o)).copied().unwrap_or(o);
    for (i, n) in d.nodes.iter().enumerate() {
        if !live[i] || memo.contains_key(&(i as TId)) {
            continue;
        }
        let ch = |c: TId| memo.get(&c).copied();
        let new = match *n {
            TNode::Op0(o) => match leaf(o) {
                Some(t) => t?,
                None => f.add(TNode::Op0(om(o))),
            },
            TNode::Op1(o, a) => f.add(TNode::Op1(om(o), ch(a)?)),
            TNode::Op2(o, a, b) => f.add(TNode::Op2(om(o), ch(a)?, ch(b)?)),
            _ => {
                if n.children().iter().any(|&c| ch(c).is_none()) {
                    return None;
                }
                f.add(n.map_children(&|c| memo[&c]))
            }
        };
        memo.insert(i as TId, new);
    }
    Some(())
}

/// What a term is, apart from which terms it reads: the head, its own arguments, and for a
/// node kept opaque the op, dtype and shape (inputs compare by dtype and shape, not name).
fn local_keys(enc: &Encoding, g: &GraphData) -> Vec<u64> {
    let opaque_kind = |k: u32| -> String {
        let Some(&id) = enc.opaque.get(k as usize) else {
            return format!("placeholder {k}");
        };
        let node = g.node(id);
        let op = match &node.op {
            Op::Input { .. } => "Input".to_string(),
            op => format!("{op:?}"),
        };
        format!("{op} {:?} {:?}", node.dtype, node.shape)
    };
    enc.dag
        .nodes
        .iter()
        .map(|n| {
            let text = match *n {
                TNode::Op0(k) => format!("Op0 {}", opaque_kind(k)),
                TNode::Op1(k, _) => format!("Op1 {}", opaque_kind(k)),
                TNode::Op2(k, _, _) => format!("Op2 {}", opaque_kind(k)),
                TNode::Un(op, _) => format!("Un {}", op.name()),
                TNode::Bin(op, _, _) => format!("Bin {}", op.name()),
                TNode::Red(op, ax, _) => format!("Red {op:?} {ax}"),
                TNode::Ed(_, v) => format!("Ed {v}"),
                n => n.head().to_string(),
            };
            crate::cache::fnv1a(text.as_bytes())
        })
        .collect()
}

/// The longest run of `enc`'s terms that repeats with a fixed period, at least
/// [`MIN_PERIOD`] terms long and twice over, whose instances read their inputs alike (see
/// the module docs), with the reduced encoding to search instead. `None`: nothing repeats.
pub fn find(enc: &Encoding, g: &GraphData) -> Option<Fold> {
    let nodes = &enc.dag.nodes;
    let n = nodes.len();
    if n < 2 * MIN_PERIOD {
        return None;
    }
    let key = local_keys(enc, g);
    let is_leaf = |t: TId| matches!(nodes[t as usize], TNode::Op0(_));
    // Candidate periods: the most frequent distances between consecutive terms of equal key.
    let mut last: HashMap<u64, usize> = HashMap::new();
    let mut gaps: HashMap<usize, usize> = HashMap::new();
    for (i, k) in key.iter().enumerate() {
        if let Some(j) = last.insert(*k, i) {
            *gaps.entry(i - j).or_default() += 1;
        }
    }
    let mut periods: Vec<(usize, usize)> = gaps
        .into_iter()
        .filter(|&(p, c)| p >= MIN_PERIOD && p <= n / 2 && c >= MIN_PERIOD)
        .collect();
    periods.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    periods.truncate(24);

    let mut best: Option<Fold> = None;
    for (p, _) in periods {
        // Term i looks like term i − p: same key, and each child the same term, the term p
        // before, or an opaque leaf of the same key.
        let like = |i: usize| -> bool {
            if key[i] != key[i - p] {
                return false;
            }
            let (a, b) = (nodes[i].children(), nodes[i - p].children());
            a.len() == b.len()
                && a.iter().zip(&b).all(|(&c, &c0)| {
                    c == c0
                        || (c as usize >= p && c as usize - p == c0 as usize)
                        || (is_leaf(c) && is_leaf(c0) && key[c as usize] == key[c0 as usize])
                })
        };
        let (mut run, mut run_start, mut best_run) = (0usize, p, (0usize, 0usize));
        for i in p..n {
            if like(i) {
                if run == 0 {
                    run_start = i;
                }
                run += 1;
                if run > best_run.1 {
                    best_run = (run_start, run);
                }
            } else {
                run = 0;
            }
        }
        let count = best_run.1 / p + 1;
        if count < 2 {
            continue;
        }
        let fold = build(enc, best_run.0 - p, p, count);
        let folded = |f: &Option<Fold>| f.as_ref().map_or(0, |f| (f.count - 1) * f.period);
        if folded(&fold) > folded(&best) {
            best = fold;
        }
    }
    best
}

/// The slots of the run `[start, start + period·count)`, with `count` cut to the instances
/// that read their inputs like instance 1 does; `None` if fewer than two do.
fn slots(
    enc: &Encoding,
    start: usize,
    period: usize,
    count: usize,
) -> Option<(Vec<Vec<Slot>>, usize)> {
    let nodes = &enc.dag.nodes;
    let is_leaf = |t: TId| matches!(nodes[t as usize], TNode::Op0(_));
    let (a, p) = (start, period);
    let mut count = count;
    'retry: loop {
        if count < 2 {
            return None;
        }
        let end = a + p * count;
        let in_run = |t: TId| (a..end).contains(&(t as usize));
        let mut all = Vec::with_capacity(p);
        for j in 0..p {
            let c0s = nodes[a + j].children();
            let mut slots = Vec::with_capacity(c0s.len());
            for (s, &c0) in c0s.iter().enumerate() {
                let child = |k: usize| nodes[a + j + k * p].children().get(s).copied();
                let c = c0 as usize;
                let slot = if (a..a + p).contains(&c) {
                    Slot::Internal(c - a)
                } else if child(1) == Some(c0) {
                    Slot::Shared(c0)
                } else if c + p >= a && c < a && child(1) == Some(c0 + p as TId) {
                    Slot::Shifted {
                        first: c0,
                        j: c + p - a,
                    }
                } else if is_leaf(c0) {
                    Slot::Param(vec![c0])
                } else {
                    return None;
                };
                // Every instance must read this slot the same way; the run ends before the
                // first that does not.
                let differs = (1..count).find(|&k| {
                    let Some(ck) = child(k) else { return true };
                    !match &slot {
                        Slot::Internal(i) => ck as usize == a + k * p + i,
                        Slot::Shared(t) => ck == *t,
                        Slot::Shifted { first, .. } => ck as usize == *first as usize + k * p,
                        Slot::Param(_) => is_leaf(ck) && !in_run(ck) && ck != c0,
                    }
                });
                if let Some(k) = differs {
                    count = k;
                    continue 'retry;
                }
                let slot = match slot {
                    Slot::Param(_) => {
                        Slot::Param((0..count).map(child).collect::<Option<Vec<TId>>>()?)
                    }
                    s => s,
                };
                slots.push(slot);
            }
            all.push(slots);
        }
        return Some((all, count));
    }
}

fn build(enc: &Encoding, start: usize, period: usize, count: usize) -> Option<Fold> {
    let nodes = &enc.dag.nodes;
    let (all, count) = slots(enc, start, period, count)?;
    let (a, p) = (start, period);
    let end = a + p * count;
    let in_run = |t: TId| (a..end).contains(&(t as usize));
    let opaque_of = |n: &TNode| match *n {
        TNode::Op0(o) | TNode::Op1(o, _) | TNode::Op2(o, _, _) => Some(o),
        _ => None,
    };

    // Per instance, its own opaque indices; a param leaf must be read by its instance alone,
    // and no opaque op may be both an instance's own and shared.
    let mut opaque_maps: Vec<HashMap<u32, u32>> = vec![HashMap::new(); count];
    let mut own_leaves: HashMap<TId, usize> = HashMap::new();
    let mut shared: HashSet<u32> = HashSet::new();
    for (j, slots) in all.iter().enumerate() {
        if let Some(o0) = opaque_of(&nodes[a + j]) {
            for (k, map) in opaque_maps.iter_mut().enumerate() {
                map.insert(o0, opaque_of(&nodes[a + j + k * p])?);
            }
        }
        for slot in slots {
            match slot {
                Slot::Param(leaves) => {
                    let o0 = opaque_of(&nodes[leaves[0] as usize])?;
                    for (k, &leaf) in leaves.iter().enumerate() {
                        if *own_leaves.entry(leaf).or_insert(k) != k {
                            return None;
                        }
                        let ok = opaque_of(&nodes[leaf as usize])?;
                        if *opaque_maps[k].entry(o0).or_insert(ok) != ok {
                            return None;
                        }
                    }
                }
                Slot::Shared(t) => {
                    if let Some(o) = opaque_of(&nodes[*t as usize]) {
                        shared.insert(o);
                    }
                }
                _ => {}
            }
        }
    }
    if opaque_maps[0].keys().any(|o| shared.contains(o)) {
        return None;
    }
    // Param leaves are read by their own instance only.
    let instance = |t: TId| in_run(t).then(|| (t as usize - a) / p);
    for (i, n) in nodes.iter().enumerate() {
        for c in n.children() {
            if let Some(&k) = own_leaves.get(&c) {
                if instance(i as TId) != Some(k) {
                    return None;
                }
            }
        }
    }

    // The reduced encoding: terms before the run, instance 0, terms after the run.
    let mut r = Encoding::with_tables(enc.opaque.clone(), enc.views.clone(), enc.online_attention);
    let base = enc.opaque.len() as u32;
    let mut placeholders: Vec<Placeholder> = vec![];
    let add = |r: &mut Encoding, n: TNode, info: Info| -> TId {
        let id = r.dag.add(n);
        if id as usize == r.info.len() {
            r.info.push(info);
        }
        id
    };
    let mut map: HashMap<TId, TId> = HashMap::new();
    for (t, node) in nodes.iter().enumerate().take(a) {
        let n = node.map_children(&|c| map[&c]);
        let id = add(&mut r, n, enc.info[t].clone());
        map.insert(t as TId, id);
    }
    let mut input_of: HashMap<TId, TId> = HashMap::new();
    for (j, slots) in all.iter().enumerate() {
        let mut child_map: HashMap<TId, TId> = HashMap::new();
        for (slot, &c0) in slots.iter().zip(&nodes[a + j].children()) {
            let new = match slot {
                Slot::Internal(i) => map[&((a + i) as TId)],
                Slot::Shared(t) => map[t],
                Slot::Param(leaves) => map[&leaves[0]],
                Slot::Shifted { first, j } => match input_of.get(first) {
                    Some(&t) => t,
                    None => {
                        let o = base + placeholders.len() as u32;
                        placeholders.push(Placeholder::Input {
                            first: *first,
                            j: *j,
                        });
                        r.placeholders.push(enc.info[*first as usize].clone());
                        let t = add(&mut r, TNode::Op0(o), enc.info[*first as usize].clone());
                        input_of.insert(*first, t);
                        t
                    }
                },
            };
            if *child_map.entry(c0).or_insert(new) != new {
                return None;
            }
        }
        let n = nodes[a + j].map_children(&|c| child_map[&c]);
        let id = add(&mut r, n, enc.info[a + j].clone());
        map.insert((a + j) as TId, id);
    }
    let mut output_of: HashMap<TId, TId> = HashMap::new();
    let mut needed: Vec<usize> = vec![];
    for (t, node) in nodes.iter().enumerate().skip(end) {
        let mut child_map: HashMap<TId, TId> = HashMap::new();
        for c in node.children() {
            let new = if in_run(c) {
                let (k, j) = ((c as usize - a) / p, (c as usize - a) % p);
                needed.push(j);
                match output_of.get(&c) {
                    Some(&x) => x,
                    None => {
                        let o = base + placeholders.len() as u32;
                        placeholders.push(Placeholder::Output { k, j });
                        r.placeholders.push(enc.info[c as usize].clone());
                        let x = add(&mut r, TNode::Op0(o), enc.info[c as usize].clone());
                        output_of.insert(c, x);
                        x
                    }
                }
            } else {
                map[&c]
            };
            child_map.insert(c, new);
        }
        let n = node.map_children(&|c| child_map[&c]);
        let id = add(&mut r, n, enc.info[t].clone());
        map.insert(t as TId, id);
    }

    // Roots: the source's outside the run, then the segment's outputs, then the terms
    // before the run that instance 0 reads.
    let mut root_kinds = vec![];
    let mut source_roots = vec![];
    for &(node, t) in &enc.dag.roots {
        if in_run(t) {
            let (k, j) = ((t as usize - a) / p, (t as usize - a) % p);
            needed.push(j);
            source_roots.push((node, Some((k, j))));
        } else {
            source_roots.push((node, None));
            root_kinds.push(RootKind::Graph);
            r.dag.roots.push((node, map[&t]));
        }
    }
    for p in &placeholders {
        if let Placeholder::Input { j, .. } = *p {
            needed.push(j);
        }
    }
    needed.sort_unstable();
    needed.dedup();
    for j in needed {
        root_kinds.push(RootKind::Body(j));
        r.dag.roots.push((NodeId(u32::MAX), map[&((a + j) as TId)]));
    }
    for p in &placeholders {
        if let Placeholder::Input { first, .. } = *p {
            root_kinds.push(RootKind::Prefix(first));
            r.dag.roots.push((NodeId(u32::MAX), map[&first]));
        }
    }

    // Facts of the terms kept.
    let keep = |t: &TId| map.get(t).copied();
    r.one_edges = enc.one_edges.iter().filter_map(keep).collect();
    r.zero_edges = enc.zero_edges.iter().filter_map(keep).collect();
    r.bcast_edges = enc.bcast_edges.iter().filter_map(keep).collect();
    r.last_reds = enc.last_reds.iter().filter_map(keep).collect();
    r.const_edges = enc
        .const_edges
        .iter()
        .filter_map(|&(t, v)| Some((keep(&t)?, v)))
        .collect();
    r.zero_strides = enc
        .zero_strides
        .iter()
        .filter_map(|&(t, s)| Some((keep(&t)?, s)))
        .collect();
    r.widened = enc
        .widened
        .iter()
        .filter_map(|&(e, raw)| Some((keep(&e)?, keep(&raw)?)))
        .collect();
    for list in [
        &mut r.one_edges,
        &mut r.zero_edges,
        &mut r.bcast_edges,
        &mut r.last_reds,
    ] {
        list.sort_unstable();
        list.dedup();
    }

    Some(Fold {
        start: a,
        period: p,
        count,
        reduced: r,
        root_kinds,
        base,
        placeholders,
        opaque_maps,
        source_roots,
    })
}

/// Whether folding is on (`LUMINAL_SEARCH_FOLD=0` switches it off).
pub fn enabled() -> bool {
    std::env::var("LUMINAL_SEARCH_FOLD").map_or(true, |v| v != "0")
}
