//! [`ResponseFuture`]: checks a request, then runs the inner service or answers itself.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use tower_service::Service;

use crate::RateLimitBody;
use crate::headers::Computed;
use crate::layer::{CheckFuture, Step, is_grpc};
use crate::response::Rejection;
use crate::settle::Settlement;

pin_project_lite::pin_project! {
    /// The future of a [`RateLimit`](crate::RateLimit) call: the check (the request's one boxed
    /// future), then the inner service's own future, unboxed.
    pub struct ResponseFuture<Inner, ReqBody>
    where
        Inner: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<Inner, ReqBody>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<Inner, ReqBody>
    where
        Inner: Service<Request<ReqBody>>,
    {
        Checking {
            check: CheckFuture,
            pending: Option<(Inner, Request<ReqBody>)>,
        },
        Calling {
            #[pin]
            call: Inner::Future,
            headers: Option<Computed>,
            settle: Option<Box<Settlement>>,
        },
        Rejected {
            rejection: Option<(Rejection, bool)>,
        },
        Done,
    }
}

impl<Inner, ReqBody> ResponseFuture<Inner, ReqBody>
where
    Inner: Service<Request<ReqBody>>,
{
    /// Checks `req`, then hands it to `inner` (polled ready) if allowed.
    pub(crate) fn checking(check: CheckFuture, inner: Inner, req: Request<ReqBody>) -> Self {
        Self {
            state: State::Checking {
                check,
                pending: Some((inner, req)),
            },
        }
    }

    /// The inner service's response, with `headers` added, its reservations settled when its
    /// body ends.
    pub(crate) fn calling(
        call: Inner::Future,
        headers: Option<Computed>,
        settle: Option<Box<Settlement>>,
    ) -> Self {
        Self {
            state: State::Calling {
                call,
                headers,
                settle,
            },
        }
    }

    /// The layer's own answer, as a gRPC status when `grpc`.
    pub(crate) fn rejected(rejection: Rejection, grpc: bool) -> Self {
        Self {
            state: State::Rejected {
                rejection: Some((rejection, grpc)),
            },
        }
    }
}

impl<Inner, ReqBody, ResBody> Future for ResponseFuture<Inner, ReqBody>
where
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<RateLimitBody<ResBody>>, Inner::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Checking { check, pending } => {
                    let step = ready!(check.as_mut().poll(cx));
                    // Taken once: the state changes right after.
                    let Some((mut inner, req)) = pending.take() else {
                        return Poll::Pending;
                    };
                    match step {
                        Step::Pass(headers, settle) => {
                            let call = inner.call(req);
                            state.set(State::Calling {
                                call,
                                headers,
                                settle,
                            });
                        }
                        Step::Reject(rejection) => {
                            let grpc = is_grpc(req.headers());
                            state.set(State::Done);
                            return Poll::Ready(Ok(rejection.into_response(grpc)));
                        }
                    }
                }
                StateProj::Calling {
                    call,
                    headers,
                    settle,
                } => {
                    let result = ready!(call.poll(cx));
                    let headers = headers.take();
                    // An error drops the reservations: settled as a dropped response.
                    let settle = settle.take();
                    state.set(State::Done);
                    let mut response = match settle {
                        None => result?.map(RateLimitBody::inner),
                        Some(mut settle) => {
                            let (parts, body) = result?.into_parts();
                            settle.head(&parts);
                            Response::from_parts(parts, RateLimitBody::settled(body, settle))
                        }
                    };
                    if let Some(headers) = headers {
                        headers.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Rejected { rejection } => {
                    let answer = rejection.take();
                    state.set(State::Done);
                    return match answer {
                        Some((rejection, grpc)) => Poll::Ready(Ok(rejection.into_response(grpc))),
                        None => Poll::Pending,
                    };
                }
                // Polled after completion: a future may then do anything but must not be
                // relied on; it stays pending.
                StateProj::Done => return Poll::Pending,
            }
        }
    }
}
