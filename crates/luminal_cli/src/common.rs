//! What the subcommands share: the error type, model loading with a progress bar, and
//! number formatting.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use luminal_cpu::{CpuBackend, CpuRuntime};
use luminal_io::IoError;
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
}

/// A model loaded on the CPU backend.
pub type CliModel = LlamaModel<CpuRuntime>;

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
    let backend = match (device, threads) {
        (Device::Cpu, Some(n)) => CpuBackend::with_threads(n),
        (Device::Cpu, None) => CpuBackend::default(),
    };
    let progress = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
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
    let loaded = loaded?;
    for warning in settings_warnings(threads, max_ctx, loaded.0.max_ctx()) {
        eprintln!("warning: {warning}");
    }
    Ok(loaded)
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
