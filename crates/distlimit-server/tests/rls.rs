//! Envoy's RLS v3 over loopback, driven by a client built from the same protos, on the
//! configuration examples of envoyproxy/ratelimit's README.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::UInt64Value;
use support::*;
use tonic::Code;

const EXAMPLE_2: &str = "
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

#[tokio::test]
async fn nested_descriptors_limit_each_number_and_spend_all_or_nothing() {
    let dir = config_dir(EXAMPLE_2);
    let server = Running::with_config(dir.path(), &[]).await;
    let mut client = server.client().await;
    align(86_400, Duration::from_secs(5)).await;
    let marketing = |number: &str| {
        request(
            "messaging",
            vec![
                descriptor(&[("message_type", "marketing"), ("to_number", number)]),
                descriptor(&[("to_number", number)]),
            ],
        )
    };
    for i in 0..5 {
        let answer = call(&mut client, marketing("2061111111")).await;
        assert_eq!(answer.overall_code, OK, "message {i}");
        let limits: Vec<u32> = answer
            .statuses
            .iter()
            .map(|s| s.current_limit.as_ref().unwrap().requests_per_unit)
            .collect();
        assert_eq!(limits, [5, 100]);
        assert_eq!(answer.statuses[0].limit_remaining, 4 - i);
        assert_eq!(answer.statuses[1].limit_remaining, 99 - i);
        let reset = answer.statuses[0].duration_until_reset.unwrap();
        assert!(reset.seconds > 0 && reset.seconds <= 86_400);
    }
    let denied = call(&mut client, marketing("2061111111")).await;
    assert_eq!(denied.overall_code, OVER_LIMIT);
    assert_eq!(denied.statuses[0].code, OVER_LIMIT);
    assert_eq!(denied.statuses[1].code, OK);
    // All or nothing: the denied request did not spend the per-number limit.
    let alone = call(
        &mut client,
        request(
            "messaging",
            vec![descriptor(&[("to_number", "2061111111")])],
        ),
    )
    .await;
    assert_eq!(alone.overall_code, OK);
    assert_eq!(alone.statuses[0].limit_remaining, 100 - 5 - 1);
    // Another number has its own limits.
    let other = call(&mut client, marketing("2062222222")).await;
    assert_eq!(other.overall_code, OK);
    assert_eq!(other.statuses[0].limit_remaining, 4);
    server.stop().await;
}

#[tokio::test]
async fn exact_value_wins_and_zero_denies_every_request() {
    let dir = config_dir(
        "
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
",
    );
    let server = Running::with_config(dir.path(), &[]).await;
    let mut client = server.client().await;
    let ip = |ip: &str| {
        request(
            "edge_proxy_per_ip",
            vec![descriptor(&[("remote_address", ip)])],
        )
    };
    let blocked = call(&mut client, ip("50.0.0.5")).await;
    assert_eq!(blocked.overall_code, OVER_LIMIT);
    assert_eq!(
        blocked.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        0
    );
    let other = call(&mut client, ip("50.0.0.1")).await;
    assert_eq!(other.overall_code, OK);
    assert_eq!(
        other.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        10
    );
    server.stop().await;
}

#[tokio::test]
async fn unmatched_and_unlimited_descriptors_pass() {
    let dir = config_dir(
        "
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
",
    );
    let server = Running::with_config(dir.path(), &[]).await;
    let mut client = server.client().await;
    let answer = call(
        &mut client,
        request(
            "internal",
            vec![
                descriptor(&[("ldap", "a")]),
                descriptor(&[("nothing", "b")]),
                descriptor(&[("azure", "c")]),
            ],
        ),
    )
    .await;
    assert_eq!(answer.overall_code, OK);
    let [ldap, nothing, azure] = answer.statuses.as_slice() else {
        panic!("three statuses: {answer:?}");
    };
    assert_eq!(ldap.code, OK);
    assert_eq!(ldap.limit_remaining, u32::MAX);
    assert!(ldap.current_limit.is_none());
    assert_eq!(nothing.code, OK);
    assert!(nothing.current_limit.is_none());
    assert_eq!(azure.current_limit.as_ref().unwrap().requests_per_unit, 100);
    // An unknown domain limits nothing.
    let unknown = call(
        &mut client,
        request("elsewhere", vec![descriptor(&[("azure", "c")])]),
    )
    .await;
    assert_eq!(unknown.overall_code, OK);
    assert!(unknown.statuses[0].current_limit.is_none());
    server.stop().await;
}

