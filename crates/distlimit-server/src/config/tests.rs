//! The matcher against the configuration examples of envoyproxy/ratelimit's README.

use super::*;

fn limit(rpu: u32, unit: Unit) -> RuleLimit {
    RuleLimit::PerUnit {
        requests_per_unit: rpu,
        unit,
    }
}

/// The limit and path `entries` land on.
fn find(config: &Config, domain: &str, entries: &[(&str, &str)]) -> Option<(RuleLimit, String)> {
    config
        .lookup(domain, entries.iter().copied())
        .map(|m| (m.rule.limit, m.path.to_owned()))
}

/// What [`find`] answers for a rule of `rpu` per `unit` at `path`.
fn rule(rpu: u32, unit: Unit, path: &str) -> Option<(RuleLimit, String)> {
    Some((limit(rpu, unit), path.to_owned()))
}

fn parse(yaml: &str) -> Config {
    Config::from_yaml("test.yaml", yaml).unwrap_or_else(|error| panic!("{error}"))
}

const EXAMPLE_1: &str = "
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
";

#[test]
fn example_1_exact_values() {
    let config = parse(EXAMPLE_1);
    let at = |domain, value| find(&config, domain, &[("database", value)]);
    for value in ["users", "default"] {
        let path = format!("database_{value}");
        assert_eq!(at("mongo_cps", value), rule(500, Unit::Second, &path));
    }
    assert_eq!(at("mongo_cps", "other"), None);
    assert_eq!(at("other_domain", "users"), None);
}

pub(crate) const EXAMPLE_2: &str = "
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

#[test]
fn example_2_nested_descriptors() {
    let config = parse(EXAMPLE_2);
    let at = |entries: &[(&str, &str)]| find(&config, "messaging", entries);
    let (marketing, to) = (("message_type", "marketing"), ("to_number", "2061111111"));
    let nested = "message_type_marketing.to_number";
    assert_eq!(at(&[marketing, to]), rule(5, Unit::Day, nested));
    assert_eq!(at(&[to]), rule(100, Unit::Day, "to_number"));
    // The placeholder level has no limit of its own.
    assert_eq!(at(&[marketing]), None);
    // Another message type matches no rule.
    assert_eq!(at(&[("message_type", "transactional"), to]), None);
}

