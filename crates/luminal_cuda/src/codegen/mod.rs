//! Graph to kernel source: one CUDA C kernel per primop node, one thread per output element
//! (reductions: one or, on a GPU, several threads per output, [`Kernel::cooperative`]).
//!
//! Each input is read through its edge's view: the `ShapeTracker`'s index and valid
//! expressions, rendered with [`Expression::to_c`], with `z` bound to the logical element.
//! Dynamic dims are renamed `lum_d0, lum_d1, …` (sorted by name) and read from a table of
//! `long long`s in device memory (a kernel parameter, with the kernel's offset in it), so one
//! source serves every binding and a captured CUDA graph replays with new values.
//! The same source is compiled by NVRTC on a GPU ([`crate::device`]) and by the host C
//! compiler in the emulator ([`crate::host`]); only the prelude differs.

pub mod prelude;

use luminal::graph::{Edge, GraphData, Node, NodeId};
use luminal::op::{BinaryOp, ConstValue, Op, ReduceOp, UnaryOp};
use luminal::{DType, Expression, ShapeTracker};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

/// Threads per block of every launch (1-D grids of `ceil(n / BLOCK)` blocks).
pub const BLOCK: u32 = 256;

/// A generated kernel. Its parameters are, in order: the output buffer, one buffer per input
/// edge, the error buffer (two `int`s) when `error_flag` is set, the plan's dims table
/// (`long long`s) when `dims` is not empty, then the scalars `lum_n` (the thread count; a
/// cooperative reduction's output count, followed by its threads per output `lum_t`) and,
/// with dims, `lum_do`: where the kernel's dims start in the table (their values in `dims`
/// order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// The C function name (a hash of the body: equal sources have equal names).
    pub name: String,
    /// The kernel's source without the prelude; the key of every compile cache.
    pub source: String,
    /// C pointer types of the buffer parameters (output first).
    pub buffer_types: Vec<&'static str>,
    /// Whether the kernel reports an out-of-range index in an extra `int[2]` buffer.
    pub error_flag: bool,
    /// Dynamic dims passed at launch, in parameter order.
    pub dims: Vec<String>,
    /// A reduction that may run several threads per output: it takes the threads per output
    /// `lum_t` as a scalar right after `lum_n` (the output count), and its grid covers
    /// `lum_n · lum_t` threads in blocks of `max(lum_t, BLOCK)`: under NVRTC `lum_t` lanes fold
    /// each output's row; the host emulator's branch ignores `lum_t` (it is 1 there).
    pub cooperative: bool,
    /// A hand-written kernel's own scalar parameters (`long long`s after the buffers; no
    /// error buffer, dims table or thread count): their number ([`skinny_kernel`]).
    pub scalars: Option<usize>,
}

/// The full source NVRTC compiles for `kernels` (one module).
pub fn cuda_source<'a>(kernels: impl IntoIterator<Item = &'a Kernel>) -> String {
    // NVRTC defines `__CUDACC__`, which makes the shape prelude's helpers device functions;
    // defined here too in case a version does not.
    let mut s = String::from("#ifndef __CUDACC__\n#define __CUDACC__\n#endif\n");
    s.push_str(prelude::CUDA_PRELUDE);
    s.push_str(luminal::shape::C_PRELUDE);
    s.push_str(prelude::COMMON_PRELUDE);
    s.push_str(prelude::QUANT_PRELUDE);
    for k in kernels {
        s.push_str(&k.source);
    }
    s
}

/// The NVRTC architecture for a device's compute capability (`(9, 0)` → `compute_90`).
pub fn nvrtc_arch(compute_capability: (i32, i32)) -> String {
    format!("compute_{}{}", compute_capability.0, compute_capability.1)
}

/// The C type of a buffer of `dtype` (block-quantized data: its raw bytes).
pub fn c_type(dtype: DType) -> Result<&'static str, String> {
    Ok(match dtype {
        DType::F32 => "float",
        DType::F16 | DType::BF16 => "unsigned short",
        DType::I32 => "int",
        DType::Bool => "unsigned char",
        q if q.is_quantized() => "unsigned char",
        q => return Err(format!("{q} data is not supported yet")),
    })
}

/// How a value is held while computing: floats as `float`, i32 and bool as `int`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Val {
    Float,
    Int,
}

fn val_kind(dtype: DType) -> Val {
    if dtype.is_float() || dtype.is_quantized() {
        Val::Float
    } else {
        Val::Int
    }
}

fn val_type(v: Val) -> &'static str {
    match v {
        Val::Float => "float",
        Val::Int => "int",
    }
}

/// `buf[idx]` of `dtype` as a computing value (a quantized buffer's element `idx`
/// dequantized from its block by the prelude's `lum_deq_<type>`).
fn load(dtype: DType, buf: &str, idx: &str) -> String {
    match dtype {
        q if q.is_quantized() => format!("lum_deq_{}({buf}, {idx})", q.name()),
        DType::F16 => format!("lum_f16_to_f32({buf}[{idx}])"),
        DType::BF16 => format!("lum_bf16_to_f32({buf}[{idx}])"),
        DType::Bool => format!("(int){buf}[{idx}]"),
        _ => format!("{buf}[{idx}]"),
    }
}

/// A value of kind `v` (any C arithmetic expression) rounded to `dtype` as the reference
/// rounds a result (floats to nearest, ints truncated and wrapped, bools `!= 0`).
fn store(dtype: DType, v: Val, value: &str) -> String {
    match (dtype, v) {
        (DType::F32, _) => format!("(float)({value})"),
        (DType::F16, _) => format!("lum_f32_to_f16((float)({value}))"),
        (DType::BF16, _) => format!("lum_f32_to_bf16((float)({value}))"),
        (DType::I32, Val::Float) => format!("lum_f2i((double)({value}))"),
        (DType::I32, Val::Int) => format!("(int)(unsigned long long)({value})"),
        _ => format!("(unsigned char)(({value}) != 0)"),
    }
}

/// Renames dynamic dims to C parameters and renders expressions.
struct Dims {
    index: BTreeMap<String, usize>,
}

impl Dims {
    fn new(exprs: &[&Expression]) -> Dims {
        let names: BTreeSet<String> = exprs
            .iter()
            .flat_map(|e| e.variables())
            .filter(|v| v != "z")
            .collect();
        Dims {
            index: names.into_iter().enumerate().map(|(i, n)| (n, i)).collect(),
        }
    }
    fn c(&self, e: &Expression) -> String {
        e.substitute_all(&|name| {
            self.index
                .get(name)
                .map(|i| Expression::var(&format!("lum_d{i}")))
        })
        .to_c()
    }
    fn names(&self) -> Vec<String> {
        self.index.keys().cloned().collect()
    }
}

/// C statements that set `var` to logical element `z_expr` of input buffer `buf` read
/// through `view` (0 where the view pads).
fn read_view(
    dims: &Dims,
    view: &ShapeTracker,
    dtype: DType,
    buf: &str,
    var: &str,
    z_expr: &str,
) -> String {
    let valid = view.valid_expression();
    let index = dims.c(&view.index_expression());
    let value = load(dtype, buf, &index);
    let zero = match val_kind(dtype) {
        Val::Float => "0.0f",
        Val::Int => "0",
    };
    let body = match valid.as_constant() {
        Some(0) => format!("{var} = {zero};"),
        Some(_) => format!("{var} = {value};"),
        None => format!("{var} = ({}) ? {value} : {zero};", dims.c(&valid)),
    };
    format!("{{ const long long z = {z_expr}; (void)z; {body} }}")
}

/// Every expression the kernel of `node` renders (to collect its dynamic dims).
fn node_expressions(node: &Node) -> Vec<Expression> {
    let mut out = vec![];
    for d in &node.shape {
        out.push(d.clone());
    }
    for e in &node.inputs {
        out.push(e.view.index_expression());
        out.push(e.view.valid_expression());
        out.extend(e.view.dims());
    }
    match &node.op {
        Op::Iota { expr } => out.push(expr.clone()),
        Op::Constant {
            value: ConstValue::Expr(e),
        } => out.push(e.clone()),
        Op::WriteSlice { start, .. } => out.push(start.clone()),
        _ => {}
    }
    out
}

