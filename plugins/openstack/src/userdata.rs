//! The `user_data` of a server: the create spec's user data and SSH key as
//! one cloud-init document, base64-encoded as Nova takes it.
//!
//! Nova authorises a key at boot only through a key pair (`key_name`), a
//! resource of the user's that berth would have to make and clean up, so
//! the spec's key goes to cloud-init, which the usual Linux images run (it
//! reads user data from Nova's metadata service or a config drive): as
//! `#cloud-config` `ssh_authorized_keys` alone, or, beside user data of the
//! caller's, as the second part of a MIME multipart document whose merge
//! rule appends to the caller's own keys instead of replacing them.

/// Nova's limit on `user_data`: 65535 characters of base64.
pub(crate) const MAX_ENCODED: usize = 65_535;

/// The user data to launch with, unencoded; `None` when there is none.
pub(crate) fn compose(
    user_data: Option<&str>,
    ssh_key: Option<&str>,
) -> Result<Option<String>, String> {
    let key = match ssh_key.map(str::trim) {
        None | Some("") => None,
        Some(k) if k.contains(['\n', '\r']) => {
            return Err("ssh public key: must be one line".into());
        }
        Some(k) => Some(k),
    };
    let text = match (user_data, key) {
        (None, None) => return Ok(None),
        (Some(data), None) => data.to_owned(),
        (None, Some(key)) => cloud_config(key),
        (Some(data), Some(key)) => multipart(data, key)?,
    };
    let encoded = text.len().div_ceil(3) * 4;
    if encoded > MAX_ENCODED {
        return Err(format!(
            "user data: {} bytes{}, {encoded} in base64; Nova takes at most {MAX_ENCODED} \
             characters of base64 ({} bytes)",
            text.len(),
            if key.is_some() {
                " with the ssh key"
            } else {
                ""
            },
            MAX_ENCODED / 4 * 3
        ));
    }
    Ok(Some(text))
}

fn cloud_config(key: &str) -> String {
    // A double-quoted YAML scalar: only `\` and `"` need escaping in one line.
    let quoted = key.replace('\\', "\\\\").replace('"', "\\\"");
    format!("#cloud-config\nssh_authorized_keys:\n  - \"{quoted}\"\n")
}

/// The cloud-init part type of user data, from its first line.
fn part_type(data: &str) -> Result<&'static str, String> {
    let start = data.trim_start_matches('\u{feff}');
    const TYPES: &[(&str, &str)] = &[
        ("#cloud-config-archive", "text/cloud-config-archive"),
        ("#cloud-config", "text/cloud-config"),
        ("#cloud-boothook", "text/cloud-boothook"),
        ("#include", "text/x-include-url"),
        ("#part-handler", "text/part-handler"),
        ("## template: jinja", "text/jinja2"),
        ("#!", "text/x-shellscript"),
    ];
    if start.to_ascii_lowercase().starts_with("content-type:") || start.starts_with("MIME-Version:")
    {
        return Err(
            "user data is already a MIME document; add the ssh key to it instead of passing one"
                .into(),
        );
    }
    Ok(TYPES
        .iter()
        .find(|(prefix, _)| start.starts_with(prefix))
        .map_or("text/plain", |(_, t)| t))
}

fn multipart(data: &str, key: &str) -> Result<String, String> {
    let kind = part_type(data)?;
    let mut boundary = "berth-user-data".to_owned();
    let mut n = 0;
    while data.contains(&boundary) {
        n += 1;
        boundary = format!("berth-user-data-{n}");
    }
    let mut out = format!(
        "Content-Type: multipart/mixed; boundary=\"{boundary}\"\nMIME-Version: 1.0\n\n\
         --{boundary}\nContent-Type: {kind}; charset=\"utf-8\"\nMIME-Version: 1.0\n\n"
    );
    out.push_str(data);
    if !data.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!(
        "--{boundary}\nContent-Type: text/cloud-config; charset=\"utf-8\"\nMIME-Version: 1.0\n\
         Merge-Type: list(append)+dict(no_replace,recurse_list)+str()\n\n{}--{boundary}--\n",
        cloud_config(key)
    ));
    Ok(out)
}

