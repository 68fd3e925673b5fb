//! The encoder-side layers (BERT, Whisper) against PyTorch
//! (scripts/gen_nn_torch_fixtures.py → tests/fixtures/torch_layers.json), on the reference
//! and the CPU backend.

use luminal::prelude::*;
use luminal_cpu::CpuBackend;
use luminal_nn::*;
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let all: Value = serde_json::from_str(include_str!("fixtures/torch_layers.json")).unwrap();
    let case = all[name].clone();
    assert!(!case.is_null(), "no fixture case {name}");
    case
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

fn dims(t: GraphTensor) -> Vec<usize> {
    t.shape()
        .iter()
        .map(|d| d.as_constant().unwrap() as usize)
        .collect()
}

/// Runs `out` with every input set from the case (each input's fixture name is its input
/// name) on `rt`, and compares it with the expected values.
fn check_on<R: Runtime>(
    mut rt: R,
    case: &str,
    inputs: &[GraphTensor],
    out: GraphTensor,
    what: &str,
) {
    let f = fixture(case);
    for t in inputs {
        let name = parameter_name(*t);
        let v = &f["inputs"][&name];
        assert!(!v.is_null(), "{case}: fixture has no input {name}");
        assert_eq!(dims(*t), shape(v), "{case}: shape of {name}");
        rt.set(*t, &floats(v)).unwrap();
    }
    rt.run().unwrap();
    let got: Vec<f32> = rt.get(out).unwrap();
    let want = floats(&f["expected"]);
    assert_eq!(dims(out), shape(&f["expected"]), "{case}: output shape");
    assert_eq!(got.len(), want.len());
    let atol = f["atol"].as_f64().unwrap() as f32;
    let rtol = f["rtol"].as_f64().unwrap() as f32;
    let mut worst = 0f32;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let err = (g - w).abs();
        worst = worst.max(err);
        assert!(
            err <= atol + rtol * w.abs(),
            "{case} on {what}[{i}]: got {g}, want {w} (atol {atol}, rtol {rtol})"
        );
    }
    println!("{case} on {what}: max |error| {worst:.2e}");
}

/// The check on the reference backend and on the CPU backend (one and two threads).
fn check(cx: &Graph, case: &str, inputs: &[GraphTensor], out: GraphTensor) {
    let opts = CompileOptions::default();
    check_on(
        cx.compile(ReferenceBackend, opts.clone()).unwrap(),
        case,
        inputs,
        out,
        "reference",
    );
    check_on(
        cx.compile(CpuBackend::with_threads(1), opts.clone())
            .unwrap(),
        case,
        inputs,
        out,
        "cpu-1",
    );
    check_on(
        cx.compile(CpuBackend::with_threads(2), opts).unwrap(),
        case,
        inputs,
        out,
        "cpu-2",
    );
}

fn elementwise(case: &str, f: impl for<'g> Fn(GraphTensor<'g>) -> GraphTensor<'g>) {
    let cx = Graph::new();
    let n = shape(&fixture(case)["inputs"]["x"])[0];
    let x = cx.tensor("x", n);
    let y = f(x).output();
    check(&cx, case, &[x], y);
}

#[test]
fn erf_and_gelu_both_forms() {
    elementwise("erf", |x| x.erf());
    elementwise("gelu_erf", |x| Activation::Gelu.apply(x));
    elementwise("gelu_tanh", |x| Activation::GeluTanh.apply(x));
}

#[test]
fn activation_names_of_hf_configs() {
    assert_eq!(Activation::from_hf_name("gelu"), Some(Activation::Gelu));
    assert_eq!(
        Activation::from_hf_name("gelu_new"),
        Some(Activation::GeluTanh)
    );
    assert_eq!(
        Activation::from_hf_name("gelu_pytorch_tanh"),
        Some(Activation::GeluTanh)
    );
    assert_eq!(Activation::from_hf_name("relu"), Some(Activation::Relu));
    assert_eq!(Activation::from_hf_name("swish"), Some(Activation::Silu));
    assert_eq!(Activation::from_hf_name("mish"), None);
}