fn product(d: &[Expression]) -> Expression {
    d.iter().product()
}

/// A C float literal holding `v` exactly (through its bits, so inf and NaN survive).
fn float_bits(v: f32) -> String {
    format!("lum_u2f(0x{:08x}u)", v.to_bits())
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// A computed value of `dtype` (kind `v`) as the next node reads it back from a buffer of
/// `dtype`: rounded as [`store`] rounds it, in the computing kind of `dtype`.
fn reload(dtype: DType, v: Val, value: &str) -> String {
    let s = store(dtype, v, value);
    match dtype {
        DType::F16 => format!("lum_f16_to_f32({s})"),
        DType::BF16 => format!("lum_bf16_to_f32({s})"),
        DType::Bool => format!("(int){s}"),
        _ => s,
    }
}

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

/// Writes one kernel: the root node's code, with fused producers computed in place.
struct Gen<'a> {
    graph: Option<&'a GraphData>,
    fused: &'a HashSet<NodeId>,
    dims: Dims,
    /// The buffer parameters after the output: the node each reads, and its dtype.
    params: Vec<(NodeId, DType)>,
    next: usize,
}

impl Gen<'_> {
    fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("lum_{prefix}{}", self.next)
    }

    /// A declaration of `var` in the computing kind of `dtype`.
    fn decl(dtype: DType, var: &str) -> String {
        format!("{} {var};", val_type(val_kind(dtype)))
    }

    /// C statements that set `var` (declared in the kind of `dtype`) to logical element
    /// `z_expr` (a C expression that does not mention `z`) of edge `e`, whose node has
    /// `dtype`: loaded from the node's buffer, or computed here when the node is fused.
    fn read_edge(&mut self, e: &Edge, dtype: DType, var: &str, z_expr: &str) -> String {
        if !self.fused.contains(&e.node) {
            let buf = format!("in{}", self.params.len());
            self.params.push((e.node, dtype));
            return read_view(&self.dims, &e.view, dtype, &buf, var, z_expr);
        }
        let graph = self.graph.expect("fused nodes come with their graph");
        let node = graph.node(e.node);
        let p = self.fresh("p");
        let index = self.dims.c(&e.view.index_expression());
        let inner = self.value(node, &p, var);
        let zero = match val_kind(dtype) {
            Val::Float => "0.0f",
            Val::Int => "0",
        };
        let valid = e.view.valid_expression();
        let body = match valid.as_constant() {
            Some(0) => format!("{var} = {zero};"),
            Some(_) => format!("const long long {p} = {index};\n{inner}"),
            None => format!(
                "if ({}) {{\nconst long long {p} = {index};\n{inner}\n}} else {{ {var} = {zero}; }}",
                self.dims.c(&valid)
            ),
        };
        format!("{{ const long long z = {z_expr}; (void)z;\n{body}\n}}")
    }

    /// C statements that set `var` to element `idx` (a variable) of fused `node`, rounded to
    /// the node's dtype as its buffer would hold it.
    fn value(&mut self, node: &Node, idx: &str, var: &str) -> String {
        let graph = self.graph.expect("fused nodes come with their graph");
        let dtypes: Vec<DType> = node
            .inputs
            .iter()
            .map(|e| graph.node(e.node).dtype)
            .collect();
        let (stmts, expr, kind) = self.compute(node, &dtypes, idx);
        format!(
            "{{ const long long z = {idx}; (void)z;\n{stmts}\n{var} = {};\n}}",
            reload(node.dtype, kind, &expr)
        )
    }

    /// Statements and the value expression (and its kind) of elementwise `node` at element
    /// `idx`; `z` is `idx` where the expression is evaluated.
    fn compute(&mut self, node: &Node, dtypes: &[DType], idx: &str) -> (String, String, Val) {
        let od = node.dtype;
        let mut stmts = String::new();
        let mut arg = |g: &mut Self, i: usize| {
            let v = g.fresh("v");
            let _ = writeln!(stmts, "{}", Self::decl(dtypes[i], &v));
            let r = g.read_edge(&node.inputs[i], dtypes[i], &v, idx);
            let _ = writeln!(stmts, "{r}");
            v
        };
        let (expr, kind) = match &node.op {
            Op::Constant { value } => {
                let v = match value {
                    ConstValue::Float(v) => match od {
                        DType::I32 | DType::Bool => format!("{}", od.round(*v) as i64),
                        _ => float_bits(od.round(*v) as f32),
                    },
                    ConstValue::Expr(e) => format!("(double)({})", self.dims.c(e)),
                };
                let kind = match value {
                    ConstValue::Float(_) if !od.is_float() => Val::Int,
                    _ => Val::Float,
                };
                (v, kind)
            }
            Op::Iota { expr } => (
                format!("(long long)({})", self.dims.c(expr)),
                if od.is_float() { Val::Float } else { Val::Int },
            ),
            Op::Unary(u) => {
                let a = arg(self, 0);
                let x = format!("(float){a}");
                let f = match u {
                    UnaryOp::Log2 => format!("log2f({x})"),
                    UnaryOp::Exp2 => format!("exp2f({x})"),
                    UnaryOp::Sin => format!("sinf({x})"),
                    UnaryOp::Sqrt => format!("sqrtf({x})"),
                    UnaryOp::Recip => format!("1.0f / {x}"),
                };
                (f, Val::Float)
            }
            Op::Binary(b) => {
                let a = arg(self, 0);
                let bb = arg(self, 1);
                let (a, b2) = (a.as_str(), bb.as_str());
                match (b, dtypes[0]) {
                    (BinaryOp::LessThan, _) => (format!("({a} < {b2})"), Val::Int),
                    (BinaryOp::Add, DType::I32) => {
                        (format!("(int)((unsigned){a} + (unsigned){b2})"), Val::Int)
                    }
                    (BinaryOp::Mul, DType::I32) => {
                        (format!("(int)((unsigned){a} * (unsigned){b2})"), Val::Int)
                    }
                    // x % 0 is 0 for ints (numpy); INT_MIN % -1 would trap in C (its value is 0).
                    (BinaryOp::Mod, DType::I32) => (
                        format!("(({b2} == 0 || {b2} == -1) ? 0 : {a} % {b2})"),
                        Val::Int,
                    ),
                    (BinaryOp::Add, DType::Bool) => (format!("({a} | {b2})"), Val::Int),
                    (BinaryOp::Mul, DType::Bool) => (format!("({a} & {b2})"), Val::Int),
                    // The reference takes fmod on the 0/1 values: x % 0 is NaN, which is true.
                    (BinaryOp::Mod, DType::Bool) => {
                        (format!("({b2} == 0 ? 1 : {a} % {b2})"), Val::Int)
                    }
                    (BinaryOp::Add, _) => (format!("{a} + {b2}"), Val::Float),
                    // Rounded on its own (never contracted with a fused add into an FMA), as
                    // the unfused kernels' stored products are.
                    (BinaryOp::Mul, _) => (format!("lum_mul({a}, {b2})"), Val::Float),
                    (BinaryOp::Mod, _) => (format!("fmodf({a}, {b2})"), Val::Float),
                }
            }
            Op::Contiguous | Op::Cast(_) => {
                let a = arg(self, 0);
                (a, val_kind(dtypes[0]))
            }
            other => unreachable!("{} is not elementwise", other.name()),
        };
        (stmts, expr, kind)
    }
}

/// The nodes whose code `root`'s kernel holds: `root` and the fused nodes it reads,
/// transitively.
fn group<'a>(
    graph: Option<&'a GraphData>,
    root: &'a Node,
    fused: &HashSet<NodeId>,
) -> Vec<&'a Node> {
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        for e in &out[i].inputs {
            if fused.contains(&e.node) {
                out.push(
                    graph
                        .expect("fused nodes come with their graph")
                        .node(e.node),
                );
            }
        }
        i += 1;
    }
    out
}

