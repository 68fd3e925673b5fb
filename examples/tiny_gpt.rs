//! A character-level GPT trained on a text file, then sampled.
//!
//! ```bash
//! cargo run --release --example tiny_gpt -- [--file /usr/share/common-licenses/GPL-3]
//!     [--steps 300] [--threads 2] [--layers 2] [--dim 64] [--ctx 64] [--batch 16]
//!     [--checkpoint]
//! ```
//!
//! `--checkpoint` wraps each transformer block in `Graph::checkpoint`: the backward pass
//! recomputes the block instead of keeping its activations (the memory plan's size is
//! printed either way).
//!
//! Token and position embeddings, pre-norm transformer blocks (causal multi-head attention,
//! GELU MLP with GPT-2's tanh approximation), a linear head; cross-entropy on next-character
//! prediction, AdamW with linear warm-up and cosine decay, gradient clipping at 1.0, on the
//! CPU backend. Prints the loss as it trains, the mean step time (after 5 warm-up steps),
//! then 300 sampled characters.

use indicatif::{ProgressBar, ProgressStyle};
use luminal::prelude::*;
use luminal_cpu::CpuBackend;
use luminal_nn::{causal_attention, LayerNorm, Linear, Module};
use luminal_training::init::Init;
use luminal_training::loss::{cross_entropy, CrossEntropy};
use luminal_training::{Adam, Schedule, StateMode, TrainOptions, TrainStep, Trainer, WarmupCosine};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Instant;

#[derive(Clone, Copy)]
struct Config {
    vocab: usize,
    dim: usize,
    heads: usize,
    layers: usize,
    ctx: usize,
    checkpoint: bool,
}

struct Block<'g> {
    ln1: LayerNorm<'g>,
    qkv: Linear<'g>,
    proj: Linear<'g>,
    ln2: LayerNorm<'g>,
    up: Linear<'g>,
    down: Linear<'g>,
}

struct Gpt<'g> {
    tok: GraphTensor<'g>,
    pos: GraphTensor<'g>,
    blocks: Vec<Block<'g>>,
    ln_f: LayerNorm<'g>,
    head: Linear<'g>,
    c: Config,
}

