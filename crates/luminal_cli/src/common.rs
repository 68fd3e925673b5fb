//! What the subcommands share: the error type, model loading with a progress bar, and
//! number formatting.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use luminal_cpu::{CpuBackend, CpuRuntime};
use luminal_cuda::{CudaBackend, CudaRuntime};
use luminal_io::IoError;
use luminal_models::llama::LoadStats;
use luminal_models::{CacheType, LlamaModel, LoadOptions, Model, ModelError, Tokenizer};
use std::fmt;
use std::path::Path;

/// Any failure of a subcommand; printed as one `error: …` line.
pub struct CliError(Box<dyn std::error::Error + Send + Sync>);

impl<E: std::error::Error + Send + Sync + 'static> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError(Box::new(e))
    }
}

impl CliError {
    /// An error with a plain message.
    pub fn msg(message: impl Into<String>) -> Self {
        CliError(message.into().into())
    }

    /// The message on one line (multi-line messages, such as a chat template's render
    /// error, are joined with " | ").
    pub fn one_line(&self) -> String {
        // The library speaks of its options; on the command line the option is a flag.
        let text = match self.0.downcast_ref::<ModelError>() {
            Some(ModelError::ContextFull { needed, max }) => format!(
                "context is full: {needed} tokens needed but the context holds {max} (use a larger --ctx)"
            ),
            _ => self.0.to_string(),
        };
        let mut line = text
            .lines()
            .map(str::trim_end)
            .filter(|l| !l.trim().is_empty())
            .collect::<Vec<_>>()
            .join(" | ");
        if let Some(hint) = self.hint() {
            line.push_str(hint);
        }
        line
    }

    /// What a reader error most likely means, when its message does not say.
    fn hint(&self) -> Option<&'static str> {
        let io = match self.0.downcast_ref::<ModelError>() {
            Some(ModelError::Io(io)) => io,
            _ => self.0.downcast_ref::<IoError>()?,
        };
        // A count in the header that the rest of the file cannot hold: the file was cut
        // short inside its header (or is corrupt).
        matches!(io.root(), IoError::ImplausibleCount { .. })
            .then_some(" (the file is truncated or corrupt)")
    }

    /// Whether stdout was closed under us (`luminal generate … | head`): not a failure.
    pub fn is_broken_pipe(&self) -> bool {
        self.0
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

impl fmt::Debug for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

pub type CliResult<T = ()> = Result<T, CliError>;

/// The device a model runs on (`--device`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    /// The CPU backend (`luminal_cpu`).
    #[default]
    Cpu,
    /// The CUDA backend (`luminal_cuda`) on GPU 0: needs the NVIDIA driver and NVRTC.
    Cuda,
}

impl Device {
    /// Fails for the subcommands that run only on the CPU backend.
    pub fn require_cpu(self, command: &str) -> CliResult {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda => Err(CliError::msg(format!(
                "`{command}` runs on the CPU only for now: --device cuda is supported by generate, chat, serve, bench and perplexity"
            ))),
        }
    }
}

/// The CUDA backend on GPU 0, or a clear error where there is no driver, NVRTC or device.
pub fn cuda_backend() -> CliResult<CudaBackend> {
    CudaBackend::new(0).map_err(|e| CliError::msg(format!("--device cuda: {e}")))
}

/// A Llama-family model on the device that `--device` chose. A call is one `match` and
/// then the backend's own code: the CPU path runs exactly as `LlamaModel<CpuRuntime>`.
/// (A process holds one and moves it a few times: no variant is boxed, so neither pays a
/// pointer chase per call.)
#[allow(clippy::large_enum_variant)]
pub enum CliModel {
    Cpu(LlamaModel<CpuRuntime>),
    Cuda(LlamaModel<CudaRuntime>),
}

impl CliModel {
    /// Load time and parameter count.
    pub fn stats(&self) -> &LoadStats {
        match self {
            CliModel::Cpu(m) => &m.stats,
            CliModel::Cuda(m) => &m.stats,
        }
    }
}

impl Model for CliModel {
    fn pos(&self) -> usize {
        match self {
            CliModel::Cpu(m) => m.pos(),
            CliModel::Cuda(m) => m.pos(),
        }
    }
    fn max_ctx(&self) -> usize {
        match self {
            CliModel::Cpu(m) => m.max_ctx(),
            CliModel::Cuda(m) => m.max_ctx(),
        }
    }
    fn vocab_size(&self) -> usize {
        match self {
            CliModel::Cpu(m) => m.vocab_size(),
            CliModel::Cuda(m) => m.vocab_size(),
        }
    }
    fn reset(&mut self) {
        match self {
            CliModel::Cpu(m) => m.reset(),
            CliModel::Cuda(m) => m.reset(),
        }
    }
    fn truncate(&mut self, pos: usize) -> bool {
        match self {
            CliModel::Cpu(m) => m.truncate(pos),
            CliModel::Cuda(m) => m.truncate(pos),
        }
    }
    fn forward(&mut self, tokens: &[u32], n_out: usize) -> luminal_models::Result<Vec<f32>> {
        match self {
            CliModel::Cpu(m) => m.forward(tokens, n_out),
            CliModel::Cuda(m) => m.forward(tokens, n_out),
        }
    }
    fn forward_into(
        &mut self,
        tokens: &[u32],
        n_out: usize,
        logits: &mut Vec<f32>,
    ) -> luminal_models::Result<()> {
        match self {
            CliModel::Cpu(m) => m.forward_into(tokens, n_out, logits),
            CliModel::Cuda(m) => m.forward_into(tokens, n_out, logits),
        }
    }
    fn logits_all(&mut self, tokens: &[u32]) -> luminal_models::Result<Vec<f32>> {
        match self {
            CliModel::Cpu(m) => m.logits_all(tokens),
            CliModel::Cuda(m) => m.logits_all(tokens),
        }
    }
}