/// Generates the kernel of one node (`None` for `Input`, which holds uploaded data).
/// `input_dtypes[i]` is the dtype of input edge `i`'s node. One buffer parameter per edge.
pub fn generate(node: &Node, input_dtypes: &[DType]) -> Result<Option<Kernel>, String> {
    Ok(generate_fused(None, node, input_dtypes, &HashSet::new())?.map(|(k, _)| k))
}

/// Generates the kernel of `node` with the nodes in `fused` that it reads (transitively)
/// computed in place ([`fused_nodes`]; `graph` is needed when that set is not empty), and the
/// nodes its buffer parameters read, in order (one per edge read from a buffer).
pub fn generate_fused(
    graph: Option<&GraphData>,
    node: &Node,
    input_dtypes: &[DType],
    fused: &HashSet<NodeId>,
) -> Result<Option<Generated>, String> {
    generate_node(graph, node, input_dtypes, fused, false)
}

/// [`generate_fused`]; `in_place`: a `WriteSlice` whose output buffer is its destination's
/// (the state input's buffer, [`write_in_place`]): one thread per written element, storing
/// only the slice (the destination is not a parameter; `lum_n` is the source's count).
fn generate_node(
    graph: Option<&GraphData>,
    node: &Node,
    input_dtypes: &[DType],
    fused: &HashSet<NodeId>,
    in_place: bool,
) -> Result<Option<Generated>, String> {
    if matches!(node.op, Op::Input { .. }) {
        return Ok(None);
    }
    let members = group(graph, node, fused);
    let exprs: Vec<Expression> = members.iter().flat_map(|n| node_expressions(n)).collect();
    let mut g = Gen {
        graph,
        fused,
        dims: Dims::new(&exprs.iter().collect::<Vec<_>>()),
        params: vec![],
        next: 0,
    };
    let out_t = c_type(node.dtype)?;
    for n in &members[1..] {
        c_type(n.dtype)?;
    }
    let od = node.dtype;
    let mut body = String::new();
    let mut error_flag = false;
    let mut cooperative = false;
    let decl = |i: usize, var: &str| Gen::decl(input_dtypes[i], var);
    let kind = match &node.op {
        Op::Input { .. } => unreachable!(),
        Op::Constant { .. }
        | Op::Iota { .. }
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Contiguous
        | Op::Cast(_) => {
            let (stmts, expr, kind) = g.compute(node, input_dtypes, "lum_i");
            let _ = writeln!(
                body,
                "    const long long z = lum_i; (void)z;\n{stmts}\n    out[lum_i] = {};",
                store(od, kind, &expr)
            );
            match &node.op {
                Op::Constant { .. } => "const",
                Op::Iota { .. } => "iota",
                Op::Unary(_) => "unary",
                Op::Binary(_) => "binary",
                _ => "copy",
            }
        }
        Op::Reduce { op, axis } => {
            let in_dims = node.inputs[0].view.dims();
            let len = g.dims.c(&in_dims[*axis]);
            let inner = g.dims.c(&product(&in_dims[axis + 1..]));
            let in_kind = val_kind(input_dtypes[0]);
            let (acc_t, ident) = match (op, in_kind) {
                (ReduceOp::Sum, Val::Float) => ("double", "0.0".to_string()),
                (ReduceOp::Sum, Val::Int) => ("long long", "0".to_string()),
                (ReduceOp::Max, Val::Float) => ("double", "-(double)LUM_INF".to_string()),
                (ReduceOp::Max, Val::Int) => (
                    "long long",
                    if input_dtypes[0] == DType::Bool {
                        "0".to_string()
                    } else {
                        "-2147483648LL".to_string()
                    },
                ),
            };
            let combine = match (op, in_kind) {
                (ReduceOp::Sum, _) => "lum_acc += a;",
                // NaN propagates (like PyTorch): NaN + anything is NaN.
                (ReduceOp::Max, Val::Float) => {
                    "lum_acc = (lum_acc != lum_acc || a != a) ? lum_acc + a : (a > lum_acc ? a : lum_acc);"
                }
                (ReduceOp::Max, Val::Int) => "if (a > lum_acc) lum_acc = a;",
            };
            let read = g.read_edge(
                &node.inputs[0],
                input_dtypes[0],
                "a",
                "(lum_outer * lum_len + lum_k) * lum_inner + lum_rest",
            );
            body.push_str(&reduce_body(ReduceParts {
                len: &len,
                inner: &inner,
                acc_t,
                ident: &ident,
                combine,
                decl: &decl(0, "a"),
                read: &read,
                store: &store(od, in_kind, "lum_acc"),
            }));
            cooperative = true;
            "reduce"
        }
        Op::Gather => {
            let tdims = node.inputs[0].view.dims();
            error_flag = true;
            // Parameters in edge order: the table's reads first.
            let read_t = g.read_edge(
                &node.inputs[0],
                input_dtypes[0],
                "a",
                "lum_id * lum_width + lum_w",
            );
            let read_ix = g.read_edge(&node.inputs[1], input_dtypes[1], "ix", "lum_s");
            let _ = writeln!(
                body,
                "    const long long lum_rows = {}, lum_width = lum_max({}, 1);\n    const long long lum_s = lum_i / lum_width, lum_w = lum_i % lum_width;\n    {}\n    {read_ix}\n    const long long lum_id = (long long)ix;\n    if (lum_id < 0 || lum_id >= lum_rows) {{ lum_err[0] = 1; lum_err[1] = (int)lum_id; out[lum_i] = 0; return; }}\n    {}\n    {read_t}\n    out[lum_i] = {};",
                g.dims.c(&tdims[0]),
                g.dims.c(&tdims[1]),
                decl(1, "ix"),
                decl(0, "a"),
                store(od, val_kind(input_dtypes[0]), "a")
            );
            "gather"
        }
        Op::WriteSlice { axis, start } if in_place => {
            let src_dims = node.inputs[1].view.dims();
            // Source element `lum_i` is (outer, a, rest) over [.., len, inner]; it lands at
            // `(outer·size + start + a)·inner + rest` of the destination.
            let read_src = g.read_edge(&node.inputs[1], input_dtypes[1], "a", "lum_i");
            let _ = writeln!(
                body,
                "    const long long lum_len = {}, lum_size = {}, lum_start = {};\n    const long long lum_inner = lum_max({}, 1);\n    const long long lum_a = (lum_i / lum_inner) % lum_max(lum_len, 1);\n    const long long lum_outer = lum_i / (lum_inner * lum_max(lum_len, 1)), lum_rest = lum_i % lum_inner;\n    {}\n    {read_src}\n    out[(lum_outer * lum_size + lum_start + lum_a) * lum_inner + lum_rest] = {};",
                g.dims.c(&src_dims[*axis]),
                g.dims.c(&node.shape[*axis]),
                g.dims.c(start),
                g.dims.c(&product(&src_dims[axis + 1..])),
                decl(1, "a"),
                store(od, val_kind(input_dtypes[1]), "a")
            );
            "write_in_place"
        }
        Op::WriteSlice { axis, start } => {
            let src_dims = node.inputs[1].view.dims();
            let read_dst = g.read_edge(&node.inputs[0], input_dtypes[0], "a", "lum_i");
            let read_src = g.read_edge(
                &node.inputs[1],
                input_dtypes[1],
                "a",
                "(lum_outer * lum_len + (lum_a - lum_start)) * lum_inner + lum_rest",
            );
            let _ = writeln!(
                body,
                "    const long long lum_len = {}, lum_size = {}, lum_start = {};\n    const long long lum_inner = lum_max({}, 1);\n    const long long lum_a = (lum_i / lum_inner) % lum_max(lum_size, 1);\n    const long long lum_outer = lum_i / (lum_inner * lum_max(lum_size, 1)), lum_rest = lum_i % lum_inner;\n    {}\n    if (lum_a >= lum_start && lum_a < lum_start + lum_len) {{\n        {read_src}\n    }} else {{\n        {read_dst}\n    }}\n    out[lum_i] = {};",
                g.dims.c(&src_dims[*axis]),
                g.dims.c(&node.shape[*axis]),
                g.dims.c(start),
                g.dims.c(&product(&src_dims[axis + 1..])),
                decl(0, "a"),
                store(od, val_kind(input_dtypes[0]), "a")
            );
            "write_slice"
        }
    };
    let mut buffer_types = vec![out_t];
    let mut params = format!("{out_t}* __restrict__ out");
    for (i, (_, d)) in g.params.iter().enumerate() {
        let t = c_type(*d)?;
        buffer_types.push(t);
        let _ = write!(params, ", const {t}* __restrict__ in{i}");
    }
    if error_flag {
        params.push_str(", int* lum_err");
    }
    let ndims = g.dims.index.len();
    let mut read_dims = String::new();
    if ndims > 0 {
        // The dims' values live in device memory (the plan's dims table, written before each
        // run), so a captured CUDA graph replays with new values.
        params.push_str(", const long long* __restrict__ lum_dv");
        for i in 0..ndims {
            let _ = writeln!(
                read_dims,
                "    const long long lum_d{i} = lum_dv[lum_do + {i}];"
            );
        }
    }
    // The thread count: a parameter, or, for a kernel with dims (whose count may change with
    // them), the table entry after its dims, so that a replayed graph launches a grid sized
    // for a bound (the plan rounds it up) and the kernel stops at this run's count.
    let mut read_n = String::new();
    if ndims > 0 {
        let _ = writeln!(
            read_n,
            "    const long long lum_n = lum_dv[lum_do + {ndims}];"
        );
    } else {
        params.push_str(", long long lum_n");
    }
    if cooperative {
        params.push_str(", long long lum_t");
    }
    if ndims > 0 {
        params.push_str(", long long lum_do");
    }
    let text = if cooperative {
        // The body computes its own thread indices (several threads per output on a GPU).
        format!(
            "LUM_EXTERN_C __global__ void LUM_REDUCE_BOUNDS KERNEL({params}) {{\n{read_n}{read_dims}{body}}}\n"
        )
    } else {
        format!(
            "LUM_EXTERN_C __global__ void KERNEL({params}) {{\n{read_n}    const long long lum_i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n    if (lum_i >= lum_n) return;\n{read_dims}{body}}}\n"
        )
    };
    let kind = if members.len() > 1 {
        format!("fused{}_{kind}", members.len())
    } else {
        kind.to_string()
    };
    let name = format!("lum_{kind}_{:016x}", fnv1a(&text));
    Ok(Some((
        Kernel {
            source: text.replace("KERNEL", &name),
            name,
            buffer_types,
            error_flag,
            dims: g.dims.names(),
            cooperative,
            scalars: None,
        },
        g.params.iter().map(|p| p.0).collect(),
    )))
}