const EXAMPLE_6: &str = "
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
";

#[tokio::test]
async fn shadow_mode_answers_ok_and_counts_the_would_be_denials() {
    let dir = config_dir(EXAMPLE_6);
    let server = Running::with_config(dir.path(), &[]).await;
    let mut client = server.client().await;
    let user = |name: &str| {
        request(
            "example6",
            vec![descriptor(&[("service", "auth-service"), ("user", name)])],
        )
    };
    align(1, Duration::from_millis(600)).await;
    for _ in 0..13 {
        let answer = call(&mut client, user("user-a")).await;
        assert_eq!(answer.overall_code, OK);
        assert_eq!(answer.statuses[0].code, OK);
    }
    let metrics = server.checker.metrics().encode();
    assert!(
        metrics.contains(
            r#"distlimit_decisions_total{policy="example6/service.user_user-a",outcome="shadow_denied",source="primary"} 3"#
        ),
        "{metrics}"
    );
    align(1, Duration::from_millis(600)).await;
    let mut codes = Vec::new();
    for _ in 0..21 {
        codes.push(call(&mut client, user("user-b")).await.overall_code);
    }
    assert_eq!(codes.iter().filter(|&&c| c == OK).count(), 20, "{codes:?}");
    assert_eq!(codes[20], OVER_LIMIT);
    server.stop().await;
}

const EXAMPLE_7: &str = "
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
";

#[tokio::test]
async fn replaces_drops_the_replaced_limit_and_leaves_it_unspent() {
    let dir = config_dir(EXAMPLE_7);
    let server = Running::with_config(dir.path(), &[]).await;
    let mut client = server.client().await;
    let both = || {
        request(
            "example7",
            vec![
                descriptor(&[("key_1", "value_1"), ("user", "bkthomps")]),
                descriptor(&[("key_2", "value_2"), ("user", "bkthomps")]),
            ],
        )
    };
    align(1, Duration::from_millis(600)).await;
    for i in 0..10 {
        let answer = call(&mut client, both()).await;
        assert_eq!(answer.overall_code, OK, "request {i}");
        assert!(answer.statuses[0].current_limit.is_none());
        assert_eq!(
            answer.statuses[1]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            10
        );
    }
    assert_eq!(call(&mut client, both()).await.overall_code, OVER_LIMIT);
    // The replaced 5 per second was never spent.
    let alone = call(
        &mut client,
        request(
            "example7",
            vec![descriptor(&[("key_1", "value_1"), ("user", "bkthomps")])],
        ),
    )
    .await;
    assert_eq!(alone.overall_code, OK);
    assert_eq!(alone.statuses[0].limit_remaining, 4);
    server.stop().await;
}

#[tokio::test]
async fn wildcard_values_limit_each_value_apart() {
    let dir = config_dir(
        "
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
    );
    let server = Running::with_config(dir.path(), &[]).await;
    let mut client = server.client().await;
    let value = |v: &str| request("example9", vec![descriptor(&[("key1", v)])]);
    align(60, Duration::from_secs(3)).await;
    for _ in 0..20 {
        assert_eq!(call(&mut client, value("value_1")).await.overall_code, OK);
    }
    assert_eq!(
        call(&mut client, value("value_1")).await.overall_code,
        OVER_LIMIT
    );
    let second = call(&mut client, value("value_2")).await;
    assert_eq!(second.overall_code, OK);
    assert_eq!(second.statuses[0].limit_remaining, 19);
    let other = call(&mut client, value("other")).await;
    assert!(other.statuses[0].current_limit.is_none());
    server.stop().await;
}

