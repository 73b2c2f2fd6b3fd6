//! The `UserData` of a launch: the create spec's user data and SSH key as
//! one cloud-init document ([`berth_sdk::cloud_init`]), within EC2's limit,
//! base64-encoded as `RunInstances` takes it.

pub(crate) use berth_sdk::cloud_init::base64;

/// EC2's limit on user data, before base64.
pub(crate) const MAX_USER_DATA: usize = 16 * 1024;

/// The user data to launch with, unencoded; `None` when there is none.
pub(crate) fn compose(
    user_data: Option<&str>,
    ssh_key: Option<&str>,
) -> Result<Option<String>, String> {
    let Some(text) = berth_sdk::cloud_init::compose(user_data, ssh_key)? else {
        return Ok(None);
    };
    if text.len() > MAX_USER_DATA {
        let with_key = ssh_key.is_some_and(|k| !k.trim().is_empty());
        return Err(format!(
            "user data: {} bytes{}, EC2 takes at most {MAX_USER_DATA}",
            text.len(),
            if with_key { " with the ssh key" } else { "" }
        ));
    }
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_limit() {
        let big = "x".repeat(MAX_USER_DATA + 1);
        assert!(compose(Some(&big), None).is_err_and(|m| m.contains("at most 16384")));
        let fits = "x".repeat(MAX_USER_DATA);
        assert!(compose(Some(&fits), None).is_ok());
        let key = "ssh-ed25519 AAAA ops@example";
        let near = "x".repeat(MAX_USER_DATA - 10);
        assert!(compose(Some(&near), Some(key)).is_err_and(|m| m.contains("with the ssh key")));
    }
}
