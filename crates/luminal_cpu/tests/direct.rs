//! Direct kernels (gather, iota, concat): kernel names and counts, and results compared
//! with the reference runtime on random data, including strided/masked views, dynamic
//! sizes, non-f32 dtypes and the typed errors.

use luminal::prelude::*;
use luminal::testing::uniform as random;

mod compare;
use compare::{check_tol, cpu};

/// Runs the graph on the CPU backend (1 and 2 threads) and the reference with the same
/// inputs and dims, and checks every output is bit-identical (these kernels move data).
/// Returns the CPU kernel names.
fn check(
    cx: &Graph,
    inputs: &[(GraphTensor, HostData)],
    dims: &[(&str, usize)],
    outs: &[GraphTensor],
) -> Vec<String> {
    check_tol(cx, inputs, dims, outs, 0.0)
}

fn f32s(v: Vec<f32>) -> HostData {
    HostData::F32(v)
}
fn i32s(v: Vec<i32>) -> HostData {
    HostData::I32(v)
}

fn no_fallback(names: &[String]) {
    assert!(
        names.iter().all(|n| !n.starts_with("fallback")),
        "a fallback kernel is left: {names:?}"
    );
}

// ---------------------------------------------------------------- gather

#[test]
fn embedding_gather_repeated_first_and_last_rows() {
    let cx = Graph::new();
    let table = cx.tensor("table", (50, 33));
    let ids = cx.input("ids", (2, 4), DType::I32);
    let out = table.embedding(ids).output();
    let names = check(
        &cx,
        &[
            (table, f32s(random(50 * 33, 1))),
            (ids, i32s(vec![0, 49, 7, 7, 0, 49, 23, 0])),
        ],
        &[],
        &[out],
    );
    assert_eq!(names, vec!["gather".to_string()]);
}

#[test]
fn gather_through_transposed_sliced_and_padded_tables() {
    for which in 0..4 {
        let cx = Graph::new();
        let table = cx.tensor("table", (40, 30));
        let view = match which {
            // [30, 40]: a row is a strided column of the buffer.
            0 => table.permute(&[1, 0]),
            // Rows 5..25, columns 3..20: contiguous rows at an offset and row stride 30.
            1 => table.slice(0, 5, 25).slice(1, 3, 20),
            // Padded rows and columns read zeros.
            2 => table.pad(&[(2, 3), (1, 4)], 0.0),
            // Transposed then sliced.
            _ => table.permute(&[1, 0]).slice(0, 4, 28).slice(1, 1, 39),
        };
        let rows = view.shape()[0].as_constant().unwrap() as i32;
        let ids = cx.input("ids", 9, DType::I32);
        let out = view.embedding(ids).output();
        let picks = vec![0, rows - 1, 1, rows / 2, 0, rows - 1, 2, 2, rows - 2];
        let names = check(
            &cx,
            &[(table, f32s(random(1200, 2 + which))), (ids, i32s(picks))],
            &[],
            &[out],
        );
        assert!(names.contains(&"gather".to_string()), "{which}: {names:?}");
        no_fallback(&names);
    }
}

#[test]
fn gather_with_strided_indices() {
    // Indices read through a transposed view and a padded one (padding reads index 0).
    let cx = Graph::new();
    let table = cx.tensor("table", (20, 7));
    let ids = cx.input("ids", (3, 4), DType::I32);
    let a = table.embedding(ids.permute(&[1, 0])).output();
    let b = table.embedding(ids.pad_axis(1, 1, 2)).output();
    let names = check(
        &cx,
        &[
            (table, f32s(random(140, 3))),
            (ids, i32s(vec![19, 0, 3, 5, 5, 8, 13, 1, 2, 17, 19, 4])),
        ],
        &[],
        &[a, b],
    );
    no_fallback(&names);
}

