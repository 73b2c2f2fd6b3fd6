//! The `berth` command: the service (`serve`), its client commands, the
//! conformance kit for driver authors, config checking and the simulated
//! cloud. Thin by design: the work is in the library.

#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use berth::plugin::{Engine, EngineConfig};

#[derive(Parser)]
#[command(
    name = "berth",
    version,
    about = "Keeps pools of cloud machines ready; drivers are sandboxed WebAssembly components"
)]
struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value = "human")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Work with driver components.
    #[command(subcommand)]
    Driver(DriverCommand),
    /// Work with config files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Work with the pool's store.
    #[command(subcommand)]
    Store(StoreCommand),
    /// Run the simulated cloud.
    Sim(berth::sim::SimArgs),
    /// Run the pool and its HTTP API as a service. Without --config: the
    /// embedded default (a simulated cloud in this process, example labels,
    /// state in ./berth-data).
    Serve(ServeArgs),
    /// Print the shell completion script for SHELL (bash, zsh, fish,
    /// elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Print berth's manual page (roff), or with --dir, write one page
    /// per command into DIR (berth.1, berth-serve.1, ...).
    Man {
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    #[command(flatten)]
    Client(berth::cli::ClientCommand),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// The config file (TOML); without it, the embedded default runs.
    #[arg(long, short, env = "BERTH_CONFIG")]
    config: Option<PathBuf>,
    /// Listen here instead of the config's api.listen (127.0.0.1:8080).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// The embedded default's state directory.
    #[arg(long, default_value = "berth-data", conflicts_with = "config")]
    state_dir: PathBuf,
    /// How long stopping waits for driver calls in flight.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    stop_grace: std::time::Duration,
    /// Print the embedded default's config (a start for your own) and exit.
    #[arg(long)]
    print_default_config: bool,
    /// Where compiled drivers are cached [default: $BERTH_CACHE_DIR, else
    /// $XDG_CACHE_HOME/berth/compiled, else ~/.cache/berth/compiled, else
    /// cache in the state directory]
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Take over, once, the instances with this pool's tags that the store
    /// cannot vouch for (a lost or replaced store, or instances made
    /// before signed tags): adopted as their tags say, those tagged as
    /// handed out on hold, and signed with this store's key (docs/tags.md).
    #[arg(long)]
    adopt_instances: bool,
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    berth::duration::parse(s).map_err(|e| e.to_string())
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Check a config file: every problem, with its path. With --against,
    /// what reading it again would change in a running `berth serve`
    /// instead.
    Check {
        /// The config file (TOML).
        file: PathBuf,
        /// A running `berth serve` (its URL): print each difference between
        /// FILE and the config it runs, and whether it can change while it
        /// runs, as that process reads FILE; exit 1 if a reload would be
        /// refused (admin).
        #[arg(long, value_name = "URL")]
        against: Option<String>,
        /// The API token for --against, sent as a bearer token.
        #[arg(
            long,
            env = "BERTH_TOKEN",
            hide_env_values = true,
            requires = "against"
        )]
        token: Option<String>,
        /// CA certificates (PEM) to trust for an https:// --against,
        /// besides the system's.
        #[arg(long, env = "BERTH_CA", value_name = "FILE", requires = "against")]
        ca: Option<PathBuf>,
    },
    /// Ask a running `berth serve` to read its config file again, as
    /// SIGHUP does, and apply what changed; if anything in it is wrong or
    /// cannot change while it runs, nothing changes and every reason is
    /// printed. Exits 1 if refused (admin).
    Reload(berth::cli::ClientOptions),
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Copy a pool's records from its embedded SQLite store into the empty
    /// PostgreSQL database that the config's `[store] url` names. Stop
    /// `berth serve` first; start it again with that config afterwards.
    Migrate {
        /// The config file naming the PostgreSQL store (TOML).
        #[arg(long, short, env = "BERTH_CONFIG")]
        config: PathBuf,
        /// The SQLite store; by default `berth.db` in the config's state-dir.
        #[arg(long)]
        from: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum DriverCommand {
    /// Check a driver against the contract without running it.
    Check {
        /// Driver files (.wasm).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Where compiled drivers are cached [default: $BERTH_CACHE_DIR,
        /// else $XDG_CACHE_HOME/berth/compiled, else ~/.cache/berth/compiled]
        #[arg(long)]
        cache_dir: Option<PathBuf>,
    },
    /// Run a driver against its real endpoint through the sandbox.
    Test {
        /// The driver file (.wasm).
        file: PathBuf,
        /// Test config (JSON): {"config": {..}, "allow_hosts": [..], "create": {..}}.
        #[arg(long)]
        config: PathBuf,
        /// Instances the paging step creates [default: one more than the
        /// driver config's page_size; without one the step is skipped]
        #[arg(long)]
        instances: Option<u32>,
        /// Recorded cloud responses (JSON) to check the driver's error
        /// mapping against (docs/writing-a-driver.md).
        #[arg(long)]
        faults: Option<PathBuf>,
        /// Where compiled drivers are cached [default: $BERTH_CACHE_DIR,
        /// else $XDG_CACHE_HOME/berth/compiled, else ~/.cache/berth/compiled]
        #[arg(long)]
        cache_dir: Option<PathBuf>,
    },
    /// Write a new driver project: a driver for the simulated cloud to change
    /// into one for yours, with the SDK and the contract, built by ./build.
    New {
        /// The driver's name (a-z, 0-9, `-`); also the project's folder.
        name: String,
        /// The language: rust, python or js.
        #[arg(long)]
        lang: berth::plugin::scaffold::Lang,
        /// Where to write the project [default: ./NAME]
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Ask a running `berth serve` to read its driver files again: each
    /// provider whose file changed switches to the new driver once it
    /// configured (admin). Exits 1 if a file was refused.
    Reload(berth::cli::ClientOptions),
    /// Return a provider of a running `berth serve` to the driver it ran
    /// before its last switch (admin).
    Rollback(berth::cli::ProviderArgs),
    /// Write a contract version this berth implements (driver.wit with its
    /// WASI deps/) to DIR, to build a driver against in any language.
    Wit {
        /// Where to write; created if missing.
        dir: PathBuf,
        /// The contract version, such as 0.1.0 [default: the newest]
        #[arg(long)]
        version: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A service logs what it does; a one-shot command only what went wrong.
    let level = match cli.command {
        Command::Serve(_) => "info",
        _ => "warn",
    };
    init_tracing(cli.log_format, level);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => return exit(Err(e.into())),
    };
    let command = match cli.command {
        Command::Driver(DriverCommand::Reload(o)) => {
            Command::Client(berth::cli::ClientCommand::ReloadDrivers(o))
        }
        Command::Driver(DriverCommand::Rollback(a)) => {
            Command::Client(berth::cli::ClientCommand::RollbackDriver(a))
        }
        Command::Config(ConfigCommand::Reload(o)) => {
            Command::Client(berth::cli::ClientCommand::ReloadConfig(o))
        }
        other => other,
    };
    if let Command::Client(cmd) = command {
        // Client commands say what went wrong and pick their exit code.
        return match runtime.block_on(berth::cli::run(cmd)) {
            Ok(code) => code,
            Err(e) => exit(Err(e)),
        };
    }
    let code = exit(runtime.block_on(run(command)));
    // Whatever is still running is abandoned, not waited for: driver calls
    // left at the end of a stop's grace (their intents are stored) or a
    // driver still compiling when a stop came during the start.
    runtime.shutdown_background();
    code
}

/// The one place outcomes become exit codes: 0 success, 1 a check or test
/// failed, 2 berth itself could not run, 3 the store could not be written
/// (docs/api.md, "Stopping").
fn exit(outcome: anyhow::Result<bool>) -> ExitCode {
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("berth: {}", chain_text(&e));
            let store = e
                .chain()
                .any(|cause| cause.is::<berth::store::StoreError>());
            ExitCode::from(if store { 3 } else { 2 })
        }
    }
}

