//! `luminal bench`: prefill and decode speed, as llama-bench measures them.
//!
//! - `ppN`: one forward pass of N prompt tokens from an empty cache (logits of the last one);
//! - `tgN`: N decode steps of one token each, from an empty cache;
//! - with a depth `-d D` (llama-bench's `n_depth`), both start with D tokens already in the
//!   cache (filled before the timed part, every repetition) and are named `ppN @ dD`.
//!
//! `-p`, `-n` and `-d` take several comma-separated values (`-p 128,512 -d 0,2048`): every
//! combination of a test size and a depth is run, as llama-bench does.
//!
//! Each test runs once to warm up, then REPS timed times; the table shows the mean ± sample
//! standard deviation of the per-run tokens per second.

use crate::common::CliModel;
use crate::common::{
    effective_threads, human_bytes, human_count, load_model, load_model_with, CliError, CliResult,
    Device,
};
use clap::{Args, ValueEnum};
use luminal_io::{GgmlType, GgufFile, SafetensorsModel};
use luminal_models::Model;
use serde_json::json;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Markdown table
    Md,
    /// JSON array of records
    Json,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// GGUF file or Hugging Face folder
    #[arg(short, long)]
    model: PathBuf,
    /// Prompt tokens of the prefill test (0 = skip); several: `-p 128,512`
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "128"
    )]
    n_prompt: Vec<usize>,
    /// Tokens of the decode test (0 = skip); several: `-n 32,64`
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "64"
    )]
    n_gen: Vec<usize>,
    /// Tokens already in the cache when each test starts (llama-bench's depth); several:
    /// `-d 0,2048`
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    n_depth: Vec<usize>,
    /// Device to run on
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// CPU threads (default: every core)
    #[arg(short, long)]
    threads: Option<usize>,
    /// KV-cache element type: f16 (default), f32, or a quantized block type (q8_0, q5_1, q5_0, q4_1, q4_0)
    #[arg(long, default_value_t = luminal_models::LoadOptions::default().cache_type)]
    cache_type: luminal_models::CacheType,
    /// Timed repetitions of each test
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    /// Output format
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Md)]
    output: OutputFormat,
    /// Compile with search (luminal_search; budget in seconds, default 20): the table is the
    /// searched model's, followed by its tok/s against the hand lowering measured alike
    #[arg(long, num_args = 0..=1, default_missing_value = "20", value_name = "SECONDS")]
    search: Option<u64>,
}

/// What the table says about the model.
struct ModelDesc {
    file_name: String,
    model_type: String,
    size_bytes: u64,
}

struct TestResult {
    name: String,
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
    samples_ns: Vec<u128>,
    samples_ts: Vec<f64>,
}

pub fn run(args: BenchArgs) -> CliResult {
    if args.reps == 0 {
        return Err(CliError::msg("-r/--repetitions must be at least 1"));
    }
    let prompts: Vec<usize> = args.n_prompt.iter().copied().filter(|&n| n > 0).collect();
    let gens: Vec<usize> = args.n_gen.iter().copied().filter(|&n| n > 0).collect();
    if prompts.is_empty() && gens.is_empty() {
        return Err(CliError::msg("nothing to measure: -p and -n are both 0"));
    }
    let depths = depths(&args);
    let longest = prompts.iter().chain(&gens).copied().max().unwrap_or(0);
    let max_ctx = depths.iter().max().unwrap_or(&0) + longest;
    let (mut model, _tok) = load_model_with(
        &args.model,
        args.device,
        args.threads,
        max_ctx,
        args.cache_type,
        args.search,
    )?;
    let desc = describe(&args.model, model.stats().parameters as u64)?;
    let threads = effective_threads(args.threads);
    let tokens = bench_tokens(model.vocab_size(), max_ctx);
    let results = run_tests(&args, &mut model, &tokens)?;
    model.reset();

    let params = model.stats().parameters as u64;
    match args.output {
        OutputFormat::Md => print_markdown(&desc, params, args.device, threads, &results),
        OutputFormat::Json => print_json(&desc, params, args.device, threads, &results)?,
    }
    if args.search.is_some() {
        // The hand lowering, measured the same way after the searched model.
        let (mut hand, _) = load_model(
            &args.model,
            args.device,
            args.threads,
            max_ctx,
            args.cache_type,
        )?;
        let base = run_tests(&args, &mut hand, &tokens)?;
        for (r, b) in results.iter().zip(&base) {
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
            let (ts, tb) = (mean(&r.samples_ts), mean(&b.samples_ts));
            eprintln!(
                "search vs hand lowering, {}: {ts:.2} vs {tb:.2} t/s ({:.2}×)",
                r.name,
                ts / tb
            );
        }
    }
    Ok(())
}

