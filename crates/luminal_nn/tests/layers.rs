//! Layers against numpy references (scripts/gen_nn_fixtures.py → tests/fixtures/layers.json).

use luminal::prelude::*;
use luminal_nn::*;
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let all: Value = serde_json::from_str(include_str!("fixtures/layers.json")).unwrap();
    all[name].clone()
}

fn floats(v: &Value) -> Vec<f32> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn shape(v: &Value) -> Vec<usize> {
    v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

/// Sets every named input from the case, runs, and compares `out` with the expected values.
fn check<'g>(
    cx: &'g Graph,
    case: &str,
    tensors: &[GraphTensor<'g>],
    out: GraphTensor<'g>,
    extra: &[(GraphTensor<'g>, Vec<i32>)],
) {
    let f = fixture(case);
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    for t in tensors {
        let name = parameter_name(*t);
        let v = &f["inputs"][&name];
        assert!(!v.is_null(), "{case}: fixture has no input {name}");
        assert_eq!(
            t.shape()
                .iter()
                .map(|d| d.as_constant().unwrap() as usize)
                .collect::<Vec<_>>(),
            shape(v),
            "{case}: {name}"
        );
        rt.set(*t, &floats(v)).unwrap();
    }
    for (t, ids) in extra {
        rt.set(*t, ids).unwrap();
    }
    rt.run().unwrap();
    let got: Vec<f32> = rt.get(out).unwrap();
    let want = floats(&f["expected"]);
    assert_eq!(
        out.shape()
            .iter()
            .map(|d| d.as_constant().unwrap() as usize)
            .collect::<Vec<_>>(),
        shape(&f["expected"])
    );
    let atol = f["atol"].as_f64().unwrap() as f32;
    let rtol = f["rtol"].as_f64().unwrap_or(1e-5) as f32;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= atol + rtol * w.abs(),
            "{case}[{i}]: got {g}, want {w}"
        );
    }
}

#[test]
fn linear_with_and_without_bias() {
    for (case, bias) in [("linear_bias", true), ("linear_nobias", false)] {
        let cx = Graph::new();
        let x = cx.tensor("x", (2, 3, 17));
        let fc = Linear::new(&cx, "fc", 17, 5, bias);
        let names: Vec<String> = fc.parameters().into_iter().map(parameter_name).collect();
        assert_eq!(
            names,
            if bias {
                vec!["fc.weight", "fc.bias"]
            } else {
                vec!["fc.weight"]
            }
        );
        let y = fc.forward(x).output();
        let mut inputs = fc.parameters();
        inputs.push(x);
        check(&cx, case, &inputs, y, &[]);
    }
}

#[test]
fn embedding_lookup() {
    let cx = Graph::new();
    let tok = Embedding::new(&cx, "tok", 11, 4);
    let ids = cx.input("ids", (2, 3), DType::I32);
    let y = tok.forward(ids).output();
    let f = fixture("embedding");
    let id_data: Vec<i32> = f["ids"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap() as i32)
        .collect();
    check(&cx, "embedding", &tok.parameters(), y, &[(ids, id_data)]);
}

#[test]
fn norms() {
    let cx = Graph::new();
    let x = cx.tensor("x", (3, 4, 33));
    let ln = LayerNorm::new(&cx, "ln", 33, true, true, 1e-5);
    let y = ln.forward(x).output();
    let mut inputs = ln.parameters();
    inputs.push(x);
    check(&cx, "layer_norm", &inputs, y, &[]);

    let cx = Graph::new();
    let x = cx.tensor("x", (3, 4, 33));
    let norm = RmsNorm::new(&cx, "norm", 33, 1e-6);
    let y = norm.forward(x).output();
    let mut inputs = norm.parameters();
    inputs.push(x);
    check(&cx, "rms_norm", &inputs, y, &[]);
}

#[test]
fn swiglu_mlp() {
    let cx = Graph::new();
    let x = cx.tensor("x", (2, 5, 8));
    let mlp = SwiGluMlp::new(&cx, "mlp", 8, 12);
    let y = mlp.forward(x).output();
    let mut inputs = mlp.parameters();
    assert_eq!(inputs.len(), 3);
    inputs.push(x);
    check(&cx, "swiglu", &inputs, y, &[]);
}

#[test]
fn rope_layouts_offsets_and_llama3_scaling() {
    let neox = Rope {
        head_dim: 16,
        theta: 10000.0,
        layout: RopeLayout::NeoX,
        scaling: None,
        freq_factors: None,
    };
    let cx = Graph::new();
    let x = cx.tensor("x", (2, 3, 7, 16));
    let y = neox.forward(x, 0).output();
    check(&cx, "rope_neox", &[x], y, &[]);

    // Interleaved pairs, positions starting at a dynamic offset bound at run time.
    let inter = Rope {
        layout: RopeLayout::Interleaved,
        ..neox
    };
    let cx = Graph::new();
    let x = cx.tensor("x", (2, 3, 7, 16));
    let y = inter.forward(x, "start").output();
    let f = fixture("rope_interleaved_start5");
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    rt.set(x, &floats(&f["inputs"]["x"])).unwrap();
    rt.set_dim("start", 5);
    rt.run().unwrap();
    let got: Vec<f32> = rt.get(y).unwrap();
    for (g, w) in got.iter().zip(floats(&f["expected"])) {
        assert!(
            (g - w).abs() <= 2e-5 + 1e-5 * w.abs(),
            "interleaved: got {g}, want {w}"
        );
    }

    let scaling = RopeScaling::Llama3(Llama3Scaling {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192.0,
    });
    let llama3 = Rope {
        head_dim: 64,
        theta: 500000.0,
        layout: RopeLayout::NeoX,
        scaling: Some(scaling),
        freq_factors: None,
    };
    let cx = Graph::new();
    let inv = llama3.inv_freq(&cx).output();
    check(&cx, "inv_freq_llama3", &[], inv, &[]);
    let cx = Graph::new();
    let x = cx.tensor("x", (1, 2, 5, 64));
    let y = llama3.forward(x, 100).output();
    check(&cx, "rope_llama3_start100", &[x], y, &[]);
}

/// GGUF (Llama 3.1+) form of the same Llama-3 scaling: per-frequency factors as a graph
/// input, `inv_freq = theta^(-2i/d) / factor_i`. With the factors llama.cpp's converter
/// writes (`base / scaled`, here from the numpy reference's scaled inverse frequencies) the
/// rotation equals the `rope_scaling` one's numpy reference.
#[test]
fn rope_gguf_freq_factors_equal_llama3_scaling() {
    let (head_dim, theta) = (64usize, 500000.0f64);
    let scaled = floats(&fixture("inv_freq_llama3")["expected"]);
    assert_eq!(scaled.len(), head_dim / 2);
    let factors: Vec<f32> = scaled
        .iter()
        .enumerate()
        .map(|(i, &s)| (theta.powf(-2.0 * i as f64 / head_dim as f64) / s as f64) as f32)
        .collect();
    // Factors are 1 (high frequencies), 8 (low) and in between.
    assert!(factors.iter().any(|&f| (f - 1.0).abs() < 1e-5));
    assert!(factors.iter().any(|&f| (f - 8.0).abs() < 1e-3));
    assert!(factors.iter().any(|&f| f > 1.01 && f < 7.99));

    let cx = Graph::new();
    let rope =
        Rope::new(head_dim, theta as f32, RopeLayout::NeoX).with_freq_factors(&cx, "rope_freqs");
    assert_eq!(rope.parameters().len(), 1);
    assert_eq!(parameter_name(rope.parameters()[0]), "rope_freqs");
    let inv = rope.inv_freq(&cx).output();
    let x = cx.tensor("x", (1, 2, 5, head_dim));
    let y = rope.forward(x, 100).output();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    rt.set(rope.freq_factors.unwrap(), &factors).unwrap();
    let f = fixture("rope_llama3_start100");
    rt.set(x, &floats(&f["inputs"]["x"])).unwrap();
    rt.run().unwrap();
    let got_inv: Vec<f32> = rt.get(inv).unwrap();
    for (g, w) in got_inv.iter().zip(&scaled) {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs() + 1e-12,
            "inv_freq: got {g}, want {w}"
        );
    }
    let got: Vec<f32> = rt.get(y).unwrap();
    let want = floats(&f["expected"]);
    assert_eq!(got.len(), want.len());
    let atol = f["atol"].as_f64().unwrap() as f32;
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (g - w).abs() <= atol + 1e-5 * w.abs(),
            "rope with freq factors: got {g}, want {w}"
        );
    }
}

