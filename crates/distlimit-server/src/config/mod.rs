//! envoyproxy/ratelimit's YAML configuration, read as is, and its matching rules (the crate
//! documentation, "Configuration", describes the format, the matching and the TOML policies).
//! Loading is linear in a file's size: flow nesting deeper than [`MAX_FLOW_DEPTH`] is refused
//! before parsing; an error in a file with merge keys is found again in the text for its line.

mod policies;
mod scan;

pub use self::scan::MAX_FLOW_DEPTH;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use distlimit_policy::PolicySet;
use serde::Deserialize;

use self::policies::PolicyDomain;

/// A rate limit's time unit. Windows are aligned on multiples of the unit since the Unix epoch,
/// as envoyproxy/ratelimit aligns them; a month is 30 days and a year 365 days, as there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3 600 seconds.
    Hour,
    /// 86 400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit's length in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The lowercase name used in the YAML files (`second`, `minute`, …).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The unit named `name`, in any case (as envoyproxy/ratelimit reads it).
    pub fn from_name(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|unit| unit.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a matched rule limits to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleLimit {
    /// `unlimited: true`: always admitted, never counted.
    Unlimited,
    /// `requests_per_unit` per `unit`, in fixed windows aligned on the unit. Zero denies every
    /// request.
    PerUnit {
        /// Requests admitted per window.
        requests_per_unit: u32,
        /// The window.
        unit: Unit,
    },
}

/// A descriptor's `rate_limit` (with its descriptor's `shadow_mode`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The limit.
    pub limit: RuleLimit,
    /// `name`: what `replaces` refers to.
    pub name: Option<String>,
    /// `replaces`: the names of the rules this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// `shadow_mode`: counted as usual, but a denial is answered OK (and counted in metrics).
    pub shadow_mode: bool,
    /// `quota_mode` (envoyproxy/ratelimit's soft limit): this descriptor being over its limit
    /// does not deny the request by itself. A request is `OVER_LIMIT` when a descriptor
    /// without `quota_mode` is over its limit, or when every descriptor with `quota_mode` (and
    /// a counted limit) is; the descriptor's own status still reads `OVER_LIMIT`.
    pub quota_mode: bool,
    /// The descriptor's `metadata` (`None` when absent or empty): with
    /// `--response-dynamic-metadata`, merged into the response's dynamic metadata when this
    /// rule passes. Keys that are not strings are written as text (`1: x` is `"1": "x"`), as
    /// envoyproxy/ratelimit converts them.
    pub metadata: Option<Arc<Metadata>>,
}

/// A rule's `metadata`: a JSON object (envoyproxy/ratelimit's `google.protobuf.Struct`).
pub type Metadata = serde_json::Map<String, serde_json::Value>;

/// A YAML mapping as JSON: keys written as text, numbers kept, tags dropped, a number that is
/// not finite written as null (a `Struct` number is finite in JSON).
fn metadata_map(mapping: serde_yaml_ng::Mapping) -> Metadata {
    mapping
        .into_iter()
        .map(|(key, value)| (metadata_key(key), metadata_value(value)))
        .collect()
}

fn metadata_key(key: serde_yaml_ng::Value) -> String {
    use serde_yaml_ng::Value;
    match key {
        Value::String(s) => s,
        Value::Null => "<nil>".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Tagged(t) => metadata_key(t.value),
        other => metadata_value(other).to_string(),
    }
}

fn metadata_value(value: serde_yaml_ng::Value) -> serde_json::Value {
    use serde_json::Value as Json;
    use serde_yaml_ng::Value;
    match value {
        Value::Null => Json::Null,
        Value::Bool(b) => Json::Bool(b),
        // An integer as itself, a float as a float, a float not finite as null.
        Value::Number(n) => serde_json::to_value(n).unwrap_or(Json::Null),
        Value::String(s) => Json::String(s),
        Value::Sequence(items) => Json::Array(items.into_iter().map(metadata_value).collect()),
        Value::Mapping(m) => Json::Object(metadata_map(m)),
        Value::Tagged(t) => metadata_value(t.value),
    }
}

