//! The e-graph: seeded with a graph's terms, saturated stage by stage under node and time
//! limits, then read back as e-classes of alternative terms and extracted by a cost model.

use crate::terms::{binary_named, reduce_named, unary_named, Encoding, Info, TId, TNode, TermDag};
use egglog::{CommandOutput, EGraph, SerializeConfig};
use luminal::graph::GraphData;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The term language (sorts, constructors, fact relations).
pub const LANG: &str = include_str!("rules/lang.egg");

/// The rule files, in stage order: `(ruleset, text)`.
pub const RULE_FILES: &[(&str, &str)] = &[
    ("movement", include_str!("rules/movement.egg")),
    ("algebra", include_str!("rules/algebra.egg")),
    ("reassociate", include_str!("rules/reassociate.egg")),
    ("attention", include_str!("rules/attention.egg")),
];

/// One rewrite rule of a rule file: its name (the `; rule NAME` comment before it), its
/// ruleset and its egglog text.
#[derive(Clone, Debug)]
pub struct Rule {
    pub name: String,
    pub ruleset: &'static str,
    pub text: String,
}

/// Every rule of [`RULE_FILES`]; each is preceded by a `; rule NAME` comment.
pub fn rules() -> Vec<Rule> {
    let mut out = vec![];
    for &(ruleset, text) in RULE_FILES {
        let mut name: Option<String> = None;
        for line in text.lines() {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("; rule ") {
                let n = rest.split(':').next().unwrap_or(rest).trim();
                name = Some(n.to_string());
            } else if line.starts_with('(') && !line.starts_with("(ruleset") {
                let name = name
                    .take()
                    .unwrap_or_else(|| panic!("rule without a '; rule NAME' line: {line}"));
                out.push(Rule {
                    name,
                    ruleset,
                    text: line.to_string(),
                });
            }
        }
    }
    out
}

/// Why a stage stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// No rule changed anything.
    Saturated,
    /// The e-graph reached the node limit.
    NodeLimit,
    /// The stage's share of the time ran out.
    TimeLimit,
    /// The iteration limit.
    IterationLimit,
}

#[derive(Clone, Debug)]
pub struct StageReport {
    pub name: String,
    pub iterations: usize,
    pub enodes: usize,
    pub stopped: StopReason,
    pub elapsed: Duration,
}

/// Limits of one saturation.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_enodes: usize,
    pub time: Duration,
    pub max_iterations: usize,
}

/// The egglog program that states the encoding's terms and facts.
pub fn seed_program(enc: &Encoding) -> String {
    let live = enc.dag.reachable();
    let mut s = String::with_capacity(enc.dag.nodes.len() * 40);
    let t = |i: TId| format!("(T {i})");
    for (i, n) in enc.dag.nodes.iter().enumerate() {
        if !live[i] {
            continue;
        }
        let body = match *n {
            TNode::Op0(k) => format!("(Op0 {k})"),
            TNode::Op1(k, a) => format!("(Op1 {k} {})", t(a)),
            TNode::Op2(k, a, b) => format!("(Op2 {k} {} {})", t(a), t(b)),
            TNode::Un(op, a) => format!("(Un \"{}\" {})", op.name(), t(a)),
            TNode::Bin(op, a, b) => format!("(Bin \"{}\" {} {})", op.name(), t(a), t(b)),
            TNode::Red(op, ax, a) => {
                format!("(Red \"{}\" {ax} {})", crate::terms::reduce_name(op), t(a))
            }
            TNode::Cont(a) => format!("(Cont {})", t(a)),
            TNode::Ed(a, v) => format!("(Ed {} {v})", t(a)),
            n => {
                let c: Vec<String> = n.children().into_iter().map(t).collect();
                format!("({} {})", n.head(), c.join(" "))
            }
        };
        s.push_str(&format!("(union (T {i}) {body})\n"));
    }
    for &e in &enc.one_edges {
        if live[e as usize] {
            s.push_str(&format!("(OneEdge (T {e}))\n"));
        }
    }
    for &e in &enc.zero_edges {
        if live[e as usize] {
            s.push_str(&format!("(ZeroEdge (T {e}))\n"));
        }
    }
    // Facts of the attention rules: a constant is named by the role it plays.
    for &(e, v) in &enc.const_edges {
        if live[e as usize] {
            s.push_str(&format!("(ConstEdge (T {e}))\n"));
            let role = match v as f32 {
                std::f32::consts::LOG2_E => Some("log2e"),
                -1.0 => Some("minus-one"),
                _ => None,
            };
            if let Some(role) = role {
                s.push_str(&format!("(ConstIs (T {e}) \"{role}\")\n"));
            }
        }
    }
    for &e in &enc.bcast_edges {
        if live[e as usize] {
            s.push_str(&format!("(Bcast (T {e}))\n"));
        }
    }
    for &(e, n) in &enc.zero_strides {
        if live[e as usize] {
            s.push_str(&format!("(ZeroStride (T {e}) {n})\n"));
        }
    }
    for &e in &enc.last_reds {
        if live[e as usize] {
            s.push_str(&format!("(LastRed (T {e}))\n"));
        }
    }
    for &(e, raw) in &enc.widened {
        if live[e as usize] && live[raw as usize] {
            s.push_str(&format!("(Widened (T {e}) (T {raw}))\n"));
        }
    }
    s
}

