//! The GPU side: device selection, NVRTC compilation, device buffers and launches (cudarc,
//! with the driver and NVRTC loaded at run time).

use crate::attention::{self as attn, AttnCall};
use crate::codegen::{self, Kernel};
use crate::error::{driver, CudaError};
use crate::gemm::{GemmCall, GemmType};
use crate::plan::{Executor, PlanRuntime};
use cudarc::cublas::{sys as cublas_sys, CudaBlas};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc;
use luminal::graph::GraphData;
use luminal::{Backend, CompileOptions, LuminalError, Result};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// The CUDA backend: one device, one stream. Cloning shares the device and the kernel cache.
#[derive(Clone)]
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: String,
    /// Compiled kernels by source text (shared by every runtime of this backend).
    cache: Arc<Mutex<HashMap<String, CudaFunction>>>,
    /// cuBLAS on the backend's stream, where the library loads (f32 products, [`crate::gemm`]).
    blas: Option<Arc<CudaBlas>>,
    /// cuBLAS's workspace (set on the handle).
    _workspace: Option<Arc<CudaSlice<u8>>>,
    /// Elementwise producers computed inside their consumers' kernels
    /// ([`crate::codegen::fused_nodes`]).
    fuse: codegen::Fusion,
    /// Attention through the flash-attention kernels ([`crate::attention`]).
    flash: bool,
    /// Multiprocessors of the device (the split-KV decision).
    sms: i64,
    /// Attention on tensor cores (3xTF32, sm_80+; `LUMINAL_CUDA_ATTENTION=simt` keeps the
    /// CUDA-core kernel).
    attn_mma: bool,
    /// Attention over f16 keys and values on f16 tensor cores ([`attn::half`]; with
    /// `attn_mma`; `LUMINAL_CUDA_ATTENTION=tf32` keeps the 3xTF32 kernel).
    attn_half: bool,
    /// Skinny products over half weights on tensor cores (sm_80+; `LUMINAL_CUDA_SKINNY_MMA=0`
    /// off): [`crate::codegen::skinny_mma_kernel`].
    skinny_mma: bool,
    /// f32 products on TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`).
    tf32: bool,
    /// f32 activations rounded to a half weight's type so cuBLAS reads the weight in place.
    half_products: bool,
    /// Steps over unchanged inputs keep their results ([`crate::plan::Executor::keeps_static_results`]).
    static_steps: bool,
    /// Reductions over long rows run several threads per output
    /// ([`crate::plan::threads_per_output`]); off: one thread per output, as the emulator.
    cooperative: bool,
    /// Generated kernels launched with programmatic dependent launch (sm_90+, unless
    /// `LUMINAL_CUDA_PDL=0`): a kernel may be launched while the one before it runs, its
    /// threads waiting at entry (`griddepcontrol.wait`, [`codegen::cuda_source`]) until that
    /// one has finished and its writes are visible, so the launch gap between dependent
    /// kernels is hidden.
    pdl: bool,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("ordinal", &self.ctx.ordinal())
            .field("arch", &self.arch)
            .field("cublas", &self.blas.is_some())
            .field("fusion", &self.fuse)
            .field("flash_attention", &self.flash)
            .field("tf32", &self.tf32)
            .field("half_products", &self.half_products)
            .field("static_steps", &self.static_steps)
            .field("cooperative_reductions", &self.cooperative)
            .finish()
    }
}

/// Whether the CUDA driver library can be loaded on this machine.
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether NVRTC can be loaded on this machine.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { nvrtc::sys::is_culib_present() }
}

