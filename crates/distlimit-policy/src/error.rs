//! [`ConfigError`]: why a policy set was rejected, and [`CheckError`]: why a check failed.

use std::fmt;

/// Why a policy set (built in code, read from TOML, or changed by
/// [`Limiter::update_policy`](crate::Limiter::update_policy)) was rejected.
///
/// It names where the problem is (the policy, the override key, the tier, the field) and what is
/// wrong, in one line:
///
/// ```text
/// policy "api", tier "burst": limit: must be at least 1
/// ```
///
/// A rejected set never replaces the running one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    policy: Option<String>,
    override_key: Option<String>,
    tier: Option<String>,
    field: &'static str,
    message: String,
}

impl ConfigError {
    /// An error in `field` (`"limit"`, `"algorithm"`, `"toml"`...) saying `message`.
    pub(crate) fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            policy: None,
            override_key: None,
            tier: None,
            field,
            message: message.into(),
        }
    }

    /// The same error located in policy `policy`.
    pub(crate) fn in_policy(mut self, policy: &str) -> Self {
        self.policy = Some(policy.to_owned());
        self
    }

    /// The same error located in the override of `key`.
    pub(crate) fn in_override(mut self, key: &[u8]) -> Self {
        self.override_key = Some(String::from_utf8_lossy(key).into_owned());
        self
    }

    /// The same error located in tier `tier`.
    pub(crate) fn in_tier(mut self, tier: &str) -> Self {
        self.tier = Some(tier.to_owned());
        self
    }

    /// The policy the error is in, if it is in one.
    pub fn policy(&self) -> Option<&str> {
        self.policy.as_deref()
    }

    /// The key of the per-key override the error is in, if it is in one (lossy UTF-8).
    pub fn override_key(&self) -> Option<&str> {
        self.override_key.as_deref()
    }

    /// The tier the error is in, if it is in one.
    pub fn tier(&self) -> Option<&str> {
        self.tier.as_deref()
    }

    /// The field at fault: `name`, `tiers`, `algorithm`, `limit`, `per`, `burst`, `scope`,
    /// `allow`, `deny`, `override`, `key`, `toml` (the file is not valid TOML or does not
    /// match the schema), `file` (the file could not be read) or `runtime` ([`watch`](crate::watch)
    /// called outside a Tokio runtime).
    pub fn field(&self) -> &str {
        self.field
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut part = |f: &mut fmt::Formatter<'_>, what: &str, name: &str| {
            let sep = if first { "" } else { ", " };
            first = false;
            write!(f, "{sep}{what} {name:?}")
        };
        if let Some(policy) = &self.policy {
            part(f, "policy", policy)?;
        }
        if let Some(key) = &self.override_key {
            part(f, "override", key)?;
        }
        if let Some(tier) = &self.tier {
            part(f, "tier", tier)?;
        }
        if !first {
            f.write_str(": ")?;
        }
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Why [`Limiter::check`](crate::Limiter::check) could not decide.
///
/// A denial is not an error: it is an `Ok(`[`Verdict`](crate::Verdict)`)`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// No policy of this name is in the active set.
    #[error("unknown policy {0:?}")]
    UnknownPolicy(String),
    /// The store failed to decide, or rejected the key (empty, or longer than
    /// [`MAX_KEY_LEN`](distlimit_core::MAX_KEY_LEN)).
    #[error(transparent)]
    Store(#[from] distlimit_core::Error),
}

impl CheckError {
    /// Whether trying again later may succeed: only transient store failures.
    pub fn is_transient(&self) -> bool {
        match self {
            CheckError::UnknownPolicy(_) => false,
            CheckError::Store(e) => e.is_transient(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_location_then_the_field() {
        let e = ConfigError::new("limit", "must be at least 1")
            .in_tier("burst")
            .in_override(b"tenant-42")
            .in_policy("api");
        assert_eq!(
            e.to_string(),
            r#"policy "api", override "tenant-42", tier "burst": limit: must be at least 1"#
        );
        let e = ConfigError::new("toml", "expected `=`");
        assert_eq!(e.to_string(), "toml: expected `=`");
    }
}