/// Where a descriptor landed: the rule to apply and the state it counts in.
#[derive(Clone, Copy, Debug)]
pub struct Match<'c> {
    /// The rule.
    pub rule: &'c Rule,
    /// The matched path below the domain, as envoyproxy/ratelimit names it in its statistics:
    /// `key_value` for a node with a value (the pattern for a wildcard), `key` for a node
    /// without, joined by `.` (`message_type_marketing.to_number`).
    pub path: &'c str,
    /// `detailed_metric` of the matched node: metrics name the request's own values.
    pub detailed_metric: bool,
    /// The nodes the request's entries landed on, to name metrics and counters.
    trail: Trail<'c>,
}

/// What a lookup walked through, kept only when a flag on the way needs it later.
#[derive(Clone, Copy, Debug)]
struct Trail<'c> {
    root: &'c Level,
    /// A node on the way matched by a wildcard has `share_threshold`.
    shares: bool,
    /// A node on the way has `value_to_metric`.
    values_to_metric: bool,
}

/// How one entry landed on its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Landed {
    /// `key` and `value` as written.
    Exact,
    /// A `value` with `*`.
    Wildcard,
    /// `key` alone.
    KeyOnly,
}

impl<'c> Match<'c> {
    /// The entries the descriptor's counter is keyed by: `entries` (the ones looked up), except
    /// that an entry landing on a wildcard with `share_threshold: true` is keyed by the pattern
    /// (`files/*`), so every value under the pattern counts against one shared limit, as in
    /// envoyproxy/ratelimit. Borrows `entries` when no `share_threshold` applies.
    pub fn counter_entries<'a>(
        &self,
        entries: &'a [(&'a str, &'a str)],
    ) -> Cow<'a, [(&'a str, &'a str)]>
    where
        'c: 'a,
    {
        if !self.trail.shares {
            return Cow::Borrowed(entries);
        }
        let mut keyed = entries.to_vec();
        walk(
            self.trail.root,
            entries.iter().copied(),
            |i, node, landed| {
                if let (Some(entry), Some(pattern)) = (keyed.get_mut(i), node.shared(landed)) {
                    entry.1 = pattern;
                }
            },
        );
        Cow::Owned(keyed)
    }

    /// The descriptor's name in metrics, below the domain, as envoyproxy/ratelimit names its
    /// statistics for `entries` (the ones looked up): [`Match::path`], except that
    /// - `detailed_metric` names every entry `key_value` (with `share_threshold`: the pattern
    ///   for an entry that landed on a shared wildcard, `key` alone for an empty value);
    /// - otherwise `value_to_metric` on a node names its entry `key_value` with the request's
    ///   value (a `share_threshold` wildcard keeps its pattern).
    pub fn metric_path(&self, entries: &[(&str, &str)]) -> Cow<'c, str> {
        let join = |segments: Vec<String>| Cow::Owned(segments.join("."));
        if self.detailed_metric {
            if !self.trail.shares {
                return join(entries.iter().map(|(k, v)| format!("{k}_{v}")).collect());
            }
            let mut segments: Vec<String> = entries
                .iter()
                .map(|(k, v)| {
                    if v.is_empty() {
                        (*k).to_owned()
                    } else {
                        format!("{k}_{v}")
                    }
                })
                .collect();
            walk(
                self.trail.root,
                entries.iter().copied(),
                |i, node, landed| {
                    if let (Some(segment), Some(pattern)) =
                        (segments.get_mut(i), node.shared(landed))
                    {
                        *segment = format!("{}_{pattern}", node.key);
                    }
                },
            );
            return join(segments);
        }
        if !self.trail.values_to_metric {
            return Cow::Borrowed(self.path);
        }
        let mut segments = Vec::with_capacity(entries.len());
        walk(
            self.trail.root,
            entries.iter().copied(),
            |i, node, landed| {
                let value = entries.get(i).map_or("", |e| e.1);
                let shown = match (landed, node.shared(landed)) {
                    (_, Some(pattern)) => pattern,
                    (Landed::Wildcard | Landed::KeyOnly, None) if node.value_to_metric => value,
                    (Landed::Wildcard, None) => node.value.as_str(),
                    (Landed::Exact, None) => value,
                    (Landed::KeyOnly, None) => "",
                };
                segments.push(if shown.is_empty() {
                    node.key.clone()
                } else {
                    format!("{}_{shown}", node.key)
                });
            },
        );
        join(segments)
    }
}

