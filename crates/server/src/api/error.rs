//! An error answer: its status, its stable [`ErrorCode`], its message and
//! the field at fault, and how the pool's refusals map to them.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::runtime::ServiceError;
use berth_core::pool::{Conflict, Refused, Unreadable};
use berth_types::{self as types, ErrorCode};

// ---- errors -------------------------------------------------------------

/// An error response: status, stable code, message, and the field at fault.
#[derive(Debug)]
pub struct ApiError {
    pub(super) status: StatusCode,
    pub(super) code: ErrorCode,
    pub(super) message: String,
    pub(super) field: Option<String>,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
        }
    }

    pub(super) fn bad(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        let field = field.into();
        let message = format!("{field}: {}", message.into());
        ApiError {
            field: Some(field),
            ..ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message)
        }
    }

    pub(super) fn not_found(what: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, what)
    }

    pub(super) fn forbidden(what: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, what)
    }

    pub(super) fn stopping() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Stopping,
            "berth is shutting down; try again once it is back",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = types::ErrorBody {
            error: types::ErrorDetail {
                code: self.code.as_str().to_owned(),
                message: self.message,
                field: self.field,
            },
        };
        let mut r = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"berth\""),
            );
        }
        if self.code.try_again_soon() {
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        r
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> ApiError {
        let message = e.to_string();
        match e {
            ServiceError::Stopped => ApiError::stopping(),
            ServiceError::Forbidden(m) => ApiError::forbidden(m),
            ServiceError::Busy(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Busy, message)
            }
            ServiceError::StoreFailed(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::StoreUnwritable,
                message,
            ),
            ServiceError::StoreUnavailable(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::StoreUnavailable,
                message,
            ),
            ServiceError::Standby(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Standby, message)
            }
            ServiceError::Refused(Refused::Empty) => ApiError::bad("labels", message),
            ServiceError::Refused(Refused::DuplicateLabel(_) | Refused::Removed(_)) => {
                ApiError::bad("labels", message)
            }
            ServiceError::Refused(Refused::TooMany { .. } | Refused::OverCap(_)) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::Unsatisfiable,
                message,
            ),
            ServiceError::Refused(Refused::KeyReused { .. }) => ApiError {
                field: Some(super::requests::IDEMPOTENCY_KEY_FIELD.into()),
                ..ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    ErrorCode::IdempotencyKeyReused,
                    message,
                )
            },
            ServiceError::Conflict(Conflict::NoSuchNode | Conflict::NoSuchRequest) => {
                ApiError::not_found(message)
            }
            ServiceError::Conflict(_) | ServiceError::Reconfigure(_) => {
                ApiError::new(StatusCode::CONFLICT, ErrorCode::Conflict, message)
            }
        }
    }
}

pub(super) type Result<T> = std::result::Result<T, ApiError>;

impl From<Unreadable> for ApiError {
    fn from(e: Unreadable) -> ApiError {
        match e {
            Unreadable::UnknownLabel { .. } => ApiError {
                field: Some(e.field()),
                ..ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    ErrorCode::UnknownLabel,
                    e.to_string(),
                )
            },
            e if e.too_large() => ApiError {
                field: Some(e.field()),
                ..ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    ErrorCode::MetadataTooLarge,
                    format!("{}: {e}", e.field()),
                )
            },
            e => ApiError::bad(e.field(), e.to_string()),
        }
    }
}
