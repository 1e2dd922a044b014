//! Placeholder, replaced by the side-by-side bench.
fn main() {}
