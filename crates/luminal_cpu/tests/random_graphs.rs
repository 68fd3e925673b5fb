//! Randomised graphs: seeded compositions of views (permute, slice, pad, expand, reshape),
//! elementwise ops, reductions and matmuls, run on the CPU backend and on the reference
//! runtime, compared element by element.

use luminal::prelude::*;
use luminal_cpu::CpuBackend;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn float(&mut self) -> f32 {
        (self.next() % 2001) as f32 / 1000.0 - 1.0
    }
}

fn dims_of(t: GraphTensor) -> Vec<usize> {
    t.shape()
        .iter()
        .map(|d| d.as_constant().unwrap() as usize)
        .collect()
}

/// One random op applied to `x` (bounded values: no overflow, no NaN by construction
/// except where the ops define it identically on both sides).
fn step<'g>(
    cx: &'g Graph,
    rng: &mut Rng,
    x: GraphTensor<'g>,
    inputs: &mut Vec<GraphTensor<'g>>,
) -> GraphTensor<'g> {
    let d = dims_of(x);
    let r = d.len();
    let mut fresh = |shape: Vec<usize>| {
        let t = cx.tensor(&format!("in{}", inputs.len()), shape);
        inputs.push(t);
        t
    };
    match rng.below(14) {
        0 => x.sin(),
        1 => (x * x + 1.0).sqrt(),
        2 => (x * x + 0.5).recip(),
        3 => x.sin().exp2(),
        4 => x * rng.float() + rng.float(),
        5 => x + fresh(d.clone()),
        6 => x * fresh(d.clone()).sin(),
        7 if r > 0 => {
            let a = rng.below(r) as i64;
            match rng.below(4) {
                0 => x.sum(a) * 0.25,
                1 => x.max(a),
                2 => x - x.max_keepdim(a),
                _ => x.softmax(a),
            }
        }
        8 if r > 1 => {
            let mut axes: Vec<usize> = (0..r).collect();
            for i in (1..r).rev() {
                axes.swap(i, rng.below(i + 1));
            }
            x.permute(&axes)
        }
        9 if r > 0 => {
            let a = rng.below(r);
            if d[a] < 2 {
                return x.relu();
            }
            let s = rng.below(d[a] - 1);
            let e = s + 1 + rng.below(d[a] - s - 1);
            x.slice(a as i64, s, e)
        }
        10 if r > 0 => x.pad_axis(rng.below(r), rng.below(3), rng.below(3)),
        11 if r < 4 => x.expand(rng.below(r + 1) as i64, 1 + rng.below(3)),
        12 if r > 1 => {
            let n: usize = d.iter().product();
            x.reshape(vec![n])
        }
        13 if (1..=3).contains(&r) => {
            let k = d[r - 1];
            let n = 1 + rng.below(5);
            let w = fresh(vec![k, n]);
            if rng.below(2) == 0 {
                x.matmul(w)
            } else {
                let wt = fresh(vec![n, k]);
                x.matmul(wt.permute(&[1, 0])) + x.matmul(w).sin()
            }
        }
        _ => x.maximum(x.sin()),
    }
}

fn run_case(seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let cx = Graph::new();
    let mut inputs = vec![];
    let rank = 1 + rng.below(3);
    let shape: Vec<usize> = (0..rank).map(|_| 1 + rng.below(6)).collect();
    let x0 = cx.tensor("x", shape);
    inputs.push(x0);
    let mut x = x0;
    let mut outs = vec![];
    for _ in 0..1 + rng.below(6) {
        x = step(&cx, &mut rng, x, &mut inputs);
        if dims_of(x).iter().product::<usize>() > 4096 {
            x = x.sum(0);
        }
        if rng.below(4) == 0 {
            outs.push(x.output());
        }
    }
    outs.push(x.output());
    let threads = 1 + (seed % 2) as usize;
    let optimize = seed % 3 != 0;
    let opts = CompileOptions {
        optimize,
        ..CompileOptions::default()
    };
    let mut cpu = cx
        .compile(CpuBackend::with_threads(threads), opts.clone())
        .unwrap();
    let mut re = cx.compile(ReferenceBackend, opts).unwrap();
    for t in &inputs {
        let n: usize = dims_of(*t).iter().product();
        let data: Vec<f32> = (0..n).map(|_| rng.float()).collect();
        cpu.set(*t, &data).unwrap();
        re.set(*t, &data).unwrap();
    }
    cpu.run().unwrap();
    re.run().unwrap();
    for o in outs {
        let (a, b) = (cpu.get::<f32>(o).unwrap(), re.get::<f32>(o).unwrap());
        assert_eq!(a.len(), b.len(), "seed {seed}");
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            let ok = (p.is_nan() && q.is_nan()) || p == q || (p - q).abs() <= 1e-4 + 1e-4 * q.abs();
            assert!(
                ok,
                "seed {seed}: element {i}: cpu {p} vs reference {q}\nkernels {:?}",
                cpu.kernel_names()
            );
        }
    }
}

#[test]
fn random_graphs_match_reference() {
    let n: u64 = std::env::var("LUMINAL_RANDOM_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    for seed in 0..n {
        run_case(seed);
    }
}
