//! [`StateName`]: the typed name of a state in a store, a policy and optionally a tier.

use crate::{KeyError, MAX_POLICY_LEN};

/// The name of the state a [`Request`](crate::Request) charges: a policy and, optionally, one of
/// its tiers, kept apart so that nobody parses a string to find them again.
///
/// A store keys its states by [`as_str`](Self::as_str), the storage name: `"<policy>/<tier>"`
/// for a tier, `"<policy>"` alone otherwise. Wrappers that act per policy (the hybrid store's
/// failure modes, the lease wrapper's policies) read [`policy`](Self::policy), so a mode set
/// for `api` covers `api/minute` and `api/day`, whatever characters the names hold. A state
/// name is never derived from metrics labels or display names: a label may change (a flag, a
/// rename in a report) while the state must not.
///
/// ```
/// use distlimit_core::StateName;
///
/// let tier = StateName::of_tier("api", "minute")?;
/// assert_eq!((tier.policy(), tier.tier(), tier.as_str()), ("api", Some("minute"), "api/minute"));
/// let own = StateName::new("login")?;
/// assert_eq!((own.policy(), own.tier()), ("login", None));
/// // A policy named with a '/' is one policy: no tier is read out of it.
/// assert_eq!(StateName::new("a/b")?.tier(), None);
/// assert!(StateName::new("x".repeat(200)).is_err());
/// # Ok::<(), distlimit_core::KeyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateName {
    /// The storage name.
    full: Box<str>,
    /// The length of the policy part of `full`.
    policy_len: usize,
}

impl StateName {
    /// The state of policy `policy` itself (no tier). At most [`MAX_POLICY_LEN`] bytes.
    ///
    /// # Errors
    ///
    /// [`KeyError::PolicyTooLong`] past [`MAX_POLICY_LEN`] bytes.
    pub fn new(policy: impl Into<Box<str>>) -> Result<Self, KeyError> {
        let full: Box<str> = policy.into();
        check_len(full.len())?;
        Ok(Self {
            policy_len: full.len(),
            full,
        })
    }

    /// The state of tier `tier` of policy `policy`, stored as `"<policy>/<tier>"` (at most
    /// [`MAX_POLICY_LEN`] bytes in all).
    ///
    /// # Errors
    ///
    /// [`KeyError::PolicyTooLong`] when the storage name is longer than [`MAX_POLICY_LEN`].
    pub fn of_tier(policy: &str, tier: &str) -> Result<Self, KeyError> {
        check_len(policy.len().saturating_add(1).saturating_add(tier.len()))?;
        Ok(Self {
            // `join`: one allocation of the exact size, no formatting machinery (per request).
            full: [policy, tier].join("/").into_boxed_str(),
            policy_len: policy.len(),
        })
    }

    /// The storage name: `"<policy>/<tier>"`, or `"<policy>"` without a tier.
    #[inline]
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The policy the state belongs to.
    #[inline]
    pub fn policy(&self) -> &str {
        self.to_ref().policy()
    }

    /// The tier, if the state is one tier of its policy.
    #[inline]
    pub fn tier(&self) -> Option<&str> {
        self.to_ref().tier()
    }

    /// The name, borrowed (what a [`Request`](crate::Request) holds).
    #[inline]
    pub fn to_ref(&self) -> StateRef<'_> {
        StateRef {
            full: &self.full,
            policy_len: self.policy_len,
        }
    }
}

impl std::fmt::Display for StateName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.full)
    }
}

/// A borrowed [`StateName`]: what [`Request::state`](crate::Request::state) answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StateRef<'a> {
    full: &'a str,
    policy_len: usize,
}

impl<'a> StateRef<'a> {
    /// The state named `policy` alone, no tier ([`Request::with_policy`](crate::Request::with_policy)):
    /// the whole string is the policy, whatever it holds.
    #[inline]
    pub(crate) const fn untyped(policy: &'a str) -> Self {
        Self {
            full: policy,
            policy_len: policy.len(),
        }
    }

    /// [`untyped`](Self::untyped), refusing a name longer than [`MAX_POLICY_LEN`] bytes: what
    /// the requests' `with_policy` take.
    #[inline]
    pub(crate) fn checked(policy: &'a str) -> Result<Self, KeyError> {
        check_len(policy.len())?;
        Ok(Self::untyped(policy))
    }

    /// The storage name: `"<policy>/<tier>"`, or `"<policy>"` without a tier.
    #[inline]
    pub fn as_str(&self) -> &'a str {
        self.full
    }

    /// The policy the state belongs to.
    #[inline]
    pub fn policy(&self) -> &'a str {
        self.full.get(..self.policy_len).unwrap_or(self.full)
    }

    /// The tier, if the state is one tier of its policy.
    #[inline]
    pub fn tier(&self) -> Option<&'a str> {
        self.full.get(self.policy_len.checked_add(1)?..)
    }
}

fn check_len(len: usize) -> Result<(), KeyError> {
    if len > MAX_POLICY_LEN {
        return Err(KeyError::PolicyTooLong {
            len,
            max: MAX_POLICY_LEN,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_kept_not_parsed() {
        let name = StateName::of_tier("a/b", "c").unwrap();
        assert_eq!((name.policy(), name.tier()), ("a/b", Some("c")));
        assert_eq!(name.as_str(), "a/b/c");
        let empty_tier = StateName::of_tier("p", "").unwrap();
        assert_eq!(empty_tier.tier(), Some(""));
        assert_eq!(StateRef::untyped("p/t").policy(), "p/t");
        assert_eq!(StateRef::untyped("p/t").tier(), None);
        assert!(StateName::of_tier(&"p".repeat(64), &"t".repeat(64)).is_err());
        assert!(StateName::of_tier(&"p".repeat(63), &"t".repeat(64)).is_ok());
    }
}
