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

use crate::attention::AttnCall;
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

/// The plan's runtime on the host emulator.
pub type HostRuntime = PlanRuntime<HostExecutor>;

/// A backend that compiles the CUDA backend's plan for the host emulator, products through
/// the emulated cuBLAS ([`crate::gemm::host_gemm`]) as `CudaBackend` runs them.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostEmulatorBackend;

impl Backend for HostEmulatorBackend {
    type Runtime = HostRuntime;
    fn compile(&self, graph: GraphData, _: &CompileOptions) -> Result<HostRuntime> {
        PlanRuntime::new(graph, HostExecutor { gemm: true })
    }
}

/// The host emulator with one kernel and one buffer per node (no elementwise fusion), as
/// `CudaBackend::without_fusion` runs; products through the emulated cuBLAS.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostEmulatorUnfused;

impl Backend for HostEmulatorUnfused {
    type Runtime = HostRuntime;
    fn compile(&self, graph: GraphData, _: &CompileOptions) -> Result<HostRuntime> {
        PlanRuntime::with_fusion(graph, HostExecutor { gemm: true }, Fusion::Off)
    }
}

/// The host emulator without cuBLAS: products run as the generated multiply and sum-reduce
/// kernels (as `CudaBackend::without_cublas` and machines without cuBLAS run them).
#[derive(Clone, Copy, Debug, Default)]
pub struct HostEmulatorKernelsOnly;

impl Backend for HostEmulatorKernelsOnly {
    type Runtime = HostRuntime;
    fn compile(&self, graph: GraphData, _: &CompileOptions) -> Result<HostRuntime> {
        PlanRuntime::new(graph, HostExecutor { gemm: false })
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
    _lib: Arc<libloading::Library>,
}

/// Runs the kernels on the CPU (see the module docs).
pub struct HostExecutor {
    gemm: bool,
}

impl HostExecutor {
    /// An executor running products through the emulated cuBLAS (`gemm`) or as kernels.
    pub fn new(gemm: bool) -> HostExecutor {
        HostExecutor { gemm }
    }
}

fn cache() -> &'static Mutex<HashMap<String, HostFunction>> {
    static CACHE: OnceLock<Mutex<HashMap<String, HostFunction>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The C source of a launcher for `k`: loops over the grid, one call per thread.
fn launcher_source(k: &Kernel) -> String {
    let mut args = vec![];
    for (i, t) in k.buffer_types.iter().enumerate() {
        args.push(format!("({t}*)lum_bufs[{i}]"));
    }
    if k.error_flag {
        args.push(format!("(int*)lum_bufs[{}]", k.buffer_types.len()));
    }
    for i in 0..=k.dims.len() {
        args.push(format!("lum_scalars[{i}]"));
    }
    format!(
        "void launch_{name}(unsigned grid, unsigned block, void* const* lum_bufs, const long long* lum_scalars) {{\n    gridDim.x = grid; blockDim.x = block; gridDim.y = gridDim.z = blockDim.y = blockDim.z = 1;\n    for (unsigned b = 0; b < grid; ++b) {{\n        blockIdx.x = b;\n        for (unsigned t = 0; t < block; ++t) {{ threadIdx.x = t; {name}({}); }}\n    }}\n}}\n",
        args.join(", "),
        name = k.name
    )
}

/// The host C source of `kernels` with their launchers.
pub fn host_source(kernels: &[&Kernel]) -> String {
    let mut s = String::from(prelude::HOST_PRELUDE);
    s.push_str(luminal::shape::C_PRELUDE);
    s.push_str(prelude::COMMON_PRELUDE);
    s.push_str(prelude::QUANT_PRELUDE);
    for k in kernels {
        s.push_str(&k.source);
        s.push_str(&launcher_source(k));
    }
    s
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("luminal_cuda_host_{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// Compiles `kernels` into one shared library and loads it.
fn compile_library(kernels: &[&Kernel]) -> Result<Arc<libloading::Library>> {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = scratch_dir();
    let src = dir.join(format!("k{n}.c"));
    let lib = dir.join(format!("k{n}.so"));
    std::fs::write(&src, host_source(kernels))
        .map_err(|e| LuminalError::Backend(format!("host emulator: writing {src:?}: {e}")))?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = Command::new(&cc)
        .args([
            "-std=c11",
            "-O1",
            "-shared",
            "-fPIC",
            "-Werror=implicit-function-declaration",
        ])
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

    fn compile(&mut self, kernels: &[&Kernel]) -> Result<Vec<HostFunction>> {
        let missing: Vec<&Kernel> = {
            let c = cache().lock().unwrap_or_else(|e| e.into_inner());
            kernels
                .iter()
                .copied()
                .filter(|k| !c.contains_key(&k.source))
                .collect()
        };
        if !missing.is_empty() {
            let lib = compile_library(&missing)?;
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
                    k.source.clone(),
                    HostFunction {
                        launcher,
                        _lib: lib.clone(),
                    },
                );
            }
        }
        let c = cache().lock().unwrap_or_else(|e| e.into_inner());
        Ok(kernels.iter().map(|k| c[&k.source].clone()).collect())
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
        let ptrs: Vec<*mut std::ffi::c_void> = buffers
            .iter()
            .map(|b| b.ptr as *mut std::ffi::c_void)
            .collect();
        // SAFETY: the launcher reads `buffers.len()` pointers and `scalars.len()` scalars, the
        // numbers the kernel was generated with (the plan passes them in that order); the
        // kernels index the buffers within the element counts they were allocated for (the
        // emulator tests compare every result with the reference runtime).
        unsafe { (f.launcher)(grid, block, ptrs.as_ptr(), scalars.as_ptr()) };
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

    fn attention(
        &mut self,
        call: &AttnCall,
        out: &HostBuffer,
        q: &HostBuffer,
        k: &HostBuffer,
        v: &HostBuffer,
        bias: Option<&HostBuffer>,
    ) -> Result<()> {
        // SAFETY: the plan resolved `call` from the operands' views at this run's dims, so it
        // addresses elements of q, k, v and the bias within their buffers, and `out` holds the
        // output node's `batch·s·d` values.
        unsafe {
            crate::attention::host_attention(
                call,
                out.ptr as *mut f32,
                q.ptr as *const f32,
                k.ptr as *const u8,
                v.ptr as *const u8,
                bias.map_or(std::ptr::null(), |b| b.ptr as *const f32),
            )
        };
        Ok(())
    }

    fn gemm(
        &mut self,
        call: &GemmCall,
        c: &HostBuffer,
        a: &HostBuffer,
        b: &HostBuffer,
    ) -> Result<()> {
        // SAFETY: the plan resolved `call` from the operands' views at this run's dims, so it
        // addresses the elements those views read (within the buffers) and C's `M·N·batch`.
        unsafe {
            crate::gemm::host_gemm(
                call,
                a.ptr as *const f32,
                b.ptr as *const f32,
                c.ptr as *mut f32,
            )
        };
        Ok(())
    }
}