/// YaRN (d 32, theta 1e4, factor 8, original context 4096: pairs 0-5 kept, 6-11 blended,
/// 12-15 divided by 8) and linear scaling (factor 4) against numpy's transformers formulas:
/// the inverse frequencies, and the rotation (YaRN's cos/sin times 0.1·ln 8 + 1).
#[test]
fn rope_yarn_and_linear_scaling() {
    let yarn = Rope {
        head_dim: 32,
        theta: 10000.0,
        layout: RopeLayout::NeoX,
        scaling: Some(RopeScaling::Yarn(YarnScaling::new(8.0, 4096.0))),
        freq_factors: None,
    };
    assert_eq!(
        YarnScaling::new(8.0, 4096.0).correction_range(32, 10000.0),
        (5.0, 12.0)
    );
    let cx = Graph::new();
    let inv = yarn.inv_freq(&cx).output();
    check(&cx, "inv_freq_yarn", &[], inv, &[]);
    let cx = Graph::new();
    let x = cx.tensor("x", (1, 2, 5, 32));
    let y = yarn.forward(x, 50).output();
    check(&cx, "rope_yarn_start50", &[x], y, &[]);

    let linear = Rope {
        head_dim: 16,
        theta: 10000.0,
        layout: RopeLayout::Interleaved,
        scaling: Some(RopeScaling::Linear { factor: 4.0 }),
        freq_factors: None,
    };
    let cx = Graph::new();
    let inv = linear.inv_freq(&cx).output();
    check(&cx, "inv_freq_linear", &[], inv, &[]);
    let cx = Graph::new();
    let x = cx.tensor("x", (2, 3, 7, 16));
    let y = linear.forward(x, 9).output();
    check(&cx, "rope_linear_interleaved_start9", &[x], y, &[]);
}

