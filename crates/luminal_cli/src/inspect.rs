//! `luminal inspect`: what a model file holds, without loading the weights.
//!
//! GGUF: format version, metadata (long arrays and strings summarised), tensors (name, type,
//! shape) and the parameter count. Hugging Face folder (or a `.safetensors` file): config.json
//! and the safetensors tensors.

use crate::common::{human_bytes, human_count, CliError, CliResult};
use clap::Args;
use luminal_io::{GgufFile, MetadataArray, MetadataValue, SafetensorsModel};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// GGUF file, Hugging Face folder, or .safetensors file
    #[arg(short, long)]
    model: PathBuf,
    /// Print every element of long arrays and the whole of long strings
    #[arg(long)]
    full: bool,
    /// Read every tensor's data (dequantized) and report NaN or infinite values: exit
    /// code 1 when any tensor has one
    #[arg(long)]
    check: bool,
}

/// Arrays longer than this are summarised as `[N items: first few, …]`.
const MAX_ARRAY_ITEMS: usize = 8;
/// How many items a summarised array shows.
const SHOWN_ITEMS: usize = 5;
/// Strings longer than this (in characters) are cut.
const MAX_STRING_CHARS: usize = 120;

pub fn run(args: InspectArgs) -> CliResult {
    let path = &args.model;
    if !path.exists() {
        return Err(CliError::msg(format!(
            "model file not found: {}",
            path.display()
        )));
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let hf = path.is_dir()
        || path
            .extension()
            .is_some_and(|e| e == "safetensors" || e == "json");
    if hf {
        inspect_safetensors(path, &mut out)?;
    } else {
        inspect_gguf(path, args.full, &mut out)?;
    }
    if args.check {
        check_tensors(path, hf, &mut out)?;
    }
    Ok(())
}

/// NaN and infinity counts of one tensor's values.
#[derive(Default)]
struct NonFinite {
    nan: usize,
    inf: usize,
    first: Option<usize>,
}

fn count_non_finite(values: &[f32]) -> NonFinite {
    let mut c = NonFinite::default();
    for (i, x) in values.iter().enumerate() {
        if x.is_nan() {
            c.nan += 1;
        } else if x.is_infinite() {
            c.inf += 1;
        } else {
            continue;
        }
        c.first.get_or_insert(i);
    }
    c
}

/// `inspect --check`: dequantizes every tensor and lists those with NaN or infinite values.
fn check_tensors(path: &Path, hf: bool, out: &mut impl Write) -> CliResult {
    let mut bad = Vec::new();
    let mut n_tensors = 0;
    let mut report = |name: &str, values: &[f32]| {
        n_tensors += 1;
        let c = count_non_finite(values);
        if c.nan + c.inf > 0 {
            bad.push(format!(
                "  {name}: {} NaN, {} infinite of {} values (first at index {})",
                c.nan,
                c.inf,
                values.len(),
                c.first.unwrap_or(0)
            ));
        }
    };
    if hf {
        let st = SafetensorsModel::open(path)?;
        for name in st.names() {
            report(name, &st.tensor_f32(name)?);
        }
    } else {
        let file = GgufFile::open(path)?;
        let mut buf = Vec::new();
        for t in file.tensors() {
            buf.resize(t.n_elements() as usize, 0.0);
            file.tensor_f32_into(t.name(), &mut buf)?;
            report(t.name(), &buf);
        }
    }
    writeln!(out)?;
    if bad.is_empty() {
        writeln!(out, "check: all {n_tensors} tensors are finite")?;
        Ok(())
    } else {
        writeln!(
            out,
            "check: {} of {n_tensors} tensors hold NaN or infinite values:",
            bad.len()
        )?;
        for line in &bad {
            writeln!(out, "{line}")?;
        }
        out.flush()?;
        Err(CliError::msg(format!(
            "{} tensor(s) hold NaN or infinite values: the file is corrupt",
            bad.len()
        )))
    }
}

fn inspect_gguf(path: &Path, full: bool, out: &mut impl Write) -> CliResult {
    let file = GgufFile::open(path)?;
    writeln!(out, "file: {}", path.display())?;
    writeln!(
        out,
        "format: GGUF v{}, alignment {}, data at byte {}, {} ({} bytes)",
        file.version(),
        file.alignment(),
        file.data_offset(),
        human_bytes(file.file_len()),
        file.file_len()
    )?;
    let meta = file.metadata();
    writeln!(out)?;
    writeln!(out, "metadata ({} keys):", meta.len())?;
    for (key, value) in meta.iter() {
        writeln!(out, "  {key}: {}", format_value(value, full))?;
    }

    let tensors = file.tensors();
    writeln!(out)?;
    writeln!(out, "tensors ({}):", tensors.len())?;
    let rows: Vec<(String, String, String)> = tensors
        .iter()
        .map(|t| {
            (
                t.name().to_string(),
                t.ggml_type().to_string(),
                format!("{:?}", t.shape()),
            )
        })
        .collect();
    print_tensor_rows(out, &rows)?;
    let params: u64 = tensors.iter().map(|t| t.n_elements()).sum();
    let bytes: u64 = tensors.iter().map(|t| t.n_bytes()).sum();
    writeln!(out)?;
    writeln!(out, "tensor data: {} ({bytes} bytes)", human_bytes(bytes))?;
    writeln!(out, "parameters: {params} ({})", human_count(params))?;
    Ok(())
}

fn inspect_safetensors(path: &Path, out: &mut impl Write) -> CliResult {
    let st = SafetensorsModel::open(path)?;
    writeln!(
        out,
        "{}: {}",
        if path.is_dir() { "folder" } else { "file" },
        path.display()
    )?;
    if path.is_dir() {
        let config_path = path.join("config.json");
        match std::fs::read_to_string(&config_path) {
            Ok(text) => {
                let pretty = serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .and_then(|v| serde_json::to_string_pretty(&v).ok())
                    .unwrap_or(text);
                writeln!(out)?;
                writeln!(out, "config.json:")?;
                for line in pretty.lines() {
                    writeln!(out, "  {line}")?;
                }
            }
            Err(e) => writeln!(out, "config.json: cannot read it ({e})")?,
        }
    }
    let names = st.names();
    writeln!(out)?;
    writeln!(
        out,
        "tensors ({}, in {} safetensors file(s)):",
        names.len(),
        st.shards().len()
    )?;
    let mut rows = Vec::with_capacity(names.len());
    let (mut params, mut bytes) = (0u64, 0u64);
    for name in names {
        let info = st.tensor_info(name)?;
        params += info.n_elements() as u64;
        bytes += st.tensor_bytes(name)?.len() as u64;
        rows.push((
            name.clone(),
            format!("{:?}", info.dtype()),
            format!("{:?}", info.shape()),
        ));
    }
    print_tensor_rows(out, &rows)?;
    writeln!(out)?;
    writeln!(out, "tensor data: {} ({bytes} bytes)", human_bytes(bytes))?;
    writeln!(out, "parameters: {params} ({})", human_count(params))?;
    Ok(())
}

/// `  name  type  [shape]`, columns aligned.
fn print_tensor_rows(out: &mut impl Write, rows: &[(String, String, String)]) -> CliResult {
    let name_w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let type_w = rows.iter().map(|r| r.1.len()).max().unwrap_or(0);
    for (name, ty, shape) in rows {
        writeln!(out, "  {name:<name_w$}  {ty:<type_w$}  {shape}")?;
    }
    Ok(())
}

fn format_value(value: &MetadataValue, full: bool) -> String {
    use MetadataValue as V;
    match value {
        V::U8(x) => x.to_string(),
        V::I8(x) => x.to_string(),
        V::U16(x) => x.to_string(),
        V::I16(x) => x.to_string(),
        V::U32(x) => x.to_string(),
        V::I32(x) => x.to_string(),
        V::U64(x) => x.to_string(),
        V::I64(x) => x.to_string(),
        V::F32(x) => format!("{x:?}"),
        V::F64(x) => format!("{x:?}"),
        V::Bool(x) => x.to_string(),
        V::String(s) => format_string(s, full),
        V::Array(a) => format_array(a, full),
    }
}

/// A quoted, escaped string; long ones cut with their length stated.
fn format_string(s: &str, full: bool) -> String {
    let n = s.chars().count();
    if full || n <= MAX_STRING_CHARS {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(MAX_STRING_CHARS).collect();
        format!("{head:?}… ({n} chars)")
    }
}

fn format_array(a: &MetadataArray, full: bool) -> String {
    let n = a.len();
    let shown = if full || n <= MAX_ARRAY_ITEMS {
        n
    } else {
        SHOWN_ITEMS
    };
    let items: Vec<String> = (0..shown)
        .filter_map(|i| a.get(i))
        .map(|v| format_value(&v, full))
        .collect();
    if shown == n {
        format!("[{}]", items.join(", "))
    } else {
        format!("[{n} items: {}, …]", items.join(", "))
    }
}
