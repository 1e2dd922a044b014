//! A small strict parser of the OpenMetrics text format, for tests: every line is a `# HELP`,
//! `# TYPE` or `# UNIT` comment or a sample `name{labels} value`, every sample belongs to a family
//! declared with HELP and TYPE before it, no series appears twice, histogram buckets are
//! cumulative and end with `le="+Inf"` equal to `_count`, and the text ends with `# EOF`.
//! Shared with the demo crate's tests (`#[path]`).

use std::collections::{BTreeMap, BTreeSet};

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) value: f64,
}

/// A parsed exposition.
#[derive(Debug, Default)]
pub(crate) struct Exposition {
    /// Family name → type.
    pub(crate) families: BTreeMap<String, String>,
    pub(crate) samples: Vec<Sample>,
}

impl Exposition {
    /// Samples named `name` whose labels include every `(key, value)` of `labels`.
    pub(crate) fn find(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    /// The value of the one sample `name` with exactly `labels`.
    pub(crate) fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let wanted: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == wanted)
            .map(|s| s.value)
    }
}

/// Parses `text`, or says which line is wrong and why.
pub(crate) fn parse(text: &str) -> Result<Exposition, String> {
    let body = text
        .strip_suffix("# EOF\n")
        .ok_or_else(|| "does not end with \"# EOF\\n\"".to_owned())?;
    let mut out = Exposition::default();
    let mut helped = BTreeSet::new();
    let mut series = BTreeSet::new();
    for (number, line) in body.lines().enumerate() {
        let err = |why: &str| format!("line {}: {why}: {line:?}", number + 1);
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            let (kind, name, rest) = (parts.next(), parts.next(), parts.next());
            let (Some(kind), Some(name), Some(rest)) = (kind, name, rest) else {
                return Err(err("malformed comment"));
            };
            check_name(name).map_err(|e| err(&e))?;
            match kind {
                "HELP" => {
                    if !helped.insert(name.to_owned()) {
                        return Err(err("second HELP"));
                    }
                }
                "TYPE" => {
                    let known = [
                        "counter",
                        "gauge",
                        "histogram",
                        "summary",
                        "info",
                        "stateset",
                        "gaugehistogram",
                        "unknown",
                    ];
                    if !known.contains(&rest) {
                        return Err(err("unknown type"));
                    }
                    if out
                        .families
                        .insert(name.to_owned(), rest.to_owned())
                        .is_some()
                    {
                        return Err(err("second TYPE"));
                    }
                }
                "UNIT" => {
                    if !name.ends_with(&format!("_{rest}")) {
                        return Err(err("family name does not end with its unit"));
                    }
                }
                _ => return Err(err("unknown comment")),
            }
            continue;
        }
        let sample = parse_sample(line).map_err(|e| err(&e))?;
        let family = family_of(&out.families, &sample.name)
            .ok_or_else(|| err("sample of an undeclared family"))?;
        if !helped.contains(&family) {
            return Err(err("family without HELP"));
        }
        if !series.insert((sample.name.clone(), sample.labels.clone())) {
            return Err(err("duplicate series"));
        }
        out.samples.push(sample);
    }
    check_histograms(&out)?;
    Ok(out)
}

fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':');
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
        Ok(())
    } else {
        Err(format!("invalid metric name {name:?}"))
    }
}

fn family_of(families: &BTreeMap<String, String>, name: &str) -> Option<String> {
    let suffixes: &[&str] = &[
        "", "_total", "_created", "_bucket", "_sum", "_count", "_info",
    ];
    suffixes.iter().find_map(|suffix| {
        let family = name.strip_suffix(suffix)?;
        let kind = families.get(family)?;
        let allowed = match kind.as_str() {
            "counter" => ["_total", "_created"].contains(suffix),
            "histogram" => ["_bucket", "_sum", "_count", "_created"].contains(suffix),
            "info" => *suffix == "_info",
            _ => suffix.is_empty(),
        };
        allowed.then(|| family.to_owned())
    })
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or_else(|| "no value".to_owned())?;
    let name = &line[..name_end];
    check_name(name)?;
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, remainder) = parse_labels(after)?;
        labels = parsed;
        rest = remainder;
    }
    let value_text = rest
        .strip_prefix(' ')
        .ok_or_else(|| "no space before the value".to_owned())?;
    // An optional timestamp may follow; we emit none, so any further text is an error.
    let value = match value_text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v
            .parse::<f64>()
            .map_err(|e| format!("bad value {v:?}: {e}"))?,
    };
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Parses `k="v",...}` and returns the labels and the text after `}`.
fn parse_labels(mut s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    loop {
        if let Some(rest) = s.strip_prefix('}') {
            return Ok((labels, rest));
        }
        let eq = s
            .find("=\"")
            .ok_or_else(|| "label without =\"".to_owned())?;
        let key = &s[..eq];
        check_name(key)?;
        let mut value = String::new();
        let mut chars = s[eq + 2..].char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break eq + 2 + i + 1,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, '\\')) => value.push('\\'),
                    _ => return Err("bad escape in a label value".to_owned()),
                },
                Some((_, '\n')) | None => return Err("unterminated label value".to_owned()),
                Some((_, c)) => value.push(c),
            }
        };
        if labels.insert(key.to_owned(), value).is_some() {
            return Err(format!("label {key} twice"));
        }
        s = &s[end..];
        if let Some(rest) = s.strip_prefix(',') {
            s = rest;
        } else if !s.starts_with('}') {
            return Err("expected , or } after a label".to_owned());
        }
    }
}

fn check_histograms(exposition: &Exposition) -> Result<(), String> {
    for (family, kind) in &exposition.families {
        if kind != "histogram" {
            continue;
        }
        let mut by_series: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
        for sample in exposition.find(&format!("{family}_bucket"), &[]) {
            let mut labels = sample.labels.clone();
            let le = labels
                .remove("le")
                .ok_or_else(|| format!("{family}_bucket without le"))?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse::<f64>()
                    .map_err(|e| format!("{family}: le {le:?}: {e}"))?
            };
            by_series
                .entry(labels)
                .or_default()
                .push((le, sample.value));
        }
        for (labels, buckets) in by_series {
            let pairs: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let count = exposition
                .value(&format!("{family}_count"), &pairs)
                .ok_or_else(|| format!("{family}{labels:?} without _count"))?;
            exposition
                .value(&format!("{family}_sum"), &pairs)
                .ok_or_else(|| format!("{family}{labels:?} without _sum"))?;
            if !buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
            {
                return Err(format!("{family}{labels:?}: buckets not cumulative"));
            }
            if buckets.last() != Some(&(f64::INFINITY, count)) {
                return Err(format!("{family}{labels:?}: +Inf bucket is not _count"));
            }
        }
    }
    Ok(())
}