/// A loaded configuration: every domain of every file (the default: none, every descriptor
/// unmatched).
#[derive(Clone, Debug, Default)]
pub struct Config {
    domains: HashMap<String, Domain>,
    /// Domains of the TOML files: descriptors decided by distlimit policies.
    policy_domains: HashMap<String, PolicyDomain>,
    /// The policies of every TOML file (`None` without TOML files).
    policies: Option<Arc<PolicySet>>,
}

#[derive(Clone, Debug)]
struct Domain {
    root: Level,
    file: PathBuf,
}

/// One level of nested descriptors.
#[derive(Clone, Debug, Default)]
struct Level {
    nodes: Vec<Node>,
    /// key → value → node index, for values without a wildcard.
    exact: HashMap<String, HashMap<String, usize>>,
    /// Nodes whose value holds a `*`, in file order.
    wildcards: Vec<usize>,
    /// key → node index, for nodes without a value.
    key_only: HashMap<String, usize>,
}

#[derive(Clone, Debug)]
struct Node {
    key: String,
    value: String,
    path: String,
    rule: Option<Rule>,
    detailed_metric: bool,
    /// `value_to_metric`: metrics name the request's value at this level.
    value_to_metric: bool,
    /// `share_threshold` (only on a wildcard value): every value under the pattern shares one
    /// counter.
    share_threshold: bool,
    children: Level,
}

impl Node {
    /// The pattern standing for the request's value in counters and metrics, when this node
    /// shares its counter and the entry landed on it through its wildcard.
    fn shared(&self, landed: Landed) -> Option<&str> {
        (self.share_threshold && landed == Landed::Wildcard).then_some(self.value.as_str())
    }
}

