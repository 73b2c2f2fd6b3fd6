//! `berth:driver@0.2.0`: its bindings. Its `log`, `state` and `net` imports
//! are 0.1's, item for item, and are served by 0.1's implementations.

use berth_core::driver as d;
use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

use super::{GuestAnswer, MAX_MESSAGE, said, tags_from_wit, tags_to_wit, v0_1};
use crate::guest_log::LogCtx;
use crate::state::{NetCtx, RecordsCtx};
use crate::store_data::StoreState;
use crate::tokens::AuthCtx;

wasmtime::component::bindgen!({
    path: "../../wit/berth-driver@0.2.0",
    world: "berth:driver/driver-plugin",
    imports: { default: async | trappable },
    exports: { default: async },
    with: {
        "wasi:http": wasmtime_wasi_http::p2::bindings::http,
        "wasi:io": wasmtime_wasi::p2::bindings::io,
        "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
        "wasi:random": wasmtime_wasi::p2::bindings::random,
    },
});

pub(crate) use self::berth::driver::auth;
use self::berth::driver::types as wit;
use self::berth::driver::{log, net, state};

pub(super) fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    log::add_to_linker::<StoreState, HasSelf<LogCtx>>(linker, |s| &mut s.log)?;
    state::add_to_linker::<StoreState, HasSelf<RecordsCtx>>(linker, |s| &mut s.records)?;
    net::add_to_linker::<StoreState, HasSelf<NetCtx>>(linker, |s| &mut s.net)?;
    auth::add_to_linker::<StoreState, HasSelf<AuthCtx>>(linker, |s| &mut s.auth)
}

impl log::Host for LogCtx {
    async fn log(
        &mut self,
        level: log::Level,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        let level = match level {
            log::Level::Trace => v0_1::log::Level::Trace,
            log::Level::Debug => v0_1::log::Level::Debug,
            log::Level::Info => v0_1::log::Level::Info,
            log::Level::Warn => v0_1::log::Level::Warn,
            log::Level::Error => v0_1::log::Level::Error,
        };
        v0_1::log::Host::log(self, level, message, fields).await
    }
}

impl state::Host for RecordsCtx {
    async fn get(&mut self, key: String) -> wasmtime::Result<Result<Option<String>, String>> {
        v0_1::state::Host::get(self, key).await
    }

    async fn scan(
        &mut self,
        prefix: String,
    ) -> wasmtime::Result<Result<Vec<(String, String)>, String>> {
        v0_1::state::Host::scan(self, prefix).await
    }

    async fn compare_and_swap(
        &mut self,
        key: String,
        expected: Option<String>,
        value: Option<String>,
    ) -> wasmtime::Result<Result<bool, String>> {
        v0_1::state::Host::compare_and_swap(self, key, expected, value).await
    }
}

impl net::Host for NetCtx {
    async fn tcp_probe(
        &mut self,
        host: String,
        port: u16,
        timeout_ms: u32,
    ) -> wasmtime::Result<Result<(), String>> {
        v0_1::net::Host::tcp_probe(self, host, port, timeout_ms).await
    }
}

impl auth::Host for AuthCtx {
    async fn auth_info(
        &mut self,
        host: String,
    ) -> wasmtime::Result<Result<Option<String>, wit::Error>> {
        Ok(self.info(&host).await.map_err(|e| match e {
            d::DriverError::Unauthorized(m) => wit::Error::Unauthorized(m),
            other => wit::Error::Transient(other.to_string()),
        }))
    }
}

impl wit::Host for AuthCtx {}

super::same_in_every_version!();

fn capabilities(c: wit::Capabilities) -> d::Capabilities {
    d::Capabilities {
        account_limits: c.contains(wit::Capabilities::ACCOUNT_LIMITS),
        user_data: c.contains(wit::Capabilities::USER_DATA),
        ssh_keys: c.contains(wit::Capabilities::SSH_KEYS),
        idempotent_create: c.contains(wit::Capabilities::IDEMPOTENT_CREATE),
        create_many: c.contains(wit::Capabilities::CREATE_MANY),
        delete_many: c.contains(wit::Capabilities::DELETE_MANY),
    }
}

impl From<wit::Instance> for d::Instance {
    fn from(mut i: wit::Instance) -> Self {
        let (state, failure) = match std::mem::replace(&mut i.state, wit::InstanceState::Unknown) {
            wit::InstanceState::Pending => (d::InstanceState::Pending, None),
            wit::InstanceState::Running => (d::InstanceState::Running, None),
            wit::InstanceState::Stopping => (d::InstanceState::Stopping, None),
            wit::InstanceState::Terminated => (d::InstanceState::Terminated, None),
            wit::InstanceState::Failed(why) => (
                d::InstanceState::Failed,
                Some(said(why, d::check::MAX_FAILURE)),
            ),
            wit::InstanceState::Unknown => (d::InstanceState::Unknown, None),
        };
        instance(i, state, failure)
    }
}

impl From<&d::CreateSpec> for wit::CreateSpec {
    fn from(s: &d::CreateSpec) -> Self {
        wit::CreateSpec {
            node_id: s.node_id.clone(),
            token: s.token.clone(),
            instance_type: s.instance_type.clone(),
            image: s.image.clone(),
            tags: tags_to_wit(&s.tags),
            user_data: s.user_data.clone(),
            ssh_public_key: s.ssh_public_key.clone(),
            options: s.options.clone(),
        }
    }
}

pub(super) async fn create_many(
    p: &DriverPlugin,
    store: &mut Store<StoreState>,
    specs: &[d::CreateSpec],
) -> wasmtime::Result<Vec<Result<d::Instance, d::DriverError>>> {
    let specs: Vec<wit::CreateSpec> = specs.iter().map(Into::into).collect();
    let answers = p
        .berth_driver_driver()
        .call_create_many(store, &specs)
        .await?;
    Ok(answers
        .into_iter()
        .map(|a| a.map(Into::into).map_err(Into::into))
        .collect())
}

pub(super) async fn get(
    p: &DriverPlugin,
    store: &mut Store<StoreState>,
    ids: &[String],
) -> GuestAnswer<Vec<d::Instance>> {
    let answer = p.berth_driver_driver().call_get(store, ids).await?;
    Ok(answer
        .map(|all| all.into_iter().map(Into::into).collect())
        .map_err(Into::into))
}

pub(super) async fn list(
    p: &DriverPlugin,
    store: &mut Store<StoreState>,
    filter: &d::Tags,
    cursor: Option<&str>,
) -> GuestAnswer<d::Page> {
    let answer = (p.berth_driver_driver())
        .call_list(store, &tags_to_wit(filter), cursor)
        .await?;
    Ok(answer
        .map(|page| d::Page {
            instances: page.instances.into_iter().map(Into::into).collect(),
            next: page.next,
        })
        .map_err(Into::into))
}

pub(super) async fn delete_many(
    p: &DriverPlugin,
    store: &mut Store<StoreState>,
    ids: &[String],
) -> wasmtime::Result<Vec<Result<(), d::DriverError>>> {
    let answers = p.berth_driver_driver().call_delete_many(store, ids).await?;
    Ok(answers.into_iter().map(|a| a.map_err(Into::into)).collect())
}
