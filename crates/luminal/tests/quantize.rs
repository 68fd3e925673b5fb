//! Block encoders (`luminal::quant::encode`) and casts into the quantized types on the
//! reference runtime, against gguf-py (`scripts/gen_quantize_fixtures.py`).

use luminal::prelude::*;
use luminal::quant::{decode, encode, SharedBytes};
use luminal::testing::{check_quantized_cast, check_quantized_state, quant_cases};

#[test]
fn encoders_match_gguf_py_bit_for_bit() {
    let mut seen = std::collections::BTreeSet::new();
    for c in quant_cases() {
        let mut bytes = vec![0u8; c.bytes.len()];
        encode(c.dtype, &c.values, &mut bytes);
        assert!(bytes == c.bytes, "{} {}: blocks differ", c.dtype, c.name);
        let mut back = vec![0f32; c.values.len()];
        decode(c.dtype, &bytes, &mut back);
        assert_eq!(back, c.decoded, "{} {}: decoded values", c.dtype, c.name);
        seen.insert(c.dtype);
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        vec![
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0
        ]
    );
}

#[test]
fn encoded_q8_0_is_within_half_a_step() {
    // Independent of the fixture: every value is within d/2 of its decoded value.
    for c in quant_cases().iter().filter(|c| c.dtype == DType::Q8_0) {
        for (b, x) in c.values.chunks(32).enumerate() {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            // Rounding to a step of d, then the step itself rounded to f16.
            let d = amax / 127.0;
            let d16 = half::f16::from_f32(d).to_f32();
            let bound = 0.5 * d + 127.0 * (d16 - d).abs() + amax * 1e-6;
            for (j, &v) in x.iter().enumerate() {
                let got = c.decoded[b * 32 + j];
                assert!((got - v).abs() <= bound, "{}: {v} -> {got}", c.name);
            }
        }
    }
}

#[test]
fn reference_casts_to_quantized_types() {
    check_quantized_cast(ReferenceBackend);
}

#[test]
fn reference_quantized_state() {
    check_quantized_state(ReferenceBackend);
}

#[test]
fn shared_bytes_are_copy_on_write() {
    let a = SharedBytes::from_vec(vec![1, 2, 3, 4]);
    let mut b = a.clone();
    b.make_mut()[0] = 9;
    assert_eq!(a.as_slice(), &[1, 2, 3, 4]);
    assert_eq!(b.as_slice(), &[9, 2, 3, 4]);
    // A window onto a shared owner becomes a private copy of just the window.
    let owner: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync> = std::sync::Arc::new(vec![5u8; 8]);
    let mut w = SharedBytes::new(owner.clone(), 2..5).unwrap();
    w.make_mut()[1] = 0;
    assert_eq!(w.as_slice(), &[5, 0, 5]);
    assert_eq!((*owner).as_ref(), &[5u8; 8]);
    // The only handle on a whole vector is written in place.
    let mut c = SharedBytes::from_vec(vec![0u8; 4]);
    let p = c.as_slice().as_ptr();
    c.make_mut()[3] = 1;
    assert_eq!(c.as_slice().as_ptr(), p);
}

#[test]
#[should_panic(expected = "cannot cast")]
fn cast_to_a_type_without_encoder_panics() {
    let cx = Graph::new();
    cx.tensor("x", (2, 256)).cast(DType::Q4_K);
}

#[test]
#[should_panic(expected = "cannot cast")]
fn cast_of_partial_blocks_panics() {
    let cx = Graph::new();
    cx.tensor("x", (2, 48)).cast(DType::Q8_0);
}

#[test]
#[should_panic(expected = "whole blocks")]
fn quantized_write_along_the_last_axis_panics() {
    let cx = Graph::new();
    let cache = cx.input("cache", (2, 64), DType::Q8_0);
    let new = cx.tensor("new", (2, 32));
    cache.write_slice(1, 0, new.cast(DType::Q8_0));
}
