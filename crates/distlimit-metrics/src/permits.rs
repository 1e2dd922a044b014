//! The concurrency limits' series: permit events by `policy` (the limit's state name) and
//! `event`, and the permits this process holds now. Policy names here come from configuration
//! (a layer's state name), never from requests, so the label set stays bounded.

use std::sync::Arc;

use distlimit_core::PermitEvent;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// `distlimit_permits_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    policy: Arc<str>,
    event: &'static str,
}

/// `distlimit_permits_held`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HeldLabels {
    policy: Arc<str>,
}

#[derive(Debug, Default)]
pub(crate) struct PermitFamilies {
    events: Family<EventLabels, Counter>,
    held: Family<HeldLabels, Gauge>,
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
        match event {
            PermitEvent::Acquired => {
                self.held
                    .get_or_create(&HeldLabels { policy })
                    .inc_by(delta);
            }
            PermitEvent::Released => {
                self.held
                    .get_or_create(&HeldLabels { policy })
                    .dec_by(delta);
            }
            _ => {}
        }
    }
}
