//! Who is calling: a bearer token from the config names a client (acting as
//! the requestor of the token's name) or an admin. With no tokens
//! configured, which the config allows only on a loopback address, every
//! caller is an admin named `anonymous`.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};

use super::error::ApiError;
pub use crate::runtime::Caller;
use berth_config::{Role, Token};
use berth_types::ErrorCode;

/// The caller a request's `Authorization: Bearer …` header names.
pub(super) fn authenticate(tokens: &[Token], headers: &HeaderMap) -> Result<Caller, ApiError> {
    if tokens.is_empty() {
        return Ok(anonymous());
    }
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| unauthorized("send `Authorization: Bearer <token>`"))?;
    let presented = bearer_value(value)
        .ok_or_else(|| unauthorized("the Authorization header must be `Bearer <token>`"))?;
    caller_of(tokens, presented)
}

/// The token of a request's `Authorization: Bearer …` header, if it has
/// one.
pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION).and_then(bearer_value)
}

fn bearer_value(value: &HeaderValue) -> Option<&str> {
    let (scheme, rest) = value.to_str().ok()?.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// The caller `presented`, a token's secret, names.
pub(super) fn caller_of(tokens: &[Token], presented: &str) -> Result<Caller, ApiError> {
    if tokens.is_empty() {
        return Ok(anonymous());
    }
    // Every token is compared, each in constant time, so the answer's
    // timing says nothing about which one came close.
    let mut found = None;
    for t in tokens {
        if same(t.secret.as_bytes(), presented.as_bytes()) {
            found = Some(t);
        }
    }
    let t = found.ok_or_else(|| unauthorized("the token is not valid"))?;
    let name = t.name.clone();
    Ok(match t.role {
        Role::Client => Caller::Client { name },
        Role::Admin => Caller::Admin { name },
    })
}

fn anonymous() -> Caller {
    Caller::Admin {
        name: "anonymous".into(),
    }
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, message)
}

/// Compares two secrets in time that depends only on their lengths
/// (`subtle`, whose comparison the optimiser cannot turn into an early
/// exit).
fn same(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Vec<Token> {
        vec![
            Token {
                name: "ci".into(),
                role: Role::Client,
                secret: "client-secret-0123456789".into(),
                max_nodes: None,
            },
            Token {
                name: "ops".into(),
                role: Role::Admin,
                secret: "admin-secret-0123456789".into(),
                max_nodes: None,
            },
        ]
    }

    fn with(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, value.parse().unwrap());
        h
    }

    #[test]
    fn tokens_name_their_caller_and_role() {
        let t = tokens();
        let ci = authenticate(&t, &with("Bearer client-secret-0123456789")).unwrap();
        assert_eq!(ci, Caller::Client { name: "ci".into() });
        assert!(ci.may_act_for("ci") && !ci.may_act_for("ops"));
        let ops = authenticate(&t, &with("bearer admin-secret-0123456789")).unwrap();
        assert!(ops.is_admin() && ops.may_act_for("anyone"));
    }

    #[test]
    fn missing_malformed_and_wrong_tokens_are_401() {
        let t = tokens();
        for h in [
            HeaderMap::new(),
            with("Basic Y2k6eA=="),
            with("Bearer client-secret-012345678"),
            with("Bearer"),
        ] {
            let e = authenticate(&t, &h).unwrap_err();
            assert_eq!(e.status, StatusCode::UNAUTHORIZED, "{h:?}");
        }
    }

    #[test]
    fn no_tokens_means_everyone_is_an_admin() {
        let c = authenticate(&[], &HeaderMap::new()).unwrap();
        assert!(c.is_admin());
    }
}
