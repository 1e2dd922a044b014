//! The concurrency limits' series: permit events by `policy` (the limit's state name) and
//! `event`, and the permits this process holds now. Policy names here come from configuration
//! (a layer's state name), never from requests, so the label set stays bounded.

use std::sync::Arc;

use distlimit_core::PermitEvent;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::labels::{EventLabels, PolicyLabels};

#[derive(Debug, Default)]
pub(crate) struct PermitFamilies {
    events: Family<EventLabels, Counter>,
    held: Family<PolicyLabels, Gauge>,
}

impl PermitFamilies {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "permits",
            "Concurrency permits by policy and event: acquired, rejected (the key was full), \
             released, expired (found expired: a crashed or too slow holder)",
            self.events.clone(),
        );
        registry.register(
            "permits_held",
            "Concurrency permits this process holds now (requests in flight), by policy",
            self.held.clone(),
        );
    }

    pub(crate) fn on_permits(&self, policy: &str, event: PermitEvent, count: u64) {
        if count == 0 {
            return;
        }
        let policy: Arc<str> = policy.into();
        self.events
            .get_or_create(&EventLabels {
                policy: policy.clone(),
                event: event.as_str(),
            })
            .inc_by(count);
        let delta = i64::try_from(count).unwrap_or(i64::MAX);
        let delta = match event {
            PermitEvent::Acquired => delta,
            PermitEvent::Released => -delta,
            _ => return,
        };
        self.held
            .get_or_create(&PolicyLabels { policy })
            .inc_by(delta);
    }
}
