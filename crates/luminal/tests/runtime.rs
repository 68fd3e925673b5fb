//! Reference runtime behaviour: weights persist, dynamic dims rebind without recompiling.

use luminal::prelude::*;

#[test]
fn weights_set_once_stay_across_runs() {
    let cx = Graph::new();
    let w = cx.tensor("w", 3);
    let x = cx.tensor("x", 3);
    let y = (x * w).sum(0).output();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    rt.set(w, &[1.0f32, 2.0, 3.0]).unwrap();
    for (xs, want) in [
        ([1.0f32, 1.0, 1.0], 6.0f32),
        ([0.0, 0.0, 2.0], 6.0),
        ([1.0, -1.0, 0.0], -1.0),
    ] {
        rt.set(x, &xs).unwrap();
        rt.run().unwrap();
        assert_eq!(rt.get::<f32>(y).unwrap(), vec![want]);
    }
}

#[test]
fn dynamic_dims_rebind_between_runs() {
    let cx = Graph::new();
    let x = cx.tensor("x", ("seq", 2));
    let total = x.sum(0).output();
    let mean = x.mean(0).output();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    for seq in [1usize, 3, 17] {
        rt.set_dim("seq", seq);
        let data: Vec<f32> = (0..seq * 2).map(|i| i as f32).collect();
        rt.set(x, &data).unwrap();
        rt.run().unwrap();
        let even: f32 = (0..seq).map(|r| (2 * r) as f32).sum();
        let odd: f32 = (0..seq).map(|r| (2 * r + 1) as f32).sum();
        assert_eq!(rt.get::<f32>(total).unwrap(), vec![even, odd]);
        let m: Vec<f32> = rt.get(mean).unwrap();
        assert!((m[0] - even / seq as f32).abs() < 1e-6 && (m[1] - odd / seq as f32).abs() < 1e-6);
    }
}

#[test]
fn readme_example() {
    let cx = Graph::new();
    let a = cx.tensor("a", (3, 1));
    let b = cx.tensor("b", (1, 4));
    let c = a.matmul(b).output();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    rt.set(a, &[1., 2., 3.]).unwrap();
    rt.set(b, &[1., 2., 3., 4.]).unwrap();
    rt.run().unwrap();
    let out: Vec<f32> = rt.get(c).unwrap();
    assert_eq!(out, vec![1., 2., 3., 4., 2., 4., 6., 8., 3., 6., 9., 12.]);
}

#[test]
fn f16_and_bf16_round_each_op() {
    let cx = Graph::new();
    let a = cx.input("a", 2, DType::F16);
    let b = (a + 0.0009765625).output(); // 2^-10: below half an f16 ulp at 2.0
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    rt.set(a, &[f16::from_f32(1.0), f16::from_f32(2.0)])
        .unwrap();
    rt.run().unwrap();
    let out: Vec<f16> = rt.get(b).unwrap();
    assert_eq!(out, vec![f16::from_f32(1.0009765625), f16::from_f32(2.0)]);
}