fn egglog_err(what: &str, e: impl std::fmt::Display) -> String {
    format!("egglog ({what}): {e}")
}

/// Builds the e-graph of `enc` with the given rules loaded (not yet run).
pub fn seed(enc: &Encoding, rule_text: &str) -> Result<EGraph, String> {
    let mut eg = EGraph::default();
    eg.parse_and_run_program(Some("lang.egg".into()), LANG)
        .map_err(|e| egglog_err("lang", e))?;
    eg.parse_and_run_program(Some("rules".into()), rule_text)
        .map_err(|e| egglog_err("rules", e))?;
    eg.parse_and_run_program(Some("seed".into()), &seed_program(enc))
        .map_err(|e| egglog_err("seed", e))?;
    Ok(eg)
}

/// Runs `rulesets` one after the other, each until saturation or a limit; `on_step` is
/// called after every iteration with the stage name and the e-node count.
pub fn saturate(
    eg: &mut EGraph,
    rulesets: &[&str],
    limits: &Limits,
    on_step: &mut dyn FnMut(&str, usize),
) -> Result<Vec<StageReport>, String> {
    let start = Instant::now();
    let mut reports = vec![];
    for (si, stage) in rulesets.iter().enumerate() {
        let t0 = Instant::now();
        // Each stage may use its share of the time that is left.
        let share = limits.time.saturating_sub(start.elapsed()) / (rulesets.len() - si) as u32;
        let mut iterations = 0;
        let stopped = loop {
            if eg.num_tuples() >= limits.max_enodes {
                break StopReason::NodeLimit;
            }
            if t0.elapsed() >= share {
                break StopReason::TimeLimit;
            }
            if iterations >= limits.max_iterations {
                break StopReason::IterationLimit;
            }
            let out = eg
                .parse_and_run_program(None, &format!("(run {stage} 1)"))
                .map_err(|e| egglog_err(stage, e))?;
            iterations += 1;
            on_step(stage, eg.num_tuples());
            let updated = out.iter().any(|o| match o {
                CommandOutput::RunSchedule(r) => r.updated,
                _ => false,
            });
            if !updated {
                break StopReason::Saturated;
            }
        };
        reports.push(StageReport {
            name: stage.to_string(),
            iterations,
            enodes: eg.num_tuples(),
            stopped,
            elapsed: t0.elapsed(),
        });
    }
    Ok(reports)
}

/// The e-graph read back: e-classes of term nodes over class ids, and the class of each
/// term of the encoding.
#[derive(Clone, Debug)]
pub struct Classes {
    pub nodes: Vec<Vec<TNode>>,
    pub class_of_term: HashMap<TId, u32>,
    /// Shape and dtype of each class (`None` where no member is well-formed).
    pub info: Vec<Option<Info>>,
}

impl Classes {
    pub fn enode_count(&self) -> usize {
        self.nodes.iter().map(|c| c.len()).sum()
    }
}