/// Walks `entries` down from `root`, calling `visit` with each entry's index, the node it
/// landed on and how, until an entry lands nowhere or on a node without children.
fn walk<'c, 'e>(
    root: &'c Level,
    entries: impl Iterator<Item = (&'e str, &'e str)>,
    mut visit: impl FnMut(usize, &'c Node, Landed),
) {
    let mut level = root;
    for (i, (key, value)) in entries.enumerate() {
        let Some((index, landed)) = level.find(key, value) else {
            return;
        };
        let Some(node) = level.nodes.get(index) else {
            return;
        };
        visit(i, node, landed);
        if node.children.nodes.is_empty() {
            return;
        }
        level = &node.children;
    }
}

impl Config {
    /// Reads `path` ([`read_sources`]: a file, or a directory's files) and parses its files.
    ///
    /// # Errors
    ///
    /// An unreadable path, or any invalid file (see [`Config::from_sources`]).
    pub fn load(path: &Path) -> Result<Self, RateLimitConfigError> {
        Self::from_sources(&read_sources(path)?)
    }

    /// Parses files already read: `(path, contents)` pairs; a `.toml` file holds distlimit
    /// policies and the domains they decide, any other file one YAML domain.
    ///
    /// # Errors
    ///
    /// The first invalid file, naming the file, the line and the field; a domain defined by
    /// two files; a policy name defined twice; a TOML domain naming an unknown policy.
    pub fn from_sources(sources: &[Source]) -> Result<Self, RateLimitConfigError> {
        let mut domains: HashMap<String, Domain> = HashMap::new();
        let mut policy_domains: HashMap<String, PolicyDomain> = HashMap::new();
        // Every policy, with the file defining it.
        let mut policies: Vec<(distlimit_policy::Policy, PathBuf)> = Vec::new();
        // A domain of `second` already defined by an earlier file.
        let defined_twice = |domains: &HashMap<String, Domain>,
                             policy_domains: &HashMap<String, PolicyDomain>,
                             name: &str,
                             second: &Path| {
            let first = domains.get(name).map(|d| &d.file);
            match first.or_else(|| policy_domains.get(name).map(|d| &d.file)) {
                Some(first) => Err(RateLimitConfigError::DuplicateDomain {
                    domain: name.to_owned(),
                    first: first.clone(),
                    second: second.to_path_buf(),
                }),
                None => Ok(()),
            }
        };
        for source in sources {
            if source.path.extension().is_some_and(|e| e == "toml") {
                let file = policies::parse(&source.path, &source.contents)?;
                for (policy, line) in file.policies {
                    if let Some((_, first)) =
                        policies.iter().find(|(p, _)| p.name() == policy.name())
                    {
                        let (name, first) = (policy.name(), first.display());
                        let message = format!("policy \"{name}\" is also defined in {first}");
                        return Err(invalid(&source.path, Some(line), message));
                    }
                    policies.push((policy, source.path.clone()));
                }
                for (name, domain) in file.domains {
                    defined_twice(&domains, &policy_domains, &name, &source.path)?;
                    policy_domains.insert(name, domain);
                }
                continue;
            }
            let (name, domain) = parse_file(&source.path, &source.contents)?;
            defined_twice(&domains, &policy_domains, &name, &source.path)?;
            domains.insert(name, domain);
        }
        for (name, domain) in &policy_domains {
            for (i, mapping) in domain.mappings.iter().enumerate() {
                if !policies.iter().any(|(p, _)| p.name() == mapping.policy) {
                    let policy = &mapping.policy;
                    let message = format!(
                        "domain.{name}.descriptors[{i}].policy: no policy named \"{policy}\""
                    );
                    return Err(invalid(&domain.file, Some(domain.line), message));
                }
            }
        }
        let policies = if policies.is_empty() {
            None
        } else {
            let set = PolicySet::new(policies.into_iter().map(|(p, _)| p))
                .map_err(|error| invalid(Path::new(""), None, error.to_string()))?;
            Some(Arc::new(set))
        };
        Ok(Self {
            domains,
            policy_domains,
            policies,
        })
    }

    /// Parses one TOML document of distlimit policies and domains, as if read from a file
    /// named `file` (a `.toml` name: [`Config::from_yaml`] reads either, by the name).
    ///
    /// # Errors
    ///
    /// See [`Config::from_sources`].
    pub fn from_toml(file: &str, toml: &str) -> Result<Self, RateLimitConfigError> {
        Self::from_yaml(file, toml)
    }

    /// The policies of the TOML files, if any.
    pub fn policies(&self) -> Option<&Arc<PolicySet>> {
        self.policies.as_ref()
    }

    /// The policy of a TOML domain deciding a descriptor whose entries have these keys, in
    /// order; `None` when `domain` is not a TOML domain or no mapping has these keys.
    pub fn policy_for<'e, I>(&self, domain: &str, keys: I) -> Option<&str>
    where
        I: IntoIterator<Item = &'e str>,
        I::IntoIter: ExactSizeIterator + Clone,
    {
        self.policy_domains
            .get(domain)?
            .policy_for(keys.into_iter())
    }

    /// Parses one YAML document (or a TOML one when `file` ends `.toml`), as if read from a
    /// file named `file`.
    ///
    /// # Errors
    ///
    /// See [`Config::from_sources`].
    pub fn from_yaml(file: &str, yaml: &str) -> Result<Self, RateLimitConfigError> {
        Self::from_sources(&[Source {
            path: PathBuf::from(file),
            contents: yaml.to_owned(),
        }])
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain) || self.policy_domains.contains_key(domain)
    }

    /// The configured domains, in no particular order.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains
            .keys()
            .chain(self.policy_domains.keys())
            .map(String::as_str)
    }

    /// The rule a descriptor's `entries` (key, value pairs, in order) land on in `domain`, if
    /// any.
    pub fn lookup<'c, 'e, I>(&'c self, domain: &str, entries: I) -> Option<Match<'c>>
    where
        I: IntoIterator<Item = (&'e str, &'e str)>,
        I::IntoIter: ExactSizeIterator,
    {
        let root = &self.domains.get(domain)?.root;
        let entries = entries.into_iter();
        let last = entries.len().checked_sub(1)?;
        let mut trail = Trail {
            root,
            shares: false,
            values_to_metric: false,
        };
        let mut landed = None;
        walk(root, entries, |i, node, how| {
            trail.shares |= node.shared(how).is_some();
            trail.values_to_metric |= node.value_to_metric;
            if i == last {
                landed = Some(node);
            }
        });
        let node = landed?;
        node.rule.as_ref().map(|rule| Match {
            rule,
            path: &node.path,
            detailed_metric: node.detailed_metric,
            trail,
        })
    }
}

