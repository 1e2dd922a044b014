//! [`PolicySelector`]: which policy of the limiter a request is checked against.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::Method;

use crate::RequestInfo;

type PolicyFn = dyn Fn(&RequestInfo<'_>) -> Option<Arc<str>> + Send + Sync;

/// Which policy a request is checked against; `None` lets the request through unchecked.
///
/// * [`fixed`](Self::fixed) (also `From<&str>`): one policy for everything.
/// * [`routes`](Self::routes): a [`RouteTable`] of method and path prefixes (gRPC paths are
///   `/package.Service/Method`).
/// * [`custom`](Self::custom): a closure.
#[derive(Clone)]
pub struct PolicySelector(Kind);

#[derive(Clone)]
enum Kind {
    Fixed(Arc<str>),
    Routes(RouteTable),
    Custom(Arc<PolicyFn>),
}

impl PolicySelector {
    /// Every request under `policy`.
    pub fn fixed(policy: impl Into<Arc<str>>) -> Self {
        Self(Kind::Fixed(policy.into()))
    }

    /// The policy of the best-matching route; unmatched requests pass unchecked unless the
    /// table has a [`fallback`](RouteTable::fallback).
    pub fn routes(table: RouteTable) -> Self {
        Self(Kind::Routes(table))
    }

    /// The policy `f` names; `None` lets the request through unchecked.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use distlimit_tower::PolicySelector;
    ///
    /// let (reads, writes): (Arc<str>, Arc<str>) = ("reads".into(), "writes".into());
    /// let select = PolicySelector::custom(move |req| {
    ///     Some(if req.method().is_safe() { reads.clone() } else { writes.clone() })
    /// });
    /// ```
    pub fn custom<F>(f: F) -> Self
    where
        F: Fn(&RequestInfo<'_>) -> Option<Arc<str>> + Send + Sync + 'static,
    {
        Self(Kind::Custom(Arc::new(f)))
    }

    /// The policies this selector can name: the fixed one, or every policy of the route table
    /// (a custom closure names none that can be known in advance).
    pub fn policies(&self) -> Vec<Arc<str>> {
        match &self.0 {
            Kind::Fixed(p) => vec![p.clone()],
            Kind::Routes(t) => t
                .routes
                .iter()
                .map(|r| r.policy.clone())
                .chain(t.fallback.clone())
                .collect(),
            Kind::Custom(_) => Vec::new(),
        }
    }

    /// The policy for a request, borrowing a fixed or routed policy's name.
    pub(crate) fn select_ref(&self, req: &RequestInfo<'_>) -> Option<Cow<'_, Arc<str>>> {
        match &self.0 {
            Kind::Fixed(p) => Some(Cow::Borrowed(p)),
            Kind::Routes(t) => t.lookup(req.method(), req.path()).map(Cow::Borrowed),
            Kind::Custom(f) => f(req).map(Cow::Owned),
        }
    }
}

impl From<&str> for PolicySelector {
    fn from(policy: &str) -> Self {
        Self::fixed(policy)
    }
}

impl From<RouteTable> for PolicySelector {
    fn from(table: RouteTable) -> Self {
        Self::routes(table)
    }
}

impl fmt::Debug for PolicySelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Fixed(p) => f.debug_tuple("PolicySelector::Fixed").field(p).finish(),
            Kind::Routes(t) => f.debug_tuple("PolicySelector::Routes").field(t).finish(),
            Kind::Custom(_) => f.write_str("PolicySelector::Custom(..)"),
        }
    }
}

/// Routes requests to policies by method and path prefix.
///
/// The longest matching prefix wins; at equal length a route for the request's method beats a
/// route for any method. A prefix matches whole path segments: `/api` matches `/api` and
/// `/api/users` but not `/apiary`; a prefix ending in `/` matches everything below it.
///
/// ```
/// use distlimit_tower::RouteTable;
/// use http::Method;
///
/// let routes = RouteTable::new()
///     .route(None, "/api", "api")
///     .route(Some(Method::POST), "/api/login", "login")
///     .route(None, "/grpc.health.v1.Health/", "health")
///     .fallback("default");
/// assert_eq!(routes.lookup(&Method::POST, "/api/login").map(|p| &**p), Some("login"));
/// assert_eq!(routes.lookup(&Method::GET, "/api/login").map(|p| &**p), Some("api"));
/// assert_eq!(routes.lookup(&Method::GET, "/apiary").map(|p| &**p), Some("default"));
/// ```
#[derive(Clone, Debug, Default)]
pub struct RouteTable {
    routes: Vec<Route>,
    fallback: Option<Arc<str>>,
}

#[derive(Clone, Debug)]
struct Route {
    method: Option<Method>,
    prefix: Box<str>,
    policy: Arc<str>,
}

impl RouteTable {
    /// An empty table: every request passes unchecked.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests with `method` (any method for `None`) under path `prefix` use `policy`.
    #[must_use]
    pub fn route(
        mut self,
        method: Option<Method>,
        prefix: impl Into<Box<str>>,
        policy: impl Into<Arc<str>>,
    ) -> Self {
        self.routes.push(Route {
            method,
            prefix: prefix.into(),
            policy: policy.into(),
        });
        self
    }

    /// Requests no route matches use `policy` (without a fallback they pass unchecked).
    #[must_use]
    pub fn fallback(mut self, policy: impl Into<Arc<str>>) -> Self {
        self.fallback = Some(policy.into());
        self
    }

    /// The policy for a request.
    pub fn lookup(&self, method: &Method, path: &str) -> Option<&Arc<str>> {
        // Reversed: of equally good routes, `max_by_key` keeps the last, the first added.
        let routes = self.routes.iter().rev();
        let matching = routes.filter(|r| {
            r.method.as_ref().is_none_or(|m| m == method) && prefix_matches(&r.prefix, path)
        });
        let best = matching.max_by_key(|r| (r.prefix.len(), r.method.is_some()));
        best.map(|r| &r.policy).or(self.fallback.as_ref())
    }
}

fn prefix_matches(prefix: &str, path: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || prefix.ends_with('/') || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_then_method_wins() {
        let t = RouteTable::new()
            .route(None, "/", "root")
            .route(Some(Method::GET), "/a", "get-a")
            .route(None, "/a", "any-a")
            .route(None, "/a/b", "any-ab");
        let get = |m: Method, p: &str| t.lookup(&m, p).map(|p| p.to_string());
        assert_eq!(get(Method::GET, "/a").as_deref(), Some("get-a"));
        assert_eq!(get(Method::POST, "/a").as_deref(), Some("any-a"));
        assert_eq!(get(Method::GET, "/a/b/c").as_deref(), Some("any-ab"));
        assert_eq!(get(Method::GET, "/a/bc").as_deref(), Some("get-a"));
        assert_eq!(get(Method::GET, "/ab").as_deref(), Some("root"));
        assert_eq!(get(Method::GET, "").as_deref(), None);
        assert_eq!(RouteTable::new().lookup(&Method::GET, "/"), None);
    }
}
