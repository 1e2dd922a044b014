//! The lease client's series (`distlimit-lease`): units withdrawn and given back, store calls
//! that took units, and the units held in leases now, by `store` (the client's name).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::labels::StoreLabels;

#[derive(Debug, Default)]
pub(crate) struct LeaseFamilies {
    takes: Family<StoreLabels, Counter>,
    taken: Family<StoreLabels, Counter>,
    returned: Family<StoreLabels, Counter>,
    held: Family<StoreLabels, Gauge>,
}

impl LeaseFamilies {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "lease_takes",
            "Store calls of a lease client that withdrew units (leases taken)",
            self.takes.clone(),
        );
        registry.register(
            "lease_taken_units",
            "Units a lease client withdrew from its store",
            self.taken.clone(),
        );
        registry.register(
            "lease_returned_units",
            "Unspent units a lease client gave back when its leases ended",
            self.returned.clone(),
        );
        registry.register(
            "lease_held_units",
            "Units a lease client holds in leases now, all keys together",
            self.held.clone(),
        );
    }

    pub(crate) fn taken(&self, store: &'static str, units: u64) {
        if units > 0 {
            let labels = StoreLabels { store };
            self.takes.get_or_create(&labels).inc();
            self.taken.get_or_create(&labels).inc_by(units);
        }
    }

    pub(crate) fn returned(&self, store: &'static str, units: u64) {
        self.returned
            .get_or_create(&StoreLabels { store })
            .inc_by(units);
    }

    pub(crate) fn held(&self, store: &'static str, units: u64) {
        self.held
            .get_or_create(&StoreLabels { store })
            .set(i64::try_from(units).unwrap_or(i64::MAX));
    }
}
