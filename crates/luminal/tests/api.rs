//! The API fixes of issue 15 (what a PyTorch user trips on), against PyTorch values
//! (scripts/gen_api_fixtures.py → tests/fixtures/api_torch.json) where there are values:
//! `get` of the wrong dtype names the tensor and says which way is wrong, `.output()` on a
//! view keeps the handle readable, negative axes in `permute` / `pad_axis`, `pad`'s order
//! against `F.pad`, `rsqrt`, `pow` with a tensor exponent, conv/pool keyword defaults.

use luminal::prelude::*;
use luminal::{DataAccess, LuminalError};
use serde_json::Value;

fn case(name: &str) -> Value {
    let all: Value = serde_json::from_str(include_str!("fixtures/api_torch.json")).unwrap();
    let c = all[name].clone();
    assert!(!c.is_null(), "no fixture case {name}");
    c
}

fn values(v: &Value) -> Vec<f32> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| match x {
            Value::String(s) => match s.as_str() {
                "nan" => f32::NAN,
                "inf" => f32::INFINITY,
                "-inf" => f32::NEG_INFINITY,
                other => panic!("bad special value {other}"),
            },
            x => x.as_f64().unwrap() as f32,
        })
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

/// Runs `build` on inputs named as in the fixture (in `names` order) and compares with
/// torch: NaN where torch has NaN, equal infinities, else within 1e-5 relative + 1e-6.
fn check(
    name: &str,
    names: &[&str],
    build: impl for<'g> Fn(&[GraphTensor<'g>]) -> GraphTensor<'g>,
) {
    let c = case(name);
    let cx = Graph::new();
    let inputs: Vec<GraphTensor> = names
        .iter()
        .map(|n| cx.tensor(n, shape(&c["inputs"][n])))
        .collect();
    let out = build(&inputs).output();
    let got_shape: Vec<usize> = out
        .shape()
        .iter()
        .map(|d| d.as_constant().unwrap() as usize)
        .collect();
    assert_eq!(got_shape, shape(&c["expected"]), "{name}: shape");
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    for (t, n) in inputs.iter().zip(names) {
        rt.set(*t, &values(&c["inputs"][n])).unwrap();
    }
    rt.run().unwrap();
    let got: Vec<f32> = rt.get(out).unwrap();
    for (i, (g, w)) in got.iter().zip(values(&c["expected"])).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            *g == w
        } else {
            (g - w).abs() <= 1e-6 + 1e-5 * w.abs()
        };
        assert!(ok, "{name}[{i}]: got {g}, want {w}");
    }
}

#[test]
fn get_of_the_wrong_dtype_says_what_the_tensor_holds() {
    let cx = Graph::new();
    let x = cx.tensor("x", 4);
    let n = cx.input("n", 2, DType::I32);
    let best = x.argmax(0).named("best").output();
    let tripled = (n * 3).output();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    rt.set(x, &[1.0f32, 5.0, 2.0, 0.0]).unwrap();
    rt.set(n, &[1i32, 2]).unwrap();
    rt.run().unwrap();
    let err = rt.get::<f32>(best).unwrap_err();
    assert_eq!(
        err,
        LuminalError::WrongDType {
            tensor: "best (shape [])".into(),
            expected: DType::I32,
            got: DType::F32,
            access: DataAccess::Get,
        }
    );
    let msg = err.to_string();
    assert!(
        msg.starts_with("tensor best (shape []) holds i32, but was read as f32"),
        "{msg}"
    );
    assert_eq!(rt.get::<i32>(best).unwrap(), vec![1]);
    // Unnamed: the op that made it, and its shape.
    let msg = rt.get::<f32>(tripled).unwrap_err().to_string();
    assert!(
        msg.contains("(shape [2]) holds i32, but was read as f32"),
        "{msg}"
    );
    assert_eq!(rt.get::<i32>(tripled).unwrap(), vec![3, 6]);
    // Setting data of the wrong dtype still says what the data was.
    let msg = rt.set(x, &[1i32, 2, 3, 4]).unwrap_err().to_string();
    assert_eq!(msg, "tensor x: dtype is f32, but the data is i32");
    // `named` on an input keeps the input's name for `set`.
    assert_eq!(parameter_label(n.named("other")), "n");
}