/// Standard base64 with padding (RFC 4648 §4), as `user_data` takes it.
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_vectors() {
        // RFC 4648 §10.
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain}");
        }
        assert_eq!(base64(&[0xff, 0xfe, 0xfd]), "//79");
    }

    const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample ops@example";

    #[test]
    fn user_data_alone_is_untouched() {
        assert_eq!(compose(None, None), Ok(None));
        assert_eq!(
            compose(Some("#!/bin/sh\necho hi\n"), None),
            Ok(Some("#!/bin/sh\necho hi\n".into()))
        );
        assert_eq!(
            compose(Some("anything"), Some("  ")),
            Ok(Some("anything".into()))
        );
    }

    #[test]
    fn key_alone_is_cloud_config() {
        assert_eq!(
            compose(None, Some(KEY)),
            Ok(Some(format!(
                "#cloud-config\nssh_authorized_keys:\n  - \"{KEY}\"\n"
            )))
        );
        assert_eq!(
            compose(None, Some(r#"ssh-rsa AAAA "quoted\" comment"#)),
            Ok(Some("#cloud-config\nssh_authorized_keys:\n  - \"ssh-rsa AAAA \\\"quoted\\\\\\\" comment\"\n".into()))
        );
        assert!(compose(None, Some("ssh-rsa AAAA\nruncmd: [rm]")).is_err());
    }

    #[test]
    fn both_make_a_multipart_document() {
        let got = compose(Some("#!/bin/sh\necho hi"), Some(KEY))
            .expect("composes")
            .expect("some");
        let want = format!(
            "Content-Type: multipart/mixed; boundary=\"berth-user-data\"\nMIME-Version: 1.0\n\n\
             --berth-user-data\nContent-Type: text/x-shellscript; charset=\"utf-8\"\nMIME-Version: 1.0\n\n\
             #!/bin/sh\necho hi\n\
             --berth-user-data\nContent-Type: text/cloud-config; charset=\"utf-8\"\nMIME-Version: 1.0\n\
             Merge-Type: list(append)+dict(no_replace,recurse_list)+str()\n\n\
             #cloud-config\nssh_authorized_keys:\n  - \"{KEY}\"\n--berth-user-data--\n"
        );
        assert_eq!(got, want);
        // The boundary never occurs in the caller's data.
        let got = compose(
            Some("#cloud-config\n# berth-user-data berth-user-data-1\n"),
            Some(KEY),
        )
        .expect("composes")
        .expect("some");
        assert!(got.starts_with("Content-Type: multipart/mixed; boundary=\"berth-user-data-2\""));
        assert!(got.contains("Content-Type: text/cloud-config; charset=\"utf-8\"\nMIME-Version: 1.0\n\n#cloud-config\n# berth"));
        assert!(
            compose(
                Some("Content-Type: multipart/mixed; boundary=x\n"),
                Some(KEY)
            )
            .is_err()
        );
    }

    #[test]
    fn part_types() {
        for (data, want) in [
            ("#cloud-config\n", "text/cloud-config"),
            ("#cloud-config-archive\n", "text/cloud-config-archive"),
            ("\u{feff}#!/bin/bash\n", "text/x-shellscript"),
            ("#include\nhttps://x\n", "text/x-include-url"),
            ("#cloud-boothook\n", "text/cloud-boothook"),
            ("## template: jinja\n", "text/jinja2"),
            ("plain words", "text/plain"),
        ] {
            assert_eq!(part_type(data), Ok(want), "{data:?}");
        }
    }

    #[test]
    fn size_limit() {
        // 49149 bytes are 65532 characters of base64; one more is 65536.
        let fits = "x".repeat(49_149);
        assert!(compose(Some(&fits), None).is_ok());
        let big = "x".repeat(49_150);
        assert!(compose(Some(&big), None).is_err_and(|m| m.contains("at most 65535")));
    }
}
