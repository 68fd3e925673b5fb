//! f32 products computed in stages (`MatmulKernel::staging`): split along K over threads
//! (weight gradients, `dYᵀ·X` over the tokens) and computed transposed (`Xᵀ·dY`, few rows
//! and many columns). Results within the reference runtime's f32 sums (1e-4 relative), and bit for
//! bit the same whatever the thread count and whether a row is computed with few rows
//! (transposed) or many (directly).

use luminal::prelude::*;
use luminal::testing::uniform as random;

mod compare;
use compare::check_tol;

fn run(
    cx: &Graph,
    threads: usize,
    inputs: &[(GraphTensor, Vec<f32>)],
    out: GraphTensor,
) -> Vec<f32> {
    run_on(
        cx,
        luminal_cpu::CpuBackend::with_threads(threads),
        inputs,
        out,
    )
}

fn run_on(
    cx: &Graph,
    backend: luminal_cpu::CpuBackend,
    inputs: &[(GraphTensor, Vec<f32>)],
    out: GraphTensor,
) -> Vec<f32> {
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    for (t, d) in inputs {
        rt.set_data(*t, HostData::F32(d.clone())).unwrap();
    }
    rt.run().unwrap();
    rt.get::<f32>(out).unwrap()
}

fn same_bits(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(
            x.to_bits(),
            y.to_bits(),
            "{what}: element {i}: {x} against {y}"
        );
    }
}

/// `dYᵀ·X + bias` over `tokens` rows (K), as a weight gradient is computed: K much larger
/// than M and N, so split along K on more than one thread.
#[test]
fn deep_products_split_along_k_match_the_reference_and_every_thread_count() {
    for (tokens, features_out, features_in) in [(1024, 256, 64), (1000, 76, 64), (1536, 64, 64)] {
        let cx = Graph::new();
        let dy = cx.tensor("dy", (tokens, features_out));
        let x = cx.tensor("x", (tokens, features_in));
        let bias = cx.tensor("bias", features_in);
        let out = (dy.permute([1, 0]).matmul(x) + bias.expand(0, features_out)).output();
        let inputs = [
            (dy, random(tokens * features_out, 1)),
            (x, random(tokens * features_in, 2)),
            (bias, random(features_in, 3)),
        ];
        let host: Vec<_> = inputs
            .iter()
            .map(|(t, d)| (*t, HostData::F32(d.clone())))
            .collect();
        check_tol(&cx, &host, &[], &[out], 1e-4);
        let one = run(&cx, 1, &inputs, out);
        for threads in [2, 3, 4] {
            let what = format!("{tokens}×{features_out}×{features_in}, {threads} threads");
            same_bits(&run(&cx, threads, &inputs, out), &one, &what);
        }
        // Many short slices (16 deep: 63 to 96 of them), split along K by the schedule.
        let sliced = |threads: usize| {
            let mut b = luminal_cpu::CpuBackend::with_threads(threads);
            b.matmul_split = luminal_cpu::MatmulSplit::Depth;
            b.matmul_tiles = Some(luminal_cpu::MatmulTiles { kc: 16, mc: 144 });
            run_on(&cx, b, &inputs, out)
        };
        let one = sliced(1);
        for threads in [2, 3] {
            let what = format!("{tokens}×{features_out}×{features_in}, kc 16, {threads} threads");
            same_bits(&sliced(threads), &one, &what);
        }
    }
}

/// Products of 64 rows and more columns (`Xᵀ·dY`, and a plain row-major one) computed
/// transposed (on AVX-512, whose kernel reads A in place; elsewhere directly): each row
/// equals the same row computed among 80 rows (directly), bit for
/// bit, and the reference within f32 rounding.
#[test]
fn few_row_products_computed_transposed_match_the_same_rows_among_many() {
    // Transposed and split along K, transposed alone, and (where the CPU has AMX) the
    // shapes that take it instead (N and K of at least 128).
    for (k, n) in [(1024, 100), (300, 120), (64, 100), (1024, 256)] {
        for transposed_a in [true, false] {
            let rows = |m: usize| {
                let cx = Graph::new();
                // The first `m` rows of one 80-row operand (columns of A's `[k, 80]` when A
                // is given transposed).
                let base = random(80 * k, 4);
                let (a, a_data) = if transposed_a {
                    let a = cx.tensor("a", (k, m));
                    (a, (0..k * m).map(|e| base[e / m * 80 + e % m]).collect())
                } else {
                    let a = cx.tensor("a", (m, k));
                    (a, base[..m * k].to_vec())
                };
                let b = cx.tensor("b", (k, n));
                let bias = cx.tensor("bias", n);
                let lhs = if transposed_a { a.permute([1, 0]) } else { a };
                let out = (lhs.matmul(b) + bias.expand(0, m)).output();
                let inputs = vec![(a, a_data), (b, random(k * n, 5)), (bias, random(n, 6))];
                let host: Vec<_> = inputs
                    .iter()
                    .map(|(t, d)| (*t, HostData::F32(d.clone())))
                    .collect();
                check_tol(&cx, &host, &[], &[out], 1e-4);
                (1..=2)
                    .map(|t| run(&cx, t, &inputs, out))
                    .collect::<Vec<_>>()
            };
            let few = rows(64);
            let many = rows(80);
            for t in 0..2 {
                let what = format!("k={k} n={n} transposed A={transposed_a}, {} threads", t + 1);
                same_bits(&few[t], &many[t][..64 * n], &what);
                same_bits(&few[t], &few[0], &what);
            }
        }
    }
}
