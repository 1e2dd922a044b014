//! distlimit's own TOML policies in the server: `[[policy]]` tables as `distlimit-policy` reads
//! them, and `[domain.NAME]` sections mapping a descriptor's entry keys, in order, to the policy
//! that decides it (the crate documentation, "distlimit's TOML policies", shows a file).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use distlimit_policy::{Policy, PolicySet};
use serde::Deserialize;
use toml::Spanned;

use super::RateLimitConfigError;
use crate::check::MAX_ENTRIES;

/// The descriptors a TOML domain hands to its policies.
#[derive(Clone, Debug)]
pub(crate) struct PolicyDomain {
    pub(crate) file: PathBuf,
    /// Where its section starts in the file, to name it in a later error.
    pub(crate) line: usize,
    pub(crate) mappings: Vec<Mapping>,
}

/// `{ keys = [...], policy = "..." }`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Mapping {
    pub(crate) keys: Vec<String>,
    pub(crate) policy: String,
}

impl PolicyDomain {
    /// The policy deciding a descriptor with these entries, if any.
    pub(crate) fn policy_for<'e>(
        &self,
        entries: impl ExactSizeIterator<Item = &'e str> + Clone,
    ) -> Option<&str> {
        self.mappings
            .iter()
            .find(|m| {
                m.keys.len() == entries.len()
                    && m.keys.iter().zip(entries.clone()).all(|(a, b)| a == b)
            })
            .map(|m| m.policy.as_str())
    }
}

/// What one TOML file holds.
pub(crate) struct PolicyFile {
    pub(crate) policies: Vec<(Policy, usize)>,
    pub(crate) domains: Vec<(String, PolicyDomain)>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawFile {
    policy: Vec<Spanned<toml::Table>>,
    domain: HashMap<String, Spanned<RawDomain>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDomain {
    descriptors: Vec<Spanned<Mapping>>,
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset).unwrap_or(text).matches('\n').count() + 1
}

/// Parses one TOML file: its policies and domains, each with the line it starts on.
pub(crate) fn parse(file: &Path, text: &str) -> Result<PolicyFile, RateLimitConfigError> {
    let raw: RawFile = toml::from_str(text).map_err(|error| {
        let line = error.span().map(|span| line_of(text, span.start));
        super::invalid(file, line, error.message().trim_end().to_owned())
    })?;
    let invalid = |line, message| super::invalid(file, Some(line), message);
    let mut policies = Vec::with_capacity(raw.policy.len());
    for (i, table) in raw.policy.into_iter().enumerate() {
        let line = line_of(text, table.span().start);
        // distlimit-policy reads the table itself, so the format and its checks are its own.
        let mut one = toml::Table::new();
        one.insert(
            "policy".to_owned(),
            toml::Value::Array(vec![toml::Value::Table(table.into_inner())]),
        );
        let set = PolicySet::from_toml_str(&one.to_string())
            .map_err(|error| invalid(line, format!("policy[{i}]: {error}")))?;
        policies.extend(set.policies().iter().cloned().map(|p| (p, line)));
    }
    let mut domains = Vec::with_capacity(raw.domain.len());
    for (name, domain) in raw.domain {
        let line = line_of(text, domain.span().start);
        if name.is_empty() {
            return Err(invalid(line, "domain: the name must not be empty".into()));
        }
        let mut mappings = Vec::new();
        for (i, mapping) in domain.into_inner().descriptors.into_iter().enumerate() {
            let line = line_of(text, mapping.span().start);
            let mapping = mapping.into_inner();
            let field = format!("domain.{name}.descriptors[{i}].keys");
            let count = mapping.keys.len();
            if count == 0 || count > MAX_ENTRIES {
                let message = format!("{field}: 1 to {MAX_ENTRIES} keys, not {count}");
                return Err(invalid(line, message));
            }
            if mappings.iter().any(|m: &Mapping| m.keys == mapping.keys) {
                let message = format!("{field}: these keys are already mapped to a policy");
                return Err(invalid(line, message));
            }
            mappings.push(mapping);
        }
        domains.push((
            name,
            PolicyDomain {
                file: file.to_path_buf(),
                line,
                mappings,
            },
        ));
    }
    Ok(PolicyFile { policies, domains })
}