#[tokio::test]
async fn hits_addend_request_level_per_descriptor_and_zero_checks_without_spending() {
    let dir = config_dir(
        "
domain: d
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 5 }
",
    );
    let server = Running::with_config(dir.path(), &[]).await;
    let mut client = server.client().await;
    align(3_600, Duration::from_secs(5)).await;
    let mut three = request("d", vec![descriptor(&[("user", "u")])]);
    three.hits_addend = 3;
    let answer = call(&mut client, three.clone()).await;
    assert_eq!(answer.statuses[0].limit_remaining, 2);
    // Per descriptor, 0: a check that spends nothing.
    let mut peek = three.clone();
    peek.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    let answer = call(&mut client, peek).await;
    assert_eq!(answer.overall_code, OK);
    assert_eq!(answer.statuses[0].limit_remaining, 2);
    // The request's 3 would not fit; the descriptor's 2 wins and does.
    assert_eq!(
        call(&mut client, three.clone()).await.overall_code,
        OVER_LIMIT
    );
    let mut two = three.clone();
    two.descriptors[0].hits_addend = Some(UInt64Value { value: 2 });
    let answer = call(&mut client, two).await;
    assert_eq!(answer.overall_code, OK);
    assert_eq!(answer.statuses[0].limit_remaining, 0);
    // 0 at the request level means 1.
    let one = request("d", vec![descriptor(&[("user", "u")])]);
    assert_eq!(call(&mut client, one).await.overall_code, OVER_LIMIT);
    server.stop().await;
}

#[tokio::test]
async fn a_limit_override_replaces_the_configured_limit() {
    let dir = config_dir(
        "
domain: d
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 100 }
",
    );
    let server = Running::with_config(dir.path(), &[]).await;
    let mut client = server.client().await;
    align(3_600, Duration::from_secs(5)).await;
    let mut overridden = request("d", vec![descriptor(&[("user", "o")])]);
    overridden.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 3, // HOUR in envoy.type.v3.RateLimitUnit
    });
    let first = call(&mut client, overridden.clone()).await;
    assert_eq!(first.overall_code, OK);
    assert_eq!(
        first.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1
    );
    assert_eq!(
        call(&mut client, overridden.clone()).await.overall_code,
        OVER_LIMIT
    );
    overridden.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 0,
    });
    let status = client.should_rate_limit(overridden).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    server.stop().await;
}