/// The `WriteSlice` nodes of `order` that write into their destination's buffer in place
/// (the KV cache: no copy of the whole state per run): the destination is an `Input` read
/// by nothing else, through a contiguous view of the same shape and dtype. The plan moves
/// the input's buffer to the node for the run and back after it (after a run both hold the
/// updated tensor, so reading either output reads that buffer).
pub fn write_in_place(graph: &GraphData, order: &[NodeId]) -> HashSet<NodeId> {
    let mut uses: HashMap<NodeId, usize> = HashMap::new();
    for &id in order {
        for e in &graph.node(id).inputs {
            *uses.entry(e.node).or_default() += 1;
        }
    }
    order
        .iter()
        .copied()
        .filter(|&id| {
            let node = graph.node(id);
            let Op::WriteSlice { .. } = node.op else {
                return false;
            };
            let dest = &node.inputs[0];
            let d = graph.node(dest.node);
            matches!(d.op, Op::Input { .. })
                && uses.get(&dest.node) == Some(&1)
                && d.dtype == node.dtype
                && !node.dtype.is_quantized()
                && dest.view.is_contiguous()
                && dest.view.dims() == node.shape
                && d.shape == node.shape
        })
        .collect()
}

/// The kernel that rounds `lum_n` f32 values to `dtype` (f16 or bf16): an f32 operand of a
/// product that cuBLAS multiplies with a half weight ([`crate::gemm::Pattern::round`]).
/// Parameters: the output, the f32 input, `lum_n`.
pub fn round_kernel(dtype: DType) -> Kernel {
    let out_t = c_type(dtype).expect("a half type");
    let text = format!(
        "LUM_EXTERN_C __global__ void KERNEL({out_t}* __restrict__ out, const float* __restrict__ in0, long long lum_n) {{\n    const long long lum_i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n    if (lum_i >= lum_n) return;\n    out[lum_i] = {};\n}}\n",
        store(dtype, Val::Float, "in0[lum_i]")
    );
    let name = format!("lum_round_{}_{:016x}", dtype.name(), fnv1a(&text));
    Kernel {
        source: text.replace("KERNEL", &name),
        name,
        buffer_types: vec![out_t, "float"],
        error_flag: false,
        dims: vec![],
        cooperative: false,
        scalars: None,
    }
}

/// Warps (output columns) per block of a [`skinny_kernel`] launch.
pub const SKINNY_WARPS: u32 = 8;

/// Products one [`skinny_kernel`] launch computes (over the same activations).
pub const SKINNY_GROUPS: usize = 3;

