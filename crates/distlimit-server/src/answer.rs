//! What envoyproxy/ratelimit adds to an answer besides its statuses, as its settings choose:
//! the rate-limit response headers under configurable names (`LIMIT_RESPONSE_HEADERS_ENABLED`,
//! `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`) and the gRPC
//! response's `dynamic_metadata` (`RESPONSE_DYNAMIC_METADATA`).
//!
//! With both off (the defaults) nothing here runs per request.

use std::collections::HashMap;

use axum::http::HeaderName;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, NullValue, Struct, Value};

use crate::check::CheckResponse;
use crate::config::Metadata;

/// The names [`CheckResponse::headers`] gives the headers envoyproxy/ratelimit lets rename.
const DEFAULT_LIMIT: &str = "ratelimit-limit";
const DEFAULT_REMAINING: &str = "ratelimit-remaining";
const DEFAULT_RESET: &str = "ratelimit-reset";

/// The names of envoyproxy/ratelimit's three response headers (`LIMIT_LIMIT_HEADER`,
/// `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`; by default `RateLimit-Limit`,
/// `RateLimit-Remaining`, `RateLimit-Reset`). Names are valid HTTP header names, held in lower
/// case (as HTTP/2 sends them). `RateLimit` and `RateLimit-Policy` keep their names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderNames {
    /// The limit of the tightest descriptor.
    pub limit: HeaderName,
    /// What it has left.
    pub remaining: HeaderName,
    /// Seconds until its window resets.
    pub reset: HeaderName,
}

impl Default for HeaderNames {
    fn default() -> Self {
        Self {
            limit: HeaderName::from_static(DEFAULT_LIMIT),
            remaining: HeaderName::from_static(DEFAULT_REMAINING),
            reset: HeaderName::from_static(DEFAULT_RESET),
        }
    }
}

impl HeaderNames {
    /// The header to send for `name`, one of [`CheckResponse::headers`]'s names. Cloning a
    /// configured name shares its bytes (no allocation).
    pub fn header(&self, name: &'static str) -> HeaderName {
        match name {
            DEFAULT_LIMIT => self.limit.clone(),
            DEFAULT_REMAINING => self.remaining.clone(),
            DEFAULT_RESET => self.reset.clone(),
            other => HeaderName::from_static(other),
        }
    }

    /// The name to send for `name`, one of [`CheckResponse::headers`]'s names, as text.
    pub fn name<'a>(&'a self, name: &'static str) -> &'a str {
        match name {
            DEFAULT_LIMIT => self.limit.as_str(),
            DEFAULT_REMAINING => self.remaining.as_str(),
            DEFAULT_RESET => self.reset.as_str(),
            other => other,
        }
    }
}

/// A header name that HTTP does not allow.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{name:?} is not an HTTP header name (a token: letters, digits and !#$%&'*+-.^_`|~)")]
pub struct InvalidHeaderName {
    /// The name refused.
    pub name: String,
}

/// Reads a header name: a non-empty HTTP token, in any case (held in lower case).
///
/// # Errors
///
/// [`InvalidHeaderName`] for an empty name or one with a character outside a token.
pub fn parse_header_name(name: &str) -> Result<HeaderName, InvalidHeaderName> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| InvalidHeaderName {
        name: name.to_owned(),
    })
}

/// How answers are completed, for both protocols.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponseSettings {
    /// Add the rate-limit headers, under these names (`--response-headers`).
    pub headers: Option<HeaderNames>,
    /// Fill the gRPC response's `dynamic_metadata` (`--response-dynamic-metadata`).
    pub dynamic_metadata: bool,
}