/// A window of 3: each query sees itself and the two positions before it, both when the
/// queries are the last 3 of 7 positions (keys cached) and in a prefill of 6.
#[test]
fn sliding_window_attention_cached_and_prefill() {
    let cx = Graph::new();
    let q = cx.tensor("q", (2, 4, 3, 8));
    let k = cx.tensor("k", (2, 2, 7, 8));
    let v = cx.tensor("v", (2, 2, 7, 8));
    let y = causal_attention_windowed(q, k, v, Some(3)).output();
    check(&cx, "attention_swa_cached", &[q, k, v], y, &[]);

    let cx = Graph::new();
    let q = cx.tensor("q", (1, 2, 6, 8));
    let k = cx.tensor("k", (1, 1, 6, 8));
    let v = cx.tensor("v", (1, 1, 6, 8));
    let y = causal_attention_windowed(q, k, v, Some(3)).output();
    check(&cx, "attention_swa_prefill", &[q, k, v], y, &[]);
}

/// The window is part of the mask over dynamic dims: the same compiled graph serves decode
/// steps at different cache lengths `p` (here keys `[0, p + s)` with `s` 1 and 3).
#[test]
fn sliding_window_attention_with_dynamic_past() {
    let f = fixture("attention_swa_cached");
    let (qf, kf, vf) = (
        floats(&f["inputs"]["q"]),
        floats(&f["inputs"]["k"]),
        floats(&f["inputs"]["v"]),
    );
    let want = floats(&f["expected"]);
    let cx = Graph::new();
    let (p, s) = (Expression::var("p"), Expression::var("s"));
    let q = cx.tensor("q", (2, 4, s.clone(), 8));
    let k = cx.tensor("k", (2, 2, p + s, 8));
    let v = cx.tensor("v", (2, 2, Expression::var("p") + Expression::var("s"), 8));
    let y = causal_attention_windowed(q, k, v, Some(3)).output();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    rt.set_dim("p", 4);
    rt.set_dim("s", 3);
    rt.set(q, &qf).unwrap();
    rt.set(k, &kf).unwrap();
    rt.set(v, &vf).unwrap();
    rt.run().unwrap();
    let got: Vec<f32> = rt.get(y).unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (g - w).abs() <= 2e-5 + 1e-5 * w.abs(),
            "p 4: got {g}, want {w}"
        );
    }
    // The last query alone (s 1, p 6) gives the fixture's last row of each head.
    let last_q: Vec<f32> = qf.chunks(8).skip(2).step_by(3).flatten().copied().collect();
    rt.set_dim("p", 6);
    rt.set_dim("s", 1);
    rt.set(q, &last_q).unwrap();
    rt.set(k, &kf).unwrap();
    rt.set(v, &vf).unwrap();
    rt.run().unwrap();
    let got: Vec<f32> = rt.get(y).unwrap();
    let want_last: Vec<f32> = want
        .chunks(8)
        .skip(2)
        .step_by(3)
        .flatten()
        .copied()
        .collect();
    assert_eq!(got.len(), want_last.len());
    for (g, w) in got.iter().zip(&want_last) {
        assert!(
            (g - w).abs() <= 2e-5 + 1e-5 * w.abs(),
            "p 6: got {g}, want {w}"
        );
    }
}

