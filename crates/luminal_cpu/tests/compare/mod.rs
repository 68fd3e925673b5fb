//! Comparing a graph's outputs on the CPU backend (1 and 2 threads) with the reference
//! runtime, shared by the test files that check kernel choices.
#![allow(dead_code)]

use luminal::prelude::*;
use luminal_cpu::{CpuBackend, CpuRuntime};

pub fn cpu(cx: &Graph, threads: usize) -> CpuRuntime {
    cx.compile(CpuBackend::with_threads(threads), CompileOptions::default())
        .unwrap()
}

/// Runs the graph on `backend` with f32 `inputs` and `dims`: the f32 values of `outs`
/// and the kernel names.
pub fn outputs(
    cx: &Graph,
    backend: luminal_cpu::CpuBackend,
    inputs: &[(GraphTensor, Vec<f32>)],
    dims: &[(&str, usize)],
    outs: &[GraphTensor],
) -> (Vec<Vec<f32>>, Vec<String>) {
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    for (t, d) in inputs {
        rt.set_data(*t, HostData::F32(d.clone())).unwrap();
    }
    for (n, v) in dims {
        rt.set_dim(n, *v);
    }
    rt.run().unwrap();
    let got = outs.iter().map(|&o| rt.get::<f32>(o).unwrap()).collect();
    (got, rt.kernel_names())
}

/// Runs the graph on the CPU backend (1 and 2 threads) and the reference with the same
/// inputs and dims and compares every output: bit for bit with `tol` 0, else within
/// `tol · (1 + |reference|)` (f32 outputs). Returns the CPU kernel names.
pub fn check_tol(
    cx: &Graph,
    inputs: &[(GraphTensor, HostData)],
    dims: &[(&str, usize)],
    outs: &[GraphTensor],
    tol: f32,
) -> Vec<String> {
    let mut re = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    for (t, d) in inputs {
        re.set_data(*t, d.clone()).unwrap();
    }
    for (n, v) in dims {
        re.set_dim(n, *v);
    }
    re.run().unwrap();
    let mut names = vec![];
    for threads in [1, 2] {
        let mut rt = cpu(cx, threads);
        for (t, d) in inputs {
            rt.set_data(*t, d.clone()).unwrap();
        }
        for (n, v) in dims {
            rt.set_dim(n, *v);
        }
        rt.run().unwrap();
        for &o in outs {
            let (a, b) = (rt.get_data(o).unwrap(), re.get_data(o).unwrap());
            assert_same(&a, &b, threads, tol);
        }
        names = rt.kernel_names();
    }
    names
}

pub fn assert_same(a: &HostData, b: &HostData, threads: usize, tol: f32) {
    match (a, b) {
        (HostData::F32(x), HostData::F32(y)) => {
            assert_eq!(x.len(), y.len(), "{threads} threads: lengths");
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                if tol == 0.0 {
                    assert_eq!(
                        p.to_bits(),
                        q.to_bits(),
                        "{threads} threads, element {i}: {p} vs {q}"
                    );
                } else {
                    assert!(
                        (p - q).abs() <= tol * (1.0 + q.abs()),
                        "{threads} threads, element {i}: {p} vs {q}"
                    );
                }
            }
        }
        _ => assert_eq!(a, b, "{threads} threads"),
    }
}
