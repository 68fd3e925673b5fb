//! A tiny classifier built from the op set and run on the reference runtime:
//! a two-layer MLP with a dynamic batch dimension, softmax and argmax.
//!
//! cargo run --release --example quickstart

use luminal::prelude::*;

fn main() -> Result<()> {
    let cx = Graph::new();
    let x = cx.tensor("x", ("batch", 4));
    let w1 = cx.tensor("w1", (4, 8));
    let w2 = cx.tensor("w2", (8, 3));
    let hidden = x.matmul(w1).gelu();
    let logits = hidden.matmul(w2);
    let probs = logits.softmax(-1).output();
    let class = logits.argmax(-1).output();

    let mut rt = cx.compile(ReferenceBackend, CompileOptions::default())?;
    // Weights are set once and stay resident across runs.
    let w1_data: Vec<f32> = (0..32).map(|i| ((i * 7 % 11) as f32 - 5.0) / 5.0).collect();
    let w2_data: Vec<f32> = (0..24).map(|i| ((i * 5 % 9) as f32 - 4.0) / 4.0).collect();
    rt.set(w1, &w1_data)?;
    rt.set(w2, &w2_data)?;

    for batch in [1usize, 3] {
        rt.set_dim("batch", batch);
        let xs: Vec<f32> = (0..batch * 4).map(|i| (i as f32 * 0.37).sin()).collect();
        rt.set(x, &xs)?;
        rt.run()?;
        let p: Vec<f32> = rt.get(probs)?;
        let c: Vec<i32> = rt.get(class)?;
        for b in 0..batch {
            println!(
                "batch {batch}, row {b}: probs {:?} -> class {}",
                &p[b * 3..b * 3 + 3],
                c[b]
            );
        }
    }
    println!(
        "graph: {} lines of graphviz (cx.to_dot())",
        cx.to_dot().lines().count()
    );
    Ok(())
}
