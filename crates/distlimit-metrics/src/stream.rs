//! The streamed responses' series (`distlimit-tower`'s streaming settlement): units metered,
//! streams stopped at the budget, blocks reserved and returned, by `policy` (from
//! configuration, never from requests, so the label set stays bounded).

use std::sync::Arc;

use distlimit_core::StreamEvent;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::labels::{EventLabels, PolicyLabels};

#[derive(Debug, Default)]
pub(crate) struct StreamFamilies {
    units: Family<PolicyLabels, Counter>,
    stopped: Family<PolicyLabels, Counter>,
    blocks: Family<EventLabels, Counter>,
    block_units: Family<EventLabels, Counter>,
}

impl StreamFamilies {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "stream_units",
            "Units streamed responses passed on (metered as they streamed), by policy",
            self.units.clone(),
        );
        registry.register(
            "stream_stopped",
            "Streamed responses stopped at their budget, by policy",
            self.stopped.clone(),
        );
        registry.register(
            "stream_blocks",
            "Blocks of units reserved for streamed responses, and unused remainders returned \
             when they ended, by policy and event",
            self.blocks.clone(),
        );
        registry.register(
            "stream_block_units",
            "Units of the blocks of distlimit_stream_blocks_total, by policy and event",
            self.block_units.clone(),
        );
    }

    pub(crate) fn on_stream(&self, policy: &str, event: StreamEvent, units: u64) {
        let policy: Arc<str> = policy.into();
        match event {
            StreamEvent::Metered => {
                self.units
                    .get_or_create(&PolicyLabels { policy })
                    .inc_by(units);
            }
            StreamEvent::Stopped => {
                self.stopped.get_or_create(&PolicyLabels { policy }).inc();
            }
            _ => {
                let labels = EventLabels {
                    policy,
                    event: event.as_str(),
                };
                self.blocks.get_or_create(&labels).inc();
                self.block_units.get_or_create(&labels).inc_by(units);
            }
        }
    }
}
