//! Casts into the block-quantized types and quantized state (a q8_0 KV cache): the same
//! checks for every backend, against gguf-py's quantizers (`fixtures/quantize.json`, made by
//! `scripts/gen_quantize_fixtures.py`; see that script for the cases).

use crate::backend::{Backend, CompileOptions, Runtime};
use crate::dtype::{ByteData, DType, HostData};
use crate::error::LuminalError;
use crate::graph::Graph;
use crate::shape::Expression;
use serde_json::Value;
use std::sync::OnceLock;

/// The fixture, embedded so that the checks run from any crate without files on disk.
pub const QUANTIZE_JSON: &str = include_str!("fixtures/quantize.json");

/// One fixture case: values, the bytes gguf-py encodes them to, and what those decode to.
#[derive(Clone, Debug)]
pub struct QuantCase {
    pub dtype: DType,
    pub name: String,
    pub values: Vec<f32>,
    pub bytes: Vec<u8>,
    pub decoded: Vec<f32>,
}

/// Every case of the fixture, by type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
pub fn quant_cases() -> &'static [QuantCase] {
    static CASES: OnceLock<Vec<QuantCase>> = OnceLock::new();
    CASES.get_or_init(|| {
        let v: Value = serde_json::from_str(QUANTIZE_JSON).expect("quantize.json parses");
        let floats = |x: &Value| -> Vec<f32> {
            x.as_array()
                .unwrap()
                .iter()
                .map(|f| f.as_f64().unwrap() as f32)
                .collect()
        };
        let mut out = vec![];
        for (ty, cases) in v.as_object().unwrap() {
            let dtype = crate::dtype::ALL_DTYPES
                .into_iter()
                .find(|d| d.name() == ty.to_ascii_lowercase())
                .unwrap_or_else(|| panic!("unknown type {ty} in quantize.json"));
            for c in cases.as_array().unwrap() {
                let hex = c["bytes"].as_str().unwrap();
                out.push(QuantCase {
                    dtype,
                    name: c["name"].as_str().unwrap().to_string(),
                    values: floats(&c["values"]),
                    bytes: (0..hex.len())
                        .step_by(2)
                        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                        .collect(),
                    decoded: floats(&c["decoded"]),
                });
            }
        }
        out
    })
}

/// The types the fixture covers.
pub fn quant_types() -> Vec<DType> {
    let mut t: Vec<DType> = quant_cases().iter().map(|c| c.dtype).collect();
    t.dedup();
    t
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `x.cast(T).dequantize()` equals gguf-py's decode of its encode, bit for bit, for every
/// type and case; the input is read through a transposed view (`[32, blocks]` stored, read
/// as `[blocks, 32]`), so the blocks are gathered from strided values.
pub fn check_quantized_cast<B: Backend + Clone>(backend: B) {
    for c in quant_cases() {
        let nb = c.values.len() / 32;
        let cx = Graph::new();
        let stored = cx.tensor("x_t", (32, nb));
        let y = stored.permute([1, 0]).cast(c.dtype).dequantize().output();
        let mut rt = cx
            .compile(backend.clone(), CompileOptions::default())
            .unwrap();
        let mut t = vec![0f32; c.values.len()];
        for b in 0..nb {
            for j in 0..32 {
                t[j * nb + b] = c.values[b * 32 + j];
            }
        }
        rt.set(stored, &t).unwrap();
        rt.run().unwrap();
        let got = rt.get::<f32>(y).unwrap();
        assert_eq!(
            bits(&got),
            bits(&c.decoded),
            "{} {}: cast values differ from gguf-py's",
            c.dtype,
            c.name
        );
    }
}

/// A quantized `[2, 3, 64]` state (a KV cache: 2 heads, 3 positions, 64 values a row,
/// two blocks) written at `p` with `new.cast(T)` over two runs, then read back through a
/// `0..p+s` slice and `.dequantize()`, and as the state's own blocks; writing past the end
/// is a typed error. Expected blocks are gguf-py's encodings of the rows written.
pub fn check_quantized_state<B: Backend + Clone>(backend: B) {
    for dtype in quant_types() {
        // A pool of fixture blocks: (values, bytes, decoded) per 32 values.
        let bb = dtype.block_bytes();
        let pool: Vec<(&[f32], &[u8], &[f32])> = quant_cases()
            .iter()
            .filter(|c| c.dtype == dtype)
            .flat_map(|c| {
                (0..c.values.len() / 32).map(move |b| {
                    (
                        &c.values[b * 32..][..32],
                        &c.bytes[b * bb..][..bb],
                        &c.decoded[b * 32..][..32],
                    )
                })
            })
            .collect();
        let (heads, ctx, d) = (2usize, 3usize, 64usize);
        let cx = Graph::new();
        let cache = cx.input("cache", (heads, ctx, d), dtype);
        let new = cx.tensor("new", (heads, "s", d));
        let updated = cache.write_slice(1, "p", new.cast(dtype));
        let seen = updated
            .slice(1, 0, Expression::var("p") + Expression::var("s"))
            .dequantize()
            .output();
        let mut rt = cx
            .compile(backend.clone(), CompileOptions::default())
            .unwrap();
        rt.set_data(
            cache,
            HostData::Bytes(ByteData::zeros(dtype, heads * ctx * d)),
        )
        .unwrap();
        // Expected state: values and blocks per (head, position), zero when unwritten.
        let zero_block = {
            let z = ByteData::zeros(dtype, 32);
            z.as_slice().to_vec()
        };
        let mut want_vals = vec![0f32; heads * ctx * d];
        let mut want_bytes: Vec<u8> = (0..heads * ctx * 2)
            .flat_map(|_| zero_block.clone())
            .collect();
        let mut next = 0usize;
        for (step, (p, s)) in [(0usize, 2usize), (2, 1)].into_iter().enumerate() {
            let mut src = vec![0f32; heads * s * d];
            for h in 0..heads {
                for r in 0..s {
                    for half in 0..2 {
                        let (vals, bytes, dec) = pool[next % pool.len()];
                        next += 1;
                        src[(h * s + r) * d + half * 32..][..32].copy_from_slice(vals);
                        let row = h * ctx + p + r;
                        want_vals[row * d + half * 32..][..32].copy_from_slice(dec);
                        want_bytes[(row * 2 + half) * bb..][..bb].copy_from_slice(bytes);
                    }
                }
            }
            rt.set_dim("p", p);
            rt.set_dim("s", s);
            rt.set(new, &src).unwrap();
            rt.run().unwrap();
            let mut want_seen = vec![];
            for h in 0..heads {
                want_seen.extend_from_slice(&want_vals[h * ctx * d..][..(p + s) * d]);
            }
            assert_eq!(
                bits(&rt.get::<f32>(seen).unwrap()),
                bits(&want_seen),
                "{dtype} step {step}: values read back"
            );
            match rt.get_data(cache).unwrap() {
                HostData::Bytes(b) => {
                    assert_eq!(b.dtype(), dtype);
                    assert_eq!(b.to_f32(), want_vals, "{dtype} step {step}: state values");
                    assert!(
                        b.as_slice() == want_bytes,
                        "{dtype} step {step}: state blocks differ from gguf-py's"
                    );
                }
                other => panic!("{dtype}: the state comes back as {:?}", other.dtype()),
            }
        }
        rt.set_dim("p", 2);
        rt.set_dim("s", 2);
        rt.set(new, &vec![1f32; heads * 2 * d]).unwrap();
        match rt.run() {
            Err(LuminalError::IndexOutOfRange { .. }) => {}
            other => panic!("{dtype}: write past the end: expected IndexOutOfRange, got {other:?}"),
        }
    }
}