/// Products with few activation rows (a decode step's linear layers), up to
/// [`SKINNY_GROUPS`] of them over the same activations in one launch (a layer's q, k and v
/// projections; gate and up). Each is cuBLAS's column-major `C = op(A)·B` with `A` read
/// transposed (`A[i, k]` at `oa + i·lda + k`: a `[N, K]` weight, `K` contiguous) and `B` not
/// (`B[k, j]` at `ob + j·ldb + k`: `M` activation rows), `C[i, j]` at `oc + i + j·ldc` —
/// what [`crate::gemm::GemmCall`] describes. One warp per output column `i` (a weight row,
/// the products' rows one after another): its lanes stream the row in 16-byte pieces (8
/// elements) where every offset and stride allows it, else element by element, multiply with
/// each of the `M ≤ 8` activation rows (staged once per block in shared memory when `M·K ≤
/// 8192`, else read from cache; f32 activations rounded to `round` first, as cuBLAS reads
/// them rounded into a scratch buffer, so no rounding launch),
/// accumulate in f32 and combine the lanes by `__shfl_xor_sync`. Types: `w`, `x` (the
/// buffers' f32/f16/bf16), `c`. Parameters: `out0, out1, out2, w0, w1, w2, x`, then the
/// scalars `M, K, ldb, ob` and per product `N, lda, ldc, oa, oc` (`N = 0` for an unused
/// slot); grid `ceil(ΣN / SKINNY_WARPS)` blocks of `32·SKINNY_WARPS` threads. The host
/// emulator's branch computes each column with one thread, summing in order.
pub fn skinny_kernel(w: DType, x: DType, round: Option<DType>, c: DType) -> Kernel {
    let ty = |d: DType| c_type(d).expect("a float type");
    let (wt, xt, ct) = (ty(w), ty(x), ty(c));
    // One element as f32: halves through the PTX conversions on a GPU (the prelude's
    // bit-exact software ones in C).
    let widen = |d: DType, v: &str| match d {
        DType::F16 => format!("lum_sk_h2f({v})"),
        DType::BF16 => format!("lum_bf16_to_f32({v})"),
        _ => v.to_string(),
    };
    let rounded = |v: String| match round {
        Some(DType::F16) => format!("lum_sk_round_f16({v})"),
        Some(DType::BF16) => format!("lum_sk_round_bf16({v})"),
        _ => v,
    };
    let (wn, xn) = (w.name(), x.name());
    let wv = widen(w, "wr[lum_e]");
    let xv = rounded(widen(x, "xr[lum_e]"));
    let xq = rounded("lum_x[lum_q]".to_string());
    let store_c = store(c, Val::Float, "lum_acc[lum_j]");
    let text = format!(
        r#"{SKINNY_HELPERS}LUM_EXTERN_C __global__ void KERNEL({ct}* out0, {ct}* out1, {ct}* out2, const {wt}* __restrict__ w0, const {wt}* __restrict__ w1, const {wt}* __restrict__ w2, const {xt}* __restrict__ x, long long lum_m, long long lum_k, long long lum_ldb, long long lum_ob, long long lum_rows0, long long lum_lda0, long long lum_ldc0, long long lum_oa0, long long lum_oc0, long long lum_rows1, long long lum_lda1, long long lum_ldc1, long long lum_oa1, long long lum_oc1, long long lum_rows2, long long lum_lda2, long long lum_ldc2, long long lum_oa2, long long lum_oc2) {{
    const long long lum_g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int lum_lane = (int)(lum_g & 31);
    /* The warp's product and row. */
    long long lum_row = lum_g >> 5, lum_rows = lum_rows0, lum_lda = lum_lda0, lum_ldc = lum_ldc0, lum_oa = lum_oa0, lum_oc = lum_oc0;
    {ct}* out = out0;
    const {wt}* w = w0;
    if (lum_row >= lum_rows0) {{
        lum_row -= lum_rows0;
        lum_rows = lum_rows1; lum_lda = lum_lda1; lum_ldc = lum_ldc1; lum_oa = lum_oa1; lum_oc = lum_oc1; out = out1; w = w1;
        if (lum_row >= lum_rows1) {{
            lum_row -= lum_rows1;
            lum_rows = lum_rows2; lum_lda = lum_lda2; lum_ldc = lum_ldc2; lum_oa = lum_oa2; lum_oc = lum_oc2; out = out2; w = w2;
        }}
    }}
    const int lum_live = lum_row < lum_rows;
    float lum_acc[8] = {{0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}};
#ifdef __CUDACC_RTC__
    /* The activations, rounded once per block into shared memory when they fit (every
       thread of the block takes part: no early return before the barrier). */
    __shared__ float4 lum_xs4[LUM_SK_STAGE / 4];
    float* lum_xs = (float*)lum_xs4;
    const int lum_stage = ((lum_k | lum_ldb | lum_ob) & 7) == 0 && lum_m * lum_k <= LUM_SK_STAGE;
    if (lum_stage) {{
        for (long long lum_i = threadIdx.x; lum_i < lum_m * lum_k; lum_i += blockDim.x) {{
            const long long lum_e = lum_i % lum_k;
            const {xt}* xr = x + lum_ob + (lum_i / lum_k) * lum_ldb;
            lum_xs[lum_i] = {xv};
        }}
        __syncthreads();
    }}
    const {wt}* wr = w + lum_oa + (lum_live ? lum_row : 0) * lum_lda;
    const long long lum_end = lum_live ? lum_k : 0;
    if (lum_stage && ((lum_lda | lum_oa) & 7) == 0) {{
        /* Lane l: elements [8c, 8c + 8) for c = l, l + 32, ... (16 bytes of halves a load),
           four pieces' loads issued before any is used (64 bytes in flight a lane). */
        for (long long lum_k0 = 8 * lum_lane; lum_k0 < lum_end; lum_k0 += 1024) {{
            unsigned lum_r[4][LUM_SK_RAW_{wn}];
#pragma unroll
            for (int lum_u = 0; lum_u < 4; ++lum_u)
                if (lum_k0 + 256 * lum_u < lum_end) lum_sk_raw_{wn}(wr + lum_k0 + 256 * lum_u, lum_r[lum_u]);
#pragma unroll
            for (int lum_u = 0; lum_u < 4; ++lum_u) {{
                if (lum_k0 + 256 * lum_u < lum_end) {{
                    float lum_w[8], lum_x[8];
                    lum_sk_cvt_{wn}(lum_r[lum_u], lum_w);
#pragma unroll
                    for (int lum_j = 0; lum_j < 8; ++lum_j) {{
                        if (lum_j < lum_m) {{
                            lum_sk_load8_f32(lum_xs + lum_j * lum_k + lum_k0 + 256 * lum_u, lum_x);
#pragma unroll
                            for (int lum_q = 0; lum_q < 8; ++lum_q) lum_acc[lum_j] += lum_w[lum_q] * lum_x[lum_q];
                        }}
                    }}
                }}
            }}
        }}
    }} else if (((lum_k | lum_lda | lum_ldb | lum_oa | lum_ob) & 7) == 0) {{
#pragma unroll 2
        for (long long lum_k0 = 8 * lum_lane; lum_k0 < lum_end; lum_k0 += 256) {{
            float lum_w[8], lum_x[8];
            lum_sk_load8_{wn}(wr + lum_k0, lum_w);
#pragma unroll
            for (int lum_j = 0; lum_j < 8; ++lum_j) {{
                if (lum_j < lum_m) {{
                    lum_sk_load8_{xn}(x + lum_ob + lum_j * lum_ldb + lum_k0, lum_x);
#pragma unroll
                    for (int lum_q = 0; lum_q < 8; ++lum_q) lum_acc[lum_j] += lum_w[lum_q] * {xq};
                }}
            }}
        }}
    }} else {{
        for (long long lum_e = lum_lane; lum_e < lum_end; lum_e += 32) {{
            const float lum_wv = {wv};
#pragma unroll
            for (int lum_j = 0; lum_j < 8; ++lum_j) {{
                if (lum_j < lum_m) {{
                    const {xt}* xr = x + lum_ob + lum_j * lum_ldb;
                    lum_acc[lum_j] += lum_wv * {xv};
                }}
            }}
        }}
    }}
    /* Every lane takes part in the butterflies (no early return). */
#pragma unroll
    for (int lum_j = 0; lum_j < 8; ++lum_j) {{
        if (lum_j < lum_m) {{
            for (int lum_o = 16; lum_o > 0; lum_o >>= 1) lum_acc[lum_j] += __shfl_xor_sync(0xffffffffu, lum_acc[lum_j], lum_o);
            if (lum_live && lum_lane == 0) out[lum_oc + lum_row + lum_j * lum_ldc] = {store_c};
        }}
    }}
#else
    /* One thread per column, summing in order. */
    if (!lum_live || lum_lane != 0) return;
    const {wt}* wr = w + lum_oa + lum_row * lum_lda;
    for (int lum_j = 0; lum_j < 8 && lum_j < lum_m; ++lum_j) {{
        const {xt}* xr = x + lum_ob + lum_j * lum_ldb;
        for (long long lum_e = 0; lum_e < lum_k; ++lum_e) lum_acc[lum_j] += {wv} * {xv};
        out[lum_oc + lum_row + lum_j * lum_ldc] = {store_c};
    }}
#endif
}}
"#
    );
    let name = format!(
        "lum_skinny_{}_{}_{}_{:016x}",
        w.name(),
        x.name(),
        c.name(),
        fnv1a(&text)
    );
    Kernel {
        source: text.replace("KERNEL", &name),
        name,
        buffer_types: vec![ct, ct, ct, wt, wt, wt, xt],
        error_flag: false,
        dims: vec![],
        cooperative: true,
        scalars: Some(4 + 5 * SKINNY_GROUPS),
    }
}

