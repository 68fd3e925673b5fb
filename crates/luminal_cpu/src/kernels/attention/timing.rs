//! Decode-attention timings (a measurement that asserts nothing, so ignored by default;
//! quoted in `benches/README.md`): `cargo test --release -p luminal_cpu --lib
//! attention::timing -- --ignored --nocapture`. One decode step (s = 1) of the SmolLM2-135M
//! head layout (9 query heads, 3 KV heads, head dim 64) over `t` cached keys, f16 and f32
//! cache, 1 and 2 threads; the graph is `luminal_nn::causal_attention_windowed` over a
//! cache, as the model builds it. `ATTN_TIMING=f16|f32`, `ATTN_THREADS`, `ATTN_T` pick one
//! case, `ATTN_REPS` the steps timed, `ATTN_COLD=<MB>` reads that much other data between
//! steps; `decode_parts` times the block steps alone.

use crate::CpuBackend;
use luminal::prelude::*;

/// CPU time of this process in ns (Linux; wall-clock time elsewhere): with one thread, a
/// measurement that other work on the machine disturbs far less than the wall clock.
fn cpu_ns() -> f64 {
    #[cfg(target_os = "linux")]
    {
        #[repr(C)]
        struct Timespec {
            sec: i64,
            nsec: i64,
        }
        extern "C" {
            fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
        }
        const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
        let mut ts = Timespec { sec: 0, nsec: 0 };
        // SAFETY: `ts` is a valid timespec to write.
        assert_eq!(
            unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut ts) },
            0
        );
        ts.sec as f64 * 1e9 + ts.nsec as f64
    }
    #[cfg(not(target_os = "linux"))]
    {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_secs_f64()
            * 1e9
    }
}

fn data(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i.wrapping_mul(2654435761).wrapping_add(seed * 97)) % 10007;
            x as f32 / 10007.0 * 4.0 - 2.0
        })
        .collect()
}

/// The attention kernel's time in the runtime's profile of the last run.
fn kernel_us(profile: &str) -> f64 {
    profile
        .lines()
        .find_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells.len() > 3 && cells[2] == "attention").then(|| cells[3].parse().unwrap())
        })
        .unwrap()
}