/// Reads the e-graph back into [`Classes`].
pub fn read_classes(eg: &EGraph, enc: &Encoding, g: &GraphData) -> Result<Classes, String> {
    let ser = eg.serialize(SerializeConfig::default()).egraph;
    let mut class_idx: HashMap<String, u32> = HashMap::new();
    let mut nodes: Vec<Vec<TNode>> = vec![];
    let mut class_of_term = HashMap::new();
    let mut idx = |c: &str, nodes: &mut Vec<Vec<TNode>>| -> u32 {
        let next = class_idx.len() as u32;
        let i = *class_idx.entry(c.to_string()).or_insert(next);
        if i == next {
            nodes.push(vec![]);
        }
        i
    };
    for node in ser.nodes.values() {
        let ch: Vec<&egraph_serialize::Node> =
            node.children.iter().map(|c| &ser.nodes[c]).collect();
        let lit = |i: usize| -> Result<&str, String> {
            Ok(ch
                .get(i)
                .ok_or_else(|| format!("{} lacks child {i}", node.op))?
                .op
                .trim_matches('"'))
        };
        let int = |i: usize| -> Result<u32, String> {
            lit(i)?
                .parse::<u32>()
                .map_err(|_| format!("{}: child {i} is not an index", node.op))
        };
        let mut cls = |i: usize| -> Result<u32, String> {
            let c = ch
                .get(i)
                .ok_or_else(|| format!("{} lacks child {i}", node.op))?;
            Ok(idx(c.eclass.as_ref(), &mut nodes))
        };
        let bad = |what: &str| format!("unknown {what} in the e-graph");
        let t = match node.op.as_str() {
            "T" => {
                let term = int(0)?;
                let c = idx(node.eclass.as_ref(), &mut nodes);
                class_of_term.insert(term, c);
                continue;
            }
            "Op0" => TNode::Op0(int(0)?),
            "Op1" => TNode::Op1(int(0)?, cls(1)?),
            "Op2" => TNode::Op2(int(0)?, cls(1)?, cls(2)?),
            "Un" => TNode::Un(
                unary_named(lit(0)?).ok_or_else(|| bad("unary op"))?,
                cls(1)?,
            ),
            "Bin" => TNode::Bin(
                binary_named(lit(0)?).ok_or_else(|| bad("binary op"))?,
                cls(1)?,
                cls(2)?,
            ),
            "Red" => TNode::Red(
                reduce_named(lit(0)?).ok_or_else(|| bad("reduce op"))?,
                int(1)?,
                cls(2)?,
            ),
            "Cont" => TNode::Cont(cls(0)?),
            "Ed" => TNode::Ed(cls(0)?, int(1)?),
            "MatMul" => TNode::MatMul(cls(0)?, cls(1)?),
            head @ ("AttnV" | "OnlineAttnV" | "Flash" | "FlashNoMask") => {
                let c: Result<Vec<u32>, String> = (0..node.children.len()).map(&mut cls).collect();
                TNode::attention(head, &c?).ok_or_else(|| bad("attention term"))?
            }
            _ => continue, // primitives, fact relations
        };
        let c = idx(node.eclass.as_ref(), &mut nodes);
        nodes[c as usize].push(t);
    }
    // Shapes and dtypes: the seeded terms' are known; others follow from their members.
    let mut info: Vec<Option<Info>> = vec![None; nodes.len()];
    for (&t, &c) in &class_of_term {
        info[c as usize] = Some(enc.info[t as usize].clone());
    }
    loop {
        let mut changed = false;
        for c in 0..nodes.len() {
            if info[c].is_some() {
                continue;
            }
            for n in &nodes[c] {
                let child = |k: TId| info[k as usize].clone();
                if let Some(i) = enc.derive(n, &child, g) {
                    info[c] = Some(i);
                    changed = true;
                    break;
                }
            }
        }
        if !changed {
            break;
        }
    }
    Ok(Classes {
        nodes,
        class_of_term,
        info,
    })
}

/// How the cost model weighs work: an estimate of seconds on a CPU-like device, relative.
#[derive(Clone, Copy, Debug)]
pub struct CostWeights {
    /// Per element an elementwise op, copy or reduction reads or writes.
    pub per_element: f64,
    /// Per multiply-add of a product.
    pub per_mac: f64,
    /// Per kernel-sized node (launch, a pass over memory).
    pub per_node: f64,
}

impl CostWeights {
    pub const DEFAULT: CostWeights = CostWeights {
        per_element: 1.0,
        per_mac: 1.0 / 16.0,
        per_node: 64.0,
    };
    /// Arithmetic counts more than memory (a compute-bound device).
    pub const COMPUTE_BOUND: CostWeights = CostWeights {
        per_element: 0.25,
        per_mac: 1.0,
        per_node: 16.0,
    };
}

fn numel(shape: &[luminal::Expression], dims: &HashMap<String, i64>) -> f64 {
    shape
        .iter()
        .map(|d| {
            d.eval_with(&|n| dims.get(n).copied())
                .map_or(1024.0, |v| v.max(0) as f64)
        })
        .product()
}