impl CudaBackend {
    /// Opens device `ordinal`. Fails with a typed error when there is no driver, no NVRTC,
    /// or no such device; never panics for a missing library. Elementwise fusion is on
    /// unless the environment sets `LUMINAL_CUDA_FUSION=0` (`=broadcast` fuses through
    /// broadcasts too; for comparisons through the CLI). f32 products use TF32 tensor cores
    /// only with `LUMINAL_CUDA_TF32=1` ([`CudaBackend::with_tf32`]); products of f32
    /// activations with an f16/bf16 weight round the activations to the weight's type
    /// unless `LUMINAL_CUDA_HALF_PRODUCTS=0` ([`CudaBackend::without_half_products`]).
    pub fn new(ordinal: usize) -> std::result::Result<CudaBackend, CudaError> {
        if !driver_available() {
            return Err(CudaError::DriverNotFound);
        }
        if !nvrtc_available() {
            return Err(CudaError::NvrtcNotFound);
        }
        let ctx =
            CudaContext::new(ordinal).map_err(|source| CudaError::Device { ordinal, source })?;
        let cc = ctx
            .compute_capability()
            .map_err(|source| CudaError::Device { ordinal, source })?;
        // One stream of our own (the legacy default stream cannot be captured into a graph).
        // Every buffer is used on this stream only, so cudarc's cross-stream event tracking
        // (which a second stream turns on) is not needed.
        // SAFETY: no buffer of this context is ever used on another stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|source| CudaError::Device { ordinal, source })?;
        // SAFETY: only tries to dlopen the library by its usual names.
        let blas = unsafe { cudarc::cublas::sys::is_culib_present() }
            .then(|| CudaBlas::new(stream.clone()).ok())
            .flatten()
            .map(Arc::new);
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_or(132, |n| n as i64);
        // cuBLAS's workspace given up front (32 MiB, NVIDIA's advice for Hopper), so that a
        // product recorded into a CUDA graph never allocates.
        let workspace = match &blas {
            Some(b) => {
                let ws = stream
                    .alloc_zeros::<u8>(32 << 20)
                    .map_err(|source| CudaError::Device { ordinal, source })?;
                let ptr = ws.device_ptr(&stream).0;
                // SAFETY: the workspace outlives the handle's use (kept in the backend).
                unsafe {
                    cublas_sys::cublasSetWorkspace_v2(*b.handle(), ptr as *mut c_void, 32 << 20)
                };
                Some(Arc::new(ws))
            }
            None => None,
        };
        Ok(CudaBackend {
            ctx,
            stream,
            arch: codegen::nvrtc_arch(cc),
            cache: Arc::default(),
            blas,
            _workspace: workspace,
            fuse: codegen::Fusion::from_env(),
            flash: std::env::var("LUMINAL_CUDA_ATTENTION").map_or(true, |v| v != "0"),
            sms,
            attn_mma: cc.0 >= 8
                && std::env::var("LUMINAL_CUDA_ATTENTION").map_or(true, |v| v != "simt"),
            attn_half: std::env::var("LUMINAL_CUDA_ATTENTION").map_or(true, |v| v != "tf32"),
            skinny_mma: cc.0 >= 8
                && std::env::var("LUMINAL_CUDA_SKINNY_MMA").map_or(true, |v| v != "0"),
            tf32: std::env::var("LUMINAL_CUDA_TF32").is_ok_and(|v| v == "1"),
            half_products: std::env::var("LUMINAL_CUDA_HALF_PRODUCTS").map_or(true, |v| v != "0"),
            static_steps: true,
            cooperative: std::env::var("LUMINAL_CUDA_COOP").map_or(true, |v| v != "0"),
            // Programmatic launches recorded into CUDA graphs need a 12.3 driver or newer.
            pdl: cc.0 >= 9
                && driver_version() >= 12030
                && std::env::var("LUMINAL_CUDA_PDL").map_or(true, |v| v != "0"),
        })
    }

    /// f32 products on TF32 tensor cores (10-bit mantissa products, f32 accumulation; like
    /// `torch.backends.cuda.matmul.allow_tf32 = True`).
    pub fn with_tf32(mut self) -> CudaBackend {
        self.tf32 = true;
        self
    }

    /// Every step runs on every run, even over inputs that were not set again (for
    /// benchmarks that time repeated runs of the same product; `LUMINAL_CUDA_STATIC=0` does
    /// the same for any backend).
    pub fn without_static_steps(mut self) -> CudaBackend {
        self.static_steps = false;
        self
    }

