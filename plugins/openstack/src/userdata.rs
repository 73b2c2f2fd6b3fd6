//! The `user_data` of a server: the create spec's user data and SSH key as
//! one cloud-init document ([`berth_sdk::cloud_init`]), base64-encoded as
//! Nova takes it, within Nova's limit.
//!
//! Nova authorises a key at boot only through a key pair (`key_name`), a
//! resource of the user's that berth would have to make and clean up, so
//! the spec's key goes to cloud-init, which the usual Linux images run (it
//! reads user data from Nova's metadata service or a config drive).

pub(crate) use berth_sdk::cloud_init::base64;

/// Nova's limit on `user_data`: 65535 characters of base64.
pub(crate) const MAX_ENCODED: usize = 65_535;

/// The user data to launch with, unencoded; `None` when there is none.
pub(crate) fn compose(
    user_data: Option<&str>,
    ssh_key: Option<&str>,
) -> Result<Option<String>, String> {
    let Some(text) = berth_sdk::cloud_init::compose(user_data, ssh_key)? else {
        return Ok(None);
    };
    let encoded = text.len().div_ceil(3) * 4;
    if encoded > MAX_ENCODED {
        let with_key = ssh_key.is_some_and(|k| !k.trim().is_empty());
        return Err(format!(
            "user data: {} bytes{}, {encoded} in base64; Nova takes at most {MAX_ENCODED} \
             characters of base64 ({} bytes)",
            text.len(),
            if with_key { " with the ssh key" } else { "" },
            MAX_ENCODED / 4 * 3
        ));
    }
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_limit() {
        // 49149 bytes are 65532 characters of base64; one more is 65536.
        let fits = "x".repeat(49_149);
        assert!(compose(Some(&fits), None).is_ok());
        let big = "x".repeat(49_150);
        assert!(compose(Some(&big), None).is_err_and(|m| m.contains("at most 65535")));
    }
}
