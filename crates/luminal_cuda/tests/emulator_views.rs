//! The generated kernels' index math on non-contiguous views (permute, slice, pad, expand and
//! their compositions), odd sizes and dynamic dims, run by the host emulator and compared with
//! the reference backend. On a GPU the same sources go through NVRTC.

mod common;
use common::data;
use luminal::prelude::*;
use luminal_cuda::HostEmulatorBackend;

/// Builds a graph with `build` from f32 inputs of `shapes`, runs it on both backends with
/// `dims` bound, and compares every output.
fn check<'g>(
    cx: &'g Graph,
    inputs: &[GraphTensor<'g>],
    outputs: &[GraphTensor<'g>],
    dims: &[(&str, usize)],
    lens: &[usize],
) {
    // The outputs of the graph on `backend`, with the same dims and input data.
    fn run_on<'g, B: Backend>(
        backend: B,
        cx: &'g Graph,
        (inputs, outs): (&[GraphTensor<'g>], &[GraphTensor<'g>]),
        dims: &[(&str, usize)],
        lens: &[usize],
    ) -> Vec<Vec<f32>> {
        let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
        for (name, v) in dims {
            rt.set_dim(name, *v);
        }
        for (i, (&t, &n)) in inputs.iter().zip(lens).enumerate() {
            rt.set(t, &data(n, i as u32)).unwrap();
        }
        rt.run().unwrap();
        outs.iter().map(|&o| rt.get_f32(o).unwrap()).collect()
    }
    let want = run_on(ReferenceBackend, cx, (inputs, outputs), dims, lens);
    let got = run_on(HostEmulatorBackend, cx, (inputs, outputs), dims, lens);
    for (o, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), w.len(), "output {o}: length");
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 + 1e-5 * b.abs() || (a.is_nan() && b.is_nan()),
                "output {o}[{i}]: emulator {a}, reference {b}"
            );
        }
    }
}

#[test]
fn permuted_sliced_padded_expanded() {
    let cx = Graph::new();
    let a = cx.tensor("a", (3, 5, 7));
    let b = cx.tensor("b", (7, 5));
    // permute + slice + pad, added to an expanded (broadcast) operand, then reduced.
    let pa = a.permute([2, 0, 1]).slice(0, 1, 6).pad_axis(2, 2, 1); // [5, 3, 8]
    let pb = b.permute([1, 0]).slice(1, 2, 5).expand(1, 8); // [5, 8, 3]
    let s = (pa + pb.permute([0, 2, 1])).contiguous();
    let r0 = s.sum(1).output(); // [5, 8]
    let r1 = s.max(2).output(); // [5, 3]
    let r2 = (s * s).sin().output();
    let r3 = s.slice(2, 3, 8).permute([2, 1, 0]).sum(0).output(); // [3, 5]
    check(&cx, &[a, b], &[r0, r1, r2, r3], &[], &[105, 35]);
}

#[test]
fn odd_sizes_and_matmul() {
    let cx = Graph::new();
    let a = cx.tensor("a", (13, 17));
    let b = cx.tensor("b", (17, 1));
    let c = cx.tensor("c", (1, 19));
    let m = a.matmul(b).matmul(c).output(); // [13, 19] through broadcast-multiply + sum
    let soft = a.softmax(1).output();
    let t = a.permute([1, 0]).matmul(a).output(); // transposed operand
    check(&cx, &[a, b, c], &[m, soft, t], &[], &[221, 17, 19]);
}

#[test]
fn dynamic_dims_are_launch_parameters() {
    let cx = Graph::new();
    let x = cx.tensor("x", ("seq", 6));
    let w = cx.tensor("w", (6, 4));
    let y = x.matmul(w).slice(0, 1, "seq").pad_axis(1, 1, 2).output(); // [seq - 1, 7]
    let z = x.permute([1, 0]).sum(1).output();
    for seq in [3usize, 7, 2] {
        check(&cx, &[x, w], &[y, z], &[("seq", seq)], &[seq * 6, 24]);
    }
}

