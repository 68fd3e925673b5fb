//! `luminal chat`, the prompt sources of `luminal generate` (`--file`, `--prompt -`), the
//! stop reason and settings warnings on stderr, and the errors of a corrupt model
//! (non-finite logits in generate and perplexity, `inspect --check`).

mod common;
use common::{err, one_line_error, s};
use luminal_io::GgufFile;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tiny_llama() -> PathBuf {
    root().join("crates/luminal_model_tests/tests/fixtures/tiny-llama")
}

fn smollm2() -> Option<PathBuf> {
    let p = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipping: {} is absent (run scripts/fetch-models.sh)",
            p.display()
        );
        None
    }
}

/// Runs `luminal args…` with `stdin` as its input.
fn luminal_stdin(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_luminal"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn luminal(args: &[&str]) -> Output {
    luminal_stdin(args, "")
}

fn out(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn generation_reference() -> Value {
    let r: Value = serde_json::from_str(
        &std::fs::read_to_string(tiny_llama().join("reference.json")).unwrap(),
    )
    .unwrap();
    r["generation"].clone()
}

#[test]
fn generate_reads_the_prompt_from_a_file_or_stdin_and_says_why_it_stopped() {
    let g = generation_reference();
    let prompt = g["prompt_text"].as_str().unwrap();
    let want = format!("{}\n", g["new_text"].as_str().unwrap());
    let tiny = tiny_llama();
    let base = ["generate", "--model", s(&tiny), "-n", "8", "--no-echo"];

    let o = luminal_stdin(&[&base[..], &["--prompt", "-"]].concat(), prompt);
    assert_eq!(out(&o), want);
    assert!(
        err(&o).contains("stopped: token limit (-n)\n"),
        "{}",
        err(&o)
    );

    let dir = std::env::temp_dir().join(format!("luminal_cli_prompt_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("prompt.txt");
    std::fs::write(&file, prompt).unwrap();
    let o = luminal(&[&base[..], &["--file", s(&file)]].concat());
    assert_eq!(out(&o), want);
    std::fs::remove_dir_all(&dir).ok();

    // A full context is a stop reason, not an error; an over-long --ctx is reported.
    let o = luminal(&[
        "generate",
        "--model",
        s(&tiny_llama()),
        "--prompt",
        "Hello",
        "-n",
        "500",
        "--ctx",
        "1000",
        "--no-echo",
    ]);
    out(&o);
    let e = err(&o);
    assert!(
        e.contains("warning: --ctx 1000 is more than the model's context length: using 256"),
        "{e}"
    );
    assert!(
        e.contains("stopped: context full") || e.contains("stopped: end of text"),
        "{e}"
    );

    // More threads than cores is reported.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let many = (cores + 1).to_string();
    let o = luminal(&[&base[..], &["--prompt", "Hi", "--threads", &many]].concat());
    out(&o);
    assert!(
        err(&o).contains(&format!(
            "warning: --threads {many} is more than the {cores} core(s)"
        )),
        "{}",
        err(&o)
    );
}

#[test]
fn chat_keeps_the_conversation_and_reuses_the_cache() {
    let g = generation_reference();
    // Greedy, no repetition penalty: the first answer is transformers' (the template
    // applied to "Hello there").
    let o = luminal_stdin(
        &[
            "chat",
            "--model",
            s(&tiny_llama()),
            "-n",
            "8",
            "--temperature",
            "0",
            "--repeat-penalty",
            "1",
        ],
        "Hello there\n\nHow are you?\n/clear\nHello there\n",
    );
    let text = out(&o);
    let answers: Vec<&str> = text.split('\n').collect();
    assert_eq!(answers.len(), 4, "{text:?}");
    assert_eq!(answers[0], g["new_text"].as_str().unwrap());
    // After /clear the same question gets the same answer.
    assert_eq!(answers[2], answers[0]);
    let e = err(&o);
    let notes: Vec<&str> = e.lines().filter(|l| l.starts_with("[stopped:")).collect();
    assert_eq!(notes.len(), 3, "{e}");
    // The second turn reuses the first turn's tokens from the cache.
    let reused = |line: &str| -> usize {
        let before = line.split(" reused").next().unwrap();
        before.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let n_prompt = g["prompt_ids"].as_array().unwrap().len();
    assert_eq!(reused(notes[0]), 0, "{e}");
    assert!(reused(notes[1]) >= n_prompt, "{e}");
    assert!(e.contains("[conversation cleared]"), "{e}");
}

/// A copy of SmolLM2 whose final norm weights are NaN.
fn corrupt_smollm2(model: &Path, dir: &Path) -> PathBuf {
    let file = GgufFile::open(model).unwrap();
    let info = file.tensor_info("output_norm.weight").unwrap();
    let at = (file.data_offset() + info.offset()) as usize;
    let n = info.n_elements() as usize;
    let mut bytes = std::fs::read(model).unwrap();
    for i in 0..n {
        bytes[at + 4 * i..at + 4 * i + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    }
    let bad = dir.join("nan.gguf");
    std::fs::write(&bad, bytes).unwrap();
    bad
}

#[test]
fn a_corrupt_model_is_reported_not_silent() {
    let Some(model) = smollm2() else { return };
    let dir = std::env::temp_dir().join(format!("luminal_cli_nan_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = corrupt_smollm2(&model, &dir);

    let line = one_line_error(&luminal(&[
        "generate",
        "--model",
        s(&bad),
        "--no-echo",
        "-n",
        "4",
    ]));
    assert!(
        line.contains("non-finite logits (NaN) during the prompt")
            && line.contains("weights are corrupt"),
        "{line}"
    );

    let text = dir.join("text.txt");
    std::fs::write(
        &text,
        "The quick brown fox jumps over the lazy dog. ".repeat(4),
    )
    .unwrap();
    let line = one_line_error(&luminal(&[
        "perplexity",
        "--model",
        s(&bad),
        "--file",
        s(&text),
        "--ctx",
        "16",
    ]));
    assert!(
        line.contains("non-finite logits (NaN) during scoring"),
        "{line}"
    );

    // inspect --check names the tensor and fails; the intact file passes.
    let o = luminal(&["inspect", "--model", s(&bad), "--check"]);
    assert_eq!(o.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains(" tensors hold NaN or infinite values:\n")
            && stdout.contains("check: 1 of "),
        "{stdout}"
    );
    assert!(
        stdout
            .contains("  output_norm.weight: 576 NaN, 0 infinite of 576 values (first at index 0)"),
        "{stdout}"
    );
    assert!(err(&o).contains("error: 1 tensor(s) hold NaN or infinite values"));
    let o = luminal(&["inspect", "--model", s(&model), "--check"]);
    let good = out(&o);
    assert!(
        good.lines().last().unwrap().starts_with("check: all ")
            && good.ends_with(" tensors are finite\n"),
        "{good}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_prompt_longer_than_the_context_names_the_flag() {
    let o = luminal(&[
        "generate",
        "--model",
        s(&tiny_llama()),
        "--prompt",
        &"word ".repeat(100),
        "--ctx",
        "16",
    ]);
    let line = one_line_error(&o);
    assert!(
        line.starts_with("error: context is full: ")
            && line.ends_with("but the context holds 16 (use a larger --ctx)"),
        "{line}"
    );
}

#[test]
fn chat_drops_old_turns_when_the_context_is_full() {
    let turns: String = (0..6).map(|i| format!("question number {i}\n")).collect();
    let o = luminal_stdin(
        &[
            "chat",
            "--model",
            s(&tiny_llama()),
            "-n",
            "8",
            "--ctx",
            "80",
            "--temperature",
            "0",
        ],
        &turns,
    );
    let text = out(&o);
    assert_eq!(text.lines().count(), 6, "{text:?}");
    let e = err(&o);
    assert!(
        e.contains("| context full: dropped the 2 oldest message(s)]"),
        "{e}"
    );
}