/// Median wall-clock µs of one decode step over `t` keys (the whole graph: the mask's iota
/// kernels and the attention kernel), the least CPU µs per step (batches of 20 steps), and
/// the attention kernel's median
/// from the runtime's profile (with several threads this counts waking the pool's workers,
/// which back-to-back kernels in a model do not pay).
fn step_us(t: usize, threads: usize, cache: DType) -> (f64, f64, f64) {
    let (hq, hkv, d, max_ctx) = (9, 3, 64, 4200);
    let cx = Graph::new();
    let q = cx.tensor("q", (1, hq, Expression::var("s"), d));
    let kc = cx.input("k_cache", (hkv, max_ctx, d), cache);
    let vc = cx.input("v_cache", (hkv, max_ctx, d), cache);
    let len = Expression::var("p") + Expression::var("s");
    let k = kc.slice(1, 0, len.clone()).unsqueeze(0);
    let v = vc.slice(1, 0, len).unsqueeze(0);
    let _out = luminal_nn::causal_attention_windowed(q, k, v, None).output();
    let mut rt = cx
        .compile(CpuBackend::with_threads(threads), CompileOptions::default())
        .unwrap();
    assert!(rt.kernel_names().iter().any(|n| n == "attention"));
    rt.set_dim("s", 1);
    rt.set_dim("p", t - 1);
    rt.set(q, &data(hq * d, 1)).unwrap();
    for (x, seed) in [(kc, 2), (vc, 3)] {
        let v = data(hkv * max_ctx * d, seed);
        let h = if cache == DType::F16 {
            HostData::F16(v.iter().map(|&x| half::f16::from_f32(x)).collect())
        } else {
            HostData::F32(v)
        };
        rt.set_data(x, h).unwrap();
    }
    for _ in 0..20 {
        rt.run().unwrap();
    }
    let wall: Vec<f64> = (0..only_reps())
        .map(|_| {
            let t0 = std::time::Instant::now();
            rt.run().unwrap();
            t0.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    // CPU time per step over batches of 20 steps (all threads: spinning workers count).
    // `ATTN_COLD=<MB>`: that much other data is read between steps (8: the caches' KV rows
    // are then read from the last-level cache, as in a model, not from L2; a few hundred:
    // from memory).
    let cold: usize = std::env::var("ATTN_COLD").map_or(0, |v| v.parse().unwrap());
    let junk: Vec<u64> = (0..(cold << 17) as u64).collect();
    let flush = || std::hint::black_box(junk.iter().step_by(8).fold(0u64, |a, &x| a ^ x));
    let mut cpu: Vec<f64> = (0..only_reps() / 20)
        .map(|_| {
            let mut ns = 0.0;
            for _ in 0..20 {
                flush();
                let t0 = cpu_ns();
                rt.run().unwrap();
                ns += cpu_ns() - t0;
            }
            ns / 20e3
        })
        .collect();
    cpu.sort_by(f64::total_cmp);
    let mut us = wall;
    us.sort_by(f64::total_cmp);
    rt.set_profile(true);
    let mut kernel: Vec<f64> = (0..50)
        .map(|_| {
            rt.run().unwrap();
            kernel_us(&rt.profile())
        })
        .collect();
    rt.set_profile(false);
    kernel.sort_by(f64::total_cmp);
    (us[us.len() / 2], cpu[0], kernel[kernel.len() / 2])
}

#[test]
#[ignore]
fn decode_step() {
    // `ATTN_TIMING=f16` (or `f32`) times that cache only; `ATTN_THREADS`, `ATTN_T` likewise.
    let only = |var: &str| std::env::var(var).ok();
    let caches = match only("ATTN_TIMING").as_deref() {
        Some("f16") => vec![DType::F16],
        Some("f32") => vec![DType::F32],
        _ => vec![DType::F16, DType::F32],
    };
    let threads_list = only("ATTN_THREADS").map_or(vec![1, 2], |v| vec![v.parse().unwrap()]);
    let ts = only("ATTN_T").map_or(vec![512, 2048, 4096], |v| vec![v.parse().unwrap()]);
    for &cache in &caches {
        for &threads in &threads_list {
            for &t in &ts {
                let (med, cpu, kernel) = step_us(t, threads, cache);
                println!(
                    "decode attention {cache:?} cache, {threads} thread(s), t = {t}: step median \
                     {med:.1} us, cpu {cpu:.1} us; kernel (profile) {kernel:.1} us"
                );
            }
        }
    }
}

/// Timed steps per case (`ATTN_REPS`, default 300).
fn only_reps() -> usize {
    std::env::var("ATTN_REPS").map_or(300, |v| v.parse().unwrap())
}

/// The decode block steps alone, one thread, f16 keys and values in L2: 3 query rows (one
/// SmolLM2 group) over `t` keys in blocks of `DECODE_BLOCK`, ns per key.
#[test]
#[ignore]
fn decode_parts() {
    use super::decode::Softmax;
    use super::{KvRows, DECODE_BLOCK};
    let (rows, d, t, kb) = (3, 64, 2048, DECODE_BLOCK);
    let q = data(rows * d, 1);
    let kv: Vec<half::f16> = data(t * d, 2)
        .into_iter()
        .map(half::f16::from_f32)
        .collect();
    let mut sc = vec![0f32; rows * kb];
    let mut acc = vec![0f32; rows * d];
    let (mut m, mut l) = (vec![f32::NEG_INFINITY; rows], vec![0f32; rows]);
    let bias = vec![0f32; kb];
    let reps = 100;
    let time = |what: &str, f: &mut dyn FnMut()| {
        for _ in 0..20 {
            f();
        }
        // The fastest of 20 trials: the least disturbed by other work on the machine.
        let ns = (0..20)
            .map(|_| {
                let t0 = cpu_ns();
                for _ in 0..reps {
                    f();
                }
                (cpu_ns() - t0) / (reps * t) as f64
            })
            .fold(f64::INFINITY, f64::min);
        println!("{what}: {ns:.2} ns per key ({rows} rows, d {d})");
    };
    #[cfg(target_arch = "x86_64")]
    {
        time("scores", &mut || {
            for jb in (0..t).step_by(kb) {
                super::fast::block_scores(
                    crate::simd::isa(),
                    &q,
                    KvRows::F16(&kv),
                    jb * d,
                    d,
                    kb,
                    d,
                    &mut sc,
                    kb,
                );
            }
        });
        time("accumulate", &mut || {
            for jb in (0..t).step_by(kb) {
                super::fast::block_accumulate(
                    crate::simd::isa(),
                    &mut acc,
                    &sc,
                    kb,
                    KvRows::F16(&kv),
                    jb * d,
                    d,
                    kb,
                    d,
                );
            }
        });
    }
    #[cfg(target_arch = "x86_64")]
    time("softmax (fast)", &mut || {
        for _ in (0..t).step_by(kb) {
            super::fast::block_softmax(
                crate::simd::isa(),
                &mut sc,
                Some((&bias, 0)),
                &mut m,
                &mut l,
                &mut acc,
                0.125,
                (1, 1, kb, kb, d),
            );
        }
    });
    time("softmax (portable)", &mut || {
        for _ in (0..t).step_by(kb) {
            crate::simd::run(Softmax {
                sc: &mut sc,
                bs: &bias,
                bstride: 0,
                m: &mut m,
                l: &mut l,
                acc: &mut acc,
                scale: 0.125,
                qt: 1,
                nq: 1,
                n: kb,
                kb,
                d,
            });
        }
    });
}

/// Encoder (bidirectional) attention with a key padding mask at all-MiniLM-L6-v2's layout
/// (`ATTN_SHAPE=b,h,s,d`, default 32 × 12 heads × 128 tokens × head dim 32; every
/// sequence of the batch a different length), as `luminal_nn::attention` builds it: the
/// attention kernel's median µs from the runtime's profile, 1 and 2 threads.
#[test]
#[ignore]
fn encoder_prefill() {
    let shape: Vec<usize> = std::env::var("ATTN_SHAPE").map_or(vec![32, 12, 128, 32], |v| {
        v.split(',').map(|x| x.parse().unwrap()).collect()
    });
    let (b, h, s, d) = (shape[0], shape[1], shape[2], shape[3]);
    let threads_list =
        std::env::var("ATTN_THREADS").map_or(vec![1, 2], |v| vec![v.parse().unwrap()]);
    for threads in threads_list {
        let cx = Graph::new();
        let q = cx.tensor("q", (b, h, s, d));
        let k = cx.tensor("k", (b, h, s, d));
        let v = cx.tensor("v", (b, h, s, d));
        let mask = cx.tensor("mask", (b, s));
        let _out = luminal_nn::attention(q, k, v, Some(mask)).output();
        let mut rt = cx
            .compile(CpuBackend::with_threads(threads), CompileOptions::default())
            .unwrap();
        assert!(rt.kernel_names().iter().any(|n| n == "attention"));
        for (x, seed) in [(q, 1), (k, 2), (v, 3)] {
            rt.set(x, &data(b * h * s * d, seed)).unwrap();
        }
        let m: Vec<f32> = (0..b * s)
            .map(|i| {
                if i % s < s - (i / s) * s / (2 * b) {
                    1.0
                } else {
                    0.0
                }
            })
            .collect();
        rt.set(mask, &m).unwrap();
        for _ in 0..3 {
            rt.run().unwrap();
        }
        rt.set_profile(true);
        let mut kernel: Vec<f64> = (0..only_reps().min(30))
            .map(|_| {
                rt.run().unwrap();
                kernel_us(&rt.profile())
            })
            .collect();
        kernel.sort_by(f64::total_cmp);
        let flops = 4.0 * (b * h * s * s * d) as f64;
        println!(
            "encoder attention {b}x{h}x{s}x{d}, {threads} thread(s): kernel median {:.1} us, \
             best {:.1} us ({:.1} GFLOP/s)",
            kernel[kernel.len() / 2],
            kernel[0],
            flops / kernel[0] / 1e3
        );
    }
}