#[test]
fn gather_dynamic_index_count_without_recompiling() {
    let cx = Graph::new();
    let table = cx.tensor("table", (64, 48));
    let ids = cx.input("ids", "n", DType::I32);
    let out = table.embedding(ids).output();
    let data = random(64 * 48, 4);
    let mut rt = cpu(&cx, 2);
    let mut re = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    rt.set(table, &data).unwrap();
    re.set(table, &data).unwrap();
    // Growing, shrinking and a large count (the parallel path).
    for n in [3usize, 17, 1, 2000, 5] {
        let picks: Vec<i32> = (0..n).map(|i| ((i * 37 + n) % 64) as i32).collect();
        rt.set_dim("n", n);
        re.set_dim("n", n);
        rt.set(ids, &picks).unwrap();
        re.set(ids, &picks).unwrap();
        rt.run().unwrap();
        re.run().unwrap();
        assert_eq!(
            rt.get::<f32>(out).unwrap(),
            re.get::<f32>(out).unwrap(),
            "n = {n}"
        );
        assert_eq!(rt.get::<f32>(out).unwrap().len(), n * 48);
    }
    assert_eq!(rt.kernel_names(), vec!["gather".to_string()]);
}

#[test]
fn gather_of_non_f32_tables() {
    let cx = Graph::new();
    let table = cx.input("table", (10, 3), DType::I32);
    let ids = cx.input("ids", 6, DType::I32);
    let out = table.embedding(ids).output();
    // torch.gather along an axis (a width-1 gather of flat positions, built with iota).
    let x = cx.tensor("x", (4, 5));
    let idx = cx.input("idx", (4, 2), DType::I32);
    let picked = x.gather(1, idx).output();
    let names = check(
        &cx,
        &[
            (table, i32s((0..30).map(|i| i * 7 - 100).collect())),
            (ids, i32s(vec![9, 0, 4, 4, 9, 1])),
            (x, f32s(random(20, 5))),
            (idx, i32s(vec![4, 0, 1, 1, 3, 2, 0, 4])),
        ],
        &[],
        &[out, picked],
    );
    assert!(
        names.iter().filter(|n| *n == "gather").count() == 2,
        "{names:?}"
    );
}

#[test]
fn gather_index_errors_match_reference() {
    for bad in [5, 6, -1, i32::MIN] {
        let cx = Graph::new();
        let table = cx.tensor("table", (5, 4));
        let ids = cx.input("ids", 3, DType::I32);
        let _ = table.embedding(ids).output();
        let mut rt = cpu(&cx, 2);
        let mut re = cx
            .compile(ReferenceBackend, CompileOptions::default())
            .unwrap();
        for r in [&mut rt as &mut dyn SetRun, &mut re] {
            r.put(table, HostData::F32(vec![1.0; 20]));
            r.put(ids, HostData::I32(vec![0, bad, 4]));
        }
        let expected = Err(LuminalError::IndexOutOfRange {
            op: "Gather".into(),
            index: bad as i64,
            size: 5,
        });
        assert_eq!(re.run(), expected);
        assert_eq!(rt.run(), expected);
    }
}

trait SetRun {
    fn put(&mut self, t: GraphTensor, d: HostData);
}
impl<R: Runtime> SetRun for R {
    fn put(&mut self, t: GraphTensor, d: HostData) {
        self.set_data(t, d).unwrap();
    }
}

// ---------------------------------------------------------------- iota

#[test]
fn iota_affine_and_general_expressions() {
    let cx = Graph::new();
    let z = Expression::var("z");
    let n = Expression::var("n");
    let affine = cx.iota(z.clone() * 3 + n.clone() - 7, 100).output();
    let general = cx
        .iota(z.clone() % 7 - z.clone() / 7 + n.clone(), n.clone() * 11)
        .output();
    let arange = cx.arange(n.clone()).output();
    let big = cx.iota(z.clone() * 2, 300_000).output();
    let x = cx.tensor("x", (6, 6));
    let tril = x.tril(0).output();
    let names = check(
        &cx,
        &[(x, f32s(random(36, 6)))],
        &[("n", 13)],
        &[affine, general, arange, big, tril],
    );
    // (tril's select still has integer compares and adds on the fallback.)
    assert!(
        names.iter().all(|n| !n.starts_with("fallback[Iota")),
        "{names:?}"
    );
    assert!(names.contains(&"iota(affine)".to_string()), "{names:?}");
    assert!(names.contains(&"iota".to_string()), "{names:?}");
}

