//! The [`Driver`] trait a driver author implements.

use crate::types::{AccountLimits, CreateSpec, DriverInfo, Error, Instance, Page};

/// A cloud driver. Implement it and export it with [`crate::export_driver!`].
///
/// The host calls [`Driver::describe`] at any time, then
/// [`Driver::configure`] once per instance of the component; the value it
/// returns receives every later call, one at a time. Calls made before a
/// successful `configure` fail with `invalid-config("driver not configured")`
/// without reaching the driver.
///
/// Every method returns the contract's typed [`Error`]; build one with the
/// constructors in [`crate::error`]. An [`crate::http::HttpError`] converts
/// into a `transient` error with `?`. A panic traps: the host discards that
/// instance of the component, reports the panic message and starts afresh,
/// configuring a new instance before its next call.
pub trait Driver: Sized + 'static {
    /// Describes the driver: name, version, config schema and capabilities.
    /// Called before `configure`; must not make requests.
    fn describe() -> DriverInfo;

    /// Validates the provider `config` (JSON text) and builds the driver's
    /// state for pool `pool_id`. Returns `invalid-config` naming the field
    /// when the config is wrong. The config never holds secrets: the host
    /// adds credentials to allowed requests itself.
    fn configure(pool_id: &str, config: &str) -> Result<Self, Error>;

    /// Creates one instance carrying `spec.tags` and returns it as soon as
    /// the cloud accepted it. Pass `spec.token` as the cloud's idempotency
    /// key where there is one, or find the instance an earlier create with
    /// that token made and return it (see `create-spec.token` in the WIT).
    fn create(&mut self, spec: CreateSpec) -> Result<Instance, Error>;

    /// Creates each of `specs` in as few calls to the cloud as it allows:
    /// one result per spec, in order. Only called when [`Driver::describe`]
    /// declares `Capabilities::CREATE_MANY`; the default says it is not
    /// supported, for each spec.
    fn create_many(&mut self, specs: Vec<CreateSpec>) -> Vec<Result<Instance, Error>> {
        specs
            .iter()
            .map(|_| {
                Err(crate::error::permanent(
                    "create-many is not supported by this driver",
                ))
            })
            .collect()
    }

    /// The instances among `ids` that exist and carry the `berth-pool` tag;
    /// an id left out is gone. Ask the cloud for these ids only, never for a
    /// list of everything. ([`crate::pages::only_ids`] keeps a cloud's
    /// answer to the ids asked and the pool.)
    fn get(&mut self, ids: &[String]) -> Result<Vec<Instance>, Error>;

    /// One page of the instances carrying all of the `filter` tags (which
    /// always include `berth-pool`), starting at `cursor` (`None`: the
    /// first page). Fetch one page of the cloud's and return its cursor
    /// for the next in [`Page::next`], `None` on the last; never follow
    /// pages inside one call. A cloud without pages can page a whole
    /// answer with [`crate::pages::page_of`].
    fn list(&mut self, filter: &[(String, String)], cursor: Option<&str>) -> Result<Page, Error>;

    /// Deletes an instance. An instance that is already gone is `not-found`,
    /// which the host treats as success.
    fn delete(&mut self, instance_id: &str) -> Result<(), Error>;

    /// Deletes each of `instance_ids` in as few calls to the cloud as it
    /// allows, with one check for the batch that they carry the pool's
    /// tag: one result per id, in order. Only called when
    /// [`Driver::describe`] declares `Capabilities::DELETE_MANY`; the
    /// default says it is not supported, for each id.
    fn delete_many(&mut self, instance_ids: &[String]) -> Vec<Result<(), Error>> {
        instance_ids
            .iter()
            .map(|_| {
                Err(crate::error::permanent(
                    "delete-many is not supported by this driver",
                ))
            })
            .collect()
    }

    /// Replaces the instance's berth tags with `tags` and leaves its other
    /// tags alone (see [`crate::tags::replace_berth_tags`]).
    fn set_tags(&mut self, instance_id: &str, tags: &[(String, String)]) -> Result<(), Error>;

    /// The account's quota and usage. Only called when [`Driver::describe`]
    /// declares `Capabilities::ACCOUNT_LIMITS`; the default says it is not
    /// supported.
    fn limits(&mut self) -> Result<AccountLimits, Error> {
        Err(crate::error::permanent(
            "account limits are not supported by this driver",
        ))
    }
}

/// What [`crate::export_driver!`] expands to calls into; not a public API.
#[doc(hidden)]
pub mod __private {
    use std::cell::RefCell;
    use std::sync::Once;
    use std::thread::LocalKey;

    pub use crate::bindings::exports::berth::driver::driver::Guest;

    use super::Driver;
    use crate::types::{Error, Tags};

    /// Where the expansion keeps the configured driver.
    pub type Slot<D> = LocalKey<RefCell<Option<D>>>;

    /// Runs at the start of every exported call.
    pub fn enter() {
        static PANIC_HOOK: Once = Once::new();
        PANIC_HOOK.call_once(|| std::panic::set_hook(Box::new(panic_hook)));
    }

    /// Writes a panic as one stderr line. The host reports the last line a
    /// driver wrote to stderr as the reason for the trap, and the default
    /// hook's last line is only a hint about `RUST_BACKTRACE`.
    fn panic_hook(info: &std::panic::PanicHookInfo<'_>) {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("panic with a non-string payload");
        let line = match info.location() {
            Some(at) => format!("{message} (at {}:{}:{})", at.file(), at.line(), at.column()),
            None => message.to_owned(),
        };
        eprintln!("{}", line.replace(['\n', '\r'], " "));
    }