/// One kernel running up to three independent generated kernels (`members`: one thread per
/// element, not cooperative) side by side: each member's body becomes a device function of its
/// block index, and the kernel's blocks `[0, g0)` run the first, `[g0, g0 + g1)` the second,
/// the rest the third (a decode step's RoPE and two cache writes: one launch instead of
/// three). Parameters: every member's buffers (with its error buffer and dims table) in
/// order, then every member's scalars in order, then `g0` (and `g1`). `None` when a member
/// is not such a kernel.
pub fn combined_kernel(members: &[&Kernel]) -> Option<Kernel> {
    if !(2..=3).contains(&members.len()) {
        return None;
    }
    let mut devs = String::new();
    let (mut ptrs, mut scalars, mut calls) = (vec![], vec![], vec![]);
    let mut buffer_types = vec![];
    let mut n_scalars = 0;
    for (m, k) in members.iter().enumerate() {
        let head = format!("LUM_EXTERN_C __global__ void {}(", k.name);
        if k.cooperative || k.scalars.is_some() || !k.source.starts_with(&head) {
            return None;
        }
        let close = k.source.find(") {\n")?;
        let params: Vec<&str> = k.source[head.len()..close].split(", ").collect();
        let mut args = vec![];
        for (i, p) in params.iter().enumerate() {
            let (ty, _) = p.rsplit_once(' ')?;
            // The wrapper only forwards: no `restrict` promise across members (two may share
            // the dims table or the error flag).
            let ty = ty.replace(" __restrict__", "");
            let name = format!("lum_m{m}_{i}");
            if ty.contains('*') {
                ptrs.push(format!("{ty} {name}"));
            } else {
                scalars.push(format!("{ty} {name}"));
                n_scalars += 1;
            }
            args.push(name);
        }
        buffer_types.extend(&k.buffer_types);
        if k.error_flag {
            buffer_types.push("int");
        }
        if !k.dims.is_empty() {
            buffer_types.push("long long");
        }
        let dev = format!("{}_dev", k.name);
        if !devs.contains(&format!(" {dev}(")) {
            // Guarded: combined kernels sharing a member may share a module.
            let guard = format!("LUM_HAVE_{dev}");
            devs.push_str(&format!("#ifndef {guard}\n#define {guard}\n"));
            devs.push_str(
                &k.source
                    .replacen(&head, &format!("LUM_DEV void {dev}(unsigned lum_bx, "), 1)
                    .replace("blockIdx.x", "lum_bx"),
            );
            devs.push_str("#endif\n");
        }
        calls.push((dev, args));
    }
    let bounds: Vec<String> = (0..members.len() - 1)
        .map(|i| format!("lum_g{i}"))
        .collect();
    let mut body = String::from("    unsigned lum_b = blockIdx.x;\n");
    for (m, (dev, args)) in calls.iter().enumerate() {
        let call = format!("{dev}(lum_b, {});", args.join(", "));
        if m + 1 < calls.len() {
            body.push_str(&format!(
                "    if (lum_b < (unsigned)lum_g{m}) {{ {call} return; }}\n    lum_b -= (unsigned)lum_g{m};\n"
            ));
        } else {
            body.push_str(&format!("    {call}\n"));
        }
    }
    let all: Vec<String> = ptrs
        .into_iter()
        .chain(scalars)
        .chain(bounds.iter().map(|b| format!("long long {b}")))
        .collect();
    let text = format!(
        "{devs}LUM_EXTERN_C __global__ void KERNEL({}) {{\n{body}}}\n",
        all.join(", ")
    );
    let name = format!("lum_combo{}_{:016x}", members.len(), fnv1a(&text));
    Some(Kernel {
        source: text.replace("KERNEL", &name),
        name,
        buffer_types,
        error_flag: false,
        dims: vec![],
        cooperative: false,
        scalars: Some(n_scalars + bounds.len()),
    })
}

/// [`skinny_kernel`] for a block-quantized weight read in place (Q8_0, Q4_0, Q4_1: a
/// decode step reads 1.06, 0.56 or 0.63 bytes a weight instead of an f16 copy's 2), with f32
/// activations rounded to f16 as the f16-copy path rounds them. Rows must be whole blocks
/// (`K`, `lda` and `oa` multiples of 32; the plan checks). Each lane decodes whole blocks of
/// its warp's row (block `b` for `b = lane, lane + 32, …`: its scale, and the quants as
/// 2-byte loads) and adds `d·Σ q·x (+ m·Σ x)`; the parameters are [`skinny_kernel`]'s (the
/// weights as bytes). The host emulator's branch sums `lum_deq_<type>(w, i)·x` in order (the
/// core's decoders), so the emulators check the block decoding against them. `None` for
/// other types.
pub fn skinny_quant_kernel(q: DType, c: DType) -> Option<Kernel> {
    let (bytes, decode) = match q {
        DType::Q8_0 => (
            34,
            "lum_d = lum_sk_lo(lum_h[0]); lum_mn = 0.f;
            for (int lum_i = 0; lum_i < 16; ++lum_i) { const unsigned lum_v = lum_h[1 + lum_i]; lum_q[2 * lum_i] = (float)(signed char)(lum_v & 0xffu); lum_q[2 * lum_i + 1] = (float)(signed char)(lum_v >> 8); }",
        ),
        DType::Q4_0 => (
            18,
            "lum_d = lum_sk_lo(lum_h[0]); lum_mn = 0.f;
            for (int lum_i = 0; lum_i < 8; ++lum_i) { const unsigned lum_v = lum_h[1 + lum_i]; lum_q[2 * lum_i] = (float)((int)(lum_v & 15u) - 8); lum_q[2 * lum_i + 1] = (float)((int)((lum_v >> 8) & 15u) - 8); lum_q[2 * lum_i + 16] = (float)((int)((lum_v >> 4) & 15u) - 8); lum_q[2 * lum_i + 17] = (float)((int)(lum_v >> 12) - 8); }",
        ),
        DType::Q4_1 => (
            20,
            "lum_d = lum_sk_lo(lum_h[0]); lum_mn = lum_sk_lo(lum_h[1]);
            for (int lum_i = 0; lum_i < 8; ++lum_i) { const unsigned lum_v = lum_h[2 + lum_i]; lum_q[2 * lum_i] = (float)(lum_v & 15u); lum_q[2 * lum_i + 1] = (float)((lum_v >> 8) & 15u); lum_q[2 * lum_i + 16] = (float)((lum_v >> 4) & 15u); lum_q[2 * lum_i + 17] = (float)(lum_v >> 12); }",
        ),
        _ => return None,
    };
    let ct = c_type(c).ok()?;
    let qn = q.name();
    let store_c = store(c, Val::Float, "lum_acc[lum_j]");
    let text = format!(
        r#"{SKINNY_HELPERS}LUM_EXTERN_C __global__ void KERNEL({ct}* out0, {ct}* out1, {ct}* out2, const unsigned char* __restrict__ w0, const unsigned char* __restrict__ w1, const unsigned char* __restrict__ w2, const float* __restrict__ x, long long lum_m, long long lum_k, long long lum_ldb, long long lum_ob, long long lum_rows0, long long lum_lda0, long long lum_ldc0, long long lum_oa0, long long lum_oc0, long long lum_rows1, long long lum_lda1, long long lum_ldc1, long long lum_oa1, long long lum_oc1, long long lum_rows2, long long lum_lda2, long long lum_ldc2, long long lum_oa2, long long lum_oc2) {{
    const long long lum_g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int lum_lane = (int)(lum_g & 31);
    long long lum_row = lum_g >> 5, lum_rows = lum_rows0, lum_lda = lum_lda0, lum_ldc = lum_ldc0, lum_oa = lum_oa0, lum_oc = lum_oc0;
    {ct}* out = out0;
    const unsigned char* w = w0;
    if (lum_row >= lum_rows0) {{
        lum_row -= lum_rows0;
        lum_rows = lum_rows1; lum_lda = lum_lda1; lum_ldc = lum_ldc1; lum_oa = lum_oa1; lum_oc = lum_oc1; out = out1; w = w1;
        if (lum_row >= lum_rows1) {{
            lum_row -= lum_rows1;
            lum_rows = lum_rows2; lum_lda = lum_lda2; lum_ldc = lum_ldc2; lum_oa = lum_oa2; lum_oc = lum_oc2; out = out2; w = w2;
        }}
    }}
    const int lum_live = lum_row < lum_rows;
    float lum_acc[8] = {{0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}};
#ifdef __CUDACC_RTC__
    __shared__ float4 lum_xs4[LUM_SK_STAGE / 4];
    float* lum_xs = (float*)lum_xs4;
    const int lum_stage = lum_m * lum_k <= LUM_SK_STAGE;
    if (lum_stage) {{
        for (long long lum_i = threadIdx.x; lum_i < lum_m * lum_k; lum_i += blockDim.x)
            lum_xs[lum_i] = lum_sk_round_f16(x[lum_ob + (lum_i / lum_k) * lum_ldb + lum_i % lum_k]);
        __syncthreads();
    }}
    const unsigned char* wr = w + ((lum_oa + (lum_live ? lum_row : 0) * lum_lda) / 32) * {bytes};
    const long long lum_nb = lum_live ? lum_k / 32 : 0;
    for (long long lum_b = lum_lane; lum_b < lum_nb; lum_b += 32) {{
        const unsigned short* lum_h = (const unsigned short*)(wr + lum_b * {bytes});
        float lum_q[32], lum_d, lum_mn;
        {{
            {decode}
        }}
#pragma unroll
        for (int lum_j = 0; lum_j < 8; ++lum_j) {{
            if (lum_j < lum_m) {{
                float lum_s = 0.f, lum_sx = 0.f;
                for (int lum_e = 0; lum_e < 32; ++lum_e) {{
                    const long long lum_at = lum_b * 32 + lum_e;
                    const float lum_xv = lum_stage ? lum_xs[lum_j * lum_k + lum_at] : lum_sk_round_f16(x[lum_ob + lum_j * lum_ldb + lum_at]);
                    lum_s += lum_q[lum_e] * lum_xv;
                    lum_sx += lum_xv;
                }}
                lum_acc[lum_j] += lum_d * lum_s + lum_mn * lum_sx;
            }}
        }}
    }}
#pragma unroll
    for (int lum_j = 0; lum_j < 8; ++lum_j) {{
        if (lum_j < lum_m) {{
            for (int lum_o = 16; lum_o > 0; lum_o >>= 1) lum_acc[lum_j] += __shfl_xor_sync(0xffffffffu, lum_acc[lum_j], lum_o);
            if (lum_live && lum_lane == 0) out[lum_oc + lum_row + lum_j * lum_ldc] = {store_c};
        }}
    }}
#else
    /* One thread per column: the core's decoder per element, summing in order. */
    if (!lum_live || lum_lane != 0) return;
    for (int lum_j = 0; lum_j < 8 && lum_j < lum_m; ++lum_j) {{
        for (long long lum_e = 0; lum_e < lum_k; ++lum_e)
            lum_acc[lum_j] += lum_deq_{qn}(w, lum_oa + lum_row * lum_lda + lum_e) * lum_sk_round_f16(x[lum_ob + lum_j * lum_ldb + lum_e]);
        out[lum_oc + lum_row + lum_j * lum_ldc] = {store_c};
    }}
#endif
}}
"#
    );
    let name = format!("lum_skinny_{qn}_{}_{:016x}", c.name(), fnv1a(&text));
    Some(Kernel {
        source: text.replace("KERNEL", &name),
        name,
        buffer_types: vec![
            ct,
            ct,
            ct,
            "unsigned char",
            "unsigned char",
            "unsigned char",
            "float",
        ],
        error_flag: false,
        dims: vec![],
        cooperative: true,
        scalars: Some(4 + 5 * SKINNY_GROUPS),
    })
}

