//! The `berth sim` subcommand: flags for every knob, then bind and serve.

use std::fmt;
use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use super::{Knobs, SimCloud};
use berth_core::duration;

/// Flags of `berth sim`; one per knob of `docs/sim-cloud.md`.
#[derive(Clone, clap::Args)]
pub struct SimArgs {
    /// Address to listen on; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:8181")]
    pub listen: SocketAddr,
    /// Keep instances in this JSON file so they outlive a restart.
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
    /// Time a create takes before it answers, e.g. `250ms`.
    #[arg(long, value_parser = duration::parse, default_value = "0s")]
    pub create_latency: Duration,
    /// Time a create that made its instance waits before it answers.
    #[arg(long, value_parser = duration::parse, default_value = "0s")]
    pub create_answer_delay: Duration,
    /// How long a new instance is left out of lists and gets.
    #[arg(long, value_parser = duration::parse, default_value = "0s")]
    pub list_lag: Duration,
    /// Time a new instance stays pending, e.g. `2s`.
    #[arg(long, value_parser = duration::parse, default_value = "0s")]
    pub boot_delay: Duration,
    /// Chance (0.0 to 1.0) that a create fails with 500.
    #[arg(long, value_parser = parse_rate, default_value_t = 0.0)]
    pub failure_rate: f64,
    /// Chance (0.0 to 1.0) that a new instance's boot fails: it is
    /// `failed`, never `running`.
    #[arg(long, value_parser = parse_rate, default_value_t = 0.0)]
    pub boot_failure_rate: f64,
    /// Most live instances at once.
    #[arg(long)]
    pub quota: Option<u32>,
    /// Cloud-API requests per second.
    #[arg(long)]
    pub rate_limit: Option<f64>,
    /// Instance types that are out of capacity (repeat or separate with commas).
    #[arg(long, value_delimiter = ',')]
    pub out_of_capacity: Vec<String>,
    /// Bearer token the cloud API requires.
    #[arg(long, env = "BERTH_SIM_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// How long terminated instances stay listed.
    #[arg(long, value_parser = duration::parse, default_value = "60s")]
    pub terminated_retention: Duration,
    /// A real SSH server (IP:PORT) that each new instance leads to, through
    /// a port of its own on 127.0.0.1.
    #[arg(long, value_name = "IP:PORT")]
    pub ssh_target: Option<String>,
    /// How long after its boot an instance's SSH port starts accepting.
    #[arg(long, value_parser = duration::parse, default_value = "0s")]
    pub ssh_accept_delay: Duration,
}

// Hand-written so the token never reaches a log line.
impl fmt::Debug for SimArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimArgs")
            .field("listen", &self.listen)
            .field("state", &self.state)
            .field("knobs", &self.knobs())
            .finish()
    }
}

fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        _ => Err(format!("expected a number from 0.0 to 1.0, got `{text}`")),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl SimArgs {
    pub(super) fn knobs(&self) -> Knobs {
        Knobs {
            create_latency_ms: millis(self.create_latency),
            create_answer_delay_ms: millis(self.create_answer_delay),
            list_lag_ms: millis(self.list_lag),
            boot_delay_ms: millis(self.boot_delay),
            failure_rate: self.failure_rate,
            boot_failure_rate: self.boot_failure_rate,
            quota: self.quota,
            rate_limit: self.rate_limit,
            out_of_capacity: self.out_of_capacity.clone(),
            token: self.token.clone(),
            terminated_retention_ms: millis(self.terminated_retention),
            ssh_target: self.ssh_target.clone(),
            ssh_accept_delay_ms: millis(self.ssh_accept_delay),
        }
    }
}

/// Runs `berth sim`: binds, prints `listening on http://ADDR` once ready, and
/// serves until `shutdown` completes.
pub async fn run(
    args: SimArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let cloud = SimCloud::new(args.knobs(), args.state.clone())?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    {
        // Flushed at once: scripts wait for this line to learn the port.
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{addr}").context("writing to stdout")?;
        out.flush().context("writing to stdout")?;
    }
    tracing::info!(%addr, "simulated cloud listening");
    cloud
        .serve(listener, shutdown)
        .await
        .context("serving the simulated cloud")
}
