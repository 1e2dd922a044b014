//! Interned policy and tier names: `&'static str`s a [`Verdict`](crate::Verdict) can carry
//! without holding the policy set that named them.
//!
//! A verdict that kept its policy set alive would cost every check two atomic read-modify-write
//! operations (a reference count or arc-swap's debt slot, taken and given back), about 11 ns on
//! the benchmark machine: more than the whole budget of a check. A verdict copies what it
//! reports instead, and the names it reports are interned once, when a set is built.
//!
//! Memory: each distinct name is kept once for the life of the process. Names are at most
//! [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes (a tier's `"<policy>/<tier>"` at most twice
//! that) and come from the configuration, not from clients, so this is the size of the
//! configuration's vocabulary: reloading the same names, or changing limits, adds nothing.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// An interned name: one pointer (a verdict carries two, so they are thin).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Name(&'static &'static str);

impl Name {
    /// The empty name of a tier or policy not yet part of a built set.
    pub(crate) const EMPTY: Name = Name(&"");

    #[inline]
    pub(crate) fn as_str(self) -> &'static str {
        self.0
    }
}

/// Every name interned so far.
static NAMES: Mutex<Option<HashMap<&'static str, Name>>> = Mutex::new(None);

/// The interned copy of `name`: the same [`Name`] for equal names.
pub(crate) fn intern(name: &str) -> Name {
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    let names = names.get_or_insert_with(HashMap::new);
    if let Some(&interned) = names.get(name) {
        return interned;
    }
    let text: &'static str = Box::leak(name.into());
    let interned = Name(Box::leak(Box::new(text)));
    names.insert(text, interned);
    interned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_names_share_one_copy() {
        let a = intern(&String::from("api/burst"));
        let b = intern("api/burst");
        assert_eq!(a.as_str(), "api/burst");
        assert!(std::ptr::eq(a.0, b.0));
        assert!(!std::ptr::eq(a.0, intern("api/steady").0));
    }
}
