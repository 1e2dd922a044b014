//! Project automation (placeholder, replaced below).
fn main() {}
