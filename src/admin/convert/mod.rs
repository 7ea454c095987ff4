//! Between criguard's types and the admin API's messages: the only place
//! that knows both. Domain → message cannot fail; message → domain fails
//! on an enum value this version does not know (a newer criguard), naming
//! the message, the field and the value.
//!
//! One file per family: `pod` (pods, containers and their enums),
//! `status` (evictions, ranks, conditions), `oom` (kernel OOM kills),
//! `usage` (disk and process usage).

mod oom;
mod pod;
mod status;
mod usage;

pub use status::{ConditionsReport, Observed};

/// A message this version cannot turn into criguard's types.
#[derive(Debug, thiserror::Error)]
#[error("{message}.{field}: unknown value {value}")]
pub struct ConvertError {
    /// The message, e.g. `Pod`.
    pub message: &'static str,
    /// The field, e.g. `qos`.
    pub field: &'static str,
    /// The value received.
    pub value: String,
}

fn unknown(message: &'static str, field: &'static str, value: impl ToString) -> ConvertError {
    ConvertError {
        message,
        field,
        value: value.to_string(),
    }
}
