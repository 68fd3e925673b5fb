//! The core's op suite on `CudaBackend`. Skips (printing a line) where no CUDA driver, NVRTC
//! or device loads, as on CI; run it on a GPU machine.

use luminal_cuda::CudaBackend;

fn backend() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            eprintln!("skipping the CUDA op suite: {e}");
            None
        }
    }
}

macro_rules! family {
    ($name:ident) => {
        #[test]
        fn $name() {
            if let Some(b) = backend() {
                eprintln!("CUDA device: {:?}", b);
                luminal::testing::run_family(stringify!($name), || b.clone());
            }
        }
    };
}

family!(unary);
family!(binary);
family!(reduce);
family!(movement);
family!(nn);
family!(conv);
family!(index);
family!(dtype);
family!(dynamic);

#[test]
fn write_slice_state() {
    if let Some(b) = backend() {
        luminal::testing::check_write_slice(b);
    }
}

#[test]
fn state_update_with_other_readers() {
    if let Some(b) = backend() {
        luminal::testing::check_state_update(b);
    }
}

#[test]
fn missing_device_is_a_typed_error() {
    // Ordinal far past any machine's device count: an error, never a panic.
    assert!(CudaBackend::new(4096).is_err());
}