    /// A batch call made before `configure`: the same error for each item.
    pub fn each<D: Driver, R>(
        slot: &'static Slot<D>,
        items: usize,
        f: impl FnOnce(&mut D) -> Vec<Result<R, Error>>,
    ) -> Vec<Result<R, Error>> {
        with(slot, |d| Ok(f(d))).unwrap_or_else(|e| (0..items).map(|_| Err(e.clone())).collect())
    }

    /// `configure`: replaces the slot's driver only on success.
    pub fn configure<D: Driver>(
        slot: &'static Slot<D>,
        pool_id: String,
        config: String,
    ) -> Result<(), Error> {
        enter();
        let driver = D::configure(&pool_id, &config)?;
        slot.with(|s| *s.borrow_mut() = Some(driver));
        Ok(())
    }

    /// Runs `f` on the configured driver.
    pub fn with<D: Driver, R>(
        slot: &'static Slot<D>,
        f: impl FnOnce(&mut D) -> Result<R, Error>,
    ) -> Result<R, Error> {
        enter();
        slot.with(|s| match s.borrow_mut().as_mut() {
            Some(driver) => f(driver),
            None => Err(crate::error::invalid_config("driver not configured")),
        })
    }

    /// Borrows owned tags as the trait takes them.
    pub fn tags(tags: &Tags) -> &[(String, String)] {
        tags
    }
}

/// Exports a [`Driver`] implementation as the component's `berth:driver/driver`.
///
/// Invoke it once, at the top level of the driver's `cdylib` crate, with the
/// type implementing [`Driver`]: `berth_sdk::export_driver!(MyCloud);` (see
/// the crate-level example).
///
/// The configured value lives in a thread-local of the expansion for the
/// life of the component instance.
#[macro_export]
macro_rules! export_driver {
    ($driver:ty) => {
        const _: () = {
            ::std::thread_local! {
                static __BERTH_DRIVER: ::core::cell::RefCell<::core::option::Option<$driver>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }

            struct __BerthDriverExport;

            impl $crate::driver::__private::Guest for __BerthDriverExport {
                fn describe() -> $crate::types::DriverInfo {
                    $crate::driver::__private::enter();
                    <$driver as $crate::Driver>::describe()
                }
                fn configure(
                    pool_id: ::std::string::String,
                    config: ::std::string::String,
                ) -> ::core::result::Result<(), $crate::types::Error> {
                    $crate::driver::__private::configure(&__BERTH_DRIVER, pool_id, config)
                }
                fn create(
                    spec: $crate::types::CreateSpec,
                ) -> ::core::result::Result<$crate::types::Instance, $crate::types::Error> {
                    $crate::driver::__private::with(&__BERTH_DRIVER, |d| {
                        <$driver as $crate::Driver>::create(d, spec)
                    })
                }
                fn create_many(
                    specs: ::std::vec::Vec<$crate::types::CreateSpec>,
                ) -> ::std::vec::Vec<
                    ::core::result::Result<$crate::types::Instance, $crate::types::Error>,
                > {
                    let n = specs.len();
                    $crate::driver::__private::each(&__BERTH_DRIVER, n, |d| {
                        <$driver as $crate::Driver>::create_many(d, specs)
                    })
                }
                fn get(
                    ids: ::std::vec::Vec<::std::string::String>,
                ) -> ::core::result::Result<
                    ::std::vec::Vec<$crate::types::Instance>,
                    $crate::types::Error,
                > {
                    $crate::driver::__private::with(&__BERTH_DRIVER, |d| {
                        <$driver as $crate::Driver>::get(d, &ids)
                    })
                }
                fn list(
                    filter: $crate::types::Tags,
                    cursor: ::core::option::Option<::std::string::String>,
                ) -> ::core::result::Result<$crate::types::Page, $crate::types::Error> {
                    $crate::driver::__private::with(&__BERTH_DRIVER, |d| {
                        <$driver as $crate::Driver>::list(
                            d,
                            $crate::driver::__private::tags(&filter),
                            cursor.as_deref(),
                        )
                    })
                }
                fn delete_many(
                    instance_ids: ::std::vec::Vec<::std::string::String>,
                ) -> ::std::vec::Vec<::core::result::Result<(), $crate::types::Error>> {
                    let n = instance_ids.len();
                    $crate::driver::__private::each(&__BERTH_DRIVER, n, |d| {
                        <$driver as $crate::Driver>::delete_many(d, &instance_ids)
                    })
                }
                fn delete(
                    instance_id: ::std::string::String,
                ) -> ::core::result::Result<(), $crate::types::Error> {
                    $crate::driver::__private::with(&__BERTH_DRIVER, |d| {
                        <$driver as $crate::Driver>::delete(d, &instance_id)
                    })
                }
                fn set_tags(
                    instance_id: ::std::string::String,
                    tags: $crate::types::Tags,
                ) -> ::core::result::Result<(), $crate::types::Error> {
                    $crate::driver::__private::with(&__BERTH_DRIVER, |d| {
                        <$driver as $crate::Driver>::set_tags(
                            d,
                            &instance_id,
                            $crate::driver::__private::tags(&tags),
                        )
                    })
                }
                fn limits()
                -> ::core::result::Result<$crate::types::AccountLimits, $crate::types::Error>
                {
                    $crate::driver::__private::with(&__BERTH_DRIVER, |d| {
                        <$driver as $crate::Driver>::limits(d)
                    })
                }
            }

    $crate::bindings::export!(__BerthDriverExport with_types_in $crate::bindings);
        };
    };
}
