//! The TOML form of a [`PolicySet`] (the schema is the crate documentation's
//! "Configuration"): parsing with errors that name the policy and the field, and serialization
//! back.

use std::path::Path;
use std::time::Duration;

use distlimit_core::{Algorithm, Limit, Quota, UnknownAlgorithm};
use serde::{Deserialize, Serialize};

use crate::error::Field;
use crate::policy::quota_error;
use crate::{Policy, PolicyConfigError, PolicySet, Scope, Tier};

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default, rename = "policy")]
    policies: Vec<RawPolicy>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    name: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    shadow: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    deny: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_in_flight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    in_flight_lease: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    overrun: Option<crate::Overrun>,
    tiers: Vec<RawTier>,
    #[serde(default, rename = "override", skip_serializing_if = "Vec::is_empty")]
    overrides: Vec<RawOverride>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    name: String,
    /// `None`: a token bucket.
    #[serde(default)]
    algorithm: Option<String>,
    limit: u64,
    per: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    burst: Option<u64>,
    /// `None`: per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scope: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawOverride {
    key: String,
    tiers: Vec<RawTier>,
}

impl PolicySet {
    /// Parses and validates a policy set from TOML (the schema is in the crate documentation).
    ///
    /// Errors name the policy, the tier and the field:
    /// `policy "api", tier "burst": algorithm: unknown algorithm "leaky"...`. A document that is
    /// not TOML, or has unknown or missing fields, is a [`Field::Toml`](crate::Field::Toml)
    /// error with its line and column, and the TOML error as its source. A document without
    /// any policy (an empty or half-written file) is a [`Field::Policy`](crate::Field::Policy)
    /// error.
    pub fn from_toml_str(text: &str) -> Result<Self, PolicyConfigError> {
        let file: File = toml::from_str(text).map_err(|e| malformed(text, e))?;
        if file.policies.is_empty() {
            return Err(PolicyConfigError::new(
                Field::Policy,
                "no policy defined (an empty or half-written file?)",
            ));
        }
        let policies = file
            .policies
            .into_iter()
            .map(RawPolicy::into_policy)
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(policies)
    }

    /// Reads [`from_toml_str`](Self::from_toml_str) from a file.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self, PolicyConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| read_error(path, e))?;
        Self::from_toml_str(&text)
    }

    /// The set as TOML, which [`from_toml_str`](Self::from_toml_str) reads back into an equal
    /// set. TOML strings are UTF-8: a list or override key that is not (possible when built in
    /// code) is written lossily, with U+FFFD in place of invalid bytes.
    pub fn to_toml_string(&self) -> String {
        let file = File {
            policies: self.policies().iter().map(RawPolicy::from_policy).collect(),
        };
        // Plain strings, integers and arrays of tables: serialization cannot fail.
        toml::to_string(&file).unwrap_or_default()
    }
}

/// A file that could not be read.
pub(crate) fn read_error(path: &Path, e: std::io::Error) -> PolicyConfigError {
    PolicyConfigError::new(Field::File, format!("cannot read {}", path.display())).with_source(e)
}

/// A document that is not TOML or does not match the schema: where, and the TOML error as
/// the source.
fn malformed(text: &str, e: toml::de::Error) -> PolicyConfigError {
    let message = match e.span() {
        Some(span) => {
            let before = text.get(..span.start).unwrap_or(text);
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("invalid at line {line}, column {column}")
        }
        None => "invalid".to_owned(),
    };
    PolicyConfigError::new(Field::Toml, message).with_source(e)
}

impl RawPolicy {
    fn into_policy(self) -> Result<Policy, PolicyConfigError> {
        let name = self.name;
        let in_policy = |e: PolicyConfigError| e.in_policy(&name);
        let mut policy = Policy::new(name.as_str()).shadow(self.shadow);
        let lease = self.in_flight_lease.as_deref();
        if let Some(limit) = in_flight(self.max_in_flight, lease).map_err(in_policy)? {
            policy = policy.with_max_in_flight(limit);
        }
        if let Some(overrun) = self.overrun {
            policy = policy.with_overrun(overrun);
        }
        for tier in self.tiers {
            policy = policy.tier(tier.into_tier().map_err(in_policy)?);
        }
        for key in &self.allow {
            policy = policy.allow(key);
        }
        for key in &self.deny {
            policy = policy.deny(key);
        }
        for o in self.overrides {
            let tiers = o
                .tiers
                .into_iter()
                .map(RawTier::into_tier)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.in_override(o.key.as_bytes()).in_policy(&name))?;
            policy = policy.override_key(&o.key, tiers);
        }
        Ok(policy)
    }

    fn from_policy(policy: &Policy) -> Self {
        Self {
            name: policy.name().to_owned(),
            shadow: policy.is_shadow(),
            allow: policy.allowed_keys().map(lossy).collect(),
            deny: policy.denied_keys().map(lossy).collect(),
            max_in_flight: policy.max_in_flight().map(|l| l.max_in_flight()),
            in_flight_lease: policy
                .max_in_flight()
                .map(|l| format_duration(l.lease_us())),
            overrun: policy.overrun(),
            tiers: policy.tiers().iter().map(RawTier::from_tier).collect(),
            overrides: policy
                .overrides()
                .iter()
                .map(|o| RawOverride {
                    key: lossy(o.key()),
                    tiers: o.tiers().iter().map(RawTier::from_tier).collect(),
                })
                .collect(),
        }
    }
}

