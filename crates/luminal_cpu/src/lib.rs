//! # luminal_cpu: the fast CPU backend
//!
//! Compiles the (generically optimised) primop graph into a plan of kernels:
//!
//! - **fused elementwise** trees (any chain of unary/binary primops, casts, constants and
//!   views) evaluated by a block interpreter in one pass over the output;
//! - **reductions** fused with their elementwise producers, and last-axis reductions fused
//!   with their producers and consumers into one *row kernel* (softmax, norms: one pass
//!   over memory in, one out; see `kernels/fused/rows.rs`);
//! - **matmul** recognised from its broadcast-multiply + sum-reduce pattern and run by our
//!   blocked GEMM on the operands' own strides (AMX, AVX-512, AVX2 or portable microkernels,
//!   `kernels/matmul/gemm_f32.rs`; f16 and bf16 widened to f32 scratch and rounded once, see
//!   `kernels/half.rs`); skinny products (decode steps) by one kernel for every weight
//!   format, read in place (`kernels/matmul/skinny.rs`: f32, half and block-quantized with
//!   f32 or int8 activations, see `kernels/quant/`); an f32 elementwise consumer fused as
//!   an epilogue;
//! - **f16 / bf16 compute** in the same fused kernels: values in f32, each half op's result
//!   rounded to its type (the reference's result), half reductions accumulated in f64;
//! - **casts** between f32, f16 and bf16 as direct conversion kernels (F16C where present);
//! - **attention** (`softmax(q·kᵀ·scale + mask)·v`, grouped-query heads, read in place
//!   from the KV cache) as one tiled online-softmax kernel whose memory is linear in the
//!   sequence, evaluating a private elementwise query (RoPE) itself (see
//!   `kernels/attention/`);
//! - **data movement** kernels: gather (embedding rows copied whole), iota, concatenation
//!   (the pad + add pattern, copied piece by piece), in-place state writes, any dtype (see
//!   `kernels/movement/`);
//! - the core's **reference semantics** as the fallback for everything else (ints, bools,
//!   casts between halves and ints), so every graph runs with the reference's results.
//!
//! Layout:
//! - `lower/`: lowering as an ordered table of named rules (the first that applies to a
//!   node builds its kernel; any but the fallback can be switched off with
//!   [`CpuBackend::disable_rules`]), then the passes that merge kernels;
//! - `kernel.rs`: the one kernel trait every family implements (reads, buffer remap,
//!   scratch, run, cost) and the buffer ids, distinct from node ids;
//! - `kernels/`: the kernel families (`fused/`, `matmul/`, `quant/`, `movement/`, `half.rs`,
//!   `fallback.rs`);
//! - `exec/`: the runtime, the static memory plan, the thread pool and the profile;
//! - `simd/`: instruction-set detection and the ISA-specific inner loops; `storage.rs`: the
//!   buffers, their element trait and the buffer ids.
//!
//! Buffers are planned at compile time and reused by liveness; after the first run for
//! given dims, `run()` allocates nothing. Threads come from a persistent pool of spinning
//! workers (`exec/par.rs`).
//!
//! ```
//! use luminal::prelude::*;
//! use luminal_cpu::CpuBackend;
//! let cx = Graph::new();
//! let a = cx.tensor("a", (3, 1));
//! let b = cx.tensor("b", (1, 4));
//! let c = a.matmul(b).output();
//! let mut rt = cx.compile(CpuBackend::default(), CompileOptions::default()).unwrap();
//! rt.set(a, &[1., 2., 3.]).unwrap();
//! rt.set(b, &[1., 2., 3., 4.]).unwrap();
//! rt.run().unwrap();
//! assert_eq!(rt.get::<f32>(c).unwrap(), vec![1., 2., 3., 4., 2., 4., 6., 8., 3., 6., 9., 12.]);
//! ```

mod exec;
mod kernel;
mod kernels;
mod lower;
pub mod search;
mod simd;
mod storage;
mod view;

