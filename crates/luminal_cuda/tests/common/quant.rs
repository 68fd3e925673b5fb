//! Dequantizing casts on a backend against the reference runtime (the core's decoders).

use luminal::prelude::*;
use luminal::SharedBytes;

/// xorshift32 bytes.
fn bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(0x9e37);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 11) as u8
        })
        .collect()
}

/// `n` values of `dtype` as raw little-endian storage: random quants, and scales that are
/// finite, of both signs, at trained-weight scale (some subnormal halves among them); halves
/// and bfloat16s random but finite.
pub fn random_storage(dtype: DType, n: usize, seed: u32) -> HostData {
    let nbytes = dtype.bytes_for(n).expect("whole blocks");
    let mut b = bytes(nbytes, seed);
    let scale = |k: usize, raw: u8| -> [u8; 2] {
        let mag = [1e-3f32, 0.02, 0.11, 3e-6][k % 4] * (1.0 + raw as f32 / 255.0);
        let v = if raw & 1 == 1 { -mag } else { mag };
        luminal::half::f16::from_f32(v).to_bits().to_le_bytes()
    };
    if dtype.is_quantized() {
        for (k, block) in b.chunks_exact_mut(dtype.block_bytes()).enumerate() {
            for (j, &at) in dtype.half_fields().iter().enumerate() {
                let s = scale(k + j, block[at]);
                block[at..at + 2].copy_from_slice(&s);
            }
        }
    } else {
        for (k, v) in b.chunks_exact_mut(2).enumerate() {
            // Clear the top exponent bit: finite, |v| < 2.
            match dtype {
                DType::F16 => v[1] &= 0xbf,
                _ => v[1] = (v[1] & 0x80) | 0x3f ^ ((k as u8) & 1),
            }
        }
    }
    HostData::from_bytes(dtype, SharedBytes::from_vec(b)).unwrap()
}

/// Runs `cx` on `backend` and on the reference with `inputs` set, returning both outputs'
/// values as f32 (reference first).
pub fn run_both<B: Backend>(
    cx: &Graph,
    backend: B,
    inputs: &[(GraphTensor<'_>, HostData)],
    outputs: &[GraphTensor<'_>],
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let mut reference = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    for (t, d) in inputs {
        reference.set_data(*t, d.clone()).unwrap();
        rt.set_data(*t, d.clone()).unwrap();
    }
    reference.run().unwrap();
    rt.run().unwrap();
    outputs
        .iter()
        .map(|&o| (reference.get_f32(o).unwrap(), rt.get_f32(o).unwrap()))
        .collect()
}

fn assert_bits_equal(what: &str, want: &[f32], got: &[f32]) {
    assert_eq!(want.len(), got.len(), "{what}: length");
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        assert!(
            w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan()),
            "{what}: element {i}: want {w:e}, got {g:e}"
        );
    }
}

/// Every block type (and f16/bf16 given as bytes) at odd shapes (the core asks for a last dim
/// that is a whole number of blocks): the backend's values equal the core decoders' bit for
/// bit.
pub fn every_block_type<B: Backend>(backend: impl Fn() -> B) {
    // Every quantized type of the core, then the half types.
    let types: Vec<DType> = luminal::dtype::ALL_DTYPES
        .into_iter()
        .filter(|d| d.is_quantized())
        .chain([DType::F16, DType::BF16])
        .collect();
    for (t, &dtype) in types.iter().enumerate() {
        let shapes: &[(usize, usize)] = if dtype.block_size() == 256 {
            &[(1, 256), (3, 512), (5, 1280)]
        } else {
            &[(1, 32), (5, 96), (7, 160), (3, 7)]
        };
        for (s, &(rows, cols)) in shapes.iter().enumerate() {
            if dtype.bytes_for(cols).is_none() {
                continue;
            }
            let cx = Graph::new();
            let w = cx.input("w", (rows, cols), dtype);
            let f = w.dequantize().output();
            let data = random_storage(dtype, rows * cols, (t * 16 + s) as u32);
            let truth = data.to_f32();
            let out = run_both(&cx, backend(), &[(w, data)], &[f]);
            let what = format!("{dtype} [{rows}, {cols}]");
            assert_bits_equal(&format!("{what} (reference)"), &truth, &out[0].0);
            assert_bits_equal(&what, &truth, &out[0].1);
        }
    }
}

/// Casts reading the blocks through permuted, sliced and padded views, and casts straight to
/// f16 and bf16.
pub fn views_and_half<B: Backend>(backend: impl Fn() -> B) {
    for (t, dtype) in [DType::Q4_1, DType::Q6_K, DType::Q5_0, DType::BF16]
        .into_iter()
        .enumerate()
    {
        let (rows, cols) = if dtype.block_size() == 256 {
            (5, 256)
        } else {
            (6, 64)
        };
        let cx = Graph::new();
        let w = cx.input("w", (rows, cols), dtype);
        let outs = [
            w.permute([1, 0]).dequantize().output(),
            w.slice(0, 1, 4).slice(1, 5, cols - 3).dequantize().output(),
            w.pad_axis(1, 2, 1).dequantize().output(),
            w.cast(DType::F16).output(),
            w.cast(DType::BF16).output(),
        ];
        let data = random_storage(dtype, rows * cols, 100 + t as u32);
        for (o, (want, got)) in run_both(&cx, backend(), &[(w, data)], &outs)
            .iter()
            .enumerate()
        {
            assert_bits_equal(&format!("{dtype} output {o}"), want, got);
        }
    }
}

/// The model's uses: a quantized embedding table gathered by token ids, and a quantized
/// weight in a matmul (`x · Wᵀ`).
pub fn gather_and_matmul<B: Backend>(backend: impl Fn() -> B) {
    let cx = Graph::new();
    let table = cx.input("table", (10, 64), DType::Q8_0);
    let ids = cx.input("ids", (4,), DType::I32);
    let w = cx.input("w", (48, 256), DType::Q4_K);
    let x = cx.tensor("x", (3, 256));
    let rows = table.dequantize().embedding(ids).output();
    let y = x.matmul(w.dequantize().permute([1, 0])).output();
    let xs: Vec<f32> = (0..768)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
        .collect();
    let inputs = [
        (table, random_storage(DType::Q8_0, 640, 7)),
        (ids, HostData::I32(vec![3, 0, 9, 3])),
        (w, random_storage(DType::Q4_K, 48 * 256, 8)),
        (x, HostData::F32(xs)),
    ];
    let out = run_both(&cx, backend(), &inputs, &[rows, y]);
    assert_bits_equal("embedding rows", &out[0].0, &out[0].1);
    let (want, got) = &out[1];
    assert_eq!(want.len(), got.len());
    // Through cuBLAS the weight is read as an f16 copy and the activations are rounded to f16
    // (2^-11 relative each, over 256 products); as kernels the product is f32.
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        assert!(
            (w - g).abs() <= 2e-3 * scale,
            "matmul element {i}: want {w}, got {g} (max |want| {scale})"
        );
    }
}