#[test]
fn one_runtime_rebinds_dims_and_reuses_kernels() {
    let cx = Graph::new();
    let x = cx.tensor("x", ("n", 3));
    let y = (x.exp() + 1.0).sum(0).output();
    let mut rt = cx
        .compile(HostEmulatorBackend, CompileOptions::default())
        .unwrap();
    let kernels = rt.kernels().len();
    for n in [5usize, 1, 9] {
        rt.set_dim("n", n);
        let v = data(n * 3, 7);
        rt.set(x, &v).unwrap();
        rt.run().unwrap();
        let got: Vec<f32> = rt.get(y).unwrap();
        for j in 0..3 {
            let want: f32 = (0..n).map(|i| v[i * 3 + j].exp() + 1.0).sum();
            assert!((got[j] - want).abs() <= 1e-4 * want.abs(), "n={n} col {j}");
        }
    }
    assert_eq!(rt.kernels().len(), kernels, "kernels are generated once");
    // Generated once for the symbolic shape: the dim is a parameter, not a constant.
    assert!(rt.kernels().iter().any(|k| k.dims == vec!["n".to_string()]));
}

#[test]
fn gather_out_of_range_is_an_error() {
    let cx = Graph::new();
    let table = cx.tensor("table", (4, 3));
    let ids = cx.input("ids", 2, DType::I32);
    let g = table.embedding(ids).output(); // the Gather primop
    let mut rt = cx
        .compile(HostEmulatorBackend, CompileOptions::default())
        .unwrap();
    rt.set(table, &data(12, 1)).unwrap();
    rt.set(ids, &[3i32, 0]).unwrap();
    rt.run().unwrap();
    assert_eq!(rt.get_f32(g).unwrap().len(), 6);
    rt.set(ids, &[1i32, 4]).unwrap();
    match rt.run() {
        Err(LuminalError::IndexOutOfRange { index: 4, .. }) => {}
        other => panic!("expected an out-of-range error, got {other:?}"),
    }
}

#[test]
fn copies_that_are_the_identity_at_the_dims_are_elided() {
    // [h, s, d] → [s, h, d] is a layout change for s > 1 and the identity for s = 1 (a
    // decode step's attention output): that run launches no copy, and the copy's readers
    // and its own output read the source's buffer.
    use luminal::prelude::*;
    let cx = Graph::new();
    let a = cx.tensor("a", (3, "s", 4));
    let x = a * 2.0 + 1.0; // computed: a buffer of its own
    let y = x.permute([1, 0, 2]).contiguous();
    let z = (y.sin() * 3.0).output();
    let x_out = x.exp2().output(); // a second reader keeps x a buffer
    let y_out = y.output();
    let mut reference = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let mut rt = cx
        .compile(HostEmulatorBackend, CompileOptions::default())
        .unwrap();
    let mut launches = vec![];
    for s in [1usize, 3, 1, 2] {
        let v: Vec<f32> = (0..12 * s).map(|i| (i as f32 * 0.37).sin()).collect();
        for (name, r) in [
            ("reference", &mut reference as &mut dyn Bind),
            ("emulator", &mut rt),
        ] {
            r.bind(a.handle(), s, &v)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        reference.run().unwrap();
        rt.run().unwrap();
        for t in [z, x_out, y_out] {
            let (want, got) = (reference.get_f32(t).unwrap(), rt.get_f32(t).unwrap());
            assert_eq!(want.len(), got.len(), "s {s}");
            for (w, g) in want.iter().zip(&got) {
                assert!(
                    (w - g).abs() <= 1e-5 * (1.0 + w.abs()),
                    "s {s}: want {w}, got {g}"
                );
            }
        }
        launches.push(rt.launches());
    }
    assert!(
        launches[0] < launches[1] && launches[2] == launches[0] && launches[3] == launches[1],
        "{launches:?}"
    );
}

/// Binds `s` and sets `a` on either runtime.
trait Bind {
    fn bind(&mut self, a: luminal::graph::TensorRef, s: usize, v: &[f32]) -> luminal::Result<()>;
}

impl<R: luminal::Runtime> Bind for R {
    fn bind(&mut self, a: luminal::graph::TensorRef, s: usize, v: &[f32]) -> luminal::Result<()> {
        self.set_dim("s", s);
        self.set_data(a, HostData::F32(v.to_vec()))
    }
}
