//! loom models of the snapshot publication protocol (run with `cargo xtask loom`).

mod loom_publish;
