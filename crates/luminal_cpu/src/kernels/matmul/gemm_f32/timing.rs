//! Timings of the f32 GEMM (ignored by default: they assert nothing).

mod scaling {
    use super::super::*;

    /// One product on 1 and 2 threads of a pool, split along N as `MatmulKernel::run_f32`
    /// splits it (`cargo test --release -p luminal_cpu --lib gemm_scaling -- --ignored
    /// --nocapture`).
    #[test]
    #[ignore]
    fn gemm_scaling() {
        for &(m, n, k) in &[(4096, 1536, 384), (4096, 384, 1536), (4096, 384, 384)] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
                .collect();
            let c = vec![0f32; m * n];
            let cp = crate::kernels::matmul::skinny::OutPtr(c.as_ptr() as *mut f32);
            for (threads, colmajor) in [(1usize, false), (2, false), (1, true), (2, true)] {
                let pool = crate::exec::par::Pool::new(threads).unwrap();
                let run = || {
                    pool.enter(|| {
                        let w = n.div_ceil(threads).next_multiple_of(16);
                        crate::exec::par::for_each(n.div_ceil(w), |t| {
                            let cp = &cp;
                            let (j0, j1) = (t * w, ((t + 1) * w).min(n));
                            unsafe {
                                sgemm(
                                    m,
                                    j1 - j0,
                                    k,
                                    Mat {
                                        ptr: a.as_ptr(),
                                        rs: k as isize,
                                        cs: 1,
                                    },
                                    if colmajor {
                                        // B as a transposed [n, k] weight: (r, c) at c·k + r.
                                        Mat {
                                            ptr: b.as_ptr().add(j0 * k),
                                            rs: 1,
                                            cs: k as isize,
                                        }
                                    } else {
                                        Mat {
                                            ptr: b.as_ptr().add(j0),
                                            rs: n as isize,
                                            cs: 1,
                                        }
                                    },
                                    cp.0.add(j0),
                                    n,
                                )
                            }
                        })
                    })
                };
                run();
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let t = std::time::Instant::now();
                    run();
                    best = best.min(t.elapsed().as_secs_f64());
                }
                println!(
                    "{m}x{n}x{k} {threads} thread(s), B {}: {:.2} ms, {:.0} GFLOP/s",
                    if colmajor { "[n, k]" } else { "[k, n]" },
                    best * 1e3,
                    2.0 * (m * n * k) as f64 / best / 1e9
                );
            }
        }
    }
}

mod small {
    use super::super::*;

    /// One thread, the attention products of a small training step (64 queries, 16-wide
    /// heads): `cargo test --release -p luminal_cpu --lib gemm_small -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn gemm_small() {
        // (m, n, k, A row stride, A col stride, B row stride, B col stride)
        let cases: &[(usize, usize, usize, isize, isize, isize, isize, &str)] = &[
            (64, 64, 16, 192, 1, 1, 192, "scores q·kᵀ"),
            (64, 16, 64, 64, 1, 192, 1, "probs·v"),
            (64, 64, 64, 64, 1, 64, 1, "64³ row-major"),
            // The backward pass: A column-major (`Pᵀ·dO`, `dSᵀ·Q`).
            (64, 16, 64, 1, 64, 192, 1, "probsᵀ·dout"),
        ];
        for &(m, n, k, ars, acs, brs, bcs, what) in cases {
            let a: Vec<f32> = (0..64 * 192).map(|i| (i % 17) as f32 * 0.1).collect();
            let b: Vec<f32> = (0..64 * 192).map(|i| (i % 13) as f32 * 0.1).collect();
            let mut c = vec![0f32; m * n];
            let reps = 20000;
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    unsafe {
                        sgemm(
                            m,
                            n,
                            k,
                            Mat {
                                ptr: a.as_ptr(),
                                rs: ars,
                                cs: acs,
                            },
                            Mat {
                                ptr: b.as_ptr(),
                                rs: brs,
                                cs: bcs,
                            },
                            c.as_mut_ptr(),
                            n,
                        )
                    };
                }
                best = best.min(t.elapsed().as_secs_f64() / reps as f64);
            }
            println!(
                "{what} {m}x{n}x{k}: {:.2} us, {:.1} GFLOP/s",
                best * 1e6,
                2.0 * (m * n * k) as f64 / best / 1e9
            );
        }
    }
}