#[test]
fn example_3_exact_value_before_key_alone() {
    let config = parse(
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
    let at = |value| find(&config, "edge_proxy_per_ip", &[("remote_address", value)]);
    assert_eq!(at("50.0.0.1"), rule(10, Unit::Second, "remote_address"));
    let blocked = "remote_address_50.0.0.5";
    assert_eq!(at("50.0.0.5"), rule(0, Unit::Second, blocked));
}

#[test]
fn example_4_a_limit_applies_only_at_the_last_entry() {
    let shallow = parse(
        "
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
",
    );
    let request = [("key", "value"), ("subkey", "subvalue")];
    assert_eq!(find(&shallow, "example4", &request), None);
    let nested = parse(
        "
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
",
    );
    let at = |entries: &[(&str, &str)]| find(&nested, "example4", entries);
    assert_eq!(at(&request), rule(300, Unit::Second, "key_value.subkey"));
    // One entry short of the configured depth: no limit.
    assert_eq!(at(&[("key", "value")]), None);
}

#[test]
fn example_5_unlimited() {
    let config = parse(
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
    let at = |key| find(&config, "internal", &[(key, "x")]);
    assert_eq!(at("ldap"), Some((RuleLimit::Unlimited, "ldap".into())));
    assert_eq!(at("azure"), rule(100, Unit::Minute, "azure"));
}

pub(crate) const EXAMPLE_6: &str = "
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

#[test]
fn example_6_shadow_mode() {
    let config = parse(EXAMPLE_6);
    let user = |user| config.lookup("example6", [("service", "auth-service"), ("user", user)]);
    let (a, b) = (user("user-a"), user("user-b"));
    assert!(a.is_some_and(|m| m.rule.shadow_mode && m.rule.limit == limit(10, Unit::Second)));
    assert!(b.is_some_and(|m| !m.rule.shadow_mode && m.rule.limit == limit(20, Unit::Second)));
}

pub(crate) const EXAMPLE_7: &str = "
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

#[test]
fn example_7_names_and_replaces_are_read() {
    let config = parse(EXAMPLE_7);
    let first = config.lookup("example7", [("key_1", "value_1"), ("user", "bkthomps")]);
    let second = config.lookup("example7", [("key_2", "value_2"), ("user", "bkthomps")]);
    assert!(first.is_some_and(|m| m.rule.name.as_deref() == Some("specific_limit")));
    assert!(second.is_some_and(|m| m.rule.replaces == ["specific_limit"]));
}

#[test]
fn example_8_detailed_metric() {
    let config = parse(
        "
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
    );
    let other = config.lookup("example8", [("key1", "unspecified_value")]);
    assert!(other.is_some_and(|m| m.detailed_metric && m.rule.limit == limit(10, Unit::Minute)));
    let exact = config.lookup("example8", [("key1", "value1")]);
    assert!(exact.is_some_and(|m| !m.detailed_metric && m.rule.limit == limit(20, Unit::Minute)));
}

pub(crate) const EXAMPLE_9: &str = "
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
";

#[test]
fn example_9_wildcards() {
    let config = parse(EXAMPLE_9);
    let at = |value| find(&config, "example9", &[("key1", value)]);
    for value in ["value_1", "value_2", "value"] {
        assert_eq!(at(value), rule(20, Unit::Minute, "key1_value*"), "{value}");
    }
    assert_eq!(at("other"), None);
}

#[test]
fn wildcards_match_in_file_order_between_exact_and_key_alone() {
    let config = parse(
        "
domain: d
descriptors:
  - key: path
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: path
    value: /api/*/orders
    rate_limit: { unit: second, requests_per_unit: 2 }
  - key: path
    value: /api/*
    rate_limit: { unit: second, requests_per_unit: 3 }
  - key: path
    value: /api/v1/orders
    rate_limit: { unit: second, requests_per_unit: 4 }
",
    );
    for (value, rpu) in [
        ("/api/v1/orders", 4),
        ("/api/v2/orders", 2),
        ("/api/v2/users", 3),
        ("/health", 1),
    ] {
        let found = config.lookup("d", [("path", value)]).map(|m| m.rule.limit);
        assert_eq!(found, Some(limit(rpu, Unit::Second)), "{value}");
    }
}

#[test]
fn wildcard_patterns() {
    assert!(wildcard_match("a*", "a"));
    assert!(wildcard_match("a*", "abc"));
    assert!(wildcard_match("*c", "abc"));
    assert!(wildcard_match("a*c", "abbbc"));
    assert!(wildcard_match("a*b*c", "a-b-c"));
    assert!(wildcard_match("*", ""));
    assert!(wildcard_match("abc", "abc"));
    assert!(!wildcard_match("abc", "abcd"));
    assert!(!wildcard_match("a*c", "ab"));
    assert!(!wildcard_match("a*bc", "abc-"));
    assert!(!wildcard_match("ab*ba", "aba"));
}

#[test]
fn a_descriptor_without_limit_or_children_passes() {
    let config = parse("domain: d\ndescriptors:\n  - key: k\n");
    assert_eq!(find(&config, "d", &[("k", "v")]), None);
    assert_eq!(find(&config, "d", &[]), None);
}

/// The error of an invalid file.
fn error(yaml: &str) -> RateLimitConfigError {
    let refused = Config::from_yaml("bad.yaml", yaml).err();
    refused.unwrap_or_else(|| panic!("accepted:\n{yaml}"))
}

#[test]
fn errors_name_file_line_and_field() {
    let head = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n";
    // (the rest of the file, the line at fault, parts of the message)
    for (rest, line, parts) in [
        (
            "      unit: secnd\n      requests_per_unit: 5\n",
            5,
            &["descriptors[0].rate_limit", "unknown unit \"secnd\""][..],
        ),
        (
            "      unit: second\n      requests_per_unit: 5\n      burst: 3\n",
            7,
            &["unknown field `burst`"],
        ),
    ] {
        let e = error(&format!("{head}{rest}"));
        let text = e.to_string();
        assert!(text.starts_with(&format!("bad.yaml:{line}:")), "{text}");
        assert_eq!(e.line(), Some(line), "{text}");
        for part in parts {
            assert!(text.contains(part), "{text}");
        }
    }
}

#[test]
fn invalid_files_are_refused() {
    let cases = [
        ("descriptors: []\n", "domain"),
        ("domain: ''\n", "domain"),
        ("domain: d\ndescriptors:\n  - value: v\n", "key"),
        (
            "domain: d\ndescriptors:\n  - key: ''\n",
            "must not be empty",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { requests_per_unit: 5 }\n",
            "unit is required",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true, unit: second }\n",
            "unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: -1 }\n",
            "requests_per_unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
            "duplicate descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1, name: a, replaces: [{ name: a }] }\n",
            "own name",
        ),
        ("domain: [1, 2]\n", "domain"),
        (
            "domain: d\ndescriptors:\n  - key: k\n    metadata: [a, b]\n",
            "metadata",
        ),
        ("{{{", "bad.yaml"),
    ];
    for (yaml, expected) in cases {
        let text = error(yaml).to_string();
        assert!(text.starts_with("bad.yaml:"), "{yaml}: {text}");
        assert!(text.contains(expected), "{yaml}: {text}");
    }
}

#[test]
fn two_files_of_one_domain_are_refused() {
    let source = |name: &str| Source {
        path: PathBuf::from(name),
        contents: EXAMPLE_9.to_owned(),
    };
    let e = Config::from_sources(&[source("a.yaml"), source("b.yaml")]).unwrap_err();
    assert!(matches!(e, RateLimitConfigError::DuplicateDomain { .. }));
}

#[test]
fn units_read_in_any_case() {
    for unit in Unit::ALL {
        assert_eq!(Unit::from_name(&unit.name().to_uppercase()), Some(unit));
    }
    assert_eq!(Unit::Week.seconds(), 604_800);
    assert_eq!(Unit::from_name("fortnight"), None);
}

#[test]
fn files_past_the_size_cap_or_not_utf8_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let huge = vec![b'#'; usize::try_from(MAX_CONFIG_FILE_BYTES).unwrap() + 1];
    for (name, bytes, why) in [
        ("huge.yaml", huge, "larger than"),
        ("binary.yaml", vec![0xff, 0xfe, 0x00], "UTF-8"),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let error = read_sources(&path).unwrap_err().to_string();
        assert!(error.contains(name) && error.contains(why), "{error}");
    }
    // A device that never ends is an error, not a reload that never returns.
    #[cfg(unix)]
    {
        let error = read_sources(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("larger than"), "{error}");
    }
}

#[cfg(unix)]
#[test]
fn a_dangling_link_or_a_directory_entry_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("..data");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("a.yaml"), EXAMPLE_2).unwrap();
    std::os::unix::fs::symlink("..data/a.yaml", dir.path().join("a.yaml")).unwrap();
    assert_eq!(read_sources(dir.path()).unwrap().len(), 1);

    std::fs::remove_file(target.join("a.yaml")).unwrap();
    let error = read_sources(dir.path()).unwrap_err();
    assert_eq!(error.file(), Some(dir.path().join("a.yaml").as_path()));
    let text = error.to_string();
    assert!(text.contains("symbolic link to a missing file"), "{text}");

    std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
    std::fs::create_dir(dir.path().join("b.yaml")).unwrap();
    let text = read_sources(dir.path()).unwrap_err().to_string();
    assert!(
        text.contains("b.yaml") && text.contains("not a regular file"),
        "{text}"
    );
}

/// `n` descriptors at one level, each with a limit.
fn flat(n: usize) -> String {
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  - key: k\n    value: v{i}\n    rate_limit: {{ unit: second, requests_per_unit: {i} }}\n"
        ));
    }
    yaml
}

#[test]
fn one_hundred_thousand_descriptors_at_one_level_load() {
    // Was quadratic (a duplicate check comparing each descriptor with all before it): 40 000
    // took 16 s. The bench `config_load` shows the time per descriptor staying flat.
    let n = 100_000;
    let config = parse(&flat(n));
    for i in [0, n / 2, n - 1] {
        let value = format!("v{i}");
        assert_eq!(
            find(&config, "d", &[("k", &value)]).map(|(l, _)| l),
            Some(limit(u32::try_from(i).unwrap(), Unit::Second))
        );
    }
    let mut duplicated = flat(3);
    duplicated.push_str("  - key: k\n    value: v1\n");
    assert!(
        error(&duplicated)
            .to_string()
            .contains("[3]: duplicate descriptor (key \"k\", value \"v1\"), also at [1]")
    );
}

#[test]
fn deep_nesting_is_refused_at_its_line() {
    // 200 KB of `[` took 56 s to be refused: now the scan stops at the first one too deep.
    let yaml = format!(
        "domain: d\ndescriptors:\n  {}\n",
        "[".repeat(100_000) + &"]".repeat(100_000)
    );
    let e = error(&yaml);
    assert_eq!(e.line(), Some(3), "{e}");
    assert!(e.to_string().contains("nested deeper than"), "{e}");
    // Block nesting is bounded by the deserializer, with its line.
    let mut block = String::from("domain: d\ndescriptors:\n");
    for depth in 0..200 {
        let pad = "  ".repeat(2 * depth);
        block.push_str(&format!("{pad}- key: k\n{pad}  descriptors:\n"));
    }
    let e = error(&block);
    assert!(e.line().is_some(), "{e}");
    // Flow style as deep as a request can go still loads.
    let mut flow = String::from("domain: d\ndescriptors: ");
    for _ in 0..crate::check::MAX_ENTRIES - 1 {
        flow.push_str("[{key: k, descriptors: ");
    }
    flow.push_str("[{key: k, rate_limit: {unit: second, requests_per_unit: 3}}]");
    flow.push_str(&"}]".repeat(crate::check::MAX_ENTRIES - 1));
    let config = parse(&flow);
    let entries = vec![("k", "v"); crate::check::MAX_ENTRIES];
    assert_eq!(
        find(&config, "d", &entries).map(|(l, _)| l),
        Some(limit(3, Unit::Second))
    );
}

#[test]
fn envoyproxy_fields_bom_merge_keys_and_empty_lists_are_read() {
    let config = parse(
        "\u{feff}domain: d
descriptors:
  - key: a
    quota_mode: true
    metadata: { owner: { team: [x, y] }, 1: 2, i: -3, f: 1.5, n: .nan }
    rate_limit: &defaults
      unit: minute
      requests_per_unit: 7
  - key: b
    rate_limit:
      <<: *defaults
      requests_per_unit: 9
    descriptors:
  - key: c
    rate_limit: { unlimited: true, requests_per_unit: 10 }
",
    );
    let a = config.lookup("d", [("a", "1")]).unwrap();
    assert_eq!(a.rule.limit, limit(7, Unit::Minute));
    assert!(a.rule.quota_mode);
    let metadata = serde_json::Value::Object((**a.rule.metadata.as_ref().unwrap()).clone());
    assert_eq!(
        metadata,
        serde_json::json!({ "owner": { "team": ["x", "y"] }, "1": 2, "i": -3, "f": 1.5, "n": null })
    );
    let b = config.lookup("d", [("b", "1")]).unwrap();
    assert_eq!(b.rule.metadata, None);
    assert_eq!(b.rule.limit, limit(9, Unit::Minute));
    assert!(!b.rule.quota_mode);
    assert_eq!(
        config.lookup("d", [("c", "1")]).unwrap().rule.limit,
        RuleLimit::Unlimited
    );
    // A BOM before nested descriptors (libyaml alone calls it several documents).
    let with_bom = format!("\u{feff}{EXAMPLE_2}");
    assert!(Config::from_yaml("bom.yaml", with_bom.trim_start_matches('\n')).is_ok());
    // `defaults` is not a field of the file: merge keys do not make unknown fields pass.
    assert!(
        error("domain: d\nx: &x { unit: second }\ndescriptors: []\n")
            .to_string()
            .contains("unknown field `x`")
    );
}

const SHARED: &str = "
domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        value_to_metric: true
        rate_limit: { unit: minute, requests_per_unit: 60 }
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: { unit: minute, requests_per_unit: 80 }
  - key: user
    value: u*
    value_to_metric: true
    descriptors:
      - key: plan
        value: free
        rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: plain
    value: p*
    rate_limit: { unit: minute, requests_per_unit: 5 }
";

#[test]
fn share_threshold_keys_the_counter_by_the_pattern_and_value_to_metric_names_values() {
    let config = parse(SHARED);
    // (the request's entries, the counter's entries, the metric name)
    for (entries, counter, metric) in [
        (
            &[("files", "files/a.txt")][..],
            &[("files", "files/*")][..],
            "files_files/*",
        ),
        (
            &[("route", "api/v1"), ("method", "GET")],
            &[("route", "api/*"), ("method", "GET")],
            "route_api/*.method_GET",
        ),
        (
            &[("service", "svc/a"), ("endpoint", "e1")],
            &[("service", "svc/*"), ("endpoint", "e1")],
            "service_svc/*.endpoint_e1",
        ),
        (
            &[("user", "u42"), ("plan", "free")],
            &[("user", "u42"), ("plan", "free")],
            "user_u42.plan_free",
        ),
        (&[("plain", "p1")], &[("plain", "p1")], "plain_p*"),
    ] {
        let m = config.lookup("d", entries.iter().copied()).unwrap();
        assert_eq!(*m.counter_entries(entries), *counter, "{entries:?}");
        assert_eq!(m.metric_path(entries), metric);
    }
    assert!(
        error("domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n")
            .to_string()
            .contains("share_threshold")
    );
}

#[test]
fn errors_in_files_with_merge_keys_name_the_line() {
    const HEAD: &str = "domain: d
descriptors:
  - key: a
    rate_limit: &d { unit: hour, requests_per_unit: 1 }
  - key: b
    rate_limit:
      <<: *d
";
    // (the rest of the file, the line at fault, a part of the message)
    for (rest, line, message) in [
        (
            "      unit: fortnight\n",
            8,
            "descriptors[1].rate_limit.unit: unknown unit \"fortnight\"",
        ),
        (
            "      requestsperunit: 3\n",
            8,
            "descriptors[1].rate_limit.requestsperunit: unknown field `requestsperunit`",
        ),
        (
            "  - key: b\n    rate_limit:\n      <<: *d\n",
            8,
            "descriptors: [2]: duplicate descriptor (key \"b\", value \"\")",
        ),
        (
            "    descriptors:\n      - key: c\n        rate_limit: { unit: hours, requests_per_unit: 1 }\n",
            10,
            "descriptors[1].descriptors[0].rate_limit.unit: unknown unit \"hours\"",
        ),
        // A field the merge brought in: the line of the mapping holding the `<<`.
        (
            "      unlimited: true\n",
            7,
            "descriptors[1].rate_limit: unlimited: true takes no unit",
        ),
    ] {
        let yaml = format!("{HEAD}{rest}");
        let e = error(&yaml);
        assert_eq!(e.line(), Some(line), "{e}\n{yaml}");
        assert!(e.to_string().contains(message), "{e}");
    }
    // A merge into a descriptor: the descriptor's line.
    let e =
        error("domain: d\ndescriptors:\n  - &e { key: a }\n  - <<: *e\n    value: v\n  - <<: *e\n");
    assert_eq!(e.line(), Some(6), "{e}");
    assert!(
        e.to_string()
            .contains("[2]: duplicate descriptor (key \"a\", value \"\"), also at [0]"),
        "{e}"
    );
}
