//! The one place EC2's failures become the contract's errors: the error
//! code from the XML body first, the HTTP status when there is no code.

use berth_sdk::error;
use berth_sdk::http::Response;
use berth_sdk::types::Error;

use crate::xml::{self, ApiError};

/// How long to hold calls back after a throttle that named no
/// `Retry-After` (EC2 never does). EC2 refills its request buckets every
/// second; two leave room for the other callers sharing the account.
pub(crate) const DEFAULT_RETRY_AFTER_MS: u64 = 2000;

/// What an error code means to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    RateLimited,
    Quota,
    CapacityForType,
    CapacityGeneral,
    NotFound,
    Unauthorized,
    /// The label's options or image name something that does not exist.
    InvalidConfig,
    Transient,
    /// Not a code this driver knows: the status decides.
    Other,
}

fn kind(code: &str) -> Kind {
    match code {
        "RequestLimitExceeded"
        | "Throttling"
        | "ThrottlingException"
        | "RequestThrottled"
        | "RequestThrottledException"
        | "TooManyRequestsException" => Kind::RateLimited,
        "InstanceLimitExceeded"
        | "VcpuLimitExceeded"
        | "MaxSpotInstanceCountExceeded"
        | "VolumeLimitExceeded" => Kind::Quota,
        "InsufficientInstanceCapacity" => Kind::CapacityForType,
        "InsufficientCapacity"
        | "InsufficientHostCapacity"
        | "InsufficientFreeAddressesInSubnet" => Kind::CapacityGeneral,
        "InvalidInstanceID.NotFound" | "InvalidInstanceID.Malformed" | "InvalidInstanceID" => {
            Kind::NotFound
        }
        "AuthFailure"
        | "UnauthorizedOperation"
        | "SignatureDoesNotMatch"
        | "InvalidClientTokenId"
        | "MissingAuthenticationToken"
        | "IncompleteSignature"
        | "RequestExpired"
        | "OptInRequired"
        | "Blocked"
        | "AccessDenied"
        | "AccessDeniedException" => Kind::Unauthorized,
        "InternalError" | "InternalFailure" | "ServiceUnavailable" | "Unavailable" => {
            Kind::Transient
        }
        _ if [
            "InvalidAMIID.",
            "InvalidSubnetID.",
            "InvalidGroup.NotFound",
            "InvalidGroupId.",
            "InvalidKeyPair.",
        ]
        .iter()
        .any(|p| code.starts_with(p)) =>
        {
            Kind::InvalidConfig
        }
        _ => Kind::Other,
    }
}