#[test]
fn layer_norm_with_and_without_affine() {
    for (case, affine, bias) in [
        ("ln_affine", true, true),
        ("ln_weight_only", true, false),
        ("ln_plain", false, false),
    ] {
        let cx = Graph::new();
        let x = cx.tensor("x", (2, 5, 48));
        let ln = LayerNorm::new(&cx, "ln", 48, affine, bias, 1e-12);
        assert_eq!(ln.parameters().len(), affine as usize + bias as usize);
        let y = ln.forward(x).output();
        let mut inputs = ln.parameters();
        inputs.push(x);
        check(&cx, case, &inputs, y);
    }
}

#[test]
fn bidirectional_attention_with_padding_mask() {
    for case in ["attention_self_masked", "attention_cross_masked"] {
        let f = fixture(case);
        let cx = Graph::new();
        let q = cx.tensor("q", shape(&f["inputs"]["q"]));
        let k = cx.tensor("k", shape(&f["inputs"]["k"]));
        let v = cx.tensor("v", shape(&f["inputs"]["v"]));
        let mask = cx.tensor("mask", shape(&f["inputs"]["mask"]));
        let y = attention(q, k, v, Some(mask)).output();
        check(&cx, case, &[q, k, v, mask], y);
    }
    let cx = Graph::new();
    let q = cx.tensor("q", (1, 2, 4, 8));
    let k = cx.tensor("k", (1, 2, 5, 8));
    let v = cx.tensor("v", (1, 2, 5, 8));
    let y = attention(q, k, v, None).output();
    check(&cx, "attention_unmasked", &[q, k, v], y);
}

