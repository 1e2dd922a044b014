//! Metrics of the requests themselves (the `distlimit_server_*` series), beside the per-rule
//! decisions of `distlimit-metrics`: served on `/metrics` together, from one registry.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use distlimit_metrics::Metrics;
use distlimit_serve::{Alpn, Tls};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, text,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// The `domain` label of a request whose domain is not configured: a request's domain is only
/// a label value when the configuration names it, so clients cannot grow the series.
pub const UNCONFIGURED_DOMAIN: &str = "unconfigured";

/// The protocol a request came in by.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Protocol {
    /// Envoy's RLS v3 over gRPC.
    grpc,
    /// `POST /v1/check`.
    http,
}

/// How a request ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RequestResult {
    /// Admitted (`OK`).
    ok,
    /// Denied (`OVER_LIMIT`).
    over_limit,
    /// Refused as malformed (`INVALID_ARGUMENT`, HTTP 400).
    invalid,
    /// No decision: the store failed or time ran out (`UNAVAILABLE`, HTTP 503).
    unavailable,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    domain: Arc<str>,
    protocol: Protocol,
    result: RequestResult,
}

/// How a configuration load ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum LoadResult {
    /// Read and applied.
    success,
    /// Refused: the running configuration is kept.
    error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LoadLabels {
    result: LoadResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    store: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProtocolLabels {
    protocol: Protocol,
}

impl RequestResult {
    /// The result of a decided (or refused) request.
    pub fn of(answer: &Result<crate::CheckResponse, crate::CheckError>) -> Self {
        match answer {
            Ok(answer) if answer.over_limit => RequestResult::over_limit,
            Ok(_) => RequestResult::ok,
            Err(crate::CheckError::InvalidArgument(_)) => RequestResult::invalid,
            Err(crate::CheckError::Unavailable(_)) => RequestResult::unavailable,
        }
    }
}

/// Protocols × results: the request counters of one domain label.
const SERIES: usize = 2 * 4;

/// The request counters of one `domain` label, each looked up in its family once (at its
/// first request) instead of at every request: no label set is built, hashed or allocated
/// per request.
#[derive(Debug)]
pub(crate) struct DomainRequests {
    domain: Arc<str>,
    counters: [OnceLock<Counter>; SERIES],
}

impl DomainRequests {
    fn new(domain: &str) -> Self {
        Self {
            domain: Arc::from(domain),
            counters: Default::default(),
        }
    }

    /// One of each configured domain of `domains`, by name.
    pub(crate) fn of<'d>(domains: impl Iterator<Item = &'d str>) -> HashMap<Box<str>, Self> {
        domains.map(|d| (Box::from(d), Self::new(d))).collect()
    }
}

/// The server's registry: the request series and the decision series of a [`Metrics`].
pub struct RequestMetrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    /// The counters of the `unconfigured` domain label.
    unconfigured: DomainRequests,
    duration: Family<ProtocolLabels, Histogram>,
    /// The duration histogram of each protocol, looked up once.
    durations: [OnceLock<Histogram>; 2],
    redis_up: Family<StoreLabels, Gauge>,
    config_loads: Family<LoadLabels, Counter>,
    /// The series of the rate limit quota service.
    pub(crate) quota: crate::rlqs::QuotaMetrics,
}

impl std::fmt::Debug for RequestMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestMetrics").finish_non_exhaustive()
    }
}

impl RequestMetrics {
    /// A registry holding the request series and `decisions`' series.
    pub fn new(decisions: &Metrics) -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        // 10 µs to about 160 ms.
        let duration = Family::<ProtocolLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(1e-5, 2.0, 15))) as fn() -> Histogram,
        );
        let mut registry = Registry::default();
        decisions.register_into(&mut registry);
        let server = registry.sub_registry_with_prefix("distlimit_server");
        server.register(
            "requests",
            "Rate-limit requests by domain (configured domains only), protocol and result",
            requests.clone(),
        );
        server.register_with_unit(
            "request_duration",
            "Time from a decoded request to its answer",
            Unit::Seconds,
            duration.clone(),
        );
        let redis_up = Family::<StoreLabels, Gauge>::default();
        server.register(
            "store_up",
            "1 while the store decides, 0 while it is unreachable (not connected yet, or the \
             circuit breaker open) and the failure mode answers; only with --redis",
            redis_up.clone(),
        );
        let config_loads = Family::<LoadLabels, Counter>::default();
        server.register(
            "config_loads",
            "Configuration loads by result: success (at start and each applied reload) or error \
             (a changed configuration refused, the running one kept)",
            config_loads.clone(),
        );
        let quota = crate::rlqs::QuotaMetrics::register(server);
        Self {
            registry,
            requests,
            unconfigured: DomainRequests::new(UNCONFIGURED_DOMAIN),
            duration,
            durations: Default::default(),
            redis_up,
            config_loads,
            quota,
        }
    }

    /// Adds `distlimit_server_tls_handshake_failures_total{protocol}`: the failed TLS
    /// handshakes (plaintext clients, untrusted client certificates, timeouts) of each port.
    pub fn register_tls(&mut self, tls: &Tls) {
        self.registry
            .register_collector(Box::new(TlsFailures(tls.clone())));
    }

    /// Sets `distlimit_server_store_up{store="redis"}`: whether Redis decides.
    pub fn set_redis_up(&self, up: bool) {
        let labels = StoreLabels {
            store: distlimit_serve::store::REDIS_STORE,
        };
        self.redis_up.get_or_create(&labels).set(i64::from(up));
    }

    /// Counts one configuration load: `distlimit_server_config_loads_total{result}`.
    pub fn on_config_load(&self, result: LoadResult) {
        self.config_loads
            .get_or_create(&LoadLabels { result })
            .inc();
    }

    /// Counts one request of `domain` (`None`: not configured) by `protocol`, on counters
    /// resolved beforehand.
    pub(crate) fn on_request_in(
        &self,
        protocol: Protocol,
        domain: Option<&DomainRequests>,
        result: RequestResult,
        elapsed: Duration,
    ) {
        let domain = domain.unwrap_or(&self.unconfigured);
        // The variants' declaration order: protocols 0 and 1, results 0 to 3.
        let (p, r) = (protocol as usize, result as usize);
        let labels = || RequestLabels {
            domain: domain.domain.clone(),
            protocol,
            result,
        };
        if let Some(counter) = domain.counters.get(p * 4 + r) {
            counter
                .get_or_init(|| self.requests.get_or_create(&labels()).clone())
                .inc();
        }
        if let Some(histogram) = self.durations.get(p) {
            histogram
                .get_or_init(|| {
                    self.duration
                        .get_or_create(&ProtocolLabels { protocol })
                        .clone()
                })
                .observe(elapsed.as_secs_f64());
        }
    }

    /// The OpenMetrics text exposition of every series.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(8192);
        // Writing to a `String` cannot fail.
        let _ = text::encode(&mut out, &self.registry);
        out
    }
}

/// The failed handshakes of a [`Tls`], read at each scrape.
#[derive(Debug)]
struct TlsFailures(Tls);

impl Collector for TlsFailures {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let counter = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "distlimit_server_tls_handshake_failures",
            "Failed TLS handshakes (plaintext clients, untrusted client certificates, timeouts) by protocol",
            None,
            counter.metric_type(),
        )?;
        for (protocol, alpn) in [(Protocol::grpc, Alpn::H2), (Protocol::http, Alpn::Http1)] {
            let labels = ProtocolLabels { protocol };
            ConstCounter::new(self.0.handshake_failures(alpn))
                .encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