#[test]
fn grouped_query_causal_attention_with_cached_keys() {
    let cx = Graph::new();
    let q = cx.tensor("q", (2, 4, 3, 8));
    let k = cx.tensor("k", (2, 2, 5, 8));
    let v = cx.tensor("v", (2, 2, 5, 8));
    let y = causal_attention(q, k, v).output();
    check(&cx, "attention_gqa_cached", &[q, k, v], y, &[]);
}

#[test]
fn llama_and_qwen2_blocks() {
    for (case, bias) in [("block", false), ("block_qkv_bias", true)] {
        let cx = Graph::new();
        let rope = Rope {
            head_dim: 4,
            theta: 10000.0,
            layout: RopeLayout::NeoX,
            scaling: None,
            freq_factors: None,
        };
        let block = TransformerBlock::new(&cx, "layers.0", 16, 24, 4, 2, bias, rope, 1e-5);
        let x = cx.tensor("x", (2, 6, 16));
        let y = block.forward(x).output();
        let mut inputs = block.parameters();
        assert_eq!(inputs.len(), if bias { 12 } else { 9 });
        inputs.push(x);
        check(&cx, case, &inputs, y, &[]);
    }
}

#[test]
fn hadamard_is_orthonormal_and_its_own_inverse() {
    for n in [1, 2, 8, 64] {
        let h = hadamard(n);
        for i in 0..n {
            for j in 0..n {
                let dot: f64 = (0..n)
                    .map(|k| h[i * n + k] as f64 * h[k * n + j] as f64)
                    .sum();
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((dot - want).abs() < 1e-6, "n {n} [{i}, {j}]: {dot}");
                assert_eq!(h[i * n + j], h[j * n + i]);
            }
        }
    }
}

/// A rotated cache (`KvCache::with_rotation`, here 64-blocks of a head dim of 128 over an
/// f32 cache, so no rounding) computes the same attention as an unrotated one: a prefill
/// of 5 tokens, then a decode step, on the reference runtime.
#[test]
fn rotated_kv_cache_leaves_attention_unchanged() {
    let run = |rotate: bool| -> (Vec<f32>, Vec<f32>) {
        let cx = Graph::new();
        let rope = Rope::new(128, 10000.0, RopeLayout::NeoX);
        let attn = Attention::new(&cx, "attn", 256, 2, 1, false, rope);
        let mut cache = KvCache::new(&cx, "attn", 1, 8, 128);
        let h = cx.tensor("rot", (64, 64));
        if rotate {
            cache = cache.with_rotation(h);
        }
        let x = cx.tensor("x", (1, "s", 256));
        let y = attn.forward_cached(x, "p", &cache).output();
        let mut rt = cx
            .compile(ReferenceBackend, CompileOptions::default())
            .unwrap();
        for (i, w) in attn.parameters().into_iter().enumerate() {
            let n = w
                .shape()
                .iter()
                .map(|d| d.as_constant().unwrap() as usize)
                .product();
            let vals: Vec<f32> = (0..n)
                .map(|j| (((j * 7919 + i * 104729) % 1009) as f32 / 1009.0 - 0.5) * 0.2)
                .collect();
            rt.set(w, &vals).unwrap();
        }
        rt.set(cache.k, &vec![0f32; 8 * 128]).unwrap();
        rt.set(cache.v, &vec![0f32; 8 * 128]).unwrap();
        if rotate {
            rt.set(h, &hadamard(64)).unwrap();
        }
        let mut out = vec![];
        for (p, s) in [(0usize, 5usize), (5, 1)] {
            let xs: Vec<f32> = (0..s * 256)
                .map(|j| (((j + p * 256) * 31 % 997) as f32 / 997.0 - 0.5) * 2.0)
                .collect();
            rt.set_dim("p", p);
            rt.set_dim("s", s);
            rt.set(x, &xs).unwrap();
            rt.run().unwrap();
            out.extend(rt.get::<f32>(y).unwrap());
        }
        (out, rt.get::<f32>(cache.k).unwrap())
    };
    let ((plain, k_plain), (rotated, k_rotated)) = (run(false), run(true));
    // The cached keys are the rotated ones: row 0's first block is H times the plain one.
    let h = hadamard(64);
    for c in 0..64 {
        let want: f32 = (0..64).map(|j| k_plain[j] * h[j * 64 + c]).sum();
        assert!((k_rotated[c] - want).abs() < 1e-5, "rotated key {c}");
    }
    assert!((0..64).any(|c| (k_rotated[c] - k_plain[c]).abs() > 1e-3));
    assert_eq!(plain.len(), 6 * 256);
    for (i, (a, b)) in plain.iter().zip(&rotated).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 + 1e-5 * a.abs(),
            "element {i}: {a} vs {b}"
        );
    }
}
