//! The lease client's events show up as their series in strict OpenMetrics text.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use distlimit_core::LeaseObserver;
use distlimit_metrics::Metrics;
use support::openmetrics::parse;

#[test]
fn lease_events_show_up_as_their_series() {
    let metrics = Metrics::new();
    metrics.on_lease_taken("lease", "api", 40);
    metrics.on_lease_taken("lease", "api", 0);
    metrics.on_lease_taken("lease", "api", 2);
    metrics.on_lease_returned("lease", "api", 7);
    metrics.on_lease_units("lease", 35);
    let exposition = parse(&metrics.encode()).unwrap();
    let value = |name| exposition.value(name, &[("store", "lease")]);
    assert_eq!(value("distlimit_lease_takes_total"), Some(2.0));
    assert_eq!(value("distlimit_lease_taken_units_total"), Some(42.0));
    assert_eq!(value("distlimit_lease_returned_units_total"), Some(7.0));
    assert_eq!(value("distlimit_lease_held_units"), Some(35.0));
    for family in [
        "distlimit_lease_takes",
        "distlimit_lease_taken_units",
        "distlimit_lease_returned_units",
    ] {
        assert_eq!(exposition.families[family], "counter", "{family}");
    }
    assert_eq!(exposition.families["distlimit_lease_held_units"], "gauge");
}
