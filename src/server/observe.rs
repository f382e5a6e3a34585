//! HTTP metrics: every request counted by route pattern, method and status,
//! and timed. Paths that match no route share the label `unmatched`, so the
//! label set stays bounded whatever clients send.

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{web, Error};

use super::AppState;

/// Methods kept as labels; others count as `OTHER`.
const METHODS: &[&str] = &["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"];

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
    let res = next.call(req).await?;
    if let Some(state) = state {
        let route = res
            .request()
            .match_pattern()
            .filter(|p| super::ROUTES.iter().any(|(_, r)| r == p))
            .unwrap_or_else(|| "unmatched".to_string());
        let status = res.status().as_u16().to_string();
        let m = &state.metrics;
        m.http_requests
            .with_label_values(&[&route, &method, &status])
            .inc();
        m.http_request_seconds
            .with_label_values(&[&route, &method])
            .observe(started.elapsed().as_secs_f64());
    }
    Ok(res)
}
