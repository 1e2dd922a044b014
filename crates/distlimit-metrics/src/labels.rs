//! The label sets of every family. Only bounded values: policy names (capped by
//! [`Metrics`](crate::Metrics) for decisions; from configuration, never requests, for permits
//! and streams), and `&'static str`s from code; never a key.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;

/// `distlimit_decisions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DecisionLabels {
    pub(crate) policy: Arc<str>,
    pub(crate) outcome: &'static str,
    pub(crate) source: &'static str,
}

/// The per-policy families: `distlimit_decision_duration_seconds`, `distlimit_near_limit_total`,
/// `distlimit_permits_held`, `distlimit_stream_units_total`, `distlimit_stream_stopped_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PolicyLabels {
    pub(crate) policy: Arc<str>,
}

/// `distlimit_permits_total`, `distlimit_stream_blocks_total`,
/// `distlimit_stream_block_units_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EventLabels {
    pub(crate) policy: Arc<str>,
    pub(crate) event: &'static str,
}

/// `distlimit_store_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StoreErrorLabels {
    pub(crate) store: &'static str,
    pub(crate) kind: &'static str,
}

/// `distlimit_breaker_state`: one series per state, 1 for the current one.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BreakerLabels {
    pub(crate) store: &'static str,
    pub(crate) state: &'static str,
}

/// `distlimit_breaker_transitions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TransitionLabels {
    pub(crate) store: &'static str,
    pub(crate) from: &'static str,
    pub(crate) to: &'static str,
}

/// `distlimit_evictions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StoreLabels {
    pub(crate) store: &'static str,
}