/// The error for a failed EC2 call. `instance_type` is what a create asked
/// for, so a capacity error can name it.
pub(crate) fn from_response(resp: &Response, instance_type: Option<&str>) -> Error {
    let body = resp.text();
    let parsed = xml::api_error(&body);
    let message = match &parsed {
        Some(ApiError {
            code,
            message,
            request_id,
        }) => {
            let mut m = code.clone();
            if !message.is_empty() {
                m.push_str(": ");
                m.push_str(message);
            }
            if let Some(id) = request_id {
                m.push_str(&format!(" (request id {id})"));
            }
            m
        }
        None => format!(
            "EC2 answered {}: {}",
            resp.status,
            body.trim().chars().take(200).collect::<String>()
        ),
    };
    let kind = parsed.as_ref().map_or(Kind::Other, |e| kind(&e.code));
    let retry_after_ms = || {
        resp.header("retry-after")
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map_or(DEFAULT_RETRY_AFTER_MS, |secs| secs.saturating_mul(1000))
    };
    match (kind, resp.status) {
        (Kind::RateLimited, _) | (Kind::Other, 429) => {
            error::rate_limited(retry_after_ms(), message)
        }
        (Kind::Quota, _) => error::quota_exceeded(message),
        (Kind::CapacityForType, _) => match instance_type {
            Some(t) => error::capacity_for_type(t, message),
            None => error::capacity_general(message),
        },
        (Kind::CapacityGeneral, _) => error::capacity_general(message),
        (Kind::NotFound, _) => error::not_found(message),
        (Kind::Unauthorized, _) | (Kind::Other, 401 | 403) => error::unauthorized(message),
        (Kind::InvalidConfig, _) => error::invalid_config(message),
        (Kind::Transient, _) | (Kind::Other, 500..=599) => error::transient(message),
        (Kind::Other, _) => error::permanent(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_sdk::types::{CapacityScope, RateLimit};

    fn resp(status: u16, headers: &[(&str, &str)], body: &str) -> Response {
        Response {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            body: body.as_bytes().to_vec(),
        }
    }

    fn ec2(code: &str) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code>\
             <Message>said {code}</Message></Error></Errors><RequestID>req-1</RequestID></Response>"
        )
    }

    /// The error's case and payload in a comparable form.
    fn case(e: &Error) -> String {
        match e {
            Error::RateLimited(RateLimit { retry_after_ms, .. }) => {
                format!("rate-limited {retry_after_ms}")
            }
            Error::QuotaExceeded(_) => "quota-exceeded".into(),
            Error::Capacity(c) => match &c.scope {
                CapacityScope::InstanceType(t) => format!("capacity {t}"),
                CapacityScope::General => "capacity general".into(),
            },
            Error::NotFound(_) => "not-found".into(),
            Error::Unauthorized(_) => "unauthorized".into(),
            Error::InvalidConfig(_) => "invalid-config".into(),
            Error::Transient(_) => "transient".into(),
            Error::Permanent(_) => "permanent".into(),
        }
    }

    fn check(
        status: u16,
        headers: &[(&str, &str)],
        body: &str,
        instance_type: Option<&str>,
        want: &str,
    ) {
        let e = from_response(&resp(status, headers, body), instance_type);
        assert_eq!(case(&e), want, "{status} {body}");
    }

    #[test]
    fn maps_codes() {
        let t = Some("c7i.large");
        check(
            503,
            &[],
            &ec2("RequestLimitExceeded"),
            t,
            "rate-limited 2000",
        );
        check(
            503,
            &[("retry-after", "7")],
            &ec2("RequestLimitExceeded"),
            t,
            "rate-limited 7000",
        );
        check(
            400,
            &[("retry-after", "soon")],
            &ec2("Throttling"),
            None,
            "rate-limited 2000",
        );
        check(400, &[], &ec2("InstanceLimitExceeded"), t, "quota-exceeded");
        check(400, &[], &ec2("VcpuLimitExceeded"), t, "quota-exceeded");
        check(
            400,
            &[],
            &ec2("MaxSpotInstanceCountExceeded"),
            t,
            "quota-exceeded",
        );
        check(
            500,
            &[],
            &ec2("InsufficientInstanceCapacity"),
            t,
            "capacity c7i.large",
        );
        check(
            500,
            &[],
            &ec2("InsufficientInstanceCapacity"),
            None,
            "capacity general",
        );
        check(
            400,
            &[],
            &ec2("InsufficientFreeAddressesInSubnet"),
            t,
            "capacity general",
        );
        check(
            400,
            &[],
            &ec2("InvalidInstanceID.NotFound"),
            None,
            "not-found",
        );
        check(
            400,
            &[],
            &ec2("InvalidInstanceID.Malformed"),
            None,
            "not-found",
        );
        for code in [
            "AuthFailure",
            "UnauthorizedOperation",
            "SignatureDoesNotMatch",
            "InvalidClientTokenId",
        ] {
            check(403, &[], &ec2(code), None, "unauthorized");
            check(400, &[], &ec2(code), None, "unauthorized");
        }
        check(400, &[], &ec2("InvalidAMIID.NotFound"), t, "invalid-config");
        check(
            400,
            &[],
            &ec2("InvalidSubnetID.NotFound"),
            t,
            "invalid-config",
        );
        check(400, &[], &ec2("InvalidGroup.NotFound"), t, "invalid-config");
        check(
            400,
            &[],
            &ec2("InvalidKeyPair.NotFound"),
            t,
            "invalid-config",
        );
        check(400, &[], &ec2("InvalidParameterValue"), t, "permanent");
        check(
            400,
            &[],
            &ec2("IdempotentParameterMismatch"),
            t,
            "permanent",
        );
        check(500, &[], &ec2("InternalError"), t, "transient");
        check(503, &[], &ec2("Unavailable"), t, "transient");
        check(502, &[], &ec2("SomethingNew"), t, "transient");
        check(400, &[], &ec2("SomethingNew"), t, "permanent");
    }

    #[test]
    fn maps_statuses_without_a_code() {
        check(
            429,
            &[("retry-after", "3")],
            "slow down",
            None,
            "rate-limited 3000",
        );
        check(401, &[], "", None, "unauthorized");
        check(403, &[], "<html>denied</html>", None, "unauthorized");
        check(500, &[], "<html>oops</html>", None, "transient");
        check(504, &[], "", None, "transient");
        check(400, &[], "bad", None, "permanent");
        check(404, &[], "", None, "permanent");
    }

    #[test]
    fn messages_carry_code_text_and_request_id() {
        let e = from_response(&resp(400, &[], &ec2("InvalidInstanceID.NotFound")), None);
        assert!(
            matches!(&e, Error::NotFound(m) if m == "InvalidInstanceID.NotFound: said InvalidInstanceID.NotFound (request id req-1)"),
            "{e:?}"
        );
        let e = from_response(&resp(502, &[], "<html>bad gateway</html>"), None);
        assert!(
            matches!(&e, Error::Transient(m) if m == "EC2 answered 502: <html>bad gateway</html>"),
            "{e:?}"
        );
    }
}
