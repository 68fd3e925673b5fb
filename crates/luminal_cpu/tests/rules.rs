//! The lowering rules can be switched off one by one (or all at once): the graph then runs
//! on what remains, down to the reference-semantics fallback, and still matches the
//! reference runtime.

use luminal::prelude::*;
use luminal_cpu::CpuBackend;

/// A small transformer-like graph: matmul, softmax (row fusion), a gather, a concat, a
/// cast to f16 and back.
type Built<'g> = (
    Vec<(GraphTensor<'g>, Vec<f32>)>,
    GraphTensor<'g>,
    GraphTensor<'g>,
    GraphTensor<'g>,
);

fn build(cx: &Graph) -> Built<'_> {
    let table = cx.tensor("table", (10, 6));
    let ids = cx.input("ids", (3,), DType::I32);
    let w = cx.tensor("w", (6, 5));
    let x = table.embedding(ids); // [3, 6]
    let h = x.matmul(w).softmax(1); // [3, 5]
    let y = h
        .concat_along(h.exp(), 1)
        .cast(DType::F16)
        .cast(DType::F32)
        .output();
    let ids_out = (ids.cast(DType::F32) * 2.0).output();
    let ramp = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37) % 23) as f32 / 11.0 - 1.0)
            .collect()
    };
    (vec![(table, ramp(60)), (w, ramp(30))], ids, y, ids_out)
}

fn run(backend: Option<CpuBackend>) -> (Vec<f32>, Vec<f32>, Vec<String>) {
    let cx = Graph::new();
    let (inputs, ids, y, z) = build(&cx);
    macro_rules! go {
        ($rt:expr) => {{
            let mut rt = $rt;
            for (t, d) in &inputs {
                rt.set(*t, d).unwrap();
            }
            rt.set(ids, &[7i32, 0, 3]).unwrap();
            rt.run().unwrap();
            (rt.get::<f32>(y).unwrap(), rt.get::<f32>(z).unwrap())
        }};
    }
    match backend {
        None => {
            let (a, b) = go!(cx
                .compile(ReferenceBackend, CompileOptions::default())
                .unwrap());
            (a, b, vec![])
        }
        Some(be) => {
            let rt = cx.compile(be, CompileOptions::default()).unwrap();
            let names = rt.kernel_names();
            let (a, b) = go!(rt);
            (a, b, names)
        }
    }
}

const ALL: &[&str] = &[
    "write_slice",
    "terms",
    "attention",
    "dequantize",
    "fused_elementwise",
    "half_cast",
    "matmul",
    "fused_reduce",
    "movement",
    "shared",
    "rows",
    "concat",
    "norm_prologue",
    "functions",
    "layer_norm",
    "epilogues",
];

#[test]
fn every_rule_can_be_switched_off() {
    let (want_y, want_z, _) = run(None);
    let (_, _, fast) = run(Some(CpuBackend::with_threads(2)));
    assert!(fast.iter().any(|n| n == "matmul"), "{fast:?}");
    assert!(fast.iter().any(|n| n == "gather"), "{fast:?}");
    let cases: Vec<&'static [&'static str]> = ALL
        .iter()
        .map(|r| std::slice::from_ref(r))
        .chain([ALL])
        .collect();
    for rules in cases {
        let be = CpuBackend::with_threads(2).disable_rules(rules);
        let (y, z, names) = run(Some(be));
        for (a, b) in y.iter().zip(&want_y) {
            assert!(
                (a - b).abs() <= 1e-3 * b.abs().max(1.0),
                "{rules:?}: {a} vs {b}"
            );
        }
        assert_eq!(z, want_z, "{rules:?}");
        if rules.contains(&"matmul") {
            assert!(!names.iter().any(|n| n.starts_with("matmul")), "{names:?}");
        }
        if rules.contains(&"movement") {
            assert!(!names.iter().any(|n| n == "gather"), "{names:?}");
        }
        if rules == ALL {
            assert!(names.iter().all(|n| n.starts_with("fallback")), "{names:?}");
        }
    }
}

#[test]
fn unknown_or_fallback_rule_is_an_error() {
    for bad in [&["no_such_rule"][..], &["fallback"][..]] {
        let cx = Graph::new();
        build(&cx);
        let err = cx
            .compile(
                CpuBackend::default().disable_rules(bad),
                CompileOptions::default(),
            )
            .err()
            .expect("compiling with an unknown rule switched off must fail");
        assert!(err.to_string().contains(bad[0]), "{err}");
    }
}