fn parameter_label(t: GraphTensor) -> String {
    t.entry().label
}

/// `.output()` on a permuted / sliced / broadcast view: both the original handle and the
/// returned one read the result (values by definition of the views).
#[test]
fn output_of_a_view_keeps_the_handle_readable() {
    let cx = Graph::new();
    let a = cx.tensor("a", (2, 3));
    let b_in = cx.tensor("b", 3);
    let t = a.permute(&[1, 0]);
    let returned = t.output();
    let s = a.slice(1, 1, 3);
    s.output();
    let b = b_in.expand_to((2, 3));
    b.output();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    rt.set(a, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    rt.set(b_in, &[7.0f32, 8.0, 9.0]).unwrap();
    rt.run().unwrap();
    let transposed = vec![1.0f32, 4.0, 2.0, 5.0, 3.0, 6.0];
    assert_eq!(rt.get::<f32>(t).unwrap(), transposed);
    assert_eq!(rt.get::<f32>(returned).unwrap(), transposed);
    assert_eq!(rt.get::<f32>(s).unwrap(), vec![2.0, 3.0, 5.0, 6.0]);
    assert_eq!(
        rt.get::<f32>(b).unwrap(),
        vec![7.0, 8.0, 9.0, 7.0, 8.0, 9.0]
    );
    // The handle still builds on: it is the same tensor.
    assert_eq!(t.shape(), returned.shape());
}

#[test]
fn negative_axes_in_permute_and_pad_axis() {
    check("permute_negative", &["x"], |x| x[0].permute(&[-1, 0, -2]));
    check("f_pad_last_first", &["x"], |x| {
        x[0].pad_axis(-1, 1, 2).pad_axis(-2, 0, 1)
    });
}

/// `pad` lists dims first to last: `F.pad(x, (1, 2, 0, 1))` is `pad(&[(0, 0), (0, 1), (1, 2)])`.
#[test]
fn pad_order_is_the_reverse_of_f_pad() {
    check("f_pad_last_first", &["x"], |x| {
        x[0].pad(&[(0, 0), (0, 1), (1, 2)], 0.0)
    });
    check("f_pad_value", &["x"], |x| {
        x[0].pad(&[(0, 0), (2, 0), (0, 0)], -1.5)
    });
}

#[test]
#[should_panic(expected = "permute: [0, -4, 1] is not a permutation")]
fn permute_rejects_out_of_range_negative_axes() {
    let cx = Graph::new();
    cx.tensor("x", (2, 3, 4)).permute(&[0, -4, 1]);
}

#[test]
fn rsqrt_and_pow_with_a_tensor_exponent() {
    check("rsqrt", &["x"], |x| x[0].rsqrt());
    check("pow_tensor", &["x", "p"], |x| x[0].pow(x[1]));
    check("pow_broadcast", &["x", "p"], |x| x[0].pow(x[1]));
}

#[test]
fn conv_and_pool_with_pytorch_defaults() {
    check("conv1d_default", &["x", "w"], |x| {
        x[0].conv1d_with(x[1], ConvOptions::default())
    });
    check("conv1d_stride2_pad1", &["x", "w"], |x| {
        x[0].conv1d_with(
            x[1],
            ConvOptions {
                stride: 2,
                padding: 1,
                ..Default::default()
            },
        )
    });
    check("conv2d_pad1_groups2", &["x", "w"], |x| {
        x[0].conv2d_with(
            x[1],
            ConvOptions {
                padding: 1,
                groups: 2,
                ..Default::default()
            },
        )
    });
    check("max_pool1d_k2", &["x"], |x| {
        x[0].max_pool1d_with(2, PoolOptions::default())
    });
    check("avg_pool1d_k3", &["x"], |x| {
        x[0].avg_pool1d_with(3, PoolOptions::default())
    });
    check("avg_pool2d_k2", &["x"], |x| {
        x[0].avg_pool2d_with(2, PoolOptions::default())
    });
    check("max_pool2d_k3_s1_p1", &["x"], |x| {
        x[0].max_pool2d_with(
            3,
            PoolOptions {
                stride: Some(1),
                padding: 1,
            },
        )
    });
}
