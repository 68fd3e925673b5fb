//! Gradients of small graphs and losses against PyTorch autograd (float64), on the reference
//! and CPU backends. Fixture: `scripts/gen_training_fixtures.py`.

mod common;

use common::*;
use luminal::autograd::gradients;
use luminal::prelude::*;
use luminal_cpu::CpuBackend;
use luminal_training::loss::{self, CrossEntropy, KlReduction, Reduction};
use std::collections::HashMap;

/// The loss of each `grads` case, mirroring the lambda of the same name in the script.
fn build_case<'g>(name: &str, t: &HashMap<String, GraphTensor<'g>>) -> GraphTensor<'g> {
    let all = |x: GraphTensor<'g>| {
        let axes: Vec<i64> = (0..x.rank() as i64).collect();
        x.sum(axes)
    };
    match name {
        "unary" => {
            let x = t["x"];
            all(t["w"] * (x.log2() + x.exp2() + x.sin() + x.sqrt() + x.recip()))
        }
        "linear_relu" => all((t["x"].matmul(t["w1"]) + t["b1"]).relu() * t["w"]),
        "mlp_tanh_sigmoid" => all(t["x"].matmul(t["w1"]).tanh().matmul(t["w2"]).sigmoid() * t["w"]),
        "non_contiguous_views" => {
            let x = t["x"];
            let a = x.permute(&[1, 0]).slice(0, 1, 5);
            // F.pad(x, (0, 0, 1, 2))[:5:2]: pad rows, then every other row of the first five.
            let b = x
                .pad_axis(0, 1, 2)
                .slice(0, 0, 6)
                .reshape([3, 2, 6])
                .slice(1, 0, 1)
                .squeeze(1);
            all(a * t["w"]) + all(b * t["v"])
        }
        "softmax_layer_norm" => {
            let x = t["x"];
            all(x.softmax(1) * t["w1"]) + all(x.layer_norm(1, 1e-5) * t["w2"])
        }
        "amax_mean" => all(t["x"].max(1) * t["w"]) + all(t["x"].mean(0) * t["v"]),
        "embedding" => all(t["table"].embedding(t["ids"]) * t["w"]),
        "conv2d" => all(t["x"].conv2d(t["k"], (1, 1), (0, 0), (1, 1), 1) * t["w"]),
        "conv2d_pad_stride" => all(t["x"].conv2d(t["k"], (2, 2), (1, 1), (1, 1), 1) * t["w"]),
        "batched_matmul_gelu" => all(t["a"].matmul(t["b"]).gelu() * t["w"]),
        "layer_norm_affine_views" => {
            let (x, w, b) = (t["x"], t["w"], t["b"]);
            let y = x.layer_norm(1, 1e-5) * w.expand_to((5, 8)) + b.expand_to((5, 8));
            all(y * t["u"]) + all((x.permute(&[1, 0]) * 2.0).layer_norm(1, 1e-3) * t["v"])
        }
        "gelu_tanh" => {
            let h = t["a"].matmul(t["b"]);
            all(h.gelu_tanh() * t["w"]) + all((h.permute(&[2, 1, 0]) * 1.5).gelu_tanh() * t["v"])
        }
        "elementwise_hl_ops" => {
            let (x, w) = (t["x"], t["w"]);
            let wi = |i: i64| w.slice(0, i, i + 1).squeeze(0);
            all(wi(0) * x.exp())
                + all(wi(1) * x.tanh())
                + all(wi(2) * x.softplus())
                + all(wi(3) * x.silu())
                + all(wi(4) * x.leaky_relu(0.1))
                + all(wi(5) * x.abs())
                + all(wi(6) * x.clamp(-0.5, 0.5))
                + all(wi(7) * x.pow(3.0))
        }
        "log_pow" => {
            let (x, w) = (t["x"], t["w"]);
            let wi = |i: i64| w.slice(0, i, i + 1).squeeze(0);
            all(wi(0) * x.log()) + all(wi(1) * x.pow(1.5)) + all(wi(2) * x.pow(-2.0))
        }
        "rms_norm_var_std" => {
            let x = t["x"];
            all(t["w"] * x.rms_norm(1, 1e-6))
                + all(t["v"] * x.var(1, 1))
                + all(t["u"] * x.std(1, 1))
        }
        "cumsum_prod" => all(t["w"] * t["x"].cumsum(1)) + all(t["v"] * t["x"].prod(1)),
        "concat_split_stack" => {
            let (a, b) = (t["a"], t["b"]);
            let c = GraphTensor::concat(&[a, b], 1);
            all(t["w1"] * c)
                + all(t["w2"] * GraphTensor::stack(&[a, a * 2.0], 0))
                + all(t["w3"] * c.split(&[1, 4], 1)[1])
        }
        "pooling" => {
            let x = t["x"];
            all(t["w1"] * x.max_pool2d((2, 2), (2, 2), (0, 0)))
                + all(t["w2"] * x.avg_pool2d((3, 3), (1, 1), (1, 1)))
        }
        "index_select_gather" => {
            let x = t["x"];
            all(t["w1"] * x.index_select(0, t["idx"])) + all(t["w2"] * x.gather(1, t["idx2"]))
        }
        "conv1d_minimum" => {
            let x = t["x"];
            all(t["w"] * x.conv1d(t["k"], 2, 1, 1, 1)) + all(t["v"] * x.minimum(0.2))
        }
        "select_where" => {
            let x = t["x"];
            all(t["w"] * t["m"].gt(0.5).select(x, x * x))
        }
        "causal_attention" => all(t["w"] * luminal_nn::causal_attention(t["q"], t["k"], t["v"])),
        other => panic!("no builder for grads case {other}"),
    }
}

