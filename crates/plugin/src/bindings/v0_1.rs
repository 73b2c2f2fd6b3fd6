//! `berth:driver@0.1.0`, frozen: its bindings, and its drivers adapted into
//! 0.2's calls. 0.1 has no `get`, no batches and no pages: `get` is a list
//! of the pool filtered by id, a batch is one call per item, and a list is
//! one page, the last.

use berth_core::driver as d;
use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

use super::{GuestAnswer, MAX_MESSAGE, said, tags_from_wit, tags_to_wit};
use crate::guest_log::LogCtx;
use crate::state::{NetCtx, RecordsCtx};
use crate::store_data::StoreState;

wasmtime::component::bindgen!({
    path: "../../wit/berth-driver@0.1.0",
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

use self::berth::driver::types as wit;
pub(crate) use self::berth::driver::{log, net, state};

pub(super) fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    log::add_to_linker::<StoreState, HasSelf<LogCtx>>(linker, |s| &mut s.log)?;
    state::add_to_linker::<StoreState, HasSelf<RecordsCtx>>(linker, |s| &mut s.records)?;
    net::add_to_linker::<StoreState, HasSelf<NetCtx>>(linker, |s| &mut s.net)
}

super::same_in_every_version!();

fn capabilities(c: wit::Capabilities) -> d::Capabilities {
    d::Capabilities {
        account_limits: c.contains(wit::Capabilities::ACCOUNT_LIMITS),
        user_data: c.contains(wit::Capabilities::USER_DATA),
        ssh_keys: c.contains(wit::Capabilities::SSH_KEYS),
        idempotent_create: c.contains(wit::Capabilities::IDEMPOTENT_CREATE),
        create_many: false,
        delete_many: false,
    }
}

impl From<wit::Instance> for d::Instance {
    fn from(i: wit::Instance) -> Self {
        let state = match i.state {
            wit::InstanceState::Pending => d::InstanceState::Pending,
            wit::InstanceState::Running => d::InstanceState::Running,
            wit::InstanceState::Stopping => d::InstanceState::Stopping,
            wit::InstanceState::Terminated => d::InstanceState::Terminated,
            wit::InstanceState::Unknown => d::InstanceState::Unknown,
        };
        instance(i, state, None)
    }
}

/// 0.1's spec has no token: its drivers use the node id, as 0.1 says.
impl From<&d::CreateSpec> for wit::CreateSpec {
    fn from(s: &d::CreateSpec) -> Self {
        wit::CreateSpec {
            node_id: s.node_id.clone(),
            instance_type: s.instance_type.clone(),
            image: s.image.clone(),
            tags: tags_to_wit(&s.tags),
            user_data: s.user_data.clone(),
            ssh_public_key: s.ssh_public_key.clone(),
            options: s.options.clone(),
        }
    }
}

/// One `create` per spec.
pub(super) async fn create_many(
    p: &DriverPlugin,
    store: &mut Store<StoreState>,
    specs: &[d::CreateSpec],
) -> wasmtime::Result<Vec<Result<d::Instance, d::DriverError>>> {
    let mut answers = Vec::with_capacity(specs.len());
    for spec in specs {
        answers.push(create(p, store, spec).await?);
    }
    Ok(answers)
}

/// The whole list: 0.1's drivers follow the cloud's pages themselves.
async fn list_all(
    p: &DriverPlugin,
    store: &mut Store<StoreState>,
    filter: &d::Tags,
) -> GuestAnswer<Vec<d::Instance>> {
    let answer = (p.berth_driver_driver())
        .call_list(store, &tags_to_wit(filter))
        .await?;
    Ok(answer
        .map(|all| all.into_iter().map(Into::into).collect())
        .map_err(Into::into))
}

/// A list of one page, the last. A cursor cannot come from a 0.1 driver, so
/// one given is the host's mistake, and answered as such.
pub(super) async fn list(
    p: &DriverPlugin,
    store: &mut Store<StoreState>,
    filter: &d::Tags,
    cursor: Option<&str>,
) -> GuestAnswer<d::Page> {
    if cursor.is_some() {
        return Ok(Err(d::DriverError::Permanent(
            "a 0.1 driver's list has one page; there is no next".into(),
        )));
    }
    Ok(list_all(p, store, filter).await?.map(|instances| d::Page {
        instances,
        next: None,
    }))
}

/// The pool's list, kept to the ids asked.
pub(super) async fn get(
    p: &DriverPlugin,
    store: &mut Store<StoreState>,
    pool_id: &str,
    ids: &[String],
) -> GuestAnswer<Vec<d::Instance>> {
    let filter = d::Tags::from([(d::POOL_TAG.to_owned(), pool_id.to_owned())]);
    let wanted: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
    Ok(list_all(p, store, &filter).await?.map(|all| {
        all.into_iter()
            .filter(|i| wanted.contains(i.id.as_str()))
            .collect()
    }))
}

/// One `delete` per id.
pub(super) async fn delete_many(
    p: &DriverPlugin,
    store: &mut Store<StoreState>,
    ids: &[String],
) -> wasmtime::Result<Vec<Result<(), d::DriverError>>> {
    let mut answers = Vec::with_capacity(ids.len());
    for id in ids {
        answers.push(delete(p, store, id).await?);
    }
    Ok(answers)
}