/// A row whose keys are all padding attends uniformly (transformers' finite mask), no NaN.
#[test]
fn fully_padded_row_attends_uniformly() {
    let cx = Graph::new();
    let q = cx.tensor("q", (1, 1, 2, 2));
    let k = cx.tensor("k", (1, 1, 3, 2));
    let v = cx.tensor("v", (1, 1, 3, 2));
    let mask = cx.tensor("mask", (1, 3));
    let y = attention(q, k, v, Some(mask)).output();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    rt.set(q, &[1.0, 2.0, -1.0, 0.5]).unwrap();
    rt.set(k, &[0.3, 0.1, 2.0, -1.0, 0.0, 4.0]).unwrap();
    rt.set(v, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    rt.set(mask, &[0.0, 0.0, 0.0]).unwrap();
    rt.run().unwrap();
    let got: Vec<f32> = rt.get(y).unwrap();
    for (g, w) in got.iter().zip([3.0, 4.0, 3.0, 4.0]) {
        assert!((g - w).abs() < 1e-5, "got {got:?}");
    }
}

#[test]
fn multi_head_self_and_cross_attention() {
    let cx = Graph::new();
    let mha = MultiHeadAttention::new(&cx, "mha", 24, 4, true);
    assert_eq!(mha.parameters().len(), 8);
    let x = cx.tensor("x", (2, 5, 24));
    let mask = cx.tensor("mask", (2, 5));
    let y = mha.forward_self(x, Some(mask)).output();
    let mut inputs = mha.parameters();
    inputs.extend([x, mask]);
    check(&cx, "mha_self_masked", &inputs, y);

    let cx = Graph::new();
    let mha = MultiHeadAttention::new(&cx, "mha", 24, 4, true);
    let x = cx.tensor("x", (2, 5, 24));
    let memory = cx.tensor("memory", (2, 9, 24));
    let mask = cx.tensor("mask", (2, 9));
    let y = mha.forward_cross(x, memory, Some(mask)).output();
    let mut inputs = mha.parameters();
    inputs.extend([x, memory, mask]);
    check(&cx, "mha_cross_masked", &inputs, y);
}

#[test]
fn learned_and_sinusoidal_positions() {
    let cx = Graph::new();
    let pos = PositionEmbedding::new(&cx, "pos", 10, 6);
    let x = cx.tensor("x", (2, 7, 6));
    let y = pos.forward(x).output();
    check(&cx, "position_learned", &[pos.weight, x], y);

    let cx = Graph::new();
    let pos = PositionEmbedding::new(&cx, "pos", 10, 6);
    let rows = pos.positions(3, 5).output();
    check(&cx, "position_rows_3_to_8", &[pos.weight], rows);

    let cx = Graph::new();
    let table = sinusoidal_positions(&cx, 200, 32, 10000.0).output();
    check(&cx, "sinusoids_200x32", &[], table);
}

#[test]
fn conv1d_pytorch_defaults_and_options() {
    for case in [
        "conv1d_default",
        "conv1d_stride2_pad1",
        "conv1d_groups2_dilation2_nobias",
        "conv1d_unbatched",
    ] {
        let f = fixture(case);
        let o = &f["options"];
        let get = |k: &str, default: u64| o[k].as_u64().unwrap_or(default) as usize;
        let options = Conv1dOptions {
            stride: get("stride", 1),
            padding: get("padding", 0),
            dilation: get("dilation", 1),
            groups: get("groups", 1),
            bias: o["bias"].as_bool().unwrap_or(true),
        };
        let cx = Graph::new();
        let conv = Conv1d::new(
            &cx,
            "conv",
            get("in", 0),
            get("out", 0),
            get("kernel", 0),
            options,
        );
        let x = cx.tensor("x", shape(&f["inputs"]["x"]));
        let y = conv.forward(x).output();
        let mut inputs = conv.parameters();
        inputs.push(x);
        check(&cx, case, &inputs, y);
    }
    assert_eq!(Conv1dOptions::default().stride, 1);
    assert!(Conv1dOptions::default().bias);
}

#[test]
fn gelu_feed_forward() {
    let cx = Graph::new();
    let ff = FeedForward::new(&cx, "ff", 8, 20, Activation::Gelu);
    let x = cx.tensor("x", (2, 3, 8));
    let y = ff.forward(x).output();
    let mut inputs = ff.parameters();
    inputs.push(x);
    check(&cx, "feed_forward_gelu", &inputs, y);
}

#[test]
fn conv2d_pytorch_defaults_and_options() {
    for case in [
        "conv2d_default",
        "conv2d_stride2_pad1_groups",
        "conv2d_unbatched_nobias",
    ] {
        let f = fixture(case);
        let o = &f["options"];
        let get = |k: &str, default: u64| o[k].as_u64().unwrap_or(default) as usize;
        let options = Conv2dOptions {
            stride: get("stride", 1),
            padding: get("padding", 0),
            dilation: get("dilation", 1),
            groups: get("groups", 1),
            bias: o["bias"].as_bool().unwrap_or(true),
        };
        let cx = Graph::new();
        let conv = Conv2d::new(
            &cx,
            "conv",
            get("in", 0),
            get("out", 0),
            get("kernel", 0),
            options,
        );
        let x = cx.tensor("x", shape(&f["inputs"]["x"]));
        let y = conv.forward(x).output();
        let mut inputs = conv.parameters();
        inputs.push(x);
        check(&cx, case, &inputs, y);
    }
}

#[test]
fn rms_norm_with_and_without_weight() {
    for (case, affine) in [("rms_weight", true), ("rms_plain", false)] {
        let cx = Graph::new();
        let x = cx.tensor("x", (3, 40));
        let norm = RmsNorm::with_affine(&cx, "rms", 40, affine, 1e-6);
        assert_eq!(norm.parameters().len(), affine as usize);
        let y = norm.forward(x).output();
        let mut inputs = norm.parameters();
        inputs.push(x);
        check(&cx, case, &inputs, y);
    }
}