/// The lease of a concurrency limit without `in_flight_lease`.
pub const DEFAULT_IN_FLIGHT_LEASE: Duration = Duration::from_secs(30);

/// A policy's concurrency limit from its two fields: a lease without a limit, a limit of 0 or
/// above 65 536, or a lease outside 1 ms to a day is a [`Field::MaxInFlight`] error.
fn in_flight(
    max: Option<u32>,
    lease: Option<&str>,
) -> Result<Option<distlimit_core::PermitLimit>, PolicyConfigError> {
    let error = |message: String| PolicyConfigError::new(Field::MaxInFlight, message);
    let (max, lease) = match (max, lease) {
        (None, None) => return Ok(None),
        (None, Some(_)) => return Err(error("in_flight_lease without max_in_flight".into())),
        (Some(max), None) => (max, DEFAULT_IN_FLIGHT_LEASE),
        (Some(max), Some(text)) => {
            let lease = parse_duration(text).map_err(|e| error(format!("in_flight_lease: {e}")))?;
            (max, lease)
        }
    };
    distlimit_core::PermitLimit::new(max, lease)
        .map(Some)
        .map_err(|e| error(e.to_string()))
}

fn lossy(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

impl RawTier {
    fn into_tier(self) -> Result<Tier, PolicyConfigError> {
        let in_tier = |e: PolicyConfigError| e.in_tier(&self.name);
        let algorithm = self
            .algorithm
            .as_deref()
            .unwrap_or(Algorithm::TokenBucket.name());
        let algorithm: Algorithm = algorithm.parse().map_err(|e: UnknownAlgorithm| {
            in_tier(PolicyConfigError::new(Field::Algorithm, e.to_string()))
        })?;
        let scope = match self.scope.as_deref().unwrap_or("key") {
            "key" => Scope::Key,
            "global" => Scope::Global,
            other => {
                return Err(in_tier(PolicyConfigError::new(
                    Field::Scope,
                    format!("unknown scope {other:?}: expected key or global"),
                )));
            }
        };
        let period = parse_duration(&self.per).map_err(in_tier)?;
        let period_us = u64::try_from(period.as_micros()).unwrap_or(u64::MAX);
        let quota = Quota::from_parts(self.limit, period_us, self.burst.unwrap_or(self.limit))
            .map_err(|e| in_tier(quota_error(e)))?;
        Ok(Tier::new(self.name.as_str(), Limit::new(algorithm, quota)).with_scope(scope))
    }

    fn from_tier(tier: &Tier) -> Self {
        let quota = tier.quota();
        Self {
            name: tier.name().to_owned(),
            algorithm: Some(tier.algorithm().name().to_owned()),
            limit: quota.limit(),
            per: format_duration(quota.period_us()),
            burst: (quota.burst() != quota.limit()).then_some(quota.burst()),
            scope: (tier.scope() != Scope::Key).then(|| tier.scope().name().to_owned()),
        }
    }
}

/// Units of `per`, largest first: the serializer picks the largest that divides the period.
const UNITS: [(&str, u64); 6] = [
    ("d", 86_400_000_000),
    ("h", 3_600_000_000),
    ("m", 60_000_000),
    ("s", 1_000_000),
    ("ms", 1_000),
    ("us", 1),
];

/// Parses `"<whole number><unit>"` with unit `us` (or `µs`), `ms`, `s`, `m`, `h` or `d`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, PolicyConfigError> {
    let bad = || {
        PolicyConfigError::new(
            Field::Per,
            format!(
                "{text:?} is not a duration: expected a whole number and a unit \
                 (us, ms, s, m, h, d), such as \"1s\" or \"15m\""
            ),
        )
    };
    let digits = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let unit = if unit == "µs" { "us" } else { unit };
    let (_, scale) = UNITS.iter().find(|(u, _)| *u == unit).ok_or_else(bad)?;
    let us = number.checked_mul(*scale).ok_or_else(bad)?;
    Ok(Duration::from_micros(us))
}

