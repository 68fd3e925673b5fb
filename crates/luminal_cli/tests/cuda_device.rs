//! `--device cuda`: without a GPU (CI) a clear one-line error, exit code 1, never a panic;
//! with one (the device machine, see benches/README.md) `generate`, `perplexity` and `bench`
//! run on the CUDA backend and agree with the CPU backend on the tiny fixtures.

mod common;
use common::{err, one_line_error, s};
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../luminal_model_tests/tests/fixtures")
}

fn luminal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_luminal"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "exit {:?}: {}", o.status.code(), err(o));
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Whether a CUDA device opens here (driver, NVRTC and device 0).
fn gpu() -> bool {
    luminal_cuda::CudaBackend::new(0).is_ok()
}

fn last_line_perplexity(out: &str) -> f64 {
    let last = out.lines().last().unwrap();
    last.strip_prefix("perplexity: ")
        .unwrap_or_else(|| panic!("last line is {last:?}"))
        .parse()
        .unwrap()
}

#[test]
fn device_cuda_without_a_driver_is_a_clear_error() {
    if luminal_cuda::driver_available() {
        eprintln!("skipping: a CUDA driver loads on this machine");
        return;
    }
    let model = fixtures().join("tiny-llama.gguf");
    let text = fixtures().join("ppl.txt");
    let runs: [&[&str]; 3] = [
        &["generate", "-m", s(&model), "-n", "2", "--device", "cuda"],
        &[
            "bench",
            "-m",
            s(&model),
            "-p",
            "4",
            "-n",
            "4",
            "--device",
            "cuda",
        ],
        &[
            "perplexity",
            "-m",
            s(&model),
            "-f",
            s(&text),
            "--ctx",
            "32",
            "--device",
            "cuda",
        ],
    ];
    for args in runs {
        let line = one_line_error(&luminal(args));
        assert!(
            line.starts_with("error: --device cuda: no CUDA driver: libcuda could not be loaded"),
            "{args:?}: {line}"
        );
    }
    // --search is a CPU-backend feature; reported before anything loads.
    let o = luminal(&[
        "bench",
        "-m",
        s(&model),
        "--device",
        "cuda",
        "--search",
        "1",
    ]);
    assert!(one_line_error(&o).contains("--search"), "{}", err(&o));
}

#[test]
fn cpu_only_subcommands_refuse_device_cuda() {
    let bert = fixtures().join("tiny-bert");
    let o = luminal(&[
        "embed",
        "-m",
        s(&bert),
        "--device",
        "cuda",
        "--text",
        "hello",
    ]);
    let line = one_line_error(&o);
    assert!(line.contains("`embed` runs on the CPU only"), "{line}");
}

#[test]
fn device_cuda_matches_the_cpu_backend_on_a_gpu() {
    if !gpu() {
        eprintln!("skipping: no CUDA device opens on this machine");
        return;
    }
    let mut failures = Vec::new();
    for name in ["tiny-llama.gguf", "tiny-llama.q8_0.gguf", "tiny-qwen2.gguf"] {
        let model = fixtures().join(name);
        // Greedy generation: the same tokens.
        let gen = |device: &str| {
            ok(&luminal(&[
                "generate",
                "-m",
                s(&model),
                "--prompt",
                "Once upon a time",
                "-n",
                "24",
                "--no-echo",
                "--device",
                device,
            ]))
        };
        let (on_gpu, on_cpu) = (gen("cuda"), gen("cpu"));
        if on_gpu != on_cpu {
            failures.push(format!(
                "{name}: greedy generations differ: {on_gpu:?} vs {on_cpu:?}"
            ));
        }

        // Perplexity: the same value to ~1e-4 relative.
        let text = fixtures().join("ppl.txt");
        let ppl = |device: &str| {
            last_line_perplexity(&ok(&luminal(&[
                "perplexity",
                "-m",
                s(&model),
                "-f",
                s(&text),
                "--ctx",
                "64",
                "--device",
                device,
            ])))
        };
        let (gpu_ppl, cpu_ppl) = (ppl("cuda"), ppl("cpu"));
        if ((gpu_ppl - cpu_ppl) / cpu_ppl).abs() >= 1e-3 {
            failures.push(format!(
                "{name}: perplexity {gpu_ppl} on cuda vs {cpu_ppl} on cpu"
            ));
        }
        eprintln!("{name}: perplexity cuda {gpu_ppl:.6}, cpu {cpu_ppl:.6}");

        // Bench names its backend.
        let o = ok(&luminal(&[
            "bench",
            "-m",
            s(&model),
            "-p",
            "16",
            "-n",
            "16",
            "-r",
            "2",
            "-o",
            "json",
            "--device",
            "cuda",
        ]));
        let records: Value = serde_json::from_str(&o).unwrap();
        for r in records.as_array().unwrap() {
            assert_eq!(r["backends"], "CUDA");
            assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