/// The response's dynamic metadata as envoyproxy/ratelimit writes it (the crate documentation,
/// "Dynamic metadata", lists the fields): the request's `domain`, `descriptors` and
/// `hitsAddend`, and the `metadata` of the YAML rules of the descriptors that passed, merged.
pub fn dynamic_metadata(request: &RateLimitRequest, answer: &CheckResponse) -> Struct {
    let mut fields = HashMap::new();
    fields.insert("domain".to_owned(), string(request.domain.clone()));
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let mut fields = HashMap::new();
            let entries = d
                .entries
                .iter()
                .map(|e| string(format!("{}={}", e.key, e.value)))
                .collect();
            fields.insert("entries".to_owned(), list(entries));
            if let Some(limit) = &d.limit {
                let unit = RateLimitUnit::try_from(limit.unit)
                    .map_or_else(|_| limit.unit.to_string(), |u| u.as_str_name().to_owned());
                let text = format!("requests_per_unit:{} unit:{unit}", limit.requests_per_unit);
                fields.insert("limit".to_owned(), string(text));
            }
            if let Some(hits) = &d.hits_addend {
                fields.insert("hitsAddend".to_owned(), number(hits.value as f64));
            }
            structure(fields)
        })
        .collect();
    fields.insert("descriptors".to_owned(), list(descriptors));
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_owned(),
            number(f64::from(request.hits_addend)),
        );
    }
    let mut passed = Struct::default();
    for status in answer.statuses.iter().filter(|s| !s.over_limit) {
        if let Some(metadata) = status
            .current_limit
            .as_ref()
            .and_then(|l| l.metadata.as_deref())
        {
            merge(&mut passed, metadata);
        }
    }
    if !passed.fields.is_empty() {
        fields.insert("metadata".to_owned(), structure(passed.fields));
    }
    Struct { fields }
}

/// Adds the keys of `src` missing from `dest`; a struct under a key in both is merged.
fn merge(dest: &mut Struct, src: &Metadata) {
    for (key, value) in src {
        match dest.fields.get_mut(key) {
            None => {
                dest.fields.insert(key.clone(), to_value(value));
            }
            Some(Value {
                kind: Some(Kind::StructValue(inner)),
            }) => {
                if let serde_json::Value::Object(src) = value {
                    merge(inner, src);
                }
            }
            Some(_) => {}
        }
    }
}

fn to_value(value: &serde_json::Value) -> Value {
    use serde_json::Value as Json;
    match value {
        Json::Null => Value {
            kind: Some(Kind::NullValue(NullValue::NullValue as i32)),
        },
        Json::Bool(b) => Value {
            kind: Some(Kind::BoolValue(*b)),
        },
        Json::Number(n) => number(n.as_f64().unwrap_or_default()),
        Json::String(s) => string(s.clone()),
        Json::Array(items) => list(items.iter().map(to_value).collect()),
        Json::Object(map) => structure(map.iter().map(|(k, v)| (k.clone(), to_value(v))).collect()),
    }
}

fn string(s: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(s)),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn structure(fields: HashMap<String, Value>) -> Value {
    Value {
        kind: Some(Kind::StructValue(Struct { fields })),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn header_names_are_tokens_held_in_lower_case() {
        assert_eq!(
            parse_header_name("X-RateLimit-Limit").unwrap().as_str(),
            "x-ratelimit-limit"
        );
        for bad in ["", "has space", "colon:", "ü", "a\nb"] {
            assert_eq!(parse_header_name(bad).unwrap_err().name, bad);
        }
        let names = HeaderNames {
            limit: parse_header_name("X-Limit").unwrap(),
            ..HeaderNames::default()
        };
        assert_eq!(names.name("ratelimit-limit"), "x-limit");
        assert_eq!(names.name("ratelimit-reset"), "ratelimit-reset");
        assert_eq!(names.header("ratelimit").as_str(), "ratelimit");
    }

    #[test]
    fn merging_keeps_the_first_value_and_merges_structs() {
        let first = serde_json::json!({ "a": 1, "s": { "x": 1 }, "l": [1] });
        let second = serde_json::json!({ "a": 2, "s": { "x": 2, "y": 2 }, "b": null });
        let mut dest = Struct::default();
        for m in [first, second] {
            merge(&mut dest, m.as_object().unwrap());
        }
        assert_eq!(dest.fields["a"], number(1.0));
        assert_eq!(
            dest.fields["s"],
            structure(HashMap::from([
                ("x".to_owned(), number(1.0)),
                ("y".to_owned(), number(2.0)),
            ]))
        );
        assert_eq!(dest.fields["l"], list(vec![number(1.0)]));
        assert!(matches!(dest.fields["b"].kind, Some(Kind::NullValue(_))));
    }
}