    /// Products of f32 activations with an f16/bf16 weight widen the weight to f32 (a cast
    /// kernel and an f32 copy each run) instead of rounding the activations to the weight's
    /// type.
    pub fn without_half_products(mut self) -> CudaBackend {
        self.half_products = false;
        self
    }

    /// Products as the generated multiply and sum-reduce kernels instead of cuBLAS.
    pub fn without_cublas(mut self) -> CudaBackend {
        self.blas = None;
        self
    }

    /// Attention as the primop kernels instead of the flash-attention kernels (also
    /// `LUMINAL_CUDA_ATTENTION=0` in the environment).
    pub fn without_flash_attention(mut self) -> CudaBackend {
        self.flash = false;
        self
    }

    /// Attention on the CUDA-core flash kernel instead of the tensor-core one (also
    /// `LUMINAL_CUDA_ATTENTION=simt`; for comparison).
    pub fn without_attention_mma(mut self) -> CudaBackend {
        self.attn_mma = false;
        self
    }

    /// Attention over f16 keys and values on the 3xTF32 tensor-core kernel instead of the
    /// f16 one (also `LUMINAL_CUDA_ATTENTION=tf32`; for comparison).
    pub fn without_half_attention(mut self) -> CudaBackend {
        self.attn_half = false;
        self
    }

    /// Skinny products over half weights on the CUDA-core kernel instead of the tensor-core
    /// one (also `LUMINAL_CUDA_SKINNY_MMA=0`; for comparison).
    pub fn without_skinny_mma(mut self) -> CudaBackend {
        self.skinny_mma = false;
        self
    }

    /// Whether attention runs through the flash-attention kernels ([`crate::attention`]).
    pub fn flash_attention(&self) -> bool {
        self.flash
    }

    /// One kernel and one buffer per node: no elementwise fusion (for comparison).
    pub fn without_fusion(mut self) -> CudaBackend {
        self.fuse = codegen::Fusion::Off;
        self
    }

    /// The backend with fusion `mode`.
    pub fn with_fusion(mut self, mode: codegen::Fusion) -> CudaBackend {
        self.fuse = mode;
        self
    }

    /// Reductions with one thread per output, looping over the reduced axis (the order the
    /// host emulator sums in; for comparison). `LUMINAL_CUDA_COOP=0` does the same.
    pub fn without_cooperative_reductions(mut self) -> CudaBackend {
        self.cooperative = false;
        self
    }

