//! The host emulator: runs the generated CUDA kernels on the CPU, to check the code
//! generation on machines without a GPU (CI has none).
//!
//! The kernel sources are compiled, unchanged, by the system C compiler (`cc`, or `$CC`)
//! under a small prelude that turns `__global__`/`__device__` into plain C and
//! `blockIdx`/`blockDim`/`threadIdx` into thread-local variables; a launcher per kernel loops
//! over the grid's blocks and threads, calling the kernel once per thread. On a GPU the same
//! sources go through NVRTC ([`crate::device`]), so what this proves is the index math and
//! the semantics of every kernel, not the GPU's compiler or launch.
//!
//! Compiled kernels are cached per process by source text.

use crate::attention::{self as attn, AttnCall};
use crate::codegen::{prelude, Fusion, Kernel};
use crate::gemm::GemmCall;
use crate::plan::{Executor, PlanRuntime};
use luminal::graph::GraphData;
use luminal::{Backend, CompileOptions, LuminalError, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Multiprocessors the cooperative emulator plans attention for (an H100's or H200's).
const EMULATED_SMS: i64 = 132;

/// The plan's runtime on the host emulator.
pub type HostRuntime = PlanRuntime<HostExecutor>;

/// A backend that compiles the CUDA backend's plan for the host emulator, products through
/// the emulated cuBLAS ([`crate::gemm::host_gemm`]) as `CudaBackend` runs them.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostEmulatorBackend;

impl Backend for HostEmulatorBackend {
    type Runtime = HostRuntime;
    fn compile(&self, graph: GraphData, _: &CompileOptions) -> Result<HostRuntime> {
        PlanRuntime::new(graph, HostExecutor::new(true))
    }
}

/// The host emulator running reductions as a GPU runs them, several threads per output
/// ([`crate::plan::threads_per_output`]): the threads of each block of a cooperative
/// reduction run at once, as OpenMP threads (the kernels compiled with `-fopenmp` and
/// `__CUDACC_RTC__` defined, so the GPU branch of the source is the one compiled),
/// `__syncthreads` an OpenMP barrier and `__shfl_xor_sync` an exchange through memory
/// between two barriers. It checks the cooperative kernels' indexing and combining
/// without a GPU; slow (hundreds of threads per block on a few cores), for tests.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostEmulatorCooperative;

impl Backend for HostEmulatorCooperative {
    type Runtime = HostRuntime;
    fn compile(&self, graph: GraphData, _: &CompileOptions) -> Result<HostRuntime> {
        PlanRuntime::new(
            graph,
            HostExecutor {
                cooperative: true,
                ..HostExecutor::new(true)
            },
        )
    }
}

/// The host emulator with one kernel and one buffer per node (no elementwise fusion), as
/// `CudaBackend::without_fusion` runs; products through the emulated cuBLAS.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostEmulatorUnfused;

impl Backend for HostEmulatorUnfused {
    type Runtime = HostRuntime;
    fn compile(&self, graph: GraphData, _: &CompileOptions) -> Result<HostRuntime> {
        PlanRuntime::with_fusion(graph, HostExecutor::new(true), Fusion::Off)
    }
}

/// The host emulator without cuBLAS: products run as the generated multiply and sum-reduce
/// kernels (as `CudaBackend::without_cublas` and machines without cuBLAS run them).
#[derive(Clone, Copy, Debug, Default)]
pub struct HostEmulatorKernelsOnly;

impl Backend for HostEmulatorKernelsOnly {
    type Runtime = HostRuntime;
    fn compile(&self, graph: GraphData, _: &CompileOptions) -> Result<HostRuntime> {
        PlanRuntime::new(graph, HostExecutor::new(false))
    }
}

/// Host memory standing in for device memory (8-byte aligned). It is owned through a raw
/// pointer, as device memory is: kernels write through it while the plan holds shared
/// references to the buffer.
pub struct HostBuffer {
    ptr: *mut u64,
    words: usize,
}

impl HostBuffer {
    fn new(bytes: usize) -> HostBuffer {
        let words = bytes.div_ceil(8).max(1);
        let ptr = Box::into_raw(vec![0u64; words].into_boxed_slice()) as *mut u64;
        HostBuffer { ptr, words }
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` owns `words` initialised u64s; no launch runs while this borrow lives
        // (launches are synchronous and take the buffers for their duration only).
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.words * 8) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, with exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.words * 8) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `Box::into_raw` of a boxed slice of `words` u64s.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr, self.words,
            )))
        };
    }
}

type Launcher = unsafe extern "C" fn(u32, u32, *const *mut std::ffi::c_void, *const i64);

/// A compiled kernel's launcher; keeps its library loaded.
#[derive(Clone)]
pub struct HostFunction {
    launcher: Launcher,
    /// Built for the cooperative emulator: its `__shared__` arrays and exchange slots are
    /// the library's statics, so its launches run one at a time in the process
    /// ([`COOPERATIVE_LAUNCH`]; tests run runtimes on several threads).
    serial: bool,
    _lib: Arc<libloading::Library>,
}

/// Held by every launch of a cooperative emulator kernel.
static COOPERATIVE_LAUNCH: Mutex<()> = Mutex::new(());

/// A launch or product recorded by the emulator's graph capture: replayed with the buffers'
/// contents at replay time, as a CUDA graph is.
pub enum Recorded {
    Launch {
        f: HostFunction,
        grid: u32,
        block: u32,
        buffers: Vec<*mut u64>,
        scalars: Vec<i64>,
    },
    Gemm {
        call: GemmCall,
        c: *mut u64,
        a: *mut u64,
        b: *mut u64,
    },
    /// A fused attention whose call is read from the parameter table when it runs (as the
    /// GPU kernels read it).
    Attention {
        params: *mut u64,
        params_at: usize,
        out: *mut u64,
        q: *mut u64,
        k: *mut u64,
        v: *mut u64,
        bias: *mut u64,
    },
}

// SAFETY: a recording's pointers are buffers of the runtime that owns the recording, which is
// moved between threads, never shared.
unsafe impl Send for Recorded {}

/// Runs the kernels on the CPU (see the module docs).
pub struct HostExecutor {
    gemm: bool,
    /// The launches recorded since `begin_capture` (graph capture, emulated).
    recording: Option<Vec<Recorded>>,
    /// Cooperative reductions with their blocks' threads as OpenMP threads
    /// ([`HostEmulatorCooperative`]).
    cooperative: bool,
    /// `LUMINAL_EMULATOR_DRY=1`: launches, products and attentions are listed, recorded and
    /// replayed but not run (results are meaningless), to time the plan's host work alone.
    dry: bool,
    /// Attention calls run (or recorded) on the f16 kernel, those with a causal mask and
    /// those with grouped queries packed.
    half_attentions: (usize, usize, usize),
}

impl HostExecutor {
    /// An executor running products through the emulated cuBLAS (`gemm`) or as kernels.
    pub fn new(gemm: bool) -> HostExecutor {
        HostExecutor {
            gemm,
            recording: None,
            cooperative: false,
            dry: std::env::var("LUMINAL_EMULATOR_DRY").is_ok_and(|v| v == "1"),
            half_attentions: (0, 0, 0),
        }
    }

    /// How many attention calls ran on the f16 kernel ([`crate::attention::half`]; the
    /// cooperative emulator's), how many of them computed a causal mask, and how many packed
    /// grouped queries.
    pub fn half_attentions(&self) -> (usize, usize, usize) {
        self.half_attentions
    }

    /// The cache key of `k`'s compiled function (the cooperative build is another library).
    fn key(&self, k: &Kernel) -> String {
        if self.cooperative {
            format!("/* cooperative */\n{}", k.source)
        } else {
            k.source.clone()
        }
    }

    fn run(r: &Recorded) {
        match r {
            Recorded::Launch {
                f,
                grid,
                block,
                buffers,
                scalars,
            } => {
                let ptrs: Vec<*mut std::ffi::c_void> = buffers
                    .iter()
                    .map(|&b| b as *mut std::ffi::c_void)
                    .collect();
                let _one_at_a_time = f
                    .serial
                    .then(|| COOPERATIVE_LAUNCH.lock().unwrap_or_else(|e| e.into_inner()));
                // SAFETY: the launcher reads `buffers.len()` pointers and `scalars.len()`
                // scalars, the numbers the kernel was generated with (the plan passes them in
                // that order); the kernels index the buffers within the element counts they
                // were allocated for (the emulator tests compare every result with the
                // reference runtime). A replayed recording's buffers are alive: the plan
                // replays only while every buffer address of the run is unchanged.
                unsafe { (f.launcher)(*grid, *block, ptrs.as_ptr(), scalars.as_ptr()) };
            }
            Recorded::Attention {
                params,
                params_at,
                out,
                q,
                k,
                v,
                bias,
            } => {
                let mut call = AttnCall::default();
                // SAFETY: the plan wrote the call (a `#[repr(C)]` struct of `i64`s) at byte
                // `params_at` of the table before the run; it then resolved it from the
                // operands' views at the run's dims, so it addresses elements of q, k, v and
                // the bias within their buffers, and `out` holds the output's `batch·s·d`
                // values.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (*params as *const u8).add(*params_at),
                        &mut call as *mut AttnCall as *mut u8,
                        std::mem::size_of::<AttnCall>(),
                    );
                    crate::attention::host_attention(
                        &call,
                        *out as *mut f32,
                        *q as *const f32,
                        *k as *const u8,
                        *v as *const u8,
                        *bias as *const f32,
                    )
                }
            }
            Recorded::Gemm { call, c, a, b } => {
                // SAFETY: the plan resolved `call` from the operands' views at this run's
                // dims, so it addresses the elements those views read (within the buffers)
                // and C's `M·N·batch`.
                unsafe {
                    crate::gemm::host_gemm(call, *a as *const u8, *b as *const u8, *c as *mut u8)
                }
            }
        }
    }
}