#[test]
fn iota_division_by_zero_is_an_expression_error() {
    let cx = Graph::new();
    let z = Expression::var("z");
    let _ = cx.iota(z % Expression::var("d"), 4).output();
    let mut rt = cpu(&cx, 1);
    rt.set_dim("d", 0);
    assert!(matches!(rt.run(), Err(LuminalError::Expression(_))));
}

// ---------------------------------------------------------------- concat

#[test]
fn concat_is_one_kernel_along_every_axis() {
    for axis in 0..3 {
        for pieces in [2usize, 3] {
            let cx = Graph::new();
            let mut inputs = vec![];
            let mut tensors = vec![];
            for p in 0..pieces {
                // Runs of at least 16 elements (shorter ones stay fused, see below).
                let mut shape = vec![4usize, 5, 17];
                shape[axis] += p; // different sizes along the axis
                let t = cx.tensor(&format!("t{p}"), shape.clone());
                inputs.push((
                    t,
                    f32s(random(shape.iter().product(), (10 * axis + p) as u64)),
                ));
                tensors.push(t);
            }
            let out = GraphTensor::concat(&tensors, axis).output();
            let names = check(&cx, &inputs, &[], &[out]);
            assert_eq!(
                names,
                vec![format!("concat({axis})")],
                "axis {axis}, {pieces} inputs"
            );
        }
    }
}

#[test]
fn concat_of_views_dynamic_sizes_and_ints() {
    let cx = Graph::new();
    // Strided pieces: a transposed input and a sliced one.
    let a = cx.tensor("a", (18, 4));
    let b = cx.tensor("b", (4, 20));
    let strided = GraphTensor::concat(&[a.permute(&[1, 0]), b.slice(1, 2, 20)], 1).output();
    // Dynamic sizes along the axis.
    let c = cx.tensor("c", ("p", 3));
    let d = cx.tensor("d", ("q", 3));
    let dynamic = GraphTensor::concat(&[c, d, c], 0).output();
    // I32 pieces (ran as per-element fallback adds before).
    let i = cx.input("i", (2, 3), DType::I32);
    let j = cx.input("j", (2, 2), DType::I32);
    let ints = GraphTensor::concat(&[i, j], 1).output();
    let names = check(
        &cx,
        &[
            (a, f32s(random(72, 20))),
            (b, f32s(random(80, 21))),
            (c, f32s(random(15, 22))),
            (d, f32s(random(6, 23))),
            (i, i32s(vec![1, -2, 3, i32::MAX, i32::MIN, 0])),
            (j, i32s(vec![7, 8, 9, 10])),
        ],
        &[("p", 5), ("q", 2)],
        &[strided, dynamic, ints],
    );
    assert_eq!(
        names.iter().filter(|n| n.starts_with("concat")).count(),
        3,
        "{names:?}"
    );
    no_fallback(&names);
}

#[test]
fn short_run_concats_stay_fused_and_match() {
    // RoPE-style interleave: pairs stacked along a new last axis (runs of 1 element), read
    // through permuted and sliced views; and a last-axis concat of 3 + 5. Both stay one
    // fused kernel (short rows load with O(1) work per row) and match the reference.
    let cx = Graph::new();
    let x = cx.tensor("x", (3, 7, 10, 2));
    let (x0, x1) = (x.slice(3, 0, 1).squeeze(3), x.slice(3, 1, 2).squeeze(3));
    let c = cx.tensor("c", (7, 10));
    let cs = c.expand(0, 3);
    let rot = GraphTensor::stack(&[x0 * cs - x1 * cs.sin(), x0 * cs.sin() + x1 * cs], 3)
        .permute(&[1, 0, 2, 3])
        .output();
    let a = cx.tensor("a", (9, 3));
    let b = cx.tensor("b", (5, 9));
    let cat = GraphTensor::concat(&[a, b.permute(&[1, 0])], 1).output();
    let names = check_tol(
        &cx,
        &[
            (x, f32s(random(420, 50))),
            (c, f32s(random(70, 51))),
            (a, f32s(random(27, 52))),
            (b, f32s(random(45, 53))),
        ],
        &[],
        &[rot, cat],
        1e-6,
    );
    assert!(names.iter().all(|n| !n.starts_with("concat")), "{names:?}");
    no_fallback(&names);
}

