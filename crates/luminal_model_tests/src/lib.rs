//! No library code: the tests live in `tests/` (see the package description).