/// Definitions for the cooperative emulator ([`HostEmulatorCooperative`]), after
/// [`prelude::HOST_PRELUDE`]: the kernels run inside an OpenMP parallel region of one
/// thread per CUDA thread of the block, so block-wide operations are OpenMP barriers. A
/// shuffle is a barrier-separated exchange through a slot per thread; every thread of the
/// block takes part in each (the kernels call them uniformly), and `lane ^ offset` stays in
/// the thread's warp.
const COOPERATIVE_PRELUDE: &str = r#"#include <stdbool.h>
#include <omp.h>
#define __shared__ static
#define __syncthreads() _Pragma("omp barrier")
/* Kernels call it uniformly over the block (every warp as often). */
#define __syncwarp() _Pragma("omp barrier")
/* A shuffle of type T: every thread of the block stores its value between two barriers and
   reads its partner's. */
#define LUM_SHFL(T, N) \
    static T lum_shfl_slots_##N[1024]; \
    static T lum_shfl_##N(T v, int o) { \
        const unsigned t = threadIdx.x; \
        _Pragma("omp barrier") \
        lum_shfl_slots_##N[t] = v; \
        _Pragma("omp barrier") \
        return lum_shfl_slots_##N[t ^ (unsigned)o]; \
    }
LUM_SHFL(double, d)
LUM_SHFL(float, f)
LUM_SHFL(long long, ll)
#define __shfl_xor_sync(mask, v, o) _Generic((v), double: lum_shfl_d, float: lum_shfl_f, default: lum_shfl_ll)((v), (o))
"#;

