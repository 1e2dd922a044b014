//! [`Key`]: the validated identity a limit is counted against.

use std::fmt;

/// The longest key, in bytes, that every store accepts.
pub const MAX_KEY_LEN: usize = 1024;

/// The longest policy name, in bytes (see [`Request::with_policy`](crate::Request::with_policy)).
pub const MAX_POLICY_LEN: usize = 128;

/// A validated, borrowed rate-limit key: 1 to [`MAX_KEY_LEN`] arbitrary bytes.
///
/// Keys usually come from clients (an IP address, a user id, an API token), so any bytes are
/// allowed: braces, NUL, invalid UTF-8. Stores must treat two keys as the same identity only when
/// their bytes are equal.
///
/// ```
/// use distlimit_core::{Key, KeyError};
///
/// let key = Key::new("user:{42}\0é")?;
/// assert_eq!(key.as_bytes(), "user:{42}\0é".as_bytes());
/// assert_eq!(Key::new(""), Err(KeyError::Empty));
/// assert!(matches!(Key::new(vec![b'x'; 2000].as_slice()), Err(KeyError::TooLong { len: 2000, .. })));
/// # Ok::<(), KeyError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key<'a>(&'a [u8]);

/// Why a [`Key`] was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key had no bytes.
    #[error("invalid key: empty")]
    Empty,
    /// The key was longer than the store accepts.
    #[error("invalid key: {len} bytes, the maximum is {max}")]
    TooLong {
        /// The key's length in bytes.
        len: usize,
        /// The maximum length.
        max: usize,
    },
    /// The policy name was longer than [`MAX_POLICY_LEN`].
    #[error("invalid policy name: {len} bytes, the maximum is {max}")]
    PolicyTooLong {
        /// The name's length in bytes.
        len: usize,
        /// The maximum length.
        max: usize,
    },
}

impl<'a> Key<'a> {
    /// Validates `bytes` as a key.
    #[inline]
    pub fn new<B: AsRef<[u8]> + ?Sized>(bytes: &'a B) -> Result<Self, KeyError> {
        let bytes = bytes.as_ref();
        if bytes.is_empty() {
            Err(KeyError::Empty)
        } else if bytes.len() > MAX_KEY_LEN {
            Err(KeyError::TooLong {
                len: bytes.len(),
                max: MAX_KEY_LEN,
            })
        } else {
            Ok(Self(bytes))
        }
    }

    /// The key's bytes.
    #[inline]
    pub fn as_bytes(&self) -> &'a [u8] {
        self.0
    }

    /// The key's length in bytes (never 0).
    #[allow(clippy::len_without_is_empty)] // a key is never empty
    #[inline]
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl fmt::Debug for Key<'_> {
    #[inline]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key(\"{}\")", self.0.escape_ascii())
    }
}

impl fmt::Display for Key<'_> {
    #[inline]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.escape_ascii())
    }
}