    /// Times `reps` device-to-device copies of `bytes` bytes on the backend's stream (after
    /// one warm-up), each waited for: seconds per copy. A copy reads and writes `bytes`, so
    /// `2 · bytes / seconds` is the bandwidth to compare kernels' read + written bytes with.
    pub fn copy_times(&self, bytes: usize, reps: usize) -> Result<Vec<f64>> {
        let src = self
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(driver("cuMemAlloc"))?;
        let mut dst = self
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(driver("cuMemAlloc"))?;
        let mut times = Vec::with_capacity(reps);
        for i in 0..=reps {
            let t = std::time::Instant::now();
            self.stream
                .memcpy_dtod(&src, &mut dst)
                .map_err(driver("cuMemcpyDtoD"))?;
            self.stream
                .synchronize()
                .map_err(driver("cuStreamSynchronize"))?;
            if i > 0 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        Ok(times)
    }

    /// Whether elementwise producers are fused into their consumers' kernels.
    pub fn fusion(&self) -> bool {
        self.fuse != codegen::Fusion::Off
    }

    /// Whether f32 products go to cuBLAS (the library loaded).
    pub fn has_cublas(&self) -> bool {
        self.blas.is_some()
    }

    /// The NVRTC architecture of the device (`compute_90` on Hopper).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The device's name (e.g. "NVIDIA H100 80GB HBM3").
    pub fn device_name(&self) -> Result<String> {
        self.ctx.name().map_err(driver("cuDeviceGetName"))
    }
}

/// The plan's runtime on a GPU.
pub type CudaRuntime = PlanRuntime<CudaExecutor>;

impl Backend for CudaBackend {
    type Runtime = CudaRuntime;
    fn compile(&self, graph: GraphData, _: &CompileOptions) -> Result<CudaRuntime> {
        PlanRuntime::with_fusion(
            graph,
            CudaExecutor {
                backend: self.clone(),
            },
            self.fuse,
        )
    }
}

/// A captured run (an instantiated CUDA graph), owned by one runtime.
pub struct DeviceGraph(CudaGraph);

// SAFETY: a graph is used by the runtime that owns it, from one thread at a time (the runtime
// is moved between threads, never shared: its methods take `&mut self`); CUDA only forbids
// concurrent use of a graph object.
unsafe impl Send for DeviceGraph {}

/// Device memory and launches on the backend's stream.
pub struct CudaExecutor {
    backend: CudaBackend,
}

impl CudaExecutor {
    /// The attention kernel `name`: of [`attn::CUDA_SOURCE`] (the tiled kernels allowed
    /// their shared memory), or of the f16 kernels ([`half_kernels`]).
    fn attention_function(&self, name: &str) -> Result<CudaFunction> {
        if name == HALF_NAMES[2] {
            // The split-KV combine of every kernel, a module of its own (any architecture).
            let source = || codegen::cuda_source(&half_kernels()[2..]);
            return self.module_function(
                name,
                "attention combine",
                source,
                &HALF_NAMES[2..],
                |_| None,
            );
        }
        if HALF_NAMES.contains(&name) {
            let dmax = |n: &str| n.strip_prefix("lum_attn_h16_")?.parse::<i64>().ok();
            return self.module_function(
                name,
                "f16 attention",
                || codegen::cuda_source(&half_kernels()[..2]),
                &HALF_NAMES[..2],
                |n| dmax(n).map(|d| attn::half::shared_bytes(d) as i64),
            );
        }
        let smem = |n: &str, prefix: &str| {
            n.strip_prefix(prefix)?
                .split('_')
                .next()?
                .parse::<i64>()
                .ok()
        };
        self.module_function(
            name,
            "attention",
            || attn::CUDA_SOURCE.to_string(),
            &attn::KERNEL_NAMES,
            |n| {
                smem(n, "lum_attn_tiled_")
                    .map(attn::shared_bytes)
                    .or_else(|| smem(n, "lum_attn_mma_").map(attn::mma_shared_bytes))
            },
        )
    }

    /// Kernel `name` of a hand-written module: `source` compiled with one NVRTC call on first
    /// use, its entry points `names` (each allowed `smem(name)` bytes of dynamic shared memory)
    /// cached with the backend's kernels under `tag` (the sources do not vary in a process).
    fn module_function(
        &self,
        name: &str,
        tag: &str,
        source: impl FnOnce() -> String,
        names: &[&str],
        smem: impl Fn(&str) -> Option<i64>,
    ) -> Result<CudaFunction> {
        let key = |n: &str| format!("// {tag}: {n}");
        if let Some(f) = self
            .backend
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key(name))
        {
            return Ok(f.clone());
        }
        let ptx = nvrtc_compile(&source(), &self.backend.arch, || tag.into())?;
        let module = self
            .backend
            .ctx
            .load_module(ptx)
            .map_err(driver("cuModuleLoadData"))?;
        let mut c = self.backend.cache.lock().unwrap_or_else(|e| e.into_inner());
        for &n in names {
            let f = module
                .load_function(n)
                .map_err(driver("cuModuleGetFunction"))?;
            if let Some(bytes) = smem(n) {
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32,
                )
                .map_err(driver("cuFuncSetAttribute"))?;
            }
            c.insert(key(n), f);
        }
        c.get(&key(name))
            .cloned()
            .ok_or_else(|| LuminalError::Backend(format!("no {tag} kernel {name}")))
    }

    /// Compiles `kernels` with one NVRTC call into one module (a model's plan has hundreds of
    /// kernels; one call per kernel spent most of a compile re-parsing the prelude).
    fn compile_module(&self, kernels: &[&Kernel]) -> Result<Vec<CudaFunction>> {
        let src = codegen::cuda_source(kernels.iter().copied());
        let ptx = nvrtc_compile(&src, &self.backend.arch, || kernel_names(kernels))?;
        let module = self
            .backend
            .ctx
            .load_module(ptx)
            .map_err(driver("cuModuleLoadData"))?;
        kernels
            .iter()
            .map(|k| {
                module
                    .load_function(&k.name)
                    .map_err(driver("cuModuleGetFunction"))
            })
            .collect()
    }
}