pub use exec::runtime::CpuRuntime;
pub use kernels::matmul::gemm_f32::MatmulPrecision;
pub use kernels::matmul::gemm_f32::Tiles as MatmulTiles;
pub use kernels::matmul::Split as MatmulSplit;
pub use simd::{detected_isa, set_max_isa, Isa};

/// Whether wide int8 products (prefill with block-quantized weights) run on AMX-INT8 tiles
/// here: the CPU and OS allow it, `LUMINAL_AMX` is not `0` and [`set_amx_int8`] did not
/// turn it off. Those products quantize activations per block of 32 (the AVX-512 VNNI and
/// AVX2 kernels: per 16).
pub fn amx_int8() -> bool {
    #[cfg(target_arch = "x86_64")]
    return kernels::quant::amx_int8_active();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Turns the AMX int8 products off (`Some(false)`) or back on where the hardware has them
/// (`Some(true)`); `None` returns to `LUMINAL_AMX`. Process-wide: for tests and benchmarks
/// comparing paths.
pub fn set_amx_int8(on: Option<bool>) {
    #[cfg(target_arch = "x86_64")]
    kernels::matmul::amx::set_amx_int8(on);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = on;
}

/// How many int8 levels the skinny products (decode steps, `M ≤ 8`) with `dtype` weights
/// quantize activations to, at the current instruction-set cap: 2 (16 bits a value, see
/// `kernels/quant/int8.rs`) for the 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
/// on the AVX2 and AVX-512 VNNI paths, 1 for the other formats and on the portable path,
/// 1 for every format under `LUMINAL_CPU_ACT_LEVELS=1` or
/// [`set_activation_levels`]`(Some(1))`. (Activations of f32 products are not quantized.)
pub fn skinny_activation_levels(dtype: luminal::DType) -> usize {
    let path = kernels::quant::int8::DotPath::current();
    1 + kernels::quant::int8_matmul::two_level(path, dtype) as usize
}

/// Sets the activation levels of [`skinny_activation_levels`] process-wide: `Some(1)` one
/// level everywhere, `Some(2)` two wherever the format's kernels take them, `None` back to
/// `LUMINAL_CPU_ACT_LEVELS` (unset: two). For tests and benchmarks comparing them.
pub fn set_activation_levels(levels: Option<u8>) {
    let l = levels.map_or(0, |l| l.clamp(1, 2));
    kernels::quant::int8_matmul::LEVELS.store(l, std::sync::atomic::Ordering::Relaxed);
}

use luminal::{Backend, CompileOptions, GraphData, Result};

/// The CPU backend. `threads: None` uses every available core.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend {
    pub threads: Option<usize>,
    /// How skinny products (decode steps) with block-quantized weights treat activations.
    pub quant_dots: QuantDots,
    /// Lowering rules and passes switched off (see [`CpuBackend::disable_rules`]).
    pub disabled_rules: &'static [&'static str],
    /// Threads the matrix products may use, at most `threads` (`None`: all of them): a
    /// kernel-level choice of the search (schedule knob `mm=N`, see `search.rs`).
    pub matmul_threads: Option<usize>,
    /// The axis a single large f32 product is split along across threads (schedule knob
    /// `split=m|n|k`; `Auto`: K for products much deeper than long and wide, else N when it
    /// is wide enough, else M).
    pub matmul_split: MatmulSplit,
    /// The f32 products' cache blocking (schedule knob `tiles=KCxMC`; `None`: 256 × 144).
    pub matmul_tiles: Option<MatmulTiles>,
    /// How exactly f32 products are computed (PyTorch's float32 matmul precision;
    /// `LUMINAL_MATMUL_PRECISION=high|highest` overrides it).
    pub matmul_precision: MatmulPrecision,
}

