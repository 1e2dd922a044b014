//! envoyproxy/ratelimit's own configuration tests, translated: its `test/config/*.yaml`
//! fixtures (copied unchanged into `tests/compat/`, see `tests/compat/NOTICE`) must load or be
//! refused as its `config_test.go` expects, and each descriptor it looks up must land on the
//! same limit, under the same statistics name (`domain.` + [`Match::metric_path`]).
//! Deliberate differences are listed in the crate README ("Compatibility").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::path::{Path, PathBuf};

use distlimit_server::config::{Match, RuleLimit, Unit};
use distlimit_server::{Config, RateLimitConfigError};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/compat")
        .join(name)
}

fn load(name: &str) -> Config {
    Config::load(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn refused(name: &str) -> RateLimitConfigError {
    match Config::load(&fixture(name)) {
        Ok(_) => panic!("{name} loaded"),
        Err(error) => error,
    }
}

const DOMAIN: &str = "test-domain";

/// What `entries` land on: requests per unit, unit (`None`: unlimited) and statistics name.
fn limit_of(config: &Config, entries: &[(&str, &str)]) -> Option<(u32, Option<Unit>, String)> {
    let m: Match<'_> = config.lookup(DOMAIN, entries.iter().copied())?;
    let name = format!("{DOMAIN}.{}", m.metric_path(entries));
    Some(match m.rule.limit {
        RuleLimit::Unlimited => (0, None, name),
        RuleLimit::PerUnit {
            requests_per_unit,
            unit,
        } => (requests_per_unit, Some(unit), name),
    })
}

fn expect(config: &Config, entries: &[(&str, &str)], rpu: u32, unit: Unit, name: &str) {
    assert_eq!(
        limit_of(config, entries),
        Some((rpu, Some(unit), name.to_owned())),
        "{entries:?}"
    );
}

#[test]
fn basic_config() {
    let c = load("basic_config.yaml");
    assert!(c.lookup("foo_domain", [("key1", "value1")]).is_none());
    assert!(c.lookup(DOMAIN, []).is_none());
    for none in [
        &[("key1", "something")][..],
        &[("key1", "value1")],
        &[("key2", "value2"), ("subkey", "subvalue")],
        &[("key5", "value5"), ("subkey5", "subvalue")],
        &[("key2", "value3")],
    ] {
        assert_eq!(limit_of(&c, none), None, "{none:?}");
    }
    let s = Unit::Second;
    expect(
        &c,
        &[("key1", "value1"), ("subkey1", "something")],
        5,
        s,
        "test-domain.key1_value1.subkey1",
    );
    expect(
        &c,
        &[("key1", "value1"), ("subkey1", "subvalue1")],
        10,
        s,
        "test-domain.key1_value1.subkey1_subvalue1",
    );
    expect(
        &c,
        &[("key2", "something")],
        20,
        Unit::Minute,
        "test-domain.key2",
    );
    expect(
        &c,
        &[("key2", "value2")],
        30,
        Unit::Minute,
        "test-domain.key2_value2",
    );
    expect(&c, &[("key3", "foo")], 1, Unit::Hour, "test-domain.key3");
    assert_eq!(c.lookup(DOMAIN, [("key3", "foo")]).unwrap().rule.name, None);
    expect(&c, &[("key4", "foo")], 1, Unit::Day, "test-domain.key4");
    assert_eq!(
        c.lookup(DOMAIN, [("key4", "foo")])
            .unwrap()
            .rule
            .name
            .as_deref(),
        Some("key4_rate_limit")
    );
    assert_eq!(limit_of(&c, &[("key6", "foo")]).map(|l| l.1), Some(None));
    // detailed_metric: the request's value is in the name.
    expect(
        &c,
        &[("key7", "unspecified_value")],
        70,
        Unit::Minute,
        "test-domain.key7_unspecified_value",
    );
    expect(
        &c,
        &[("key7", "another_value")],
        70,
        Unit::Minute,
        "test-domain.key7_another_value",
    );
}

#[test]
fn files_envoyproxy_refuses_are_refused_naming_the_file() {
    for (name, expected) in [
        ("empty_domain.yaml", "domain"),
        ("empty_key.yaml", "key"),
        ("duplicate_key.yaml", "duplicate descriptor"),
        ("bad_limit_unit.yaml", "unknown unit \"foo\""),
        ("replaces_self.yaml", "own name"),
        ("replaces_empty.yaml", "name"),
        ("bad_yaml.yaml", "bad_yaml.yaml"),
        ("misspelled_key.yaml", "unknown field `ratelimit`"),
        ("misspelled_key2.yaml", "unknown field `requestsperunit`"),
        ("non_string_key.yaml", "non_string_key.yaml"),
        ("non_map_list.yaml", "descriptors[0]"),
        ("unlimited_with_unit.yaml", "unlimited"),
    ] {
        let error = refused(name);
        assert_eq!(
            error.file(),
            Some(fixture(name).as_path()),
            "{name}: {error}"
        );
        let text = error.to_string();
        assert!(text.contains(expected), "{name}: {text}");
    }
}

#[test]
fn a_domain_in_two_files_is_refused() {
    let sources = |a: &str, b: &str| {
        distlimit_server::config::read_sources(&fixture(a))
            .unwrap()
            .into_iter()
            .chain(distlimit_server::config::read_sources(&fixture(b)).unwrap())
            .collect::<Vec<_>>()
    };
    for (a, b) in [
        ("basic_config.yaml", "duplicate_domain.yaml"),
        ("merge_domain_key1.yaml", "merge_domain_key1.yaml"),
        // envoyproxy merges these two under MERGE_DOMAIN_CONFIG=true (a deliberate difference:
        // one domain, one file).
        ("merge_domain_key1.yaml", "merge_domain_key2.yaml"),
    ] {
        let error = Config::from_sources(&sources(a, b)).unwrap_err();
        assert!(
            matches!(error, RateLimitConfigError::DuplicateDomain { .. }),
            "{a} + {b}: {error}"
        );
    }
    // Each alone loads (duplicate_domain.yaml's `descriptors:` is empty).
    for name in [
        "duplicate_domain.yaml",
        "merge_domain_key1.yaml",
        "merge_domain_key2.yaml",
    ] {
        assert!(load(name).has_domain(DOMAIN));
    }
}

#[test]
fn shadow_mode() {
    let c = load("shadowmode_config.yaml");
    let shadow = |entries: &[(&str, &str)]| {
        c.lookup(DOMAIN, entries.iter().copied())
            .unwrap()
            .rule
            .shadow_mode
    };
    expect(
        &c,
        &[("key1", "value1"), ("subkey1", "something")],
        5,
        Unit::Second,
        "test-domain.key1_value1.subkey1",
    );
    assert!(!shadow(&[("key1", "value1"), ("subkey1", "something")]));
    expect(
        &c,
        &[("key1", "value1"), ("subkey1", "subvalue1")],
        10,
        Unit::Second,
        "test-domain.key1_value1.subkey1_subvalue1",
    );
    assert!(shadow(&[("key1", "value1"), ("subkey1", "subvalue1")]));
    expect(
        &c,
        &[("key2", "something")],
        20,
        Unit::Minute,
        "test-domain.key2",
    );
    assert!(shadow(&[("key2", "something")]));
    expect(
        &c,
        &[("key2", "value2")],
        30,
        Unit::Minute,
        "test-domain.key2_value2",
    );
    assert!(!shadow(&[("key2", "value2")]));
}

#[test]
fn wildcards() {
    let c = load("wildcard.yaml");
    let m = Unit::Minute;
    expect(&c, &[("noVal", "foo1")], 20, m, "test-domain.noVal");
    expect(&c, &[("noVal", "foo2")], 20, m, "test-domain.noVal");
    expect(&c, &[("wild", "foo1")], 20, m, "test-domain.wild_foo*");
    expect(&c, &[("wild", "foo2")], 20, m, "test-domain.wild_foo*");
    expect(
        &c,
        &[("nestedWild", "val1"), ("wild", "goo2")],
        20,
        m,
        "test-domain.nestedWild_val1.wild_goo*",
    );
    for value in ["barab", "bar123b", "barb"] {
        expect(
            &c,
            &[("midWild", value)],
            20,
            m,
            "test-domain.midWild_bar*b",
        );
    }
    for value in ["foo123bar456baz", "foobarbaz"] {
        expect(
            &c,
            &[("multiWild", value)],
            10,
            m,
            "test-domain.multiWild_foo*bar*baz",
        );
    }
    for none in [
        ("wild", "bar"),
        ("noWild", "foo1"),
        ("midWild", "bara"),
        ("midWild", "xbarb"),
        ("multiWild", "foo123baz"),
        ("multiWild", "bar456baz"),
    ] {
        assert_eq!(limit_of(&c, &[none]), None, "{none:?}");
    }
}

/// The counter entries of `entries`: their values, the pattern where the limit is shared.
fn counter(c: &Config, entries: &[(&str, &str)]) -> Vec<String> {
    let m = c.lookup(DOMAIN, entries.iter().copied()).unwrap();
    m.counter_entries(entries)
        .iter()
        .map(|(_, v)| (*v).to_owned())
        .collect()
}

#[test]
fn share_threshold() {
    let c = load("share_threshold.yaml");
    let m = Unit::Minute;
    for value in ["files/a.pdf", "files/b.csv", "files/c.txt"] {
        expect(&c, &[("files", value)], 100, m, "test-domain.files_files/*");
        assert_eq!(counter(&c, &[("files", value)]), ["files/*"]);
    }
    // (entries, limit, name, counter values): share_threshold wins over value_to_metric and
    // detailed_metric in names; a shared wildcard at any level keys the counter by its pattern.
    type Case<'a> = (&'a [(&'a str, &'a str)], u32, &'a str, &'a [&'a str]);
    let cases: [Case<'_>; 6] = [
        (
            &[("route", "api/v1"), ("method", "GET")],
            60,
            "test-domain.route_api/*.method",
            &["api/*", "GET"],
        ),
        (
            &[("service", "svc/users"), ("endpoint", "get")],
            80,
            "test-domain.service_svc/*.endpoint_get",
            &["svc/*", "get"],
        ),
        (
            &[("nested", "parent"), ("files", "nested/file1.txt")],
            200,
            "test-domain.nested_parent.files_nested/*",
            &["parent", "nested/*"],
        ),
        (
            &[("files", "top/a"), ("files", "nested/b")],
            300,
            "test-domain.files_top/*.files_nested/*",
            &["top/*", "nested/*"],
        ),
        (
            &[("path", "path/a"), ("file", "file/b"), ("type", "pdf")],
            120,
            "test-domain.path_path/*.file_file/*.type",
            &["path/*", "file/b", "pdf"],
        ),
        (
            &[
                ("user", "user/1"),
                ("resource", "res/2"),
                ("action", "read"),
            ],
            150,
            "test-domain.user_user/*.resource_res/*.action",
            &["user/*", "res/*", "read"],
        ),
    ];
    for (entries, rpu, name, values) in cases {
        expect(&c, entries, rpu, m, name);
        assert_eq!(counter(&c, entries), values);
    }
    // An exact value comes before the shared wildcard.
    expect(&c, &[("file", "test1")], 50, m, "test-domain.file_test1");
    assert_eq!(counter(&c, &[("file", "test1")]), ["test1"]);
    for value in ["test2", "test123", "testABC"] {
        expect(&c, &[("file", value)], 100, m, "test-domain.file_test*");
        assert_eq!(counter(&c, &[("file", value)]), ["test*"]);
    }
    // Middle and multiple wildcards: (key, values that match, limit, name, a value that does not).
    for (key, values, rpu, name, other) in [
        (
            "midpath",
            &["/api/v1", "/api/users/v1", "/apiv1"][..],
            100,
            "test-domain.midpath_/api*v1",
            "/api/v2",
        ),
        (
            "multiroute",
            &["svcAepBrpc", "svc-users-ep-get-rpc"],
            50,
            "test-domain.multiroute_svc*ep*rpc",
            "svcABCrpc",
        ),
        (
            "midroute",
            &["/api/v2", "/api-beta-v2"],
            80,
            "test-domain.midroute_/api*v2",
            "/api/v1",
        ),
    ] {
        for value in values {
            expect(&c, &[(key, value)], rpu, m, name);
        }
        assert_eq!(limit_of(&c, &[(key, other)]), None);
    }
    let tenant = [("tenant", "t-acme-prod"), ("resource", "res-x-v2")];
    expect(
        &c,
        &tenant,
        60,
        m,
        "test-domain.tenant_t*prod.resource_res*v2",
    );
    assert_eq!(counter(&c, &tenant), ["t*prod", "res*v2"]);
}

#[test]
fn metadata_is_accepted() {
    let c = load("metadata.yaml");
    assert!(c.lookup(DOMAIN, []).is_none());
    expect(
        &c,
        &[("key1", "value1"), ("subkey1", "something")],
        5,
        Unit::Second,
        "test-domain.key1_value1.subkey1",
    );
    expect(
        &c,
        &[("key2", "something")],
        20,
        Unit::Minute,
        "test-domain.key2",
    );
}

#[test]
fn envoyproxys_integration_config_directory_loads() {
    let c = load("integration");
    for domain in ["another", "basic", "share-threshold-test"] {
        assert!(c.has_domain(domain), "{domain}");
    }
}

/// The statistics name of `entries` in the one domain of `yaml`.
fn stat(yaml: &str, entries: &[(&str, &str)]) -> String {
    let c = Config::from_yaml("inline.yaml", yaml).unwrap_or_else(|e| panic!("{e}"));
    let domain = c.domains().next().unwrap().to_owned();
    let m = c
        .lookup(&domain, entries.iter().copied())
        .unwrap_or_else(|| panic!("{entries:?} matched nothing in\n{yaml}"));
    format!("{domain}.{}", m.metric_path(entries))
}

/// `TestValueToMetric_*` and `TestWildcardStatsBehavior`: their inline configurations as YAML.
#[test]
fn value_to_metric_names() {
    let chain = "
domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: { unit: minute, requests_per_unit: 60 }
";
    let run = [
        ("route", "draw"),
        ("http_method", "GET"),
        ("subject_id", "123"),
    ];
    assert_eq!(
        stat(chain, &run),
        "domain.route_draw.http_method_GET.subject_id"
    );
    for (entries, expected) in [
        (
            [("route", ""), ("http_method", "GET"), ("subject_id", "123")],
            "domain.route.http_method_GET.subject_id",
        ),
        (
            [
                ("route", "draw"),
                ("http_method", ""),
                ("subject_id", "123"),
            ],
            "domain.route_draw.http_method.subject_id",
        ),
        (
            [("route", ""), ("http_method", ""), ("subject_id", "123")],
            "domain.route.http_method.subject_id",
        ),
    ] {
        assert_eq!(stat(chain, &entries), expected);
    }
    // detailed_metric at the leaf wins over value_to_metric.
    let detailed = chain.replace(
        "          - key: subject_id\n",
        "          - key: subject_id\n            detailed_metric: true\n",
    );
    assert_eq!(
        stat(&detailed, &run),
        "domain.route_draw.http_method_GET.subject_id_123"
    );

    let two = |flag_1: &str, flag_2: &str| {
        format!(
            "
domain: d
descriptors:
  - key: k1
    {flag_1}
    descriptors:
      - key: k2
        {flag_2}
        descriptors:
          - key: k3
            rate_limit: {{ unit: second, requests_per_unit: 1 }}
"
        )
    };
    let xyz = [("k1", "X"), ("k2", "Y"), ("k3", "Z")];
    assert_eq!(
        stat(&two("value_to_metric: true", ""), &xyz),
        "d.k1_X.k2.k3"
    );
    assert_eq!(
        stat(&two("", "value_to_metric: true"), &xyz),
        "d.k1.k2_Y.k3"
    );
    assert_eq!(stat(&two("", ""), &xyz), "d.k1.k2.k3");

    let configured = "
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: { unit: minute, requests_per_unit: 60 }
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: { unit: minute, requests_per_unit: 30 }
";
    for method in ["GET", "POST"] {
        assert_eq!(
            stat(
                configured,
                &[
                    ("route", "api"),
                    ("http_method", method),
                    ("subject_id", "u")
                ]
            ),
            format!("test-domain.route_api.http_method_{method}.subject_id")
        );
    }
    let wildcard = "
domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: { unit: minute, requests_per_unit: 100 }
";
    assert_eq!(
        stat(
            wildcard,
            &[
                ("user", "alice"),
                ("action", "readfile"),
                ("resource", "documents")
            ]
        ),
        "domain.user_alice.action_readfile.resource"
    );

    let wild = |value: &str, flags: &str| {
        format!(
            "domain: test-domain\ndescriptors:\n  - key: wild\n    value: '{value}'\n{flags}    rate_limit: {{ unit: minute, requests_per_unit: 20 }}\n"
        )
    };
    let foo1 = [("wild", "foo1")];
    assert_eq!(stat(&wild("foo*", ""), &foo1), "test-domain.wild_foo*");
    assert_eq!(
        stat(&wild("foo*", "    value_to_metric: true\n"), &foo1),
        "test-domain.wild_foo1"
    );
    assert_eq!(
        stat(&wild("foo*", "    share_threshold: true\n"), &foo1),
        "test-domain.wild_foo*"
    );
    assert_eq!(
        stat(
            &wild(
                "foo*",
                "    share_threshold: true\n    value_to_metric: true\n"
            ),
            &foo1
        ),
        "test-domain.wild_foo*"
    );
    for value in ["foo123bar456", "fooXbarY"] {
        assert_eq!(
            stat(&wild("foo*bar*", ""), &[("wild", value)]),
            "test-domain.wild_foo*bar*"
        );
    }
    assert_eq!(
        stat(
            &wild("foo*bar*", "    value_to_metric: true\n"),
            &[("wild", "foo123bar456")]
        ),
        "test-domain.wild_foo123bar456"
    );
    let other = "
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: { unit: minute, requests_per_unit: 20 }
";
    assert_eq!(
        stat(other, &[("wild", "foo1"), ("other", "bar"), ("limit", "X")]),
        "test-domain.wild_foo*.other_bar.limit"
    );
}

/// `TestDetailedMetric`: its inline configurations as YAML.
#[test]
fn detailed_metric_names() {
    let nested = |detailed_1: bool, detailed_2: bool| {
        format!(
            "
domain: nested
descriptors:
  - key: key-1
    detailed_metric: {detailed_1}
    rate_limit: {{ unit: minute, requests_per_unit: 100 }}
    descriptors:
      - key: key-2
        detailed_metric: {detailed_2}
        rate_limit: {{ unit: minute, requests_per_unit: 5 }}
"
        )
    };
    let top = [("key-1", "value-1")];
    let both = [("key-1", "value-1"), ("key-2", "value-2")];
    assert_eq!(stat(&nested(true, false), &top), "nested.key-1_value-1");
    assert_eq!(stat(&nested(false, false), &top), "nested.key-1");
    assert_eq!(
        stat(&nested(true, true), &both),
        "nested.key-1_value-1.key-2_value-2"
    );
    assert_eq!(stat(&nested(false, false), &both), "nested.key-1.key-2");

    let realistic = "
domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 500 }
  - key: key_1
    value: some-value-for-key-1
    rate_limit: { unit: minute, requests_per_unit: 500 }
  - key: key_2
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 5000 }
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 50000 }
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: { unit: minute, requests_per_unit: 100 }
";
    assert_eq!(
        stat(realistic, &[("key_1", "value-for-key-1")]),
        "nested.key_1_value-for-key-1"
    );
    assert_eq!(
        stat(realistic, &[("key_2", "key-2-value")]),
        "nested.key_2_key-2-value"
    );
    assert_eq!(
        stat(
            realistic,
            &[("key_2", "key-2-value"), ("key_3", "requested-key3-value")]
        ),
        "nested.key_2_key-2-value.key_3_requested-key3-value"
    );
}