/// Conversions and 8-element loads of [`skinny_kernel`] (once per module): on a GPU the PTX
/// `cvt` instructions (rounding, round to nearest even as the prelude's) and 16-byte vector
/// loads, in C the prelude's conversions element by element; f16 weights widened by integer
/// operations in both (the H200 run with a `cvt` per weight and per activation element
/// streamed a 1B model's weights at a third of the bandwidth: conversions, not memory).
const SKINNY_HELPERS: &str = r#"#ifndef LUM_SKINNY_HELPERS
#define LUM_SKINNY_HELPERS
/* Floats of activations a block stages in shared memory (32 KiB). */
#define LUM_SK_STAGE 8192
/* The two halves of a word as f32 by integer operations and one exact product by 2^112
   (normal and subnormal halves exactly, zeros with their sign; infinities and NaNs, which
   weights do not hold, become large finite values): far cheaper on a GPU than one cvt each. */
LUM_DEV float lum_sk_lo(unsigned u) { return lum_u2f(lum_f2u(lum_u2f((u & 0x7fffu) << 13) * 0x1p112f) | ((u & 0x8000u) << 16)); }
LUM_DEV float lum_sk_hi(unsigned u) { return lum_u2f(lum_f2u(lum_u2f((u >> 3) & 0x0fffe000u) * 0x1p112f) | (u & 0x80000000u)); }
#ifdef __CUDA_ARCH__
LUM_DEV float lum_sk_h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
LUM_DEV float lum_sk_round_f16(float v) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v)); return lum_sk_h2f(h); }
LUM_DEV float lum_sk_round_bf16(float v) { unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v)); return lum_bf16_to_f32(h); }
LUM_DEV void lum_sk_words4(const unsigned short* p, unsigned* u) { const uint4 v = *(const uint4*)p; u[0] = v.x; u[1] = v.y; u[2] = v.z; u[3] = v.w; }
LUM_DEV void lum_sk_load8_f32(const float* p, float* o) {
    const float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
    o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w; o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
}
#else
typedef struct { float x, y, z, w; } float4;
LUM_DEV float lum_sk_h2f(unsigned short h) { return lum_f16_to_f32(h); }
LUM_DEV float lum_sk_round_f16(float v) { return lum_f16_to_f32(lum_f32_to_f16(v)); }
LUM_DEV float lum_sk_round_bf16(float v) { return lum_bf16_to_f32(lum_f32_to_bf16(v)); }
LUM_DEV void lum_sk_words4(const unsigned short* p, unsigned* u) { memcpy(u, p, 16); }
LUM_DEV void lum_sk_load8_f32(const float* p, float* o) { for (int i = 0; i < 8; ++i) o[i] = p[i]; }
#endif
/* A piece of 8 weights as raw 32-bit words (loaded), then as floats (converted). */
#define LUM_SK_RAW_f16 4
#define LUM_SK_RAW_bf16 4
#define LUM_SK_RAW_f32 8
LUM_DEV void lum_sk_raw_f16(const unsigned short* p, unsigned* u) { lum_sk_words4(p, u); }
LUM_DEV void lum_sk_raw_bf16(const unsigned short* p, unsigned* u) { lum_sk_words4(p, u); }
LUM_DEV void lum_sk_raw_f32(const float* p, unsigned* u) { lum_sk_words4((const unsigned short*)p, u); lum_sk_words4((const unsigned short*)(p + 4), u + 4); }
LUM_DEV void lum_sk_cvt_f16(const unsigned* u, float* o) {
    for (int i = 0; i < 4; ++i) { o[2 * i] = lum_sk_lo(u[i]); o[2 * i + 1] = lum_sk_hi(u[i]); }
}
LUM_DEV void lum_sk_cvt_bf16(const unsigned* u, float* o) {
    for (int i = 0; i < 4; ++i) { o[2 * i] = lum_u2f(u[i] << 16); o[2 * i + 1] = lum_u2f(u[i] & 0xffff0000u); }
}
LUM_DEV void lum_sk_cvt_f32(const unsigned* u, float* o) { for (int i = 0; i < 8; ++i) o[i] = lum_u2f(u[i]); }
LUM_DEV void lum_sk_load8_f16(const unsigned short* p, float* o) { unsigned u[4]; lum_sk_raw_f16(p, u); lum_sk_cvt_f16(u, o); }
LUM_DEV void lum_sk_load8_bf16(const unsigned short* p, float* o) { unsigned u[4]; lum_sk_raw_bf16(p, u); lum_sk_cvt_bf16(u, o); }
#endif
"#;

