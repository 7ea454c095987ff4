//! The relay's metrics: each CRI call's duration by method and gRPC code
//! (the connection and held-bytes gauges are [`super::budget`]'s).

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of one CRI call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// `service/method`, e.g. `runtime.v1.RuntimeService/Version`; `other`
    /// for paths outside CRI (keeps the label set bounded).
    pub method: &'static str,
    /// gRPC status code name, e.g. `OK`, `NotFound`; `Cancelled` when the
    /// client reset the call before its answer ended.
    pub code: &'static str,
}

/// Metrics of the CRI proxy.
#[derive(Clone, Debug)]
pub struct CriMetrics {
    duration: Family<CallLabels, Histogram>,
}

impl Default for CriMetrics {
    fn default() -> Self {
        let duration = Family::<CallLabels, Histogram>::new_with_constructor(|| {
            // 50 µs … ~3.3 s.
            Histogram::new(exponential_buckets(0.000_05, 2.0, 17))
        });
        Self { duration }
    }
}

impl CriMetrics {
    /// Registers the call durations and the budget's gauges.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "criguard_cri_request_duration_seconds",
            "CRI calls through criguard: time from request to the end of the answer, by method and gRPC code",
            self.duration.clone(),
        );
        super::budget::register(registry);
    }

    /// Records one finished call of `method` (a label from `cri::methods`).
    pub fn observe(&self, method: &'static str, code: i32, started: Instant) {
        let labels = CallLabels {
            method,
            code: code_name(code),
        };
        self.duration
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
    }
}

/// The canonical name of a gRPC status code.
pub fn code_name(code: i32) -> &'static str {
    use tonic::Code;
    match Code::from_i32(code) {
        Code::Ok => "OK",
        Code::Cancelled => "Cancelled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}
