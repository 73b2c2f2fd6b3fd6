//! berth's config file: the TOML as written, checked into typed
//! [`Settings`] that report every problem at once, each with its path.
//!
//! The settings are plain data, split by who reads them: the pool core gets
//! [`Config`] (labels, offers, limits, timings) and nothing else; the
//! runtime gets each provider's [`DriverSettings`] (driver file, driver
//! config, sandbox limits, credentials); the service gets [`ApiSettings`]. Secrets
//! reach the driver config, credentials and API tokens through `${ENV}`
//! interpolation and are never printed: their `Debug` shows them redacted.

#![forbid(unsafe_code)]

mod api;
mod checks;
mod credentials;
mod exchanged;
mod fleet;
mod inside;
mod interpolate;
mod labels;
mod locate;
mod parse;
mod problem;
mod providers;
mod reload;
mod sandbox;
mod settings;
mod store;
#[cfg(test)]
mod tests;
mod walker;

pub use api::listen_problem;
pub use berth_core::config::{
    Check, Config, Label, LabelIx, LabelKind, Offer, Provider, ProviderIx, ProviderLimits,
    Readiness, Timings,
};
pub use checks::{check_files, file_sha256, warnings};
pub use credentials::credentials;
pub use exchanged::{
    ClientAuth, ClientCertificate, GoogleServiceAccount, Keystone, KeystoneMethod, KeystoneRef,
    MAX_SECRET_FILE, OAuth2, SecretSource,
};
pub use fleet::fleet_digest;
pub use inside::{FileError, FileErrorKind, name_problem, open_inside, read_driver, stays_inside};
pub use interpolate::interpolate_json;
pub use locate::locate;
pub use parse::{base_dir, load, parse};
pub use problem::{ConfigErrors, Location, Problem};
pub use reload::{Difference, align, differences, drivers_changed};
pub use sandbox::{
    AllowedHost, Auth, Credential, FIELD_SIZE_LIMIT, SandboxLimits, Secret, canonical_ip,
};
pub use settings::{
    ApiSettings, DriverSettings, Password, Postgres, Role, Settings, StoreSettings, StoreSync,
    TlsFiles, Token,
};
