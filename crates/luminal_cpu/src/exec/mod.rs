//! Execution: the runtime (kernel launches and the `Runtime` API), the thread pool and the
//! per-kernel profile.

pub(crate) mod memory;
pub(crate) mod par;
pub(crate) mod profile;
pub(crate) mod runtime;
