//! The backend-generic op suite (src/testing) on the reference runtime: every primop and
//! hl_op against numpy-generated fixtures. A backend crate runs the same cases with
//! `luminal::op_suite!(MyBackend::default());`.

#![allow(clippy::default_constructed_unit_structs)]

luminal::op_suite!(luminal::ReferenceBackend::default());