impl Level {
    /// The node `key`/`value` lands on: exact value, then wildcards in order, then key alone.
    fn find(&self, key: &str, value: &str) -> Option<(usize, Landed)> {
        if let Some(&i) = self.exact.get(key).and_then(|values| values.get(value)) {
            return Some((i, Landed::Exact));
        }
        let wildcard = self.wildcards.iter().copied().find(|&i| {
            self.nodes
                .get(i)
                .is_some_and(|node| node.key == key && wildcard_match(&node.value, value))
        });
        wildcard
            .map(|i| (i, Landed::Wildcard))
            .or_else(|| self.key_only.get(key).map(|&i| (i, Landed::KeyOnly)))
    }
}

/// Whether `text` matches `pattern`, where each `*` stands for any run of characters (empty
/// included) and everything else for itself.
pub fn wildcard_match(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else {
        return text.is_empty();
    };
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let mut parts: Vec<&str> = parts.collect();
    let Some(last) = parts.pop() else {
        // No `*` at all.
        return rest.is_empty();
    };
    for part in parts {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// One configuration file as read from disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its text.
    pub contents: String,
}

/// Reads the configuration files at `path` (a file, or a directory's `.yaml`/`.yml`/`.toml`
/// files in name order, dot files skipped, symbolic links followed).
///
/// # Errors
///
/// [`RateLimitConfigError::Io`], naming the file, when the path or a file cannot be read, is
/// a symbolic link to a missing file, is not a regular file, is not UTF-8, or is larger than
/// [`MAX_CONFIG_FILE_BYTES`]. A directory entry that cannot be read is never skipped: the
/// running configuration is kept rather than replaced by one without its domains.
pub fn read_sources(path: &Path) -> Result<Vec<Source>, RateLimitConfigError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RateLimitConfigError::Io { path, source }
    };
    let read = |path: PathBuf| {
        let text = distlimit_serve::read_at_most(&path, MAX_CONFIG_FILE_BYTES).and_then(|bytes| {
            String::from_utf8(bytes)
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8"))
        });
        match text {
            Ok(contents) => Ok(Source { path, contents }),
            Err(source) => Err(RateLimitConfigError::Io { path, source }),
        }
    };
    let meta = std::fs::metadata(path).map_err(io(path))?;
    if !meta.is_dir() {
        return Ok(vec![read(path.to_path_buf())?]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(io(path))? {
        let entry = entry.map_err(io(path))?;
        let file = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let known = name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".toml");
        if name.starts_with('.') || !known {
            continue;
        }
        // Follows symbolic links: a ConfigMap's files are links into its `..data` directory. A
        // dangling one (its `..data` vanished) is an error, never left out (see above).
        match std::fs::metadata(&file) {
            Ok(meta) if meta.is_file() => files.push(file),
            Ok(_) => {
                return Err(io(&file)(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "not a regular file",
                )));
            }
            Err(error) => {
                let error = match std::fs::read_link(&file) {
                    Ok(target) if error.kind() == std::io::ErrorKind::NotFound => {
                        let missing =
                            format!("symbolic link to a missing file ({})", target.display());
                        std::io::Error::new(std::io::ErrorKind::NotFound, missing)
                    }
                    _ => error,
                };
                return Err(io(&file)(error));
            }
        }
    }
    files.sort();
    files.into_iter().map(read).collect()
}

/// [`RateLimitConfigError::Invalid`]: `file`, at `line`, is not valid: `message`.
fn invalid(file: &Path, line: Option<usize>, message: String) -> RateLimitConfigError {
    let file = file.to_path_buf();
    RateLimitConfigError::Invalid {
        file,
        line,
        message,
    }
}

/// The largest configuration file read (each file of a directory): 16 MiB.
pub const MAX_CONFIG_FILE_BYTES: u64 = 16 << 20;

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RateLimitConfigError {
    /// A path could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A file is not a valid configuration.
    #[error("{}:{}: {message}", file.display(), line.map_or_else(|| "?".to_owned(), |l| l.to_string()))]
    Invalid {
        /// The file.
        file: PathBuf,
        /// The line (1-based) the parser was at, when known.
        line: Option<usize>,
        /// The field (`descriptors[1].rate_limit.unit`) and what is wrong with it.
        message: String,
    },
    /// Two files define the same domain.
    #[error("domain \"{domain}\" is defined by both {} and {}", first.display(), second.display())]
    DuplicateDomain {
        /// The domain.
        domain: String,
        /// The file read first.
        first: PathBuf,
        /// The other file.
        second: PathBuf,
    },
}