/// The depths of `args` (`-d`, 0 when none).
fn depths(args: &BenchArgs) -> Vec<usize> {
    if args.n_depth.is_empty() {
        vec![0]
    } else {
        args.n_depth.clone()
    }
}

/// The prefill and decode tests of `args` on `model`, at each depth.
fn run_tests(args: &BenchArgs, model: &mut CliModel, tokens: &[u32]) -> CliResult<Vec<TestResult>> {
    let prompts: Vec<usize> = args.n_prompt.iter().copied().filter(|&n| n > 0).collect();
    let gens: Vec<usize> = args.n_gen.iter().copied().filter(|&n| n > 0).collect();
    let name = |kind: &str, n: usize, depth: usize| {
        if depth == 0 {
            format!("{kind}{n}")
        } else {
            format!("{kind}{n} @ d{depth}")
        }
    };
    let mut results = Vec::new();
    for &depth in &depths(args) {
        let (context, rest) = tokens.split_at(depth);
        for &n in &prompts {
            let prompt = &rest[..n];
            let r = measure(args.reps, n, model, context, |model| {
                model.forward(prompt, 1).map(|_| ())
            })?;
            results.push(TestResult {
                name: name("pp", n, depth),
                n_prompt: n,
                n_gen: 0,
                n_depth: depth,
                samples_ns: r.0,
                samples_ts: r.1,
            });
        }
        for &n in &gens {
            let r = measure(args.reps, n, model, context, |model| {
                decode(model, &rest[..n])
            })?;
            results.push(TestResult {
                name: name("tg", n, depth),
                n_prompt: 0,
                n_gen: n,
                n_depth: depth,
                samples_ns: r.0,
                samples_ts: r.1,
            });
        }
    }
    Ok(results)
}

/// Decode steps of one token each, continuing from the cache's current position.
fn decode(model: &mut CliModel, tokens: &[u32]) -> luminal_models::Result<()> {
    let mut logits = Vec::new();
    for &t in tokens {
        model.forward_into(&[t], 1, &mut logits)?;
    }
    Ok(())
}

/// One warm-up run, then `reps` timed runs of `f`, each processing `n_tokens` after the
/// cache was reset and filled with `context` (not timed).
fn measure(
    reps: usize,
    n_tokens: usize,
    model: &mut CliModel,
    context: &[u32],
    mut f: impl FnMut(&mut CliModel) -> luminal_models::Result<()>,
) -> CliResult<(Vec<u128>, Vec<f64>)> {
    let fill = |model: &mut CliModel| -> luminal_models::Result<()> {
        model.reset();
        if !context.is_empty() {
            model.forward(context, 1)?;
        }
        Ok(())
    };
    fill(model)?;
    f(model)?;
    let (mut ns, mut ts) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        fill(model)?;
        let start = Instant::now();
        f(model)?;
        let t = start.elapsed();
        ns.push(t.as_nanos());
        ts.push(n_tokens as f64 / t.as_secs_f64().max(1e-12));
    }
    Ok((ns, ts))
}

/// Deterministic pseudo-random token ids (llama-bench also feeds random tokens).
fn bench_tokens(vocab: usize, n: usize) -> Vec<u32> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % vocab.max(1) as u64) as u32
        })
        .collect()
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// The backend column / `backends` field (llama-bench's names).
fn backend_name(device: Device) -> &'static str {
    match device {
        Device::Cpu => "CPU",
        Device::Cuda => "CUDA",
    }
}

