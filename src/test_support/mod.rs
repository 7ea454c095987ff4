//! Fixtures for tests, benches and examples; never part of the binary
//! (behind the `test-pods` feature).

pub mod kubelet;