/// A linear layer over a block-quantized weight (`x · Wᵀ`, f32 activations): run three times
/// on `backend` against the reference — new activations each run, the weight set before the
/// first and the third. Returns the f16 copies each run wrote and whether every product read
/// half operands (a backend that dequantizes the weight once into an f16 copy writes it in the
/// first and third runs only).
pub fn quantized_linear<E, B>(backend: B, dtype: DType) -> (Vec<usize>, bool)
where
    E: luminal_cuda::plan::Executor,
    B: Backend<Runtime = luminal_cuda::plan::PlanRuntime<E>>,
{
    let (n, k) = (6, 2 * dtype.block_size().max(128));
    let cx = Graph::new();
    let x = cx.tensor("x", (3, "s", k));
    let w = cx.input("w", (n, k), dtype);
    let y = x.matmul(w.cast(DType::F32).permute([1, 0])).output();
    let mut reference = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    let (mut launches, mut half) = (vec![], true);
    for run in 0..3u32 {
        if run != 1 {
            let wv = random_storage(dtype, n * k, 5 + run);
            reference.set_data(w, wv.clone()).unwrap();
            rt.set_data(w, wv).unwrap();
        }
        let s = 2 + run as usize;
        let xv = super::data(3 * s * k, 11 + run);
        reference.set_dim("s", s);
        rt.set_dim("s", s);
        reference.set(x, &xv).unwrap();
        rt.set(x, &xv).unwrap();
        reference.run().unwrap();
        rt.run().unwrap();
        let (want, got) = (reference.get_f32(y).unwrap(), rt.get_f32(y).unwrap());
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            // Activations rounded to f16 (2^-11 relative) over k products.
            assert!(
                (a - b).abs() <= 2e-3 * scale.max(1e-6),
                "{dtype} linear run {run} element {i}: want {a}, got {b} (max |want| {scale})"
            );
        }
        launches.push(rt.dequantized_copies());
        half &= rt.half_products() > 0;
    }
    (launches, half)
}

/// A decode step's linear layers over a block-quantized weight (`x · Wᵀ`, 1–3 activation
/// rows, f32 activations): q, k and v projections of the same activations, each against the
/// reference (exact decoders, unrounded activations: the plan rounds them to f16), twice
/// with new activations. Returns the launches of both runs and the skinny products: Q8_0,
/// Q4_0 and Q4_1 weights are read in place by one grouped skinny launch (no dequantizing
/// launch); other types are dequantized into an f16 copy in the first run (between the
/// products, which then stay apart), read by one grouped launch in the second. `k`: the
/// row length (the kernel's 16-byte chunk path needs rows of whole 16-byte pieces: `k` a
/// multiple of 256 for the legacy types; past 1024, more than one chunk of 32 blocks).
pub fn quantized_decode<E, B>(backend: B, dtype: DType, m: usize, k: usize) -> (Vec<usize>, usize)
where
    E: luminal_cuda::plan::Executor,
    B: Backend<Runtime = luminal_cuda::plan::PlanRuntime<E>>,
{
    let rows = [24, 8, 8];
    let cx = Graph::new();
    let (x, ws, ys) = super::shared_linears(&cx, (m, k), &rows, dtype);
    let mut reference = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    for (i, (&w, &n)) in ws.iter().zip(&rows).enumerate() {
        let wv = random_storage(dtype, n * k, 40 + i as u32);
        reference.set_data(w, wv.clone()).unwrap();
        rt.set_data(w, wv).unwrap();
    }
    let mut launches = vec![];
    for run in 0..2u32 {
        let xv = super::data(m * k, 3 + run);
        reference.set(x, &xv).unwrap();
        rt.set(x, &xv).unwrap();
        reference.run().unwrap();
        rt.run().unwrap();
        launches.push(rt.launches());
        for (o, &y) in ys.iter().enumerate() {
            let (want, got) = (reference.get_f32(y).unwrap(), rt.get_f32(y).unwrap());
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                // Activations rounded to f16 (2^-11 relative) over k products.
                assert!(
                (a - b).abs() <= 2e-3 * scale.max(1e-6),
                "{dtype} decode m {m} k {k} run {run} output {o} element {i}: want {a}, got {b} (max |want| {scale})"
            );
            }
        }
    }
    (launches, rt.skinny_products())
}