/// The most threads one output of a reduction gets (its block's size; the kernels are
/// compiled with `__launch_bounds__` of this many threads, so a launch never asks for more
/// registers than a multiprocessor has).
pub const MAX_THREADS_PER_OUTPUT: u32 = 512;

/// The pieces of a reduction kernel's body ([`reduce_body`]), as C text.
struct ReduceParts<'a> {
    /// The reduced axis' length and the product of the dims after it.
    len: &'a str,
    inner: &'a str,
    /// The accumulator's type and identity, and the statement folding `a` into `lum_acc`.
    acc_t: &'a str,
    ident: &'a str,
    combine: &'a str,
    /// The declaration of `a` and the statements reading element `lum_k` of the output's
    /// row into it.
    decl: &'a str,
    read: &'a str,
    /// `lum_acc` as stored into the output.
    store: &'a str,
}

/// The body of a reduction kernel. Under NVRTC (`__CUDACC_RTC__`) `lum_t` threads compute
/// each output (`lum_t` a power of two up to [`MAX_THREADS_PER_OUTPUT`], chosen by the plan
/// at launch, [`crate::plan::threads_per_output`]): lane `l` folds elements `l, l + lum_t, …`
/// of the row (consecutive lanes read consecutive elements), the lanes of a warp combine
/// with a `__shfl_xor_sync` butterfly, the warps of a block through shared memory, and lane
/// 0 stores. With `lum_t == 1` that is the sequential loop, in the same order. No thread
/// returns early when `lum_t > 1` (every lane of a warp takes part in its shuffles and every
/// thread of a block in its barrier); threads past the last output fold nothing and store
/// nothing. The host emulator (no cross-thread cooperation) compiles the `#else` branch:
/// one thread per output, looping over the reduced axis.
fn reduce_body(p: ReduceParts) -> String {
    let ReduceParts {
        len,
        inner,
        acc_t,
        ident,
        combine,
        decl,
        read,
        store,
    } = p;
    format!(
        r#"#ifdef __CUDACC_RTC__
    const long long lum_g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long lum_i = lum_g / lum_t, lum_lane = lum_g % lum_t;
    const bool lum_live = lum_i < lum_n;
    if (lum_t == 1 && !lum_live) return;
    const long long lum_len = {len};
    const long long lum_inner = lum_max({inner}, 1);
    const long long lum_outer = lum_i / lum_inner, lum_rest = lum_i % lum_inner;
    {acc_t} lum_acc = {ident};
#pragma unroll 4
    for (long long lum_k = lum_live ? lum_lane : lum_len; lum_k < lum_len; lum_k += lum_t) {{
        {decl}
        {read}
        {combine}
    }}
    for (int lum_o = (lum_t < 32 ? (int)lum_t : 32) >> 1; lum_o > 0; lum_o >>= 1) {{
        const {acc_t} a = __shfl_xor_sync(0xffffffffu, lum_acc, lum_o);
        {combine}
    }}
    if (lum_t > 32) {{
        __shared__ {acc_t} lum_part[32];
        const int lum_w = (int)(threadIdx.x >> 5), lum_l = (int)(threadIdx.x & 31u);
        const int lum_nw = (int)(lum_t >> 5), lum_first = (int)(threadIdx.x / lum_t) * lum_nw;
        if (lum_l == 0) lum_part[lum_w] = lum_acc;
        __syncthreads();
        lum_acc = lum_l < lum_nw ? lum_part[lum_first + lum_l] : {ident};
        for (int lum_o = 16; lum_o > 0; lum_o >>= 1) {{
            const {acc_t} a = __shfl_xor_sync(0xffffffffu, lum_acc, lum_o);
            {combine}
        }}
    }}
    if (lum_live && lum_lane == 0) out[lum_i] = {store};
#else
    const long long lum_i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    (void)lum_t;
    if (lum_i >= lum_n) return;
    const long long lum_len = {len};
    const long long lum_inner = lum_max({inner}, 1);
    const long long lum_outer = lum_i / lum_inner, lum_rest = lum_i % lum_inner;
    {acc_t} lum_acc = {ident};
    for (long long lum_k = 0; lum_k < lum_len; ++lum_k) {{
        {decl}
        {read}
        {combine}
    }}
    out[lum_i] = {store};
#endif
"#
    )
}

/// A node's kernel and the nodes its buffer parameters read, in order.
pub type Generated = (Kernel, Vec<NodeId>);

/// Kernels for every node of `order` (the nodes to compute, inputs before consumers) that
/// is not in `fused`, with the nodes their buffer parameters read; `None` where the node is
/// an `Input`.
pub fn generate_all(
    graph: &GraphData,
    order: &[NodeId],
    fused: &HashSet<NodeId>,
    in_place: &HashSet<NodeId>,
) -> Result<Vec<(NodeId, Option<Generated>)>, String> {
    order
        .iter()
        .filter(|id| !fused.contains(id))
        .map(|&id| {
            let node = graph.node(id);
            let dtypes: Vec<DType> = node
                .inputs
                .iter()
                .map(|e| graph.node(e.node).dtype)
                .collect();
            generate_node(Some(graph), node, &dtypes, fused, in_place.contains(&id))
                .map(|k| (id, k))
                .map_err(|e| format!("node {} ({}): {e}", id.0, node.op.name()))
        })
        .collect()
}
#[cfg(test)]
mod tests {
    use super::*;
    use luminal::graph::Graph;

    #[test]
    fn arch_from_compute_capability() {
        assert_eq!(nvrtc_arch((9, 0)), "compute_90");
        assert_eq!(nvrtc_arch((8, 6)), "compute_86");
    }

    #[test]
    fn views_render_through_index_and_valid_expressions() {
        let cx = Graph::new();
        let a = cx.tensor("a", ("seq", 4));
        let b = a.permute([1, 0]).pad_axis(1, 1, 0).contiguous().output();
        let g = cx.snapshot();
        let node = g.node(b.node());
        let k = generate(node, &[DType::F32]).unwrap().unwrap();
        // The dynamic dim is a parameter; the pad is a validity test; one output per thread.
        assert_eq!(k.dims, vec!["seq".to_string()]);
        assert!(
            k.source.contains("long long lum_d0 = lum_dv[lum_do + 0]"),
            "{}",
            k.source
        );
        assert!(k.source.contains("? in0["), "{}", k.source);
        assert!(k.source.contains("if (lum_i >= lum_n) return;"));
        // Equal nodes give equal sources (the cache key) and names.
        let again = generate(node, &[DType::F32]).unwrap().unwrap();
        assert_eq!(again, k);
        assert!(cuda_source([&k]).contains(&k.name));
    }

    #[test]
    fn quantized_buffers_are_bytes_read_by_their_dequantizer() {
        assert_eq!(c_type(DType::Q4_0), Ok("unsigned char"));
        assert_eq!(c_type(DType::BF16), Ok("unsigned short"));
        let cx = Graph::new();
        let w = cx.input("w", (3, 256), DType::Q4_K);
        let f = w.permute([1, 0]).dequantize().output();
        let g = cx.snapshot();
        let k = generate(g.node(f.node()), &[DType::Q4_K]).unwrap().unwrap();
        assert!(k.source.contains("lum_deq_q4_k(in0, "), "{}", k.source);
        assert_eq!(k.buffer_types, vec!["float", "unsigned char"]);
        // Every dequantizer the source can call is in the prelude.
        for dt in luminal::dtype::ALL_DTYPES
            .iter()
            .filter(|d| d.is_quantized())
        {
            let f = format!("lum_deq_{}(", dt.name());
            assert!(prelude::QUANT_PRELUDE.contains(&f), "{f}");
        }
    }
}
