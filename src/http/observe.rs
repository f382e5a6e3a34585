//! Around every request: HTTP metrics (every request counted by route
//! pattern, method and status, and timed; a request a client marks as a
//! retry, `X-TypeSafe-Retry-Count`, counted by its retry number; paths that
//! match no route share the label `unmatched`, so the label set stays
//! bounded whatever clients send), a handler's panic caught: answered
//! 500 once in the route's shape, logged, and counted, the server serving
//! on; and a handler whose client left dropped, with its work (`peer.rs`),
//! counted with status 499.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{web, Error};
use futures::FutureExt;

use super::error::ApiError;
use super::systemone::WireError;
use super::AppState;

/// Methods kept as labels; others count as `OTHER`.
const METHODS: &[&str] = &["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"];

/// The header typesafe-sdk sends on a retry: how many attempts came before.
const RETRY_COUNT: &str = "x-typesafe-retry-count";

/// The `retry` label of a retry count header's value: `1` to `3`, `4+`, or
/// `invalid` (not a whole number from 1).
fn retry_label(value: &[u8]) -> &'static str {
    match std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        Some(1) => "1",
        Some(2) => "2",
        Some(3) => "3",
        Some(n) if n >= 4 => "4+",
        _ => "invalid",
    }
}

pub async fn record(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, Error> {
    let started = Instant::now();
    let state = req.app_data::<web::Data<AppState>>().cloned();
    let method = req.method().as_str().to_string();
    let method = if METHODS.contains(&method.as_str()) {
        method
    } else {
        "OTHER".to_string()
    };
    let retry = req
        .headers()
        .get(RETRY_COUNT)
        .map(|v| retry_label(v.as_bytes()));
    // The pattern the router will match (actix finds it from the path).
    let route = req
        .match_pattern()
        .filter(|p| super::ROUTES.iter().any(|e| e.path == *p))
        .unwrap_or_else(|| "unmatched".to_string());
    // A client that leaves drops its handler, and with it its engine job
    // (`peer.rs`); its request is counted 499, as nginx logs one.
    let peer = req.conn_data::<super::peer::Peer>().cloned();
    let handled = AssertUnwindSafe(next.call(req)).catch_unwind();
    let res = tokio::select! {
        biased;
        handled = handled => match handled {
            Ok(res) => res,
            Err(panic) => Err(panicked(&*panic, &route)),
        },
        () = super::peer::left(peer) => Err(client_left(&route)),
    };
    if let Some(state) = state {
        let status = match &res {
            Ok(res) => res.status(),
            Err(e) => e.as_response_error().status_code(),
        };
        let status = status.as_u16().to_string();
        let m = &state.metrics;
        m.http_requests
            .with_label_values(&[&route, &method, &status])
            .inc();
        m.http_request_seconds
            .with_label_values(&[&route, &method])
            .observe(started.elapsed().as_secs_f64());
        if let Some(retry) = retry {
            m.client_retries.with_label_values(&[&route, retry]).inc();
        }
    }
    res
}

/// The status of a request whose client left before its answer (nginx's
/// "client closed request"); nobody reads it but the logs and metrics.
const CLIENT_LEFT: u16 = 499;

fn client_left(route: &str) -> Error {
    tracing::debug!("a client of {route} left before its answer; its work was dropped");
    let status = actix_web::http::StatusCode::from_u16(CLIENT_LEFT).expect("a valid status");
    actix_web::error::InternalError::new("the client closed the connection", status).into()
}

/// The answer to a request whose handler panicked: a 500 in its route's
/// shape, the panic logged; the server serves on.
fn panicked(panic: &(dyn std::any::Any + Send), route: &str) -> Error {
    let message = crate::text_route::panic_message(panic);
    tracing::error!("the handler of {route} panicked: {message}; answered 500");
    let e = ApiError::Internal(format!(
        "the server failed on this request ({message}); it logged the fault and serves on"
    ));
    match route {
        "/v1/systemone" => WireError::Api(e).into(),
        _ => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test as http;
    use actix_web::{middleware, App, HttpResponse};

    /// A handler that panics gets a 500 in its route's shape, once, and the
    /// worker serves the next request.
    #[actix_web::test]
    async fn a_panicking_handler_answers_500_and_the_server_serves_on() {
        let app = http::init_service(
            App::new()
                .wrap(middleware::from_fn(record))
                .route(
                    "/v1/systemone",
                    web::post().to(|| async {
                        panic!("the fault hook of the unit tests");
                        #[allow(unreachable_code)]
                        HttpResponse::Ok().finish()
                    }),
                )
                .route(
                    "/v1/decide",
                    web::post().to(|| async {
                        panic!("a {} fault", "formatted");
                        #[allow(unreachable_code)]
                        HttpResponse::Ok().finish()
                    }),
                )
                .route("/health", web::get().to(HttpResponse::Ok)),
        )
        .await;
        // What actix answers a request with: the response, or the error's.
        let answer = |req| {
            let app = &app;
            async move {
                let res = match http::try_call_service(app, req).await {
                    Ok(res) => res.map_into_boxed_body().into_parts().1,
                    Err(e) => e.error_response(),
                };
                let status = res.status().as_u16();
                let body = actix_web::body::to_bytes(res.into_body())
                    .await
                    .ok()
                    .unwrap();
                (
                    status,
                    serde_json::from_slice::<serde_json::Value>(&body).ok(),
                )
            }
        };
        for _ in 0..2 {
            let (status, body) =
                answer(http::TestRequest::post().uri("/v1/systemone").to_request()).await;
            let body = body.unwrap();
            assert_eq!(status, 500);
            assert_eq!(body["detail"]["error_type"], "api_error", "{body}");
            let message = body["detail"]["message"].as_str().unwrap();
            assert!(
                message.contains("the fault hook of the unit tests"),
                "{body}"
            );

            let (status, body) =
                answer(http::TestRequest::post().uri("/v1/decide").to_request()).await;
            let body = body.unwrap();
            assert_eq!(status, 500);
            assert_eq!(body["error"]["type"], "server_error", "{body}");
            assert!(body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("a formatted fault"));

            let (status, _) = answer(http::TestRequest::get().uri("/health").to_request()).await;
            assert_eq!(status, 200);
        }
    }

    #[test]
    fn retry_numbers_fall_in_a_bounded_label_set() {
        for (value, label) in [
            ("1", "1"),
            ("2", "2"),
            (" 3 ", "3"),
            ("4", "4+"),
            ("1000000", "4+"),
            ("0", "invalid"),
            ("-1", "invalid"),
            ("two", "invalid"),
            ("", "invalid"),
        ] {
            assert_eq!(retry_label(value.as_bytes()), label, "{value:?}");
        }
        assert_eq!(retry_label(&[0xff, 0x31]), "invalid");
    }
}
