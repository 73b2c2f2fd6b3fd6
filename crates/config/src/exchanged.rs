//! Where a credential's secrets are read from, and the settings of the
//! credentials the host exchanges for tokens (Keystone, OAuth2 client
//! credentials, Google service accounts) or presents as a client
//! certificate. Plain settings: `berth-plugin` reads the files and makes
//! the exchanges.

use std::fmt;
use std::path::PathBuf;

use crate::sandbox::Secret;

/// The largest secret file read, in bytes: a key file or a password, never
/// more than a few KiB.
pub const MAX_SECRET_FILE: u64 = 1 << 20;

/// Where one secret comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// From the environment (`${NAME}` in the config), read once at start.
    Value(Secret),
    /// From a file (the `*-file` key), read again at each exchange and, for
    /// kinds with none, at start and on `SIGHUP`: a rotated file is used
    /// without a restart.
    File(PathBuf),
}

impl fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::Value(_) => f.write_str("<from the environment>"),
            SecretSource::File(p) => write!(f, "<file {}>", p.display()),
        }
    }
}

impl SecretSource {
    /// The secret as it is now. A file's text loses one trailing newline
    /// (`\n` or `\r\n`), which editors and `echo` add. The error names the
    /// file and never its content.
    pub fn read(&self) -> Result<Secret, String> {
        match self {
            SecretSource::Value(s) => Ok(s.clone()),
            SecretSource::File(path) => {
                let shown = path.display();
                let meta =
                    std::fs::metadata(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
                if meta.len() > MAX_SECRET_FILE {
                    return Err(format!(
                        "{shown} is {} bytes, more than a secret file may be ({MAX_SECRET_FILE})",
                        meta.len()
                    ));
                }
                let bytes = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
                let mut text =
                    String::from_utf8(bytes).map_err(|_| format!("{shown} is not UTF-8 text"))?;
                if text.ends_with('\n') {
                    text.pop();
                    if text.ends_with('\r') {
                        text.pop();
                    }
                }
                if text.is_empty() {
                    return Err(format!("{shown} is empty"));
                }
                Ok(Secret::new(text))
            }
        }
    }

    /// Whether it is read from a file, so may change while berth runs.
    pub fn is_file(&self) -> bool {
        matches!(self, SecretSource::File(_))
    }
}

/// A user or a project in Keystone: by id, or by name within a domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeystoneRef {
    Id(String),
    Name { name: String, domain: String },
}

/// How Keystone is asked for a token.
#[derive(Clone, Debug)]
pub enum KeystoneMethod {
    /// `password`: a user's password, for a project.
    Password {
        user: KeystoneRef,
        password: SecretSource,
        project: Option<KeystoneRef>,
    },
    /// `application_credential`: scoped by Keystone when it was made.
    ApplicationCredential { id: String, secret: SecretSource },
}

/// `kind = "keystone"`: OpenStack Identity v3. The token is sent as
/// `X-Auth-Token`.
#[derive(Clone, Debug)]
pub struct Keystone {
    /// The Identity v3 endpoint, e.g. `https://keystone.example.com:5000/v3`;
    /// tokens are asked at `{auth_url}/auth/tokens`.
    pub auth_url: String,
    pub method: KeystoneMethod,
    /// PEM CA certificates `auth_url`'s certificate must chain to, in
    /// place of the system's trust store (`ca-file`).
    pub ca: Option<PathBuf>,
}

/// How an OAuth2 client proves who it is at the token endpoint.
#[derive(Clone, Debug)]
pub enum ClientAuth {
    /// `client_secret`, in the form body or (`basic`) as HTTP Basic
    /// (RFC 6749 §2.3.1).
    Secret { secret: SecretSource, basic: bool },
    /// A JWT assertion signed RS256 with the client's private key
    /// (RFC 7523 §2.2; Entra ID's certificate credentials).
    PrivateKeyJwt {
        key: SecretSource,
        /// The `kid` header, or for Entra ID `x5t` (the certificate's
        /// SHA-1 thumbprint, base64url) when it is given as `x5t:…`.
        key_id: Option<String>,
    },
}

/// `kind = "oauth2-client-credentials"` (RFC 6749 §4.4): Azure/Entra ID
/// and generic OIDC providers. The token is sent as `Authorization:
/// Bearer`.
#[derive(Clone, Debug)]
pub struct OAuth2 {
    pub token_url: String,
    pub client_id: String,
    pub client: ClientAuth,
    /// `scope`, e.g. `https://management.azure.com/.default`.
    pub scope: Option<String>,
    /// `resource` (Entra ID v1 endpoints).
    pub resource: Option<String>,
    /// PEM CA certificates the token endpoint's certificate must chain to,
    /// in place of the system's trust store (`ca-file`).
    pub ca: Option<PathBuf>,
}

/// `kind = "google-service-account"`: a service-account JSON key; the host
/// signs an RS256 JWT with it and exchanges it at the key's `token_uri`.
#[derive(Clone, Debug)]
pub struct GoogleServiceAccount {
    pub key: SecretSource,
    pub scopes: Vec<String>,
}

/// `kind = "client-certificate"`: mutual TLS to the credential's host.
#[derive(Clone, Debug)]
pub struct ClientCertificate {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: SecretSource,
    /// PEM CA certificates the host's certificate must chain to, in place
    /// of the system's roots.
    pub ca: Option<PathBuf>,
}