/// The cost of one e-node alone (children excluded).
pub fn node_cost(
    n: &TNode,
    info: &dyn Fn(u32) -> Option<Info>,
    out: &Info,
    w: &CostWeights,
    dims: &HashMap<String, i64>,
) -> f64 {
    let elems = numel(&out.shape, dims);
    match *n {
        TNode::Op0(_) | TNode::Ed(..) => 1e-3,
        TNode::Red(_, _, a) => {
            w.per_node + w.per_element * (elems + info(a).map_or(elems, |i| numel(&i.shape, dims)))
        }
        TNode::MatMul(a, _) => {
            let k = info(a).map_or(1.0, |i| numel(&i.shape[1..], dims));
            w.per_node + w.per_element * elems + w.per_mac * elems * k
        }
        // Their primop forms: the product with the values, and about four passes over the
        // scores (max, exp, sum; the online form twice over half the keys, plus a merge).
        TNode::AttnV(x, _) | TNode::OnlineAttnV(x, _) => {
            let scores = info(x).map_or(elems, |i| numel(&i.shape, dims));
            let t = info(x).map_or(1.0, |i| numel(&i.shape[i.shape.len() - 1..], dims));
            let passes = if matches!(n, TNode::AttnV(..)) {
                4.0
            } else {
                4.5
            };
            6.0 * w.per_node + w.per_element * passes * scores + w.per_mac * elems * t
        }
        // One kernel: both products, no scores in memory.
        TNode::Flash(q, ..) | TNode::FlashNoMask(q, ..) => {
            let qk = info(q).map_or(elems, |i| numel(&i.shape, dims));
            w.per_node + w.per_element * elems + 2.0 * w.per_mac * qk
        }
        _ => w.per_node + w.per_element * elems,
    }
}

/// The cheapest term of every root under the cost model (tree cost: shared children
/// counted once per use), as a DAG whose roots are the encoding's roots.
pub fn extract(
    classes: &Classes,
    enc: &Encoding,
    g: &GraphData,
    w: &CostWeights,
    dims: &HashMap<String, i64>,
) -> Result<TermDag, String> {
    let n = classes.nodes.len();
    let mut best: Vec<Option<(f64, usize)>> = vec![None; n];
    let info = |c: u32| classes.info[c as usize].clone();
    // Relax until nothing improves (Bellman-Ford over the e-graph; costs are positive, so
    // the chosen terms are acyclic).
    loop {
        let mut changed = false;
        for c in 0..n {
            let Some(out) = &classes.info[c] else {
                continue;
            };
            for (k, node) in classes.nodes[c].iter().enumerate() {
                let mut total = node_cost(node, &info, out, w, dims);
                let mut ok = enc.derive(node, &info, g).is_some();
                for ch in node.children() {
                    match best[ch as usize] {
                        Some((cost, _)) => total += cost,
                        None => ok = false,
                    }
                }
                if ok && best[c].is_none_or(|(b, _)| total < b * (1.0 - 1e-12)) {
                    best[c] = Some((total, k));
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    // Build the chosen terms bottom-up (explicit stack: graphs can be thousands deep).
    let mut dag = TermDag::default();
    let mut built: HashMap<u32, TId> = HashMap::new();
    for &(node, term) in &enc.dag.roots {
        let root = *classes
            .class_of_term
            .get(&term)
            .ok_or("a root has no e-class")?;
        let mut stack = vec![(root, false)];
        while let Some((c, expanded)) = stack.pop() {
            if built.contains_key(&c) {
                continue;
            }
            let (_, k) = best[c as usize].ok_or("an output has no well-formed term")?;
            let chosen = classes.nodes[c as usize][k];
            if !expanded {
                stack.push((c, true));
                for ch in chosen.children() {
                    if !built.contains_key(&ch) {
                        stack.push((ch, false));
                    }
                }
                continue;
            }
            let t = chosen.map_children(&|x: u32| built[&x]);
            let id = dag.add(t);
            built.insert(c, id);
        }
        dag.roots.push((node, built[&root]));
    }
    Ok(dag)
}

/// The cost of a whole term DAG (each term counted once).
pub fn dag_cost(
    dag: &TermDag,
    enc: &Encoding,
    g: &GraphData,
    w: &CostWeights,
    dims: &HashMap<String, i64>,
) -> f64 {
    let mut info: Vec<Option<Info>> = vec![];
    let mut total = 0.0;
    let live = dag.reachable();
    for (i, n) in dag.nodes.iter().enumerate() {
        let inf = {
            let child = |t: TId| info[t as usize].clone();
            enc.derive(n, &child, g)
        };
        if live[i] {
            if let Some(out) = &inf {
                let child = |t: u32| info[t as usize].clone();
                total += node_cost(n, &child, out, w, dims);
            }
        }
        info.push(inf);
    }
    total
}