/// Loads a GGUF file or a Hugging Face folder onto `device`, drawing a progress bar on
/// stderr (hidden when stderr is not a terminal).
pub fn load_model(
    path: &Path,
    device: Device,
    threads: Option<usize>,
    max_ctx: usize,
    cache_type: CacheType,
) -> CliResult<(CliModel, Tokenizer)> {
    load_model_with(path, device, threads, max_ctx, cache_type, None)
}

/// [`load_model`], compiled with search (`luminal_search`, budget `search` seconds, timing
/// the decode shape; results cached on disk) when `search` is given.
pub fn load_model_with(
    path: &Path,
    device: Device,
    threads: Option<usize>,
    max_ctx: usize,
    cache_type: CacheType,
    search: Option<u64>,
) -> CliResult<(CliModel, Tokenizer)> {
    if !path.exists() {
        return Err(CliError::msg(format!(
            "model file not found: {}",
            path.display()
        )));
    }
    if threads == Some(0) {
        return Err(CliError::msg("--threads must be at least 1"));
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} loading {msg} [{bar:30}] {pos}/{len} tensors")
            .expect("valid progress template")
            .progress_chars("=> "),
    );
    bar.set_message(
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let opts = LoadOptions {
        max_ctx,
        cache_type,
    };
    let progress = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    if device == Device::Cuda {
        if search.is_some() {
            bar.finish_and_clear();
            return Err(CliError::msg(
                "--search runs on the CPU backend only: leave it out with --device cuda",
            ));
        }
        if threads.is_some() {
            eprintln!("warning: --threads is ignored with --device cuda");
        }
        let backend = match cuda_backend() {
            Ok(b) => b,
            Err(e) => {
                bar.finish_and_clear();
                return Err(e);
            }
        };
        let loaded = LlamaModel::load(path, backend, &opts, progress);
        bar.finish_and_clear();
        let (model, tok) = loaded?;
        for warning in settings_warnings(None, max_ctx, model.max_ctx()) {
            eprintln!("warning: {warning}");
        }
        return Ok((CliModel::Cuda(model), tok));
    }
    let backend = cpu_backend(threads, MatmulPrecisionArg::Highest);
    let loaded = match search {
        None => LlamaModel::load(path, backend, &opts, progress),
        Some(secs) => {
            let budget = luminal::SearchBudget {
                time: std::time::Duration::from_secs(secs),
                ..Default::default()
            };
            let budget = budget.dim("s", 1).dim("p", max_ctx / 2).dim("n_out", 1);
            let search = luminal_search::Search::new(backend).with_budget(budget);
            let report = search.report_handle();
            let loaded = LlamaModel::load(path, search, &opts, progress);
            if let Some(r) = report.lock().ok().and_then(|mut r| r.take()) {
                eprintln!("{r}");
            }
            loaded
        }
    };
    bar.finish_and_clear();
    let (model, tok) = loaded?;
    for warning in settings_warnings(threads, max_ctx, model.max_ctx()) {
        eprintln!("warning: {warning}");
    }
    Ok((CliModel::Cpu(model), tok))
}

/// What a run's settings silently lose: a context clamped to the model's length, more
/// threads than cores.
pub fn settings_warnings(threads: Option<usize>, asked_ctx: usize, got_ctx: usize) -> Vec<String> {
    let mut out = Vec::new();
    if got_ctx < asked_ctx {
        out.push(format!(
            "--ctx {asked_ctx} is more than the model's context length: using {got_ctx}"
        ));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if let Some(n) = threads.filter(|&n| n > cores) {
        out.push(format!(
            "--threads {n} is more than the {cores} core(s) available: threads will wait on each other (use at most {cores})"
        ));
    }
    out
}

/// The number of threads a run uses (`--threads`, else every core, as the backend does).
pub fn effective_threads(threads: Option<usize>) -> usize {
    threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `134.52 M`, `1.24 B`, `950 K`.
pub fn human_count(n: u64) -> String {
    let x = n as f64;
    if x >= 1e9 {
        format!("{:.2} B", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.2} M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.2} K", x / 1e3)
    } else {
        n.to_string()
    }
}

/// `85.82 MiB`, `1.20 GiB`.
pub fn human_bytes(n: u64) -> String {
    let x = n as f64;
    const KIB: f64 = 1024.0;
    if x >= KIB * KIB * KIB {
        format!("{:.2} GiB", x / (KIB * KIB * KIB))
    } else if x >= KIB * KIB {
        format!("{:.2} MiB", x / (KIB * KIB))
    } else if x >= KIB {
        format!("{:.2} KiB", x / KIB)
    } else {
        format!("{n} B")
    }
}

/// `--matmul-precision`: how exactly the CPU computes f32 products (PyTorch's
/// `torch.set_float32_matmul_precision`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MatmulPrecisionArg {
    /// f32 accuracy
    #[default]
    Highest,
    /// Each operand as two bf16 pieces (~2^-16 relative; PyTorch's "high"), where the CPU
    /// has AMX: ~1.8x the speed of the products there; elsewhere the same as highest
    High,
}

/// The CPU backend on `threads` threads (every core when `None`), f32 products at
/// `precision`.
pub fn cpu_backend(threads: Option<usize>, precision: MatmulPrecisionArg) -> CpuBackend {
    let backend = match threads {
        Some(n) => CpuBackend::with_threads(n),
        None => CpuBackend::default(),
    };
    backend.matmul_precision(match precision {
        MatmulPrecisionArg::Highest => luminal_cpu::MatmulPrecision::Highest,
        MatmulPrecisionArg::High => luminal_cpu::MatmulPrecision::High,
    })
}