/// The shortest `parse_duration` text for `us` microseconds.
fn format_duration(us: u64) -> String {
    let (unit, scale) = UNITS
        .iter()
        .find(|(_, scale)| us.is_multiple_of(*scale))
        .copied()
        .unwrap_or(("us", 1));
    format!("{}{unit}", us / scale)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn durations_parse_and_format_in_every_unit() {
        for (text, us) in [
            ("1d", 86_400_000_000),
            ("2h", 7_200_000_000),
            ("15m", 900_000_000),
            ("1s", 1_000_000),
            ("250ms", 250_000),
            ("10us", 10),
        ] {
            assert_eq!(parse_duration(text).unwrap(), Duration::from_micros(us));
            assert_eq!(format_duration(us), text);
        }
        assert_eq!(parse_duration("7µs").unwrap(), Duration::from_micros(7));
        assert_eq!(format_duration(90_000_000), "90s");
        for bad in [
            "",
            "s",
            "1",
            "1.5s",
            "1 s",
            "-1s",
            "1w",
            "99999999999999999999d",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert_eq!(e.field(), Field::Per, "{bad:?}");
        }
    }

    #[test]
    fn overrun_parses_and_round_trips() {
        let text = "[[policy]]\nname = \"tokens\"\noverrun = \"debt\"\ntiers = [{ name = \"t\", limit = 1, per = \"1s\" }]\n";
        let overrun =
            |text: &str| PolicySet::from_toml_str(text).map(|s| s.policies()[0].overrun());
        let set = PolicySet::from_toml_str(text).unwrap();
        assert_eq!(overrun(text), Ok(Some(crate::Overrun::Debt)));
        assert_eq!(
            overrun(&set.to_toml_string()),
            Ok(Some(crate::Overrun::Debt))
        );
        assert_eq!(overrun(&text.replace("overrun = \"debt\"\n", "")), Ok(None));
        let bad = overrun(&text.replace("\"debt\"", "\"later\""));
        assert_eq!(bad.unwrap_err().field(), Field::Toml);
    }

    #[test]
    fn concurrency_limits_parse_validate_and_round_trip() {
        let text = "[[policy]]\nname = \"gen\"\nmax_in_flight = 4\nin_flight_lease = \"10s\"\ntiers = [{ name = \"t\", limit = 1, per = \"1s\" }]\n";
        let set = PolicySet::from_toml_str(text).unwrap();
        let limit = set.get("gen").unwrap().max_in_flight().unwrap();
        assert_eq!(
            (limit.max_in_flight(), limit.lease()),
            (4, Duration::from_secs(10))
        );
        let again = PolicySet::from_toml_str(&set.to_toml_string()).unwrap();
        assert_eq!(again.get("gen").unwrap().max_in_flight(), Some(limit));
        let default = text.replace("in_flight_lease = \"10s\"\n", "");
        let set = PolicySet::from_toml_str(&default).unwrap();
        assert_eq!(
            set.get("gen").unwrap().max_in_flight().unwrap().lease(),
            DEFAULT_IN_FLIGHT_LEASE
        );
        let edit = |from: &str, to: &str| text.replace(from, to);
        for (bad, says) in [
            (edit("max_in_flight = 4", "max_in_flight = 0"), "at least 1"),
            (
                edit("max_in_flight = 4", "max_in_flight = 70000"),
                "maximum is 65536",
            ),
            (edit("\"10s\"", "\"0s\""), "at least 1 ms"),
            (edit("\"10s\"", "\"2d\""), "longer than"),
            (edit("\"10s\"", "\"ten\""), "in_flight_lease"),
            (edit("max_in_flight = 4\n", ""), "without max_in_flight"),
        ] {
            let e = PolicySet::from_toml_str(&bad).unwrap_err();
            assert_eq!(e.field(), Field::MaxInFlight, "{bad}");
            let message = e.to_string();
            assert!(
                message.contains("policy \"gen\"") && message.contains(says),
                "{message}"
            );
        }
    }

    /// `PolicySet::in_flight`: the limit a TOML policy names, or an error naming the policy
    /// that has none (or does not exist).
    #[test]
    fn a_policys_concurrency_limit_is_read_by_name() {
        let text = "[[policy]]\nname = \"gen\"\nmax_in_flight = 2\ntiers = [{ name = \"t\", limit = 1, per = \"1s\" }]\n[[policy]]\nname = \"api\"\ntiers = [{ name = \"t\", limit = 1, per = \"1s\" }]\n";
        let set = PolicySet::from_toml_str(text).unwrap();
        let limit = set.in_flight("gen").unwrap();
        assert_eq!(
            (limit.max_in_flight(), limit.lease()),
            (2, DEFAULT_IN_FLIGHT_LEASE)
        );
        let e = set.in_flight("api").unwrap_err();
        assert_eq!(
            (e.field(), e.to_string().as_str()),
            (
                Field::MaxInFlight,
                "policy \"api\": max_in_flight: the policy has no max_in_flight"
            )
        );
        let e = set.in_flight("nope").unwrap_err();
        assert_eq!(
            (e.field(), e.to_string().as_str()),
            (Field::Name, "policy \"nope\": name: no such policy")
        );
    }
}
