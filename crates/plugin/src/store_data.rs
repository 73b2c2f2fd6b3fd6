//! `StoreState`, everything a driver instance's `Store` holds: WASI and
//! wasi:http (implemented here), one context per berth import (`log`,
//! `state`, `net`, `auth`; each import's `Host` is implemented on its
//! context, and served for every contract version by `bindings`), the
//! memory limiter and the call's deadline.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use berth_config::{FIELD_SIZE_LIMIT, SandboxLimits};

use super::guest_log::{GuestOutput, LogBudget, LogCtx};
use super::limits::Limiter;
use super::sandbox::{Hooks, HttpPolicy};
use super::state::{NetCtx, RecordsCtx, StateSpace};
use super::tokens::AuthCtx;

/// Everything a driver instance's `Store` holds.
pub(crate) struct StoreState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    table: ResourceTable,
    hooks: Hooks,
    /// What the `log` import needs.
    pub log: LogCtx,
    /// What the `state` import needs: the provider's durable records.
    pub records: RecordsCtx,
    /// What the `net` import needs.
    pub net: NetCtx,
    /// What the `auth` import (0.2) needs.
    pub auth: AuthCtx,
    pub limiter: Limiter,
    /// The current call must finish before this instant; read by the epoch
    /// callback.
    pub deadline: Instant,
    /// The last line the guest wrote to stderr (a Rust panic message).
    stderr_tail: Arc<std::sync::Mutex<String>>,
}

impl StoreState {
    pub fn new(
        provider: Arc<str>,
        limits: &SandboxLimits,
        policy: Arc<HttpPolicy>,
        state: StateSpace,
        log: Arc<LogBudget>,
    ) -> Self {
        // No preopened directories, no environment, no arguments, no network
        // sockets (the builder's defaults deny every address); stdio goes to
        // the host log attributed to the provider.
        let stderr_tail = Arc::new(std::sync::Mutex::new(String::new()));
        let dispatch = tracing::dispatcher::get_default(|d| d.clone());
        let mut http = WasiHttpCtx::new();
        http.set_field_size_limit(FIELD_SIZE_LIMIT);
        let mut table = ResourceTable::new();
        table.set_max_capacity(limits.max_resources());
        let wasi = WasiCtx::builder()
            .stdout(GuestOutput {
                provider: provider.clone(),
                stream: "stdout",
                gate: log.clone(),
                dispatch: dispatch.clone(),
                last: None,
            })
            .stderr(GuestOutput {
                provider: provider.clone(),
                stream: "stderr",
                gate: log.clone(),
                dispatch: dispatch.clone(),
                last: Some(stderr_tail.clone()),
            })
            .allow_ip_name_lookup(false)
            .allow_tcp(false)
            .allow_udp(false)
            .build();
        StoreState {
            wasi,
            http,
            table,
            hooks: Hooks::new(policy.clone(), limits, dispatch),
            log: LogCtx {
                provider,
                budget: log,
            },
            records: RecordsCtx {
                space: state,
                host_memory_bytes: limits.host_memory_bytes,
            },
            net: NetCtx {
                policy: policy.clone(),
            },
            auth: AuthCtx { policy },
            limiter: Limiter::new(limits.memory_bytes),
            deadline: Instant::now(),
            stderr_tail,
        }
    }

    /// The last complete line the guest wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        self.stderr_tail
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for StoreState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}
