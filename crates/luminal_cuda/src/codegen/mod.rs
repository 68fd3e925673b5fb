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

mod combine;
mod fusion;
pub mod prelude;
mod reduce;
mod skinny;

pub use combine::combined_kernel;
pub use fusion::{fused_nodes, Fusion, MAX_BROADCAST_COST};
pub use reduce::MAX_THREADS_PER_OUTPUT;
use reduce::{reduce_body, ReduceParts};
pub(crate) use skinny::skinny_helpers;
pub use skinny::{
    round_kernel, skinny_kernel, skinny_mma_fits, skinny_mma_grid, skinny_mma_kernel,
    skinny_mma_norm_kernel, skinny_mma_residual_kernel, skinny_quant_kernel, skinny_split,
    SkinnyNorm, SKINNY_GROUPS, SKINNY_MAX_BLOCKS, SKINNY_MMA_MAX_BLOCKS, SKINNY_MMA_STAGE,
    SKINNY_WARPS,
};

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
        s.push_str(&with_pdl_entry(&k.source, &k.name));
    }
    s
}

/// `source` with `LUM_PDL_ENTRY` (the prelude's wait for the kernel launched before) first in
/// the body of kernel `name`: a kernel launched as a programmatic dependency
/// (`CudaBackend`'s `pdl`) touches no memory before its predecessor has finished.
fn with_pdl_entry(source: &str, name: &str) -> String {
    let body = source
        .find(&format!(" {name}("))
        .and_then(|at| source[at..].find(')').map(|p| at + p))
        .and_then(|at| source[at..].find('{').map(|b| at + b + 1))
        .unwrap_or_else(|| panic!("kernel {name}: no body in its source"));
    format!("{} LUM_PDL_ENTRY{}", &source[..body], &source[body..])
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
