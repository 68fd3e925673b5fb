//! Peak memory and time of plain causal attention (`softmax(q·kᵀ/√d + mask)·v` from hl_ops,
//! `[heads, seq, 64]`) on the CPU backend, one plan per process so that peak RSS is the
//! plan's:
//!
//! - `plain`: the hand `attention` rule off, no search: the `[heads, seq, seq]` scores are
//!   materialised;
//! - `search`: the hand rule off, compiled with `CompileOptions::search` (the rules derive
//!   the online-softmax term); the result is cached in the temp dir, so run it twice and
//!   read the second line (`from cache`: the process ran no other candidate);
//! - `hand`: the backend's hand-written attention rule.
//!
//! `cargo run --release -p luminal_search --example attention_memory -- MODE SEQ [RUNS]`
//! prints one line: mode, seq, compile s, median run ms, plan buffer MB, peak RSS MB,
//! kernels, and the search's choice.

use luminal::prelude::*;
use luminal_cpu::CpuBackend;
use luminal_search::Search;
use std::time::{Duration, Instant};

const HEADS: usize = 4;
const HEAD_DIM: usize = 64;

fn peak_rss_mb() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?.to_string();
            let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(format!("{:.0}", kb / 1024.0))
        })
        .unwrap_or_else(|| "n/a".into())
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
        })
        .collect()
}

fn main() -> luminal::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: attention_memory plain|search|hand SEQ [RUNS]";
    let mode = args.get(1).expect(usage).clone();
    let seq: usize = args.get(2).and_then(|s| s.parse().ok()).expect(usage);
    let runs: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5);

    let cx = Graph::new();
    let (h, d, s) = (HEADS, HEAD_DIM, seq);
    let q = cx.tensor("q", (h, s, d));
    let k = cx.tensor("k", (h, s, d));
    let v = cx.tensor("v", (h, s, d));
    let key = cx.arange(s).expand(0, s);
    let query = cx.arange(s).expand(1, s);
    let mask = (key - query).le(cx.constant(0.0)).cast(DType::F32).log2();
    let scores = q.matmul(k.permute([0, 2, 1])) * (1.0 / (d as f32).sqrt()) + mask.expand(0, h);
    let out = scores.softmax(2).matmul(v).output();

    let hand_off = CpuBackend::default().disable_rules(&["attention"]);
    let t0 = Instant::now();
    let mut choice = String::new();
    let mut rt = match mode.as_str() {
        "plain" => cx.compile(hand_off, CompileOptions::default())?,
        "hand" => cx.compile(CpuBackend::default(), CompileOptions::default())?,
        "search" => {
            let dir = std::env::temp_dir().join("luminal-attention-memory-cache");
            let search = Search::new(hand_off).cache_dir(dir);
            let handle = search.report_handle();
            let budget = SearchBudget {
                time: Duration::from_secs(30),
                repeats: 3,
                ..SearchBudget::default()
            };
            let rt = cx.compile(search, CompileOptions::search(budget))?;
            if let Some(r) = handle.lock().unwrap().take() {
                if std::env::var("LUMINAL_SEARCH_LOG").is_err() && !r.from_cache {
                    eprintln!("{r}");
                }
                choice = format!(
                    "{} {} {} [{}]",
                    if r.from_cache {
                        "from cache"
                    } else {
                        "searched"
                    },
                    r.variant,
                    r.schedule,
                    r.fused.join(",")
                );
            }
            rt
        }
        _ => panic!("{usage}"),
    };
    let compile = t0.elapsed();
    rt.set(q, &values(h * s * d, 1))?;
    rt.set(k, &values(h * s * d, 2))?;
    rt.set(v, &values(h * s * d, 3))?;
    rt.run()?; // warm-up
    let mut times = vec![];
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        rt.run()?;
        times.push(t.elapsed());
    }
    times.sort();
    let median = times[times.len() / 2];
    let y: Vec<f32> = rt.get(out)?;
    let checksum: f64 = y.iter().map(|&x| x as f64).sum();
    let mut kernels = rt.kernel_names();
    kernels.dedup();
    println!(
        "{mode:<6} seq {seq:>5}: compile {:>6.2} s, run {:>9.2} ms (median of {}), plan buffers {:>7.1} MB, peak RSS {:>6} MB, checksum {checksum:.4}, kernels {} {:?} {choice}",
        compile.as_secs_f64(),
        median.as_secs_f64() * 1e3,
        times.len(),
        rt.buffer_bytes() as f64 / 1e6,
        peak_rss_mb(),
        rt.kernel_count(),
        kernels,
    );
    Ok(())
}