fn print_markdown(
    desc: &ModelDesc,
    params: u64,
    device: Device,
    threads: usize,
    results: &[TestResult],
) {
    let header = [
        "model", "size", "params", "backend", "threads", "test", "t/s",
    ];
    let rows: Vec<[String; 7]> = results
        .iter()
        .map(|r| {
            let (mean, std) = mean_std(&r.samples_ts);
            [
                desc.model_type.clone(),
                human_bytes(desc.size_bytes),
                human_count(params),
                backend_name(device).to_string(),
                threads.to_string(),
                r.name.clone(),
                format!("{mean:.2} ± {std:.2}"),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    // Text columns left-aligned, numbers right-aligned (as llama-bench does).
    let right = [false, true, true, false, true, true, true];
    let line = |cells: Vec<String>| {
        let cells: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let pad = widths[i].saturating_sub(c.chars().count());
                if right[i] {
                    format!("{}{c}", " ".repeat(pad))
                } else {
                    format!("{c}{}", " ".repeat(pad))
                }
            })
            .collect();
        format!("| {} |", cells.join(" | "))
    };
    println!("{}", line(header.iter().map(|s| s.to_string()).collect()));
    let rule: Vec<String> = widths
        .iter()
        .zip(right)
        .map(|(&w, r)| {
            if r {
                format!("{}:", "-".repeat(w + 1))
            } else {
                "-".repeat(w + 2)
            }
        })
        .collect();
    println!("|{}|", rule.join("|"));
    for r in rows {
        println!("{}", line(r.to_vec()));
    }
}

/// The CPU's model name (`/proc/cpuinfo`'s "model name"), as llama-bench's `cpu_info`.
fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ` (llama-bench's `test_time`).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + (month <= 2) as i64;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Records with llama-bench's JSON field names (those that apply to us), plus `test`.
fn print_json(
    desc: &ModelDesc,
    params: u64,
    device: Device,
    threads: usize,
    results: &[TestResult],
) -> CliResult {
    let (cpu, time) = (cpu_info(), utc_now());
    let records: Vec<serde_json::Value> = results
        .iter()
        .map(|r| {
            let (avg_ts, stddev_ts) = mean_std(&r.samples_ts);
            let ns: Vec<f64> = r.samples_ns.iter().map(|&x| x as f64).collect();
            let (avg_ns, stddev_ns) = mean_std(&ns);
            json!({
                "model_filename": desc.file_name,
                "model_type": desc.model_type,
                "model_size": desc.size_bytes,
                "model_n_params": params,
                "build_commit": concat!("luminal-", env!("CARGO_PKG_VERSION")),
                "cpu_info": cpu,
                "backends": backend_name(device),
                "n_threads": threads,
                "n_prompt": r.n_prompt,
                "n_gen": r.n_gen,
                "n_depth": r.n_depth,
                "test_time": time,
                "test": r.name,
                "avg_ns": avg_ns.round() as u64,
                "stddev_ns": stddev_ns.round() as u64,
                "avg_ts": avg_ts,
                "stddev_ts": stddev_ts,
                "samples_ns": r.samples_ns.iter().map(|&x| x as u64).collect::<Vec<_>>(),
                "samples_ts": r.samples_ts,
            })
        })
        .collect();
    println!("{}", serde_json::to_string_pretty(&records)?);
    Ok(())
}

/// The model's name for the table (`llama 135M Q4_1`) and its weights' size in bytes.
fn describe(path: &Path, params: u64) -> CliResult<ModelDesc> {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    let size_label = size_label(params);
    if path.is_dir() {
        let config: serde_json::Value = std::fs::read_to_string(path.join("config.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let arch = config["model_type"].as_str().unwrap_or("llama").to_string();
        let dtype = config["torch_dtype"]
            .as_str()
            .or_else(|| config["dtype"].as_str())
            .unwrap_or("")
            .to_uppercase()
            .replace("FLOAT", "F")
            .replace("BFLOAT", "BF");
        let st = SafetensorsModel::open(path)?;
        let mut size = 0u64;
        for name in st.names() {
            size += st.tensor_bytes(name)?.len() as u64;
        }
        let model_type = format!("{arch} {size_label} {dtype}")
            .trim_end()
            .to_string();
        return Ok(ModelDesc {
            file_name,
            model_type,
            size_bytes: size,
        });
    }
    let file = GgufFile::open(path)?;
    let arch = file
        .metadata()
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .unwrap_or("llama")
        .to_string();
    // `general.file_type` names the quantisation as llama.cpp does (a Q6_K file keeps its
    // embedding in Q8_0, so the type with the most bytes would misname it); files without it
    // are named by the type that holds most of the weight bytes.
    let mut bytes_by_type: HashMap<GgmlType, u64> = HashMap::new();
    for t in file.tensors() {
        *bytes_by_type.entry(t.ggml_type()).or_default() += t.n_bytes();
    }
    let size = bytes_by_type.values().sum();
    let main_type = file
        .metadata()
        .get("general.file_type")
        .and_then(|v| v.as_u32())
        .and_then(ftype_name)
        .map(str::to_string)
        .unwrap_or_else(|| {
            bytes_by_type
                .iter()
                .max_by_key(|(_, &b)| b)
                .map(|(t, _)| t.to_string())
                .unwrap_or_default()
        });
    Ok(ModelDesc {
        file_name,
        model_type: format!("{arch} {size_label} {main_type}"),
        size_bytes: size,
    })
}

/// llama.cpp's name of a `general.file_type` value (its `llama_ftype` enum), for the types
/// this project reads.
fn ftype_name(ftype: u32) -> Option<&'static str> {
    Some(match ftype {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        21 => "Q2_K - Small",
        32 => "BF16",
        _ => return None,
    })
}

/// `135M`, `1B`, `8B`: llama.cpp's rounded parameter count.
fn size_label(params: u64) -> String {
    let p = params as f64;
    if p >= 1e9 {
        format!("{}B", (p / 1e9).round())
    } else if p >= 1e6 {
        format!("{}M", (p / 1e6).round())
    } else {
        format!("{}K", (p / 1e3).round())
    }
}