impl Executor for CudaExecutor {
    type Buffer = CudaSlice<u8>;
    type Function = CudaFunction;
    type Graph = DeviceGraph;

    fn graphs_available(&self) -> bool {
        true
    }

    fn begin_capture(&mut self) -> Result<()> {
        self.backend
            .stream
            .begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .map_err(driver("cuStreamBeginCapture"))
    }

    fn end_capture(&mut self) -> Result<DeviceGraph> {
        self.backend
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
            .map_err(driver("cuStreamEndCapture"))?
            .map(DeviceGraph)
            .ok_or_else(|| LuminalError::Backend("the captured CUDA graph is empty".into()))
    }

    fn replay(&mut self, graph: &DeviceGraph) -> Result<()> {
        graph.0.launch().map_err(driver("cuGraphLaunch"))
    }

    fn addr(&self, buf: &CudaSlice<u8>) -> u64 {
        buf.device_ptr(&self.backend.stream).0
    }

    fn compile(&mut self, kernels: &[&Kernel]) -> Result<Vec<CudaFunction>> {
        let cache = self.backend.cache.clone();
        let missing: Vec<&Kernel> = {
            let c = cache.lock().unwrap_or_else(|e| e.into_inner());
            let mut seen = std::collections::HashSet::new();
            kernels
                .iter()
                .copied()
                .filter(|k| !c.contains_key(&k.source) && seen.insert(&k.source))
                .collect()
        };
        if !missing.is_empty() {
            let functions = self.compile_module(&missing)?;
            let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
            for (k, f) in missing.iter().zip(functions) {
                c.insert(k.source.clone(), f);
            }
        }
        let c = cache.lock().unwrap_or_else(|e| e.into_inner());
        Ok(kernels.iter().map(|k| c[&k.source].clone()).collect())
    }

    fn alloc(&mut self, bytes: usize) -> Result<CudaSlice<u8>> {
        self.backend
            .stream
            .alloc_zeros::<u8>(bytes.max(8))
            .map_err(driver("cuMemAlloc"))
    }

    fn upload(&mut self, data: &[u8]) -> Result<CudaSlice<u8>> {
        if data.is_empty() {
            return self.alloc(8);
        }
        self.backend
            .stream
            .clone_htod(data)
            .map_err(driver("cuMemcpyHtoD"))
    }