impl<'g> Gpt<'g> {
    fn new(cx: &'g Graph, c: Config) -> Gpt<'g> {
        let d = c.dim;
        let blocks = (0..c.layers)
            .map(|i| {
                let p = format!("h.{i}");
                Block {
                    ln1: LayerNorm::new(cx, &format!("{p}.ln1"), d, true, true, 1e-5),
                    qkv: Linear::new(cx, &format!("{p}.qkv"), d, 3 * d, true),
                    proj: Linear::new(cx, &format!("{p}.proj"), d, d, true),
                    ln2: LayerNorm::new(cx, &format!("{p}.ln2"), d, true, true, 1e-5),
                    up: Linear::new(cx, &format!("{p}.up"), d, 4 * d, true),
                    down: Linear::new(cx, &format!("{p}.down"), 4 * d, d, true),
                }
            })
            .collect();
        Gpt {
            tok: cx.tensor("tok.weight", (c.vocab, d)),
            pos: cx.tensor("pos.weight", (c.ctx, d)),
            blocks,
            ln_f: LayerNorm::new(cx, "ln_f", d, true, true, 1e-5),
            head: Linear::new(cx, "head", d, c.vocab, true),
            c,
        }
    }

    /// `(parameter, initial values)`: GPT-2's scheme (N(0, 0.02) as a uniform of the same
    /// variance; norms 1 and 0; biases 0).
    fn parameters(&self, init: &mut Init) -> Vec<(GraphTensor<'g>, Vec<f32>)> {
        let mut out = vec![];
        let mut weight = |t: GraphTensor<'g>, out: &mut Vec<(GraphTensor<'g>, Vec<f32>)>| {
            let n = t.n_elements().as_constant().unwrap() as usize;
            out.push((t, init.uniform(n, 0.02 * 3f32.sqrt())));
        };
        let fill = |t: GraphTensor<'g>, v: f32| {
            let n = t.n_elements().as_constant().unwrap() as usize;
            (t, vec![v; n])
        };
        weight(self.tok, &mut out);
        weight(self.pos, &mut out);
        let mut linear = |l: &Linear<'g>, out: &mut Vec<_>| {
            weight(l.weight, out);
            out.extend(l.bias.map(|b| fill(b, 0.0)));
        };
        let norm = |n: &LayerNorm<'g>, out: &mut Vec<_>| {
            out.extend(n.weight.map(|w| fill(w, 1.0)));
            out.extend(n.bias.map(|b| fill(b, 0.0)));
        };
        for b in &self.blocks {
            norm(&b.ln1, &mut out);
            linear(&b.qkv, &mut out);
            linear(&b.proj, &mut out);
            norm(&b.ln2, &mut out);
            linear(&b.up, &mut out);
            linear(&b.down, &mut out);
        }
        norm(&self.ln_f, &mut out);
        linear(&self.head, &mut out);
        out
    }

    /// `ids [B, T]` → logits `[B, T, vocab]`.
    fn forward(&self, ids: GraphTensor<'g>) -> GraphTensor<'g> {
        let (b, t) = (ids.shape()[0].clone(), ids.shape()[1].clone());
        let (d, h) = (self.c.dim, self.c.heads);
        let hd = d / h;
        let mut x = self.tok.embedding(ids) + self.pos.expand(0, b.clone());
        for blk in &self.blocks {
            let block = |mut x: GraphTensor<'g>| {
                let qkv = blk.qkv.forward(blk.ln1.forward(x)); // [B, T, 3D]
                let qkv = qkv.reshape(vec![b.clone(), t.clone(), 3.into(), h.into(), hd.into()]);
                let head = |i: i64| qkv.slice(2, i, i + 1).squeeze(2).permute(&[0, 2, 1, 3]);
                let att = causal_attention(head(0), head(1), head(2)) // [B, H, T, hd]
                    .permute(&[0, 2, 1, 3])
                    .reshape(vec![b.clone(), t.clone(), d.into()]);
                x = x + blk.proj.forward(att);
                x + blk
                    .down
                    .forward(blk.up.forward(blk.ln2.forward(x)).gelu_tanh())
            };
            x = if self.c.checkpoint {
                ids.graph.checkpoint(|| block(x))
            } else {
                block(x)
            };
        }
        self.head.forward(self.ln_f.forward(x))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut file = "/usr/share/common-licenses/GPL-3".to_string();
    let (mut steps, mut threads, mut layers, mut dim, mut ctx, mut batch) =
        (300usize, 2usize, 2usize, 64usize, 64usize, 16usize);
    let mut checkpoint = false;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--checkpoint" {
            checkpoint = true;
            continue;
        }
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--file" => file = v.clone(),
            "--steps" => steps = v.parse()?,
            "--threads" => threads = v.parse()?,
            "--layers" => layers = v.parse()?,
            "--dim" => dim = v.parse()?,
            "--ctx" => ctx = v.parse()?,
            "--batch" => batch = v.parse()?,
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?;
    let mut chars: Vec<char> = text
        .chars()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    chars.sort_unstable();
    let index = |c: char| chars.binary_search(&c).unwrap() as i32;
    let data: Vec<i32> = text.chars().map(index).collect();
    if data.len() <= ctx + 1 {
        return Err(format!("{file} is shorter than the context ({ctx} chars)").into());
    }
    let c = Config {
        vocab: chars.len(),
        dim,
        heads: 4,
        layers,
        ctx,
        checkpoint,
    };
    eprintln!(
        "{file}: {} chars, vocab {}; GPT {layers} layers, dim {dim}, 4 heads, ctx {ctx}, batch {batch}",
        data.len(),
        c.vocab
    );

    // Training graph.
    let cx = Graph::new();
    let ids = cx.input("ids", (batch, ctx), DType::I32);
    let targets = cx.input("targets", batch * ctx, DType::I32);
    let gpt = Gpt::new(&cx, c);
    let logits = gpt.forward(ids).reshape(vec![batch * ctx, c.vocab]);
    let loss = cross_entropy(logits, targets, CrossEntropy::default());
    let mut init = Init::new(0);
    let params = gpt.parameters(&mut init);
    let tensors: Vec<GraphTensor> = params.iter().map(|(p, _)| *p).collect();
    let n_params: usize = params.iter().map(|(_, v)| v.len()).sum();
    let options = TrainOptions {
        mode: StateMode::HostCopy,
        clip_grad_norm: Some(1.0),
        ..TrainOptions::default()
    };
    let step = TrainStep::build(&tensors, loss, &Adam::adamw(), options);
    let rt = cx.compile(CpuBackend::with_threads(threads), CompileOptions::default())?;
    let mut trainer = Trainer::new(rt, step)?;
    for (p, v) in &params {
        trainer.runtime.set(*p, v)?;
    }
    eprintln!("{n_params} parameters");
    let schedule = WarmupCosine {
        lr: 3e-3,
        min_lr: 3e-4,
        start_factor: 0.1,
        warmup: steps / 10,
        total: steps.max(2),
    };
    let mut rng = StdRng::seed_from_u64(0);
    let (mut xb, mut yb) = (vec![0i32; batch * ctx], vec![0i32; batch * ctx]);
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").expect("template"));
    let start = Instant::now();
    let mut timed = std::time::Duration::ZERO;
    let mut last = f32::NAN;
    for s in 0..steps {
        let t0 = Instant::now();
        for r in 0..batch {
            let at = rng.random_range(0..data.len() - ctx - 1);
            xb[r * ctx..(r + 1) * ctx].copy_from_slice(&data[at..at + ctx]);
            yb[r * ctx..(r + 1) * ctx].copy_from_slice(&data[at + 1..at + ctx + 1]);
        }
        trainer.runtime.set(ids, &xb)?;
        trainer.runtime.set(targets, &yb)?;
        last = trainer.step(schedule.lr(s))?;
        if s >= 5 {
            timed += t0.elapsed();
        }
        if s == 0 {
            bar.suspend(|| {
                eprintln!(
                    "memory plan: {:.1} MB{}",
                    trainer.runtime.buffer_bytes() as f64 / 1e6,
                    if checkpoint {
                        " (blocks checkpointed)"
                    } else {
                        ""
                    }
                )
            });
        }
        let tok_s = ((s + 1) * batch * ctx) as f64 / start.elapsed().as_secs_f64();
        bar.set_message(format!("loss {last:.3}  {tok_s:.0} tok/s"));
        bar.inc(1);
        if s % 50 == 0 {
            bar.println(format!("step {s:>4}  loss {last:.4}"));
        }
    }
    bar.finish();
    if std::env::var("LUMINAL_PROFILE").is_ok_and(|v| v == "1") {
        eprintln!("{}", trainer.runtime.profile());
    }
    let secs = timed.as_secs_f64();
    eprintln!(
        "final loss {last:.4} (uniform guess: {:.4}); {:.1} ms/step",
        (c.vocab as f32).ln(),
        secs * 1e3 / steps.saturating_sub(5).max(1) as f64
    );

    // Sampling graph: one sequence of the full context, the last position's distribution.
    let scx = Graph::new();
    let sids = scx.input("ids", (1, ctx), DType::I32);
    let sgpt = Gpt::new(&scx, c);
    let probs = (sgpt.forward(sids).slice(1, ctx as i64 - 1, ctx as i64) * (1.0 / 0.8))
        .softmax(-1)
        .output();
    let mut srt = scx.compile(CpuBackend::with_threads(threads), CompileOptions::default())?;
    for ((sp, _), p) in sgpt.parameters(&mut Init::new(0)).iter().zip(&tensors) {
        srt.set(*sp, &trainer.state_value(*p)?)?;
    }
    let mut window: Vec<i32> = data[..ctx].to_vec();
    let mut out: String = window.iter().map(|&i| chars[i as usize]).collect();
    for _ in 0..300 {
        srt.set(sids, &window)?;
        srt.run()?;
        let p: Vec<f32> = srt.get(probs)?;
        let mut u: f32 = rng.random_range(0.0..1.0);
        let mut next = p.len() - 1;
        for (i, &pi) in p.iter().enumerate() {
            if u < pi {
                next = i;
                break;
            }
            u -= pi;
        }
        window.remove(0);
        window.push(next as i32);
        out.push(chars[next]);
    }
    println!("{out}");
    Ok(())
}