#[test]
fn concat_dynamic_sizes_change_between_runs() {
    let cx = Graph::new();
    let c = cx.tensor("c", ("p", 4));
    let d = cx.tensor("d", ("q", 4));
    let out = GraphTensor::concat(&[c, d], 0).output();
    let mut rt = cpu(&cx, 2);
    for (p, q) in [(3, 2), (0, 5), (7, 0), (1000, 3000)] {
        let (cd, dd) = (random(p * 4, p as u64), random(q * 4, q as u64 + 99));
        rt.set_dim("p", p);
        rt.set_dim("q", q);
        rt.set(c, &cd).unwrap();
        rt.set(d, &dd).unwrap();
        rt.run().unwrap();
        let expected: Vec<f32> = cd.iter().chain(&dd).copied().collect();
        assert_eq!(rt.get::<f32>(out).unwrap(), expected, "p = {p}, q = {q}");
    }
}

#[test]
fn concat_keeps_reference_zero_sign_and_fuses_into_consumers() {
    let cx = Graph::new();
    let a = cx.tensor("a", 19);
    let b = cx.tensor("b", 18);
    let cat = GraphTensor::concat(&[a, b], 0);
    let out = cat.output();
    // The adds compute `-0.0 + 0.0 = +0.0`; the direct copy does the same.
    let mut ad = vec![-0.0, 1.0, f32::NEG_INFINITY];
    ad.extend(random(16, 40));
    let mut bd = vec![f32::NAN, -0.0];
    bd.extend(random(16, 41));
    let names = check(&cx, &[(a, f32s(ad)), (b, f32s(bd))], &[], &[out]);
    assert_eq!(names, vec!["concat(0)".to_string()]);

    // Consumed once by an elementwise op: stays inside that one fused kernel.
    let cx = Graph::new();
    let a = cx.tensor("a", (4, 3));
    let b = cx.tensor("b", (4, 5));
    let out = (GraphTensor::concat(&[a, b], 1) * 2.0).exp().output();
    let names = check_tol(
        &cx,
        &[(a, f32s(random(12, 30))), (b, f32s(random(20, 31)))],
        &[],
        &[out],
        1e-6,
    );
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].starts_with("elementwise"), "{names:?}");
}

#[test]
fn overlapping_pads_are_not_a_concat() {
    // Overlap-add: windows [0, 4) and [2, 6) overlap, so this is a sum, not a copy.
    let cx = Graph::new();
    let a = cx.tensor("a", (3, 4));
    let b = cx.tensor("b", (3, 4));
    let out = (a.pad_axis(1, 0, 2) + b.pad_axis(1, 2, 0)).output();
    let names = check(
        &cx,
        &[(a, f32s(random(12, 40))), (b, f32s(random(12, 41)))],
        &[],
        &[out],
    );
    assert!(names.iter().all(|n| !n.starts_with("concat")), "{names:?}");
}

#[test]
fn large_concat_and_gather_match_on_many_threads() {
    let cx = Graph::new();
    let a = cx.tensor("a", (300, 257));
    let b = cx.tensor("b", (300, 100));
    let cat = GraphTensor::concat(&[a, b], 1).output();
    let ids = cx.input("ids", 700, DType::I32);
    let rows = a.embedding(ids).output();
    let picks: Vec<i32> = (0..700).map(|i| i * 131 % 300).collect();
    let names = check(
        &cx,
        &[
            (a, f32s(random(300 * 257, 50))),
            (b, f32s(random(300 * 100, 51))),
            (ids, i32s(picks)),
        ],
        &[],
        &[cat, rows],
    );
    no_fallback(&names);
}
