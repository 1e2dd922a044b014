//! envoyproxy/ratelimit's own configuration tests, translated: its `test/config/*.yaml`
//! fixtures (copied unchanged into `tests/compat/`, see `tests/compat/NOTICE`) must load or be
//! refused as its `config_test.go` expects, and each descriptor it looks up must land on the
//! same limit, under the same statistics name (`domain.` + [`Match::metric_path`]).
//! Deliberate differences are listed in the crate README ("Compatibility").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

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
    // share_threshold wins over value_to_metric and detailed_metric in names.
    let route = [("route", "api/v1"), ("method", "GET")];
    expect(&c, &route, 60, m, "test-domain.route_api/*.method");
    assert_eq!(counter(&c, &route), ["api/*", "GET"]);
    let service = [("service", "svc/users"), ("endpoint", "get")];
    expect(
        &c,
        &service,
        80,
        m,
        "test-domain.service_svc/*.endpoint_get",
    );
    assert_eq!(counter(&c, &service), ["svc/*", "get"]);
    let nested = [("nested", "parent"), ("files", "nested/file1.txt")];
    expect(
        &c,
        &nested,
        200,
        m,
        "test-domain.nested_parent.files_nested/*",
    );
    assert_eq!(counter(&c, &nested), ["parent", "nested/*"]);
    let both = [("files", "top/a"), ("files", "nested/b")];
    expect(&c, &both, 300, m, "test-domain.files_top/*.files_nested/*");
    assert_eq!(counter(&c, &both), ["top/*", "nested/*"]);
    let mixed = [("path", "path/a"), ("file", "file/b"), ("type", "pdf")];
    expect(
        &c,
        &mixed,
        120,
        m,
        "test-domain.path_path/*.file_file/*.type",
    );
    assert_eq!(counter(&c, &mixed), ["path/*", "file/b", "pdf"]);
    let two = [
        ("user", "user/1"),
        ("resource", "res/2"),
        ("action", "read"),
    ];
    expect(
        &c,
        &two,
        150,
        m,
        "test-domain.user_user/*.resource_res/*.action",
    );
    assert_eq!(counter(&c, &two), ["user/*", "res/*", "read"]);
    // An exact value comes before the shared wildcard.
    expect(&c, &[("file", "test1")], 50, m, "test-domain.file_test1");
    assert_eq!(counter(&c, &[("file", "test1")]), ["test1"]);
    for value in ["test2", "test123", "testABC"] {
        expect(&c, &[("file", value)], 100, m, "test-domain.file_test*");
        assert_eq!(counter(&c, &[("file", value)]), ["test*"]);
    }
    for value in ["/api/v1", "/api/users/v1", "/apiv1"] {
        expect(
            &c,
            &[("midpath", value)],
            100,
            m,
            "test-domain.midpath_/api*v1",
        );
    }
    assert_eq!(limit_of(&c, &[("midpath", "/api/v2")]), None);
    for value in ["svcAepBrpc", "svc-users-ep-get-rpc"] {
        expect(
            &c,
            &[("multiroute", value)],
            50,
            m,
            "test-domain.multiroute_svc*ep*rpc",
        );
    }
    assert_eq!(limit_of(&c, &[("multiroute", "svcABCrpc")]), None);
    for value in ["/api/v2", "/api-beta-v2"] {
        expect(
            &c,
            &[("midroute", value)],
            80,
            m,
            "test-domain.midroute_/api*v2",
        );
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