fn check_grads<B: Backend>(backend: impl Fn() -> B, label: &str) {
    let cases = fixture()["grads"].as_object().unwrap();
    assert!(cases.len() >= 20);
    for (name, case) in cases {
        let cx = Graph::new();
        let mut t = HashMap::new();
        for (k, v) in case["inputs"].as_object().unwrap() {
            t.insert(k.clone(), input(&cx, k, v));
        }
        let params: Vec<String> = case["params"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().to_string())
            .collect();
        let loss = build_case(name, &t);
        let ptensors: Vec<GraphTensor> = params.iter().map(|p| t[p]).collect();
        let grads: Vec<GraphTensor> = gradients(&ptensors, loss)
            .into_iter()
            .map(|g| g.output())
            .collect();
        let loss = loss.output();
        let mut rt = cx.compile(backend(), CompileOptions::default()).unwrap();
        for (k, v) in case["inputs"].as_object().unwrap() {
            set(&mut rt, t[k], v);
        }
        rt.run().unwrap();
        let got_loss = rt.get::<f32>(loss).unwrap();
        let want_loss = case["loss"].as_f64().unwrap() as f32;
        assert_close(
            &format!("{label} {name} loss"),
            &got_loss,
            &[want_loss],
            1e-4,
            1e-4,
        );
        for (p, g) in params.iter().zip(&grads) {
            let want = floats(&case["grads"][p]["data"]);
            let got = rt.get::<f32>(*g).unwrap();
            assert_close(&format!("{label} {name} d/d{p}"), &got, &want, 1e-4, 1e-4);
        }
    }
}

#[test]
fn graph_gradients_match_pytorch_reference_backend() {
    check_grads(|| ReferenceBackend, "reference");
}

#[test]
fn graph_gradients_match_pytorch_cpu_backend() {
    check_grads(|| CpuBackend::with_threads(2), "cpu");
}

fn build_loss<'g>(
    name: &str,
    x: GraphTensor<'g>,
    t: &HashMap<String, GraphTensor<'g>>,
) -> GraphTensor<'g> {
    let ce = CrossEntropy::default();
    match name {
        "mse" => loss::mse(x, t["target"], Reduction::Mean),
        "mse_sum" => loss::mse(x, t["target"], Reduction::Sum),
        "l1" => loss::l1(x, t["target"], Reduction::Mean),
        "huber" => loss::huber(x, t["target"], 0.7, Reduction::Mean),
        "smooth_l1" => loss::smooth_l1(x, t["target"], 0.5, Reduction::Mean),
        "cross_entropy" => loss::cross_entropy(x, t["labels"], ce),
        "cross_entropy_smoothing_ignore" => loss::cross_entropy(
            x,
            t["labels"],
            CrossEntropy {
                label_smoothing: 0.1,
                ignore_index: -100,
                ..ce
            },
        ),
        "cross_entropy_sum" => loss::cross_entropy(
            x,
            t["labels"],
            CrossEntropy {
                reduction: Reduction::Sum,
                ..ce
            },
        ),
        "nll" => loss::nll(x, t["labels"], -100, Reduction::Mean),
        "bce_with_logits" => loss::bce_with_logits(x, t["target"], Reduction::Mean),
        "kl_div" => loss::kl_div(x, t["target"], KlReduction::BatchMean),
        other => panic!("no builder for loss case {other}"),
    }
}

fn check_losses<B: Backend>(backend: impl Fn() -> B, label: &str) {
    let cases = fixture()["losses"].as_object().unwrap();
    for (name, case) in cases {
        let cx = Graph::new();
        let x = input(&cx, "input", &case["input"]);
        let mut t = HashMap::new();
        for k in ["target", "labels"] {
            if case.get(k).is_some() {
                t.insert(k.to_string(), input(&cx, k, &case[k]));
            }
        }
        let l = build_loss(name, x, &t);
        let g = gradients(&[x], l)[0].output();
        let l = l.output();
        let mut rt = cx.compile(backend(), CompileOptions::default()).unwrap();
        set(&mut rt, x, &case["input"]);
        for (k, tensor) in &t {
            set(&mut rt, *tensor, &case[k.as_str()]);
        }
        rt.run().unwrap();
        let want = case["loss"].as_f64().unwrap() as f32;
        assert_close(
            &format!("{label} {name}"),
            &rt.get::<f32>(l).unwrap(),
            &[want],
            1e-5,
            1e-5,
        );
        let want_g = floats(&case["grad"]["data"]);
        assert_close(
            &format!("{label} {name} grad"),
            &rt.get::<f32>(g).unwrap(),
            &want_g,
            1e-5,
            1e-4,
        );
    }
}

#[test]
fn losses_match_pytorch_reference_backend() {
    check_losses(|| ReferenceBackend, "reference");
}

#[test]
fn losses_match_pytorch_cpu_backend() {
    check_losses(|| CpuBackend::with_threads(2), "cpu");
}