    fn download(&self, buf: &CudaSlice<u8>, bytes: usize) -> Result<Vec<u8>> {
        if bytes == 0 {
            return Ok(vec![]);
        }
        let mut out = vec![0u8; bytes];
        self.backend
            .stream
            .memcpy_dtoh(&buf.slice(..bytes), &mut out)
            .map_err(driver("cuMemcpyDtoH"))?;
        self.backend
            .stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))?;
        Ok(out)
    }

    fn write(&mut self, buf: &mut CudaSlice<u8>, data: &[u8]) -> Result<()> {
        self.backend
            .stream
            .memcpy_htod(data, &mut buf.slice_mut(..data.len()))
            .map_err(driver("cuMemcpyHtoD"))
    }

    fn copy(&mut self, src: &CudaSlice<u8>, dst: &mut CudaSlice<u8>, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.backend
            .stream
            .memcpy_dtod(&src.slice(..bytes), &mut dst.slice_mut(..bytes))
            .map_err(driver("cuMemcpyDtoD"))
    }

    fn launch(
        &mut self,
        f: &CudaFunction,
        grid: u32,
        block: u32,
        buffers: &[&CudaSlice<u8>],
        scalars: &[i64],
    ) -> Result<()> {
        let stream = &self.backend.stream;
        if self.backend.pdl {
            return launch_dependent(stream, f, (grid, block), buffers, scalars);
        }
        let mut args = stream.launch_builder(f);
        for b in buffers {
            args.arg(*b);
        }
        for s in scalars {
            args.arg(s);
        }
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the generated kernel's parameters in number, order and
        // type (buffers as pointers, scalars as `long long`), as the plan builds them from the
        // kernel's description; every buffer holds the elements the kernel indexes (sized from
        // the same shapes at this run's dims).
        unsafe { args.launch(cfg) }
            .map(|_| ())
            .map_err(driver("cuLaunchKernel"))
    }

    fn synchronize(&mut self) -> Result<()> {
        self.backend
            .stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }

    fn gemm_available(&self) -> bool {
        self.backend.blas.is_some()
    }

    fn attention_available(&self) -> bool {
        self.backend.flash
    }

    fn attention_scratch(&self, call: &AttnCall) -> usize {
        let mut c = *call;
        self.plan_attention(&mut c);
        4 * attn::scratch_floats(&c) as usize
    }

    fn plan_attention(&self, call: &mut AttnCall) {
        let b = &self.backend;
        attn::launch_plan(call, b.sms, b.attn_mma, b.attn_half);
    }

    fn attention_reads_bias(&self, call: &AttnCall) -> bool {
        let b = &self.backend;
        attn::reads_bias(call, b.sms, b.attn_mma, b.attn_half)
    }

    fn prepare_attention(&mut self) -> Result<()> {
        self.attention_function(attn::KERNEL_NAMES[0])?;
        self.attention_function(HALF_NAMES[2])?;
        if self.backend.attn_mma && self.backend.attn_half {
            self.attention_function(HALF_NAMES[0])?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &mut self,
        call: &AttnCall,
        params: &CudaSlice<u8>,
        params_at: usize,
        out: &CudaSlice<u8>,
        q: &CudaSlice<u8>,
        k: &CudaSlice<u8>,
        v: &CudaSlice<u8>,
        bias: Option<&CudaSlice<u8>>,
        scratch: &CudaSlice<u8>,
    ) -> Result<()> {
        let mut c = *call;
        let b = &self.backend;
        let (variant, grid, threads, smem) =
            attn::launch_plan(&mut c, b.sms, b.attn_mma, b.attn_half);
        let half = matches!(variant, attn::Variant::Half { .. });
        let name = attn::kernel_name(&c, variant)
            .ok_or_else(|| LuminalError::Backend("attention: k and v dtypes differ".into()))?;
        let f = self.attention_function(&name)?;
        // Sized by the plan from `attention_scratch` (the same launch plan).
        let part = scratch;
        let bias = bias.unwrap_or(q);
        let stream = self.backend.stream.clone();
        // The call in the parameter table (written by the plan before the run).
        debug_assert_eq!(&c, call, "the plan writes planned calls");
        let pp: u64 = params.device_ptr(&stream).0 + params_at as u64;
        let mut args = stream.launch_builder(&f);
        args.arg(&pp);
        args.arg(out);
        args.arg(part);
        args.arg(q);
        args.arg(k);
        args.arg(v);
        args.arg(bias);
        // The f16 kernels read the call at a word offset from the pointer (here 0).
        let at = 0i64;
        if half {
            args.arg(&at);
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: the arguments are the entry point's parameters in order (a pointer to the
        // call in the parameter table, `#[repr(C)]` i64 fields as `LumAttnParams` declares
        // them, then six pointers); the plan resolved the call from the operands' views at this run's dims,
        // so the kernel reads only elements of q, k, v and the bias those views address, and
        // writes `out` (`[batch.., s, d]`, the output node's buffer) and the scratch buffer
        // (sized by `scratch_floats` for this call's split).
        unsafe { args.launch(cfg) }.map_err(driver("cuLaunchKernel"))?;
        if c.splits > 1 {
            let combine = self.attention_function(HALF_NAMES[2])?;
            let n = c.batches() * c.s * c.d;
            let mut args = stream.launch_builder(&combine);
            args.arg(&pp);
            args.arg(out);
            args.arg(part);
            args.arg(&at);
            let threads = attn::half::COMBINE_THREADS;
            let cfg = LaunchConfig {
                grid_dim: (attn::cdiv(n, threads as i64) as u32, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: as above: the combine reads the partial results the first kernel wrote
            // in the scratch buffer and writes the `batch·s·d` outputs.
            unsafe { args.launch(cfg) }.map_err(driver("cuLaunchKernel"))?;
        }
        Ok(())
    }

    fn gemm_rounds_activations(&self) -> bool {
        self.backend.half_products
    }

    fn keeps_static_results(&self) -> bool {
        self.backend.static_steps
    }

    fn cooperative_reductions(&self) -> bool {
        self.backend.cooperative
    }

    fn skinny_mma(&self) -> bool {
        self.backend.skinny_mma
    }

    fn gemm(
        &mut self,
        g: &GemmCall,
        c: &CudaSlice<u8>,
        a: &CudaSlice<u8>,
        b: &CudaSlice<u8>,
    ) -> Result<()> {
        let blas = self
            .backend
            .blas
            .as_ref()
            .ok_or_else(|| LuminalError::Backend("cuBLAS is not loaded".into()))?;
        // cuBLAS runs in the calling thread's current context.
        self.backend
            .ctx
            .bind_to_thread()
            .map_err(driver("cuCtxSetCurrent"))?;
        let stream = &self.backend.stream;
        let (pa, _ra) = a.device_ptr(stream);
        let (pb, _rb) = b.device_ptr(stream);
        let (pc, _rc) = c.device_ptr(stream);
        let at =
            |p: u64, off: i64, t: GemmType| (p + (t.size() as i64 * off) as u64) as *mut c_void;
        let op = |t: bool| {
            if t {
                cublas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                cublas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let ty = |t: GemmType| match t {
            GemmType::F32 => cublas_sys::cudaDataType::CUDA_R_32F,
            GemmType::F16 => cublas_sys::cudaDataType::CUDA_R_16F,
            GemmType::BF16 => cublas_sys::cudaDataType::CUDA_R_16BF,
        };
        let all_f32 = [g.a_type, g.b_type, g.c_type] == [GemmType::F32; 3];
        let compute = if all_f32 && self.backend.tf32 {
            cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: the plan resolved the call from the operands' views at this run's dims: it
        // addresses only elements those views read (inside `a` and `b`, in the types the
        // buffers hold) and C's `M·N·batch` values (inside `c`, sized for the reduction's
        // output); the handle is bound to this stream, so the call is ordered after the
        // kernels that wrote A and B. Compute type 32F takes f32 `alpha`/`beta`.
        unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                *blas.handle(),
                op(g.trans_a),
                op(g.trans_b),
                g.m,
                g.n,
                g.k,
                &alpha as *const f32 as *const c_void,
                at(pa, g.offset_a, g.a_type),
                ty(g.a_type),
                g.lda,
                g.stride_a,
                at(pb, g.offset_b, g.b_type),
                ty(g.b_type),
                g.ldb,
                g.stride_b,
                &beta as *const f32 as *const c_void,
                at(pc, g.offset_c, g.c_type),
                ty(g.c_type),
                g.ldc,
                g.stride_c,
                g.batch,
                compute,
                cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| LuminalError::Backend(format!("cublasGemmStridedBatchedEx: {e:?}")))
    }
}

/// Compiles a whole CUDA source (e.g. [`crate::attention::CUDA_SOURCE`]) with NVRTC for
/// `arch` and returns the PTX, without a GPU.
pub fn nvrtc_source_ptx(src: &str, arch: &str) -> Result<String> {
    if !nvrtc_available() {
        return Err(CudaError::NvrtcNotFound.into());
    }
    nvrtc_compile(src, arch, || "source".into()).map(|p| p.to_src())
}

/// Compiles `kernels` (one module, as a plan's are) with NVRTC for `arch` (`compute_90`) and
/// returns the PTX: checks that NVRTC accepts generated sources on a machine with NVRTC but
/// no GPU (no driver is needed).
pub fn nvrtc_ptx(kernels: &[&Kernel], arch: &str) -> Result<String> {
    if !nvrtc_available() {
        return Err(CudaError::NvrtcNotFound.into());
    }
    let src = codegen::cuda_source(kernels.iter().copied());
    nvrtc_compile(&src, arch, || kernel_names(kernels)).map(|p| p.to_src())
}

/// The CUDA version the driver supports (`12030` for 12.3; 0 where it cannot say).
fn driver_version() -> i32 {
    let mut v = 0;
    // SAFETY: writes one int; the driver library is loaded (checked by `new`).
    let ok = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }.result();
    if ok.is_ok() {
        v
    } else {
        0
    }
}

/// A generated kernel's launch on `stream` with programmatic stream serialization allowed
/// (`cuLaunchKernelEx`): it may start while the kernel before it runs; every generated
/// kernel waits at entry for its predecessor ([`codegen::cuda_source`]).
fn launch_dependent(
    stream: &CudaStream,
    f: &CudaFunction,
    (grid, block): (u32, u32),
    buffers: &[&CudaSlice<u8>],
    scalars: &[i64],
) -> Result<()> {
    use cudarc::driver::sys;
    let pointers: Vec<sys::CUdeviceptr> = buffers.iter().map(|b| b.device_ptr(stream).0).collect();
    let mut params: Vec<*mut c_void> = pointers
        .iter()
        .map(|p| p as *const sys::CUdeviceptr as *mut c_void)
        .chain(scalars.iter().map(|s| s as *const i64 as *mut c_void))
        .collect();
    // SAFETY: a zeroed attribute value is a valid union of plain integers; the id names the
    // member set.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    stream
        .context()
        .bind_to_thread()
        .map_err(driver("cuCtxSetCurrent"))?;
    // SAFETY: `params` points at one value per kernel parameter, in order (buffers as device
    // pointers, scalars as `long long`), alive across the call, as `launch` builds them;
    // every buffer holds the elements the kernel indexes.
    unsafe {
        sys::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(driver("cuLaunchKernelEx"))
}

/// NVRTC's PTX of `src` for `arch` (`compute_90`); a failure is a typed error naming `what`
/// (the kernels) with NVRTC's log.
fn nvrtc_compile(src: &str, arch: &str, what: impl FnOnce() -> String) -> Result<nvrtc::Ptx> {
    let opts = nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture={arch}")],
        ..Default::default()
    };
    nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| {
        let log = match &e {
            nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into(),
            other => format!("{other:?}"),
        };
        LuminalError::from(CudaError::Nvrtc {
            kernel: what(),
            arch: arch.to_string(),
            log,
        })
    })
}

fn kernel_names(kernels: &[&Kernel]) -> String {
    kernels
        .iter()
        .map(|k| k.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The f16 attention's kernels ([`attn::half`]): head dims up to 64, up to 128, and the
/// split-KV combine every attention kernel uses (a module of its own).
pub fn half_kernels() -> &'static [codegen::Kernel; 3] {
    static KERNELS: std::sync::OnceLock<[codegen::Kernel; 3]> = std::sync::OnceLock::new();
    KERNELS.get_or_init(|| {
        [
            attn::half::kernel(64),
            attn::half::kernel(128),
            attn::half::combine_kernel(),
        ]
    })
}

/// The names of [`half_kernels`], in order.
const HALF_NAMES: [&str; 3] = ["lum_attn_h16_64", "lum_attn_h16_128", "lum_attn_combine"];