fn cache() -> &'static Mutex<HashMap<String, HostFunction>> {
    static CACHE: OnceLock<Mutex<HashMap<String, HostFunction>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The C source of a launcher for `k`: loops over the grid, one call per thread (with
/// `cooperative`, a cooperative reduction's blocks run their threads at once, as OpenMP
/// threads).
fn launcher_source(k: &Kernel, cooperative: bool) -> String {
    let mut args = vec![];
    for (i, t) in k.buffer_types.iter().enumerate() {
        args.push(format!("({t}*)lum_bufs[{i}]"));
    }
    let mut next = k.buffer_types.len();
    if let Some(n) = k.scalars {
        // A hand-written kernel: its own scalars after the buffers.
        args.extend((0..n).map(|i| format!("lum_scalars[{i}]")));
    }
    if k.error_flag {
        args.push(format!("(int*)lum_bufs[{next}]"));
        next += 1;
    }
    if !k.dims.is_empty() {
        args.push(format!("(const long long*)lum_bufs[{next}]"));
    }
    // The scalars: the thread count (a kernel with dims reads it from the dims table), a
    // cooperative reduction's threads per output, the kernel's offset in the dims table.
    let mut s = 0;
    let mut scalar = |args: &mut Vec<String>| {
        args.push(format!("lum_scalars[{s}]"));
        s += 1;
    };
    if k.scalars.is_none() && k.dims.is_empty() {
        scalar(&mut args);
    }
    if k.scalars.is_none() && k.cooperative {
        scalar(&mut args);
    }
    if !k.dims.is_empty() {
        scalar(&mut args);
    }
    if cooperative && k.cooperative {
        return format!(
            "void launch_{name}(unsigned grid, unsigned block, void* const* lum_bufs, const long long* lum_scalars) {{\n    omp_set_dynamic(0);\n    for (unsigned b = 0; b < grid; ++b) {{\n#pragma omp parallel num_threads(block)\n        {{\n            if (omp_get_num_threads() != (int)block) __builtin_trap();\n            gridDim.x = grid; blockDim.x = block; gridDim.y = gridDim.z = blockDim.y = blockDim.z = 1;\n            blockIdx.x = b; threadIdx.x = (unsigned)omp_get_thread_num();\n            {name}({});\n        }}\n    }}\n}}\n",
            args.join(", "),
            name = k.name
        );
    }
    format!(
        "void launch_{name}(unsigned grid, unsigned block, void* const* lum_bufs, const long long* lum_scalars) {{\n    gridDim.x = grid; blockDim.x = block; gridDim.y = gridDim.z = blockDim.y = blockDim.z = 1;\n    for (unsigned b = 0; b < grid; ++b) {{\n        blockIdx.x = b;\n        for (unsigned t = 0; t < block; ++t) {{ threadIdx.x = t; {name}({}); }}\n    }}\n}}\n",
        args.join(", "),
        name = k.name
    )
}

/// The host C source of `kernels` with their launchers.
pub fn host_source(kernels: &[&Kernel]) -> String {
    source_for(kernels, false)
}

/// [`host_source`], or the cooperative emulator's ([`HostEmulatorCooperative`]).
fn source_for(kernels: &[&Kernel], cooperative: bool) -> String {
    let mut s = String::from(prelude::HOST_PRELUDE);
    if cooperative {
        s.push_str(COOPERATIVE_PRELUDE);
    }
    s.push_str(luminal::shape::C_PRELUDE);
    s.push_str(prelude::COMMON_PRELUDE);
    s.push_str(prelude::QUANT_PRELUDE);
    for k in kernels {
        s.push_str(&k.source);
        s.push_str(&launcher_source(k, cooperative));
    }
    s
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("luminal_cuda_host_{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// Compiles `kernels` into one shared library and loads it.
fn compile_library(kernels: &[&Kernel], cooperative: bool) -> Result<Arc<libloading::Library>> {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = scratch_dir();
    let src = dir.join(format!("k{n}.c"));
    let lib = dir.join(format!("k{n}.so"));
    std::fs::write(&src, source_for(kernels, cooperative))
        .map_err(|e| LuminalError::Backend(format!("host emulator: writing {src:?}: {e}")))?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let mut cmd = Command::new(&cc);
    cmd.args([
        "-std=c11",
        "-O1",
        "-shared",
        "-fPIC",
        "-Werror=implicit-function-declaration",
    ]);
    if cooperative {
        cmd.args(["-fopenmp", "-D__CUDACC_RTC__"]);
    }
    let out = cmd
        .arg("-o")
        .arg(&lib)
        .arg(&src)
        .arg("-lm")
        .output()
        .map_err(|e| LuminalError::Backend(format!("host emulator: running {cc}: {e}")))?;
    if !out.status.success() {
        return Err(LuminalError::Backend(format!(
            "host emulator: {cc} failed on {src:?}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    // SAFETY: a library we just built from generated C; its initialisers are the C runtime's.
    let l = unsafe { libloading::Library::new(&lib) }
        .map_err(|e| LuminalError::Backend(format!("host emulator: loading {lib:?}: {e}")))?;
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&lib);
    Ok(Arc::new(l))
}

impl Executor for HostExecutor {
    type Buffer = HostBuffer;
    type Function = HostFunction;
    type Graph = Vec<Recorded>;

    fn compile(&mut self, kernels: &[&Kernel]) -> Result<Vec<HostFunction>> {
        let missing: Vec<&Kernel> = {
            let c = cache().lock().unwrap_or_else(|e| e.into_inner());
            kernels
                .iter()
                .copied()
                .filter(|k| !c.contains_key(&self.key(k)))
                .collect()
        };
        if !missing.is_empty() {
            let lib = compile_library(&missing, self.cooperative)?;
            let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
            for k in &missing {
                let sym = format!("launch_{}", k.name);
                // SAFETY: the launcher was generated with exactly this signature.
                let launcher: Launcher = unsafe {
                    *lib.get::<Launcher>(sym.as_bytes()).map_err(|e| {
                        LuminalError::Backend(format!("host emulator: symbol {sym}: {e}"))
                    })?
                };
                c.insert(
                    self.key(k),
                    HostFunction {
                        launcher,
                        serial: self.cooperative,
                        _lib: lib.clone(),
                    },
                );
            }
        }
        let c = cache().lock().unwrap_or_else(|e| e.into_inner());
        Ok(kernels.iter().map(|k| c[&self.key(k)].clone()).collect())
    }

    fn alloc(&mut self, bytes: usize) -> Result<HostBuffer> {
        Ok(HostBuffer::new(bytes))
    }

    fn upload(&mut self, data: &[u8]) -> Result<HostBuffer> {
        let mut b = self.alloc(data.len())?;
        b.bytes_mut()[..data.len()].copy_from_slice(data);
        Ok(b)
    }

    fn download(&self, buf: &HostBuffer, bytes: usize) -> Result<Vec<u8>> {
        Ok(buf.bytes()[..bytes].to_vec())
    }

    fn write(&mut self, buf: &mut HostBuffer, data: &[u8]) -> Result<()> {
        buf.bytes_mut()[..data.len()].copy_from_slice(data);
        Ok(())
    }

    fn copy(&mut self, src: &HostBuffer, dst: &mut HostBuffer, bytes: usize) -> Result<()> {
        dst.bytes_mut()[..bytes].copy_from_slice(&src.bytes()[..bytes]);
        Ok(())
    }

    fn launch(
        &mut self,
        f: &HostFunction,
        grid: u32,
        block: u32,
        buffers: &[&HostBuffer],
        scalars: &[i64],
    ) -> Result<()> {
        let r = Recorded::Launch {
            f: f.clone(),
            grid,
            block,
            buffers: buffers.iter().map(|b| b.ptr).collect(),
            scalars: scalars.to_vec(),
        };
        match self.recording.as_mut() {
            Some(rec) => rec.push(r),
            None if self.dry => {}
            None => Self::run(&r),
        }
        Ok(())
    }

    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }

    fn gemm_available(&self) -> bool {
        self.gemm
    }

    /// Attention runs through [`crate::attention::host_attention`] where products run
    /// through the emulated cuBLAS ([`HostEmulatorKernelsOnly`] keeps every kernel).
    fn attention_available(&self) -> bool {
        self.gemm
    }

    /// The cooperative emulator plans calls as on an H200 (132 multiprocessors, tensor
    /// cores): those the f16 kernel takes run it, split as a GPU splits them.
    fn plan_attention(&self, call: &mut AttnCall) {
        if self.cooperative {
            attn::launch_plan(call, EMULATED_SMS, true, true);
        }
    }

    fn attention_reads_bias(&self, call: &AttnCall) -> bool {
        if self.cooperative {
            attn::reads_bias(call, EMULATED_SMS, true, true)
        } else {
            call.has_bias != 0
        }
    }

    fn attention_scratch(&self, call: &AttnCall) -> usize {
        let mut c = *call;
        self.plan_attention(&mut c);
        4 * attn::scratch_floats(&c) as usize
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &mut self,
        call: &AttnCall,
        params: &HostBuffer,
        params_at: usize,
        out: &HostBuffer,
        q: &HostBuffer,
        k: &HostBuffer,
        v: &HostBuffer,
        bias: Option<&HostBuffer>,
        scratch: &HostBuffer,
    ) -> Result<()> {
        let mut c = *call;
        if self.cooperative {
            if let (attn::Variant::Half { dmax }, (grid, ..), threads, _) =
                attn::launch_plan(&mut c, EMULATED_SMS, true, true)
            {
                // The f16 kernel itself, as a GPU runs it (the call read from the table).
                self.half_attentions.0 += 1;
                self.half_attentions.1 += usize::from(c.causal != 0);
                self.half_attentions.2 += usize::from(c.group_rows != 0);
                // The kernels for head dims up to 64 or 128, and the combine.
                let kernels = crate::device::half_kernels();
                let f = self.compile(&[&kernels[usize::from(dmax > 64)], &kernels[2]])?;
                let at = [(params_at / 8) as i64];
                let bias = bias.unwrap_or(q);
                self.launch(
                    &f[0],
                    grid,
                    threads,
                    &[params, out, scratch, q, k, v, bias],
                    &at,
                )?;
                if c.splits > 1 {
                    let n = c.batches() * c.s * c.d;
                    let blocks = attn::cdiv(n, attn::half::COMBINE_THREADS as i64) as u32;
                    let threads = attn::half::COMBINE_THREADS;
                    self.launch(&f[1], blocks, threads, &[params, out, scratch], &at)?;
                }
                return Ok(());
            }
        }
        let r = Recorded::Attention {
            params: params.ptr,
            params_at,
            out: out.ptr,
            q: q.ptr,
            k: k.ptr,
            v: v.ptr,
            bias: bias.map_or(std::ptr::null_mut(), |b| b.ptr),
        };
        match self.recording.as_mut() {
            Some(rec) => rec.push(r),
            None if self.dry => {}
            None => Self::run(&r),
        }
        Ok(())
    }

    fn gemm_rounds_activations(&self) -> bool {
        // As the GPU's default, so the emulator tests cover the rounding path.
        self.gemm
    }

    fn cooperative_reductions(&self) -> bool {
        self.cooperative
    }

    fn skinny_mma(&self) -> bool {
        // As the GPU's default (`LUMINAL_CUDA_SKINNY_MMA=0`: off), so the emulator tests cover
        // the tensor-core kernel (its GPU branch on the cooperative emulator).
        std::env::var("LUMINAL_CUDA_SKINNY_MMA").map_or(true, |v| v != "0")
    }

    fn gemm(
        &mut self,
        call: &GemmCall,
        c: &HostBuffer,
        a: &HostBuffer,
        b: &HostBuffer,
    ) -> Result<()> {
        let r = Recorded::Gemm {
            call: *call,
            c: c.ptr,
            a: a.ptr,
            b: b.ptr,
        };
        match self.recording.as_mut() {
            Some(rec) => rec.push(r),
            None if self.dry => {}
            None => Self::run(&r),
        }
        Ok(())
    }

    fn graphs_available(&self) -> bool {
        true
    }

    fn begin_capture(&mut self) -> Result<()> {
        self.recording = Some(vec![]);
        Ok(())
    }

    fn end_capture(&mut self) -> Result<Vec<Recorded>> {
        self.recording
            .take()
            .ok_or_else(|| LuminalError::Backend("no capture in progress".into()))
    }

    fn replay(&mut self, graph: &Vec<Recorded>) -> Result<()> {
        if !self.dry {
            graph.iter().for_each(Self::run);
        }
        Ok(())
    }

    fn addr(&self, buf: &HostBuffer) -> u64 {
        buf.ptr as u64
    }
}
