//! loom models of the shard locks (run with `cargo xtask loom`).

mod loom_shard;