/// An error and its causes as one line, `a: b: c`, leaving out a cause
/// whose text the message before it already ends with (many errors include
/// their source in their own message).
fn chain_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.ends_with(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

async fn run(command: Command) -> anyhow::Result<bool> {
    match command {
        Command::Driver(DriverCommand::Check { files, cache_dir }) => {
            let engine = Engine::new(EngineConfig {
                cache_dir: cache_dir.or_else(berth::plugin::default_cache_dir),
                ..EngineConfig::default()
            })?;
            let mut all_ok = true;
            for file in files {
                let report = berth::conformance::check(&engine, &file).await;
                println!("{}", file.display());
                print!("{report}");
                all_ok &= report.passed();
            }
            Ok(all_ok)
        }
        Command::Driver(DriverCommand::Test {
            file,
            config,
            instances,
            faults,
            cache_dir,
        }) => {
            let mut config = berth::conformance::TestConfig::from_file(&config)?;
            if instances.is_some() {
                config.instances = instances;
            }
            if let Some(faults) = &faults {
                config.faults = berth::conformance::Fault::from_file(faults)?;
            }
            let engine = Engine::new(EngineConfig {
                cache_dir: cache_dir.or_else(berth::plugin::default_cache_dir),
                ..EngineConfig::default()
            })?;
            // Ctrl-C stops the steps; the cleanup still runs and reports. A
            // second one leaves at once, saying what may be left.
            let first = berth::serve::shutdown_signals().context("listening for signals")?;
            let stop = async move {
                first.await;
                eprintln!(
                    "berth: stopping: deleting what this run created (Ctrl-C again to leave it)"
                );
                if let Ok(second) = berth::serve::shutdown_signals() {
                    tokio::spawn(async move {
                        second.await;
                        eprintln!(
                            "berth: cleanup abandoned: instances this run created may remain \
                             (their berth-node tags start with conformance-node-)"
                        );
                        std::process::exit(130);
                    });
                }
            };
            let report = berth::conformance::test_until(&engine, &file, &config, stop).await;
            println!("{}", file.display());
            print!("{report}");
            Ok(report.passed())
        }
        Command::Driver(DriverCommand::New { name, lang, dir }) => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            let n = berth::plugin::scaffold::new_project(&dir, &name, lang)?;
            println!(
                "{}: a {lang} driver project, {n} files; build it with {}",
                dir.display(),
                dir.join("build").display()
            );
            Ok(true)
        }
        Command::Driver(DriverCommand::Wit { dir, version }) => {
            let (version, n) = berth::contract::write_wit(&dir, version.as_deref())
                .with_context(|| format!("writing the contract to {}", dir.display()))?;
            println!(
                "{}: {n} files of berth:driver@{version} (world driver-plugin) and its WASI deps",
                dir.display()
            );
            Ok(true)
        }
        Command::Store(StoreCommand::Migrate { config, from }) => {
            let settings = berth::config::load(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
            let Some(pg) = &settings.store.postgres else {
                anyhow::bail!(
                    "{}: [store] names no PostgreSQL url to copy the pool into",
                    config.display()
                );
            };
            let from = from.unwrap_or_else(|| settings.state_dir.join("berth.db"));
            if !from.is_file() {
                anyhow::bail!("no SQLite store at {}", from.display());
            }
            let pool = std::sync::Arc::new(settings.pool.clone());
            let mut source = berth::store::SqliteStore::open(
                &from,
                pool.clone(),
                berth::config::StoreSync::Full,
            )
            .with_context(|| format!("opening the store {}", from.display()))?;
            let mut target = berth::store::PgStore::open(pg, pool.clone(), None)
                .await
                .with_context(|| format!("opening the PostgreSQL store {}", pg.url))?;
            let copied = berth::store::copy_into_empty(&mut source, &mut target, &pool)
                .await
                .with_context(|| format!("copying {} into {}", from.display(), pg.url))?;
            for note in &copied.dropped {
                eprintln!("left out: {note}");
            }
            // The drivers' records (the static driver's hosts), kept beside
            // the SQLite store, go along for every configured provider.
            let records_file = from.with_file_name("driver-state.sqlite");
            let mut records = 0;
            if records_file.is_file() {
                let source = berth::plugin::DriverState::on(std::sync::Arc::new(
                    berth::store::SqliteRecords::open(&records_file)?,
                ));
                let target = berth::plugin::DriverState::on(std::sync::Arc::new(target.records()));
                let providers = settings.pool.providers.iter().map(|p| p.name.as_str());
                records = source.copy_into(&target, providers).await.map_err(|e| {
                    anyhow::anyhow!(
                        "the pool was copied into {}, but not all driver records of {}: {e}",
                        pg.url,
                        records_file.display()
                    )
                })?;
            }
            println!(
                "copied {}, {}, {} and {} from {} into {}",
                count(copied.nodes, "node", "nodes"),
                count(copied.requests, "request", "requests"),
                count(copied.leases, "requestor lease", "requestor leases"),
                count(records, "driver record", "driver records"),
                from.display(),
                pg.url
            );
            Ok(true)
        }
        Command::Config(ConfigCommand::Check {
            file,
            against: Some(url),
            token,
            ca,
        }) => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let client = match &ca {
                Some(ca) => berth::client::Client::with_ca(&url, token, ca)?,
                None => berth::client::Client::new(&url, token)?,
            };
            let check = client.check_config(text).await?;
            for d in &check.differences {
                let restart = if d.live {
                    ""
                } else {
                    " (cannot change while berth runs: restart it)"
                };
                println!("{}: {}: {}{restart}", file.display(), d.key, d.what);
            }
            for p in &check.problems {
                println!("{}: {p}", file.display());
            }
            for why in &check.reasons {
                println!("{}: refused: {why}", file.display());
            }
            let summary = match (check.refused, check.differences.len()) {
                (true, _) => "a reload would be refused; nothing would change".to_owned(),
                (false, 0) => "a reload would change nothing".to_owned(),
                (false, n) => format!("a reload would make {}", count(n, "change", "changes")),
            };
            println!(
                "{}: {summary} (against {} at {url})",
                file.display(),
                check.file
            );
            Ok(!check.refused)
        }
        Command::Config(ConfigCommand::Check { file, .. }) => {
            // Read here rather than through `config::load` so that a file
            // that cannot be read is berth failing to run (exit 2), not a
            // problem found in the config (exit 1).
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let env = |name: &str| std::env::var(name).ok();
            let problems = match berth::config::parse(&text, berth::config::base_dir(&file), &env) {
                Ok(config) => {
                    // Warnings: allowed, but worth changing; the exit code
                    // stays 0 for them.
                    let mut warnings = berth::config::warnings(&config);
                    berth::config::locate(&text, &mut warnings);
                    for w in &warnings {
                        let at = (w.location)
                            .map(|l| format!("{}:{}:", l.line, l.column))
                            .unwrap_or_default();
                        println!("{}:{at} warning: {}: {}", file.display(), w.path, w.message);
                    }
                    let mut problems = berth::config::check_files(&config);
                    // Files that can be read: what they hold, as serve reads it.
                    if problems.is_empty() {
                        problems.extend(berth::serve::tls_problem(&config.api));
                    }
                    berth::config::locate(&text, &mut problems);
                    if problems.is_empty() {
                        let warned = match warnings.len() {
                            0 => String::new(),
                            n => format!(", {}", count(n, "warning", "warnings")),
                        };
                        println!(
                            "{}: ok ({}, {}){warned}",
                            file.display(),
                            count(config.pool.providers.len(), "provider", "providers"),
                            count(config.pool.labels.len(), "label", "labels")
                        );
                        return Ok(true);
                    }
                    problems
                }
                Err(e) => e.problems,
            };
            // `file:line:column: path: message`, one line each.
            for p in &problems {
                let sep = if p.location.is_some() { ":" } else { ": " };
                println!("{}{sep}{p}", file.display());
            }
            let n = problems.len();
            println!("{n} problem{}", if n == 1 { "" } else { "s" });
            Ok(false)
        }
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "berth", &mut std::io::stdout());
            Ok(true)
        }
        Command::Man { dir } => {
            let cmd = <Cli as clap::CommandFactory>::command();
            match dir {
                Some(dir) => {
                    std::fs::create_dir_all(&dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                    clap_mangen::generate_to(cmd, &dir)
                        .with_context(|| format!("writing the pages into {}", dir.display()))?;
                }
                None => clap_mangen::Man::new(cmd).render(&mut std::io::stdout())?,
            }
            Ok(true)
        }
        Command::Sim(args) => {
            let stop = berth::serve::shutdown_signals().context("listening for signals")?;
            berth::sim::run(args, stop).await?;
            Ok(true)
        }
        Command::Client(_)
        | Command::Config(ConfigCommand::Reload(_))
        | Command::Driver(DriverCommand::Reload(_) | DriverCommand::Rollback(_)) => {
            unreachable!("client commands are run in main")
        }
        Command::Serve(args) => {
            if args.print_default_config {
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 8181));
                print!(
                    "{}",
                    berth::serve::default_config_text(addr, std::path::Path::new("berth-data"))
                );
                return Ok(true);
            }
            // Before anything else: from here on a signal is a clean stop.
            let stop = berth::serve::shutdown_signals().context("listening for signals")?;
            let options = berth::serve::ServeOptions {
                config: args.config,
                listen: args.listen,
                state_dir: Some(args.state_dir),
                stop_grace: Some(args.stop_grace),
                cache_dir: args.cache_dir,
                adopt_instances: args.adopt_instances,
            };
            berth::serve::serve(options, stop, |listening, config| {
                let (addr, url) = (listening.addr, listening.url());
                println!("berth listening on {url}");
                let labels: Vec<&str> = config.labels.iter().map(|l| l.name.as_str()).collect();
                println!("labels: {}", labels.join(", "));
                // The CLI's default server; elsewhere the hint names it.
                let server = if addr == std::net::SocketAddr::from(([127, 0, 0, 1], 8080))
                    && !listening.tls
                {
                    String::new()
                } else {
                    format!(" --server {url}")
                };
                println!(
                    "try:    berth nodes{server}    |    berth request {}{server} --wait",
                    labels.first().copied().unwrap_or("LABEL")
                );
                println!("page:   {url}/ui");
            })
            .await?;
            Ok(true)
        }
    }
}

/// `1 node`, `2 nodes`.
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn init_tracing(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BERTH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // Colours only for a terminal, never into a file or a pipe.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
