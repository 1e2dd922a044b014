//! Test helpers.
pub(crate) mod openmetrics;