#[tokio::test]
async fn response_headers_when_enabled() {
    let dir = config_dir(
        "
domain: d
descriptors:
  - key: user
    rate_limit: { name: per-user, unit: hour, requests_per_unit: 10 }
",
    );
    let server = Running::with_config(dir.path(), &["--response-headers"]).await;
    let mut client = server.client().await;
    align(3_600, Duration::from_secs(5)).await;
    let answer = call(
        &mut client,
        request("d", vec![descriptor(&[("user", "h")])]),
    )
    .await;
    let headers: Vec<(String, String)> = answer
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{name} in {headers:?}"))
    };
    assert_eq!(get("ratelimit-policy"), r#""per-user";q=10;w=3600"#);
    assert!(get("ratelimit").starts_with(r#""per-user";r=9;t="#));
    assert_eq!(get("ratelimit-limit"), "10");
    assert_eq!(get("ratelimit-remaining"), "9");
    let reset: u64 = get("ratelimit-reset").parse().unwrap();
    assert!((1..=3_600).contains(&reset));
    server.stop().await;
}

#[tokio::test]
async fn bad_requests_get_invalid_argument_and_the_server_keeps_serving() {
    let dir = config_dir(
        "
domain: d
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 1000 }
",
    );
    let server = Running::with_config(dir.path(), &[]).await;
    let mut client = server.client().await;
    let many_entries: Vec<(String, String)> = (0..10_000)
        .map(|i| (format!("k{i}"), format!("v{i}")))
        .collect();
    let many_entries: Vec<(&str, &str)> = many_entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut negative = request("d", vec![descriptor(&[("user", "n")])]);
    negative.descriptors[0].is_negative_hits = true;
    let cases = [
        (
            "empty domain",
            request("", vec![descriptor(&[("user", "a")])]),
            "domain",
        ),
        ("no descriptors", request("d", vec![]), "no descriptors"),
        (
            "10 000 entries",
            request("d", vec![descriptor(&many_entries)]),
            "entries",
        ),
        (
            "10 000 descriptors",
            request("d", vec![descriptor(&[("user", "a")]); 10_000]),
            "descriptors",
        ),
        // A give-back on a YAML rule (a fixed window): refused, typed.
        ("negative hits", negative, "cannot carry debt"),
    ];
    for (name, bad, expected) in cases {
        let status = client.should_rate_limit(bad).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{name}: {status:?}");
        assert!(status.message().contains(expected), "{name}: {status:?}");
    }
    // A long value within bounds is counted under a digest of the key.
    let long = "y".repeat(4_096);
    let answer = call(
        &mut client,
        request("d", vec![descriptor(&[("user", &long)])]),
    )
    .await;
    assert_eq!(answer.overall_code, OK);
    assert_eq!(answer.statuses[0].limit_remaining, 999);
    server.stop().await;
}

/// A descriptor repeated in one request is answered hit by hit, as envoyproxy/ratelimit
/// answers it (one `INCRBY` each, in order): each status what was left after its own hit, and
/// when the hits do not all fit, the first ones `OK` and the rest `OVER_LIMIT`. Unlike
/// envoyproxy/ratelimit a denied request charges nothing (all or nothing).
#[tokio::test]
async fn a_repeated_descriptor_answers_each_hit_after_the_ones_before_it() {
    let dir = config_dir(
        "
domain: d
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 20 }
",
    );
    let server = Running::with_config(dir.path(), &[]).await;
    let mut client = server.client().await;
    align(3_600, Duration::from_secs(5)).await;
    let user = descriptor(&[("user", "t")]);
    let twice = request("d", vec![user.clone(), user.clone()]);
    let answer = call(&mut client, twice.clone()).await;
    assert_eq!(answer.overall_code, OK);
    let remaining = |a: &RateLimitResponse| -> Vec<(i32, u32)> {
        a.statuses
            .iter()
            .map(|s| (s.code, s.limit_remaining))
            .collect()
    };
    assert_eq!(remaining(&answer), [(OK, 19), (OK, 18)]);
    // Down to 1 left: the first hit fits, the second does not, and nothing is charged.
    let mut seventeen = request("d", vec![user.clone()]);
    seventeen.hits_addend = 17;
    assert_eq!(remaining(&call(&mut client, seventeen).await), [(OK, 1)]);
    let answer = call(&mut client, twice.clone()).await;
    assert_eq!(answer.overall_code, OVER_LIMIT);
    assert_eq!(remaining(&answer), [(OK, 1), (OVER_LIMIT, 0)]);
    // The JSON API decides the same batch the same way.
    let addr = server.http;
    let body = r#"{"domain":"d","descriptors":[[{"key":"user","value":"t"}],[{"key":"user","value":"t"}]]}"#;
    let (status, text) =
        tokio::task::spawn_blocking(move || binary::http(addr, "POST", "/v1/check", body))
            .await
            .unwrap();
    assert_eq!(status, 429, "{text}");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let statuses: Vec<_> = (0..2)
        .map(|i| {
            (
                json["statuses"][i]["code"].clone(),
                json["statuses"][i]["limit_remaining"].clone(),
            )
        })
        .collect();
    assert_eq!(
        statuses,
        [("OK".into(), 1.into()), ("OVER_LIMIT".into(), 0.into())],
        "{text}"
    );
    let once = call(&mut client, request("d", vec![user])).await;
    assert_eq!(remaining(&once), [(OK, 0)]);
    server.stop().await;
}

#[tokio::test]
async fn grpc_health_reports_serving() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let server = Running::start(&[]).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let answer = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.status, 1, "{service}: SERVING");
    }
    server.stop().await;
}