/// The fixtures served by the binary over gRPC answer as envoyproxy/ratelimit's service does:
/// the limit each descriptor lands on, OK without a limit where none applies, unlimited with
/// the largest remaining count, and the first over-limit request denied.
#[tokio::test]
async fn fixtures_served_over_grpc() {
    use support::*;
    let dir = tempfile::tempdir().unwrap();
    for name in ["basic_config.yaml", "share_threshold.yaml"] {
        let yaml = std::fs::read_to_string(fixture(name)).unwrap();
        // One domain per file: the second fixture is served under its own domain.
        let yaml = yaml.replacen("domain: test-domain", &format!("domain: {name}"), 1);
        std::fs::write(dir.path().join(name), yaml).unwrap();
    }
    let server = support::binary::Binary::with_config(dir.path(), &[]);
    let mut client = server.client().await;
    let basic = "basic_config.yaml";
    let one = |entries: &[(&str, &str)]| request(basic, vec![descriptor(entries)]);

    let answer = call(&mut client, one(&[("key1", "value1"), ("subkey1", "x")])).await;
    assert_eq!(answer.overall_code, OK);
    let limit = answer.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (5, 1)); // SECOND
    for entries in [
        &[("key2", "value3")][..],
        &[("key1", "value1")],
        &[("nope", "x")],
    ] {
        let answer = call(&mut client, one(entries)).await;
        assert_eq!(answer.overall_code, OK, "{entries:?}");
        assert_eq!(answer.statuses[0].current_limit, None, "{entries:?}");
    }
    let unlimited = call(&mut client, one(&[("key6", "x")])).await;
    assert_eq!(unlimited.statuses[0].limit_remaining, u32::MAX);
    // key3: one an hour (both requests in one window).
    align(3_600, std::time::Duration::from_secs(1)).await;
    assert_eq!(
        call(&mut client, one(&[("key3", "a")])).await.overall_code,
        OK
    );
    let denied = call(&mut client, one(&[("key3", "a")])).await;
    assert_eq!(denied.overall_code, OVER_LIMIT);
    assert_eq!(
        call(&mut client, one(&[("key3", "b")])).await.overall_code,
        OK
    );
    // The share_threshold fixture is served too (its counters are shared once the decision
    // applies `Match::counter_entries`).
    let shared = call(
        &mut client,
        request(
            "share_threshold.yaml",
            vec![descriptor(&[("files", "files/a")])],
        ),
    )
    .await;
    let limit = shared.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(limit.requests_per_unit, 100);
}
