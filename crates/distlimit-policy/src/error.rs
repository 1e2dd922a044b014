//! [`PolicyConfigError`]: why a policy set was rejected, and [`CheckError`]: why a check failed.

use std::borrow::Cow;
use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// Names and keys echoed in error messages are cut to this many bytes (plus `…`).
const SHOWN_MAX: usize = 64;

/// `text` as an error message shows it: at most [`SHOWN_MAX`] bytes, cut on a character
/// boundary and marked with `…` when longer.
pub(crate) fn shown(text: &str) -> Cow<'_, str> {
    if text.len() <= SHOWN_MAX {
        return Cow::Borrowed(text);
    }
    let mut end = SHOWN_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…", text.get(..end).unwrap_or_default()))
}

/// [`shown`] for a key, which may be any bytes (lossy UTF-8).
pub(crate) fn shown_key(key: &[u8]) -> String {
    shown(&String::from_utf8_lossy(key)).into_owned()
}

/// The part of a policy configuration a [`PolicyConfigError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Field {
    /// A policy or tier name.
    Name,
    /// A tier list (empty, too long, or no such tier).
    Tiers,
    /// A tier's algorithm.
    Algorithm,
    /// A tier's limit.
    Limit,
    /// A tier's period.
    Per,
    /// A tier's burst.
    Burst,
    /// A tier's scope.
    Scope,
    /// An allow-list entry.
    Allow,
    /// A deny-list entry.
    Deny,
    /// A per-key override's key.
    Override,
    /// The set's policies: none at all, or a policy the limiter's users declared is missing
    /// (see [`Limiter::declare`](crate::Limiter::declare)).
    Policy,
    /// The file is not valid TOML or does not match the schema; the source is the TOML error.
    Toml,
    /// The file could not be read, or is not UTF-8; the source says why.
    File,
    /// [`watch`](crate::watch) was called outside a Tokio runtime.
    Runtime,
    /// A policy's concurrency limit (`max_in_flight`, `in_flight_lease`).
    MaxInFlight,
}

impl Field {
    /// The name used in configuration and messages: the variant's in snake case (`per`,
    /// `max_in_flight`).
    pub fn name(self) -> &'static str {
        match self {
            Field::Name => "name",
            Field::Tiers => "tiers",
            Field::Algorithm => "algorithm",
            Field::Limit => "limit",
            Field::Per => "per",
            Field::Burst => "burst",
            Field::Scope => "scope",
            Field::Allow => "allow",
            Field::Deny => "deny",
            Field::Override => "override",
            Field::Policy => "policy",
            Field::Toml => "toml",
            Field::File => "file",
            Field::Runtime => "runtime",
            Field::MaxInFlight => "max_in_flight",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a policy set (built in code, read from TOML, changed by
/// [`Limiter::update_policy`](crate::Limiter::update_policy) or refused by
/// [`Limiter::replace`](crate::Limiter::replace)) was rejected.
///
/// It names where the problem is (the policy, the override key, the tier: each shown up to 64
/// bytes), the [`Field`] and what is wrong, in one line:
///
/// ```text
/// policy "api", tier "burst": limit: must be at least 1
/// ```
///
/// A file that cannot be read or parsed keeps its cause (the I/O or TOML error) as
/// [`source`](Error::source), which the line does not repeat. A rejected set never replaces
/// the running one.
#[derive(Clone, Debug)]
pub struct PolicyConfigError {
    policy: Option<String>,
    override_key: Option<String>,
    tier: Option<String>,
    field: Field,
    message: String,
    source: Option<Arc<dyn Error + Send + Sync>>,
}

impl PolicyConfigError {
    /// An error in `field` saying `message`.
    pub(crate) fn new(field: Field, message: impl Into<String>) -> Self {
        Self {
            policy: None,
            override_key: None,
            tier: None,
            field,
            message: message.into(),
            source: None,
        }
    }

    /// The same error caused by `source`.
    pub(crate) fn with_source(mut self, source: impl Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// The same error located in policy `policy`.
    pub(crate) fn in_policy(mut self, policy: &str) -> Self {
        self.policy = Some(shown(policy).into_owned());
        self
    }

    /// The same error located in the override of `key`.
    pub(crate) fn in_override(mut self, key: &[u8]) -> Self {
        self.override_key = Some(shown_key(key));
        self
    }

    /// The same error located in tier `tier`.
    pub(crate) fn in_tier(mut self, tier: &str) -> Self {
        self.tier = Some(shown(tier).into_owned());
        self
    }

    /// The policy the error is in, if it is in one (cut to 64 bytes and `…` if longer).
    pub fn policy(&self) -> Option<&str> {
        self.policy.as_deref()
    }

    /// The key of the per-key override the error is in, if it is in one (lossy UTF-8, cut
    /// like [`policy`](Self::policy)).
    pub fn override_key(&self) -> Option<&str> {
        self.override_key.as_deref()
    }

    /// The tier the error is in, if it is in one (cut like [`policy`](Self::policy)).
    pub fn tier(&self) -> Option<&str> {
        self.tier.as_deref()
    }

    /// The field at fault.
    pub fn field(&self) -> Field {
        self.field
    }

    /// What is wrong, for people (the cause, if any, is the [`source`](Error::source)).
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Equal when they say the same: location, field, message, and causes that display alike.
impl PartialEq for PolicyConfigError {
    fn eq(&self, other: &Self) -> bool {
        let cause = |e: &Self| e.source.as_ref().map(ToString::to_string);
        fn place(e: &PolicyConfigError) -> [&Option<String>; 3] {
            [&e.policy, &e.override_key, &e.tier]
        }
        (place(self), self.field, &self.message, cause(self))
            == (place(other), other.field, &other.message, cause(other))
    }
}

impl Eq for PolicyConfigError {}

impl fmt::Display for PolicyConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let located = [
            ("policy", &self.policy),
            ("override", &self.override_key),
            ("tier", &self.tier),
        ];
        let mut sep = "";
        for (what, name) in located {
            if let Some(name) = name {
                write!(f, "{sep}{what} {name:?}")?;
                sep = ", ";
            }
        }
        if !sep.is_empty() {
            f.write_str(": ")?;
        }
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl Error for PolicyConfigError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// Why [`Limiter::check`](crate::Limiter::check) could not decide.
///
/// A denial is not an error: it is an `Ok(`[`Verdict`](crate::Verdict)`)`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// No policy of this name is in the active set (the message shows up to 64 bytes of it).
    #[error("unknown policy {:?}", shown(.0))]
    UnknownPolicy(String),
    /// The store failed to decide, or rejected the key (empty, or longer than
    /// [`MAX_KEY_LEN`](distlimit_core::MAX_KEY_LEN)).
    #[error(transparent)]
    Store(#[from] distlimit_core::Error),
}

impl CheckError {
    /// Whether trying again later may succeed: only transient store failures.
    pub fn is_transient(&self) -> bool {
        matches!(self, CheckError::Store(e) if e.is_transient())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_cut_on_a_character_boundary() {
        assert_eq!(shown("api"), "api");
        // '€' is 3 bytes: byte 64 is inside the 22nd, so 21 are kept (63 bytes).
        let long = "€".repeat(2_000);
        let cut = shown(&long);
        assert_eq!(cut, format!("{}…", "€".repeat(21)));
        let e = PolicyConfigError::new(Field::Name, "too long").in_policy(&long);
        assert!(e.to_string().len() < 100, "{e}");
        let e = CheckError::UnknownPolicy("x".repeat(5_000));
        assert_eq!(e.to_string().len(), r#"unknown policy """#.len() + 64 + 3);
    }
}