/// Activations of products with block-quantized weights: skinny ones (M ≤ 8 rows: decode
/// steps) on every ISA, and prefill (M > 8) where the CPU has AVX-512 VNNI (elsewhere
/// prefill keeps f32 activations and `gemm`, which is faster there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QuantDots {
    /// f32 activations: each weight row is dequantized in registers and dotted in f32
    /// (`LUMINAL_CPU_QDOT=f32`).
    F32,
    /// The default. Activations quantized per group of 16 to int8 and dotted with integer
    /// instructions (as llama.cpp does per 32; AVX-512 VNNI, AVX2). In decode steps with
    /// the 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) on those paths, in two
    /// levels (each group's rounding residual quantized again: 16 bits a value, see
    /// [`skinny_activation_levels`]). In products whose result is a graph output (the
    /// logits), the 32 largest entries of each row are then recomputed with f32
    /// activations: argmax, top-k and the log-probabilities of the likely tokens are those
    /// of f32 activations, the rest carry the int8 rounding (`LUMINAL_CPU_QDOT=int8`). On
    /// SmolLM2 Q4_1 decode (534 teacher-forced steps): 533/534 top-1 agreement with
    /// transformers (two levels; one level: 523/534 VNNI, 520/534 AVX2), perplexity within
    /// 0.01% of f32 activations (one level: +0.5%); int8 prefill (one level) moves the teacher-forced
    /// perplexity by 0.26% and turns a near-tie (0.08 logits) in the chat test's first
    /// token the other way.
    #[default]
    Int8RefineOutputs,
    /// Int8, except in products whose result is a graph output, which keep f32 activations
    /// throughout (`LUMINAL_CPU_QDOT=int8-f32-outputs`).
    Int8ExceptOutputs,
    /// Int8 everywhere, logits included, no refinement (`LUMINAL_CPU_QDOT=int8-all`).
    Int8,
}

impl QuantDots {
    /// `self`, unless `LUMINAL_CPU_QDOT` names another choice (`f32`, `int8`,
    /// `int8-f32-outputs`, `int8-all`).
    fn resolved(self) -> QuantDots {
        match std::env::var("LUMINAL_CPU_QDOT").as_deref() {
            Ok("f32") => QuantDots::F32,
            Ok("int8") => QuantDots::Int8RefineOutputs,
            Ok("int8-f32-outputs") => QuantDots::Int8ExceptOutputs,
            Ok("int8-all") => QuantDots::Int8,
            _ => self,
        }
    }
}

impl CpuBackend {
    /// A backend using `n` threads (1 = no parallelism).
    pub fn with_threads(n: usize) -> CpuBackend {
        CpuBackend {
            threads: Some(n.max(1)),
            ..CpuBackend::default()
        }
    }

    /// This backend with f32 products at `precision` (see [`MatmulPrecision`]).
    pub fn matmul_precision(self, precision: MatmulPrecision) -> CpuBackend {
        CpuBackend {
            matmul_precision: precision,
            ..self
        }
    }

    /// This backend with quantized-weight products computed as `dots` says.
    pub fn quant_dots(self, dots: QuantDots) -> CpuBackend {
        CpuBackend {
            quant_dots: dots,
            ..self
        }
    }
}

impl CpuBackend {
    /// This backend with the named lowering rules or passes switched off: the graph runs
    /// on the remaining ones (ultimately the reference-semantics fallback) with the same
    /// results. Rules: `write_slice`, `terms` (fused terms a search names, see `search.rs`),
    /// `attention`, `dequantize`, `fused_elementwise`, `half_cast`,
    /// `matmul`, `fused_reduce`, `movement`; passes: `shared`, `rows`, `concat`. Unknown names are
    /// an error at compile time.
    pub fn disable_rules(self, rules: &'static [&'static str]) -> CpuBackend {
        CpuBackend {
            disabled_rules: rules,
            ..self
        }
    }
}

impl Backend for CpuBackend {
    type Runtime = CpuRuntime;
    fn compile(&self, graph: GraphData, _: &CompileOptions) -> Result<CpuRuntime> {
        let threads = self
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        let knobs = crate::lower::MatmulKnobs {
            threads: self.matmul_threads,
            split: self.matmul_split,
            tiles: self.matmul_tiles,
            precision: self.matmul_precision.resolved(),
        };
        crate::lower::with_matmul_knobs(knobs, || {
            CpuRuntime::new(
                graph,
                threads,
                self.quant_dots.resolved(),
                self.disabled_rules,
            )
        })
    }
}