impl RateLimitConfigError {
    /// The file at fault, if one is.
    pub fn file(&self) -> Option<&Path> {
        match self {
            RateLimitConfigError::Io { path, .. } => Some(path),
            RateLimitConfigError::Invalid { file, .. } => Some(file),
            RateLimitConfigError::DuplicateDomain { second, .. } => Some(second),
        }
    }

    /// The line at fault (1-based), if known.
    pub fn line(&self) -> Option<usize> {
        match self {
            RateLimitConfigError::Invalid { line, .. } => *line,
            _ => None,
        }
    }
}

// ---- The file format, as envoyproxy/ratelimit reads it. ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    domain: String,
    #[serde(default)]
    descriptors: Descriptors,
}

/// A list of descriptors (`descriptors:` with nothing after it is an empty list, as there).
#[derive(Default, Deserialize)]
#[serde(try_from = "Option<Vec<RawDescriptor>>")]
struct Descriptors(Vec<RawDescriptor>);

impl TryFrom<Option<Vec<RawDescriptor>>> for Descriptors {
    type Error = String;

    fn try_from(list: Option<Vec<RawDescriptor>>) -> Result<Self, String> {
        let list = list.unwrap_or_default();
        // One hash look-up per descriptor: a level of 100 000 descriptors loads in linear time.
        let mut seen: HashMap<(&str, &str), usize> = HashMap::with_capacity(list.len());
        for (i, d) in list.iter().enumerate() {
            if let Some(j) = seen.insert((&d.key.0, &d.value), i) {
                return Err(format!(
                    "[{i}]: duplicate descriptor (key \"{}\", value \"{}\"), also at [{j}]",
                    d.key.0, d.value
                ));
            }
            if d.share_threshold && !d.value.contains('*') {
                return Err(format!(
                    "[{i}].share_threshold: only a value with a `*` wildcard can share its limit, \
                     not (key \"{}\", value \"{}\")",
                    d.key.0, d.value
                ));
            }
        }
        Ok(Self(list))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: NonEmpty,
    #[serde(default)]
    value: String,
    rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    descriptors: Descriptors,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    quota_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    /// Returned in a response's dynamic metadata (`--response-dynamic-metadata`) when the
    /// descriptor passes: a mapping, or nothing.
    metadata: Option<serde_yaml_ng::Mapping>,
}

#[derive(PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
struct NonEmpty(String);

impl TryFrom<String> for NonEmpty {
    type Error = &'static str;

    fn try_from(s: String) -> Result<Self, &'static str> {
        if s.is_empty() {
            Err("must not be empty")
        } else {
            Ok(Self(s))
        }
    }
}

#[derive(Deserialize)]
#[serde(try_from = "RawRateLimitFields")]
struct RawRateLimit {
    limit: RuleLimit,
    name: Option<String>,
    replaces: Vec<String>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawRateLimitFields {
    unit: Option<UnitName>,
    requests_per_unit: Option<u32>,
    unlimited: bool,
    name: Option<String>,
    replaces: Vec<RawReplace>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplace {
    name: String,
}

#[derive(Deserialize)]
#[serde(try_from = "String")]
struct UnitName(Unit);

impl TryFrom<String> for UnitName {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        Unit::from_name(&s).map(UnitName).ok_or_else(|| {
            format!(
                "unknown unit \"{s}\", expected one of second, minute, hour, day, week, month, year"
            )
        })
    }
}

impl TryFrom<RawRateLimitFields> for RawRateLimit {
    type Error = String;

