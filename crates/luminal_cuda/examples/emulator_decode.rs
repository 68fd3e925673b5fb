//! A model's decode steps on the host emulator, to see a step's launches and host time
//! without a GPU: `LUMINAL_CUDA_STATS=3 cargo run --release -p luminal_cuda --example
//! emulator_decode -- models/SmolLM2-135M-Instruct.F16.gguf [steps]` prints each run's
//! launches by kernel name, whether it replayed a captured graph, and its host time
//! preparing (the kernels themselves run on the CPU here, slowly: ~0.4 s a step for 135M).
//! With `LUMINAL_EMULATOR_DRY=1` nothing runs (results are meaningless): a step's time is
//! then the plan's host work alone (`LUMINAL_CUDA_STATS=2`: preparing and enqueueing).
use luminal_cuda::HostEmulatorBackend;
use luminal_models::{LlamaModel, LoadOptions, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: emulator_decode <model.gguf> [steps]")?;
    let steps: u32 = args.next().map_or(Ok(6), |s| s.parse())?;
    let (mut model, _) = LlamaModel::load(
        &path,
        HostEmulatorBackend,
        &LoadOptions::default(),
        |_, _| {},
    )?;
    model.forward(&[1, 2, 3, 4], 1)?;
    for t in 0..steps {
        let start = std::time::Instant::now();
        model.forward(&[5 + t], 1)?;
        println!(
            "step {t}: {:.1} ms, {} launches",
            start.elapsed().as_secs_f64() * 1e3,
            model.runtime().launches()
        );
    }
    Ok(())
}