    fn try_from(raw: RawRateLimitFields) -> Result<Self, String> {
        let limit = if raw.unlimited {
            // As envoyproxy/ratelimit: `requests_per_unit` is ignored, a unit is a mistake.
            if raw.unit.is_some() {
                return Err("unlimited: true takes no unit".into());
            }
            RuleLimit::Unlimited
        } else {
            let Some(UnitName(unit)) = raw.unit else {
                return Err(
                    "unit is required (second, minute, hour, day, week, month or year) \
                     unless unlimited: true"
                        .into(),
                );
            };
            RuleLimit::PerUnit {
                requests_per_unit: raw.requests_per_unit.unwrap_or(0),
                unit,
            }
        };
        let mut replaces = Vec::with_capacity(raw.replaces.len());
        for replace in raw.replaces {
            if replace.name.is_empty() {
                return Err("replaces: a name must not be empty".into());
            }
            if raw.name.as_deref() == Some(replace.name.as_str()) {
                return Err(format!(
                    "replaces: \"{}\" is this rate limit's own name",
                    replace.name
                ));
            }
            replaces.push(replace.name);
        }
        Ok(Self {
            limit,
            name: raw.name.filter(|n| !n.is_empty()),
            replaces,
        })
    }
}

fn parse_file(file: &Path, yaml: &str) -> Result<(String, Domain), RateLimitConfigError> {
    let yaml_error = |error: serde_yaml_ng::Error| {
        invalid(file, error.location().map(|l| l.line()), error.to_string())
    };
    // A byte order mark is no part of the document (libyaml misreads some files starting with
    // one as several documents).
    let yaml = yaml.strip_prefix('\u{feff}').unwrap_or(yaml);
    if let Some(line) = scan::too_deep(yaml) {
        let message = format!("flow collections ([ ], {{ }}) nested deeper than {MAX_FLOW_DEPTH}");
        return Err(invalid(file, Some(line), message));
    }
    let raw: RawFile = if yaml.contains("<<") {
        // Merge keys (`<<: *defaults`) are resolved on the document's tree; an error past this
        // point knows the field's path, which is looked up in the text for its line.
        let mut value: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).map_err(yaml_error)?;
        value.apply_merge().map_err(yaml_error)?;
        serde_path_to_error::deserialize(value).map_err(|error| {
            let path = error.path().clone();
            let inner = error.into_inner();
            let line = locate::line_of(yaml, &path, &inner.to_string());
            let path = path.to_string();
            let message = if path == "." {
                inner.to_string()
            } else {
                format!("{path}: {inner}")
            };
            invalid(file, inner.location().map(|l| l.line()).or(line), message)
        })?
    } else {
        serde_yaml_ng::from_str(yaml).map_err(yaml_error)?
    };
    if raw.domain.is_empty() {
        return Err(invalid(file, None, "domain: must not be empty".into()));
    }
    let root = build_level(raw.descriptors.0, "");
    Ok((
        raw.domain,
        Domain {
            root,
            file: file.to_path_buf(),
        },
    ))
}

fn build_level(descriptors: Vec<RawDescriptor>, parent: &str) -> Level {
    let mut level = Level::default();
    for raw in descriptors {
        let key = raw.key.0;
        let segment = if raw.value.is_empty() {
            key.clone()
        } else {
            format!("{key}_{}", raw.value)
        };
        let path = if parent.is_empty() {
            segment
        } else {
            format!("{parent}.{segment}")
        };
        let children = build_level(raw.descriptors.0, &path);
        let rule = raw.rate_limit.map(|r| Rule {
            limit: r.limit,
            name: r.name,
            replaces: r.replaces,
            shadow_mode: raw.shadow_mode,
            quota_mode: raw.quota_mode,
            metadata: raw
                .metadata
                .filter(|m| !m.is_empty())
                .map(|m| Arc::new(metadata_map(m))),
        });
        let index = level.nodes.len();
        if raw.value.is_empty() {
            level.key_only.insert(key.clone(), index);
        } else if raw.value.contains('*') {
            level.wildcards.push(index);
        } else {
            level
                .exact
                .entry(key.clone())
                .or_default()
                .insert(raw.value.clone(), index);
        }
        level.nodes.push(Node {
            key,
            value: raw.value,
            path,
            rule,
            detailed_metric: raw.detailed_metric,
            value_to_metric: raw.value_to_metric,
            share_threshold: raw.share_threshold,
            children,
        });
    }
    level
}

mod locate;
#[cfg(test)]
mod tests;
