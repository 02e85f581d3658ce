//! The `gateway` command.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::{Args, Parser, Subcommand};

// mimalloc: the request path allocates many small, short-lived objects, which glibc's malloc
// serves markedly slower. The bare baseline uses the same allocator, so comparisons stay fair.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use gateway::config::{GatewayConfig, Overrides, Secret};
use gateway::routing::config::RoutingConfig;
use gateway::server::{run_until_signal, Gateway};
use plugin_sdk::PluginDescriptor;

#[derive(Parser)]
#[command(
    name = "gateway",
    version,
    about = "An AI gateway in front of many model providers"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway (the default command).
    Serve(ServeArgs),
    /// Work with config files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Work with plugins.
    Plugins {
        #[command(subcommand)]
        command: PluginsCommand,
    },
    /// Prepare the control-plane database: apply its migrations and, when it is empty, make
    /// the organisation, its owner, the `default` workspace and an admin key (the value of
    /// GW_BOOTSTRAP_ADMIN_KEY, or a generated key printed once). `serve` does the same at start.
    Bootstrap(BootstrapArgs),
}

#[derive(Args, Clone)]
struct BootstrapArgs {
    /// The config file (for `database_url`).
    #[arg(long, env = "GW_CONFIG", default_value = "configs/gateway.yaml")]
    config: PathBuf,
    /// Control-plane database URL; overrides `database_url`.
    #[arg(long, env = "GW_DATABASE_URL")]
    database_url: Option<String>,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate a config file; print each error with its YAML path; exit 1 on error.
    Check { file: PathBuf },
}

#[derive(Subcommand)]
enum PluginsCommand {
    /// List every registered plugin with its summary and an example config.
    List,
}

#[derive(Args, Clone)]
struct ServeArgs {
    /// The config file.
    #[arg(long, env = "GW_CONFIG", default_value = "configs/gateway.yaml")]
    config: PathBuf,
    /// Address to listen on (host:port); overrides `listen` in the file.
    #[arg(long, env = "GW_LISTEN")]
    listen: Option<String>,
    /// The control plane's own address (host:port); overrides `admin_listen` in the file.
    #[arg(long, env = "GW_ADMIN_LISTEN")]
    admin_listen: Option<String>,
    /// Control-plane database URL; overrides `database_url`.
    #[arg(long, env = "GW_DATABASE_URL")]
    database_url: Option<String>,
    /// Redis URL for shared counters; overrides `redis_url`.
    #[arg(long, env = "GW_REDIS_URL")]
    redis_url: Option<String>,
    /// Log filter, plus `json` for JSON lines (e.g. `info,json`); overrides `log`.
    #[arg(long, env = "GW_LOG")]
    log: Option<String>,
    /// Hosts that may resolve to internal addresses (comma-separated `host` or `host:port`),
    /// added to `egress.trusted_hosts`.
    #[arg(long, env = "GW_TRUSTED_CUSTOM_HOSTS")]
    trusted_custom_hosts: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        None => serve(cli.serve),
        Some(Command::Serve(args)) => serve(args),
        Some(Command::Config {
            command: ConfigCommand::Check { file },
        }) => config_check(&file),
        Some(Command::Bootstrap(args)) => bootstrap(args),
        Some(Command::Plugins {
            command: PluginsCommand::List,
        }) => {
            plugins::link();
            for d in PluginDescriptor::all() {
                println!("{}\n  {}\n  example:", d.kind, d.summary);
                for line in d.example.lines() {
                    println!("    {line}");
                }
                println!();
            }
            ExitCode::SUCCESS
        }
    }
}

fn config_check(file: &std::path::Path) -> ExitCode {
    plugins::link();
    if let Some(routing) = read_routing_config(file) {
        return match RoutingConfig::parse(&routing) {
            Ok(_) => {
                println!("{}: ok (routing config)", file.display());
                ExitCode::SUCCESS
            }
            Err(problems) => {
                for p in &problems {
                    let path = if p.path.is_empty() {
                        "(config)"
                    } else {
                        &p.path
                    };
                    eprintln!("{}: {path}: {}", file.display(), p.message);
                }
                eprintln!("{} error(s)", problems.len());
                ExitCode::from(1)
            }
        };
    }
    match GatewayConfig::load(file, &Overrides::default()) {
        Ok(config) => {
            let kinds: Vec<_> = config.pipeline.iter().map(|p| p.kind.as_str()).collect();
            let admin = match (config.admin_listen, config.admin_on_main_listener) {
                (Some(addr), true) => format!(", control plane also on {addr}"),
                (Some(addr), false) => format!(", control plane only on {addr}"),
                (None, _) => String::new(),
            };
            println!(
                "{}: ok (listen {}{admin}, {} providers, pipeline: {})",
                file.display(),
                config.listen,
                config.providers.len(),
                kinds.join(" -> ")
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for issue in &errors.0 {
                let path = if issue.path.is_empty() {
                    "(file)"
                } else {
                    &issue.path
                };
                eprintln!("{}: {path}: {}", file.display(), issue.message);
            }
            eprintln!("{} error(s)", errors.0.len());
            ExitCode::from(1)
        }
    }
}

/// The file as a routing config (JSON or YAML), when it is one rather than a gateway config:
/// an object with `strategy`, `targets`, `provider` or `virtual_key` and none of the gateway
/// file's sections.
fn read_routing_config(file: &std::path::Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(file).ok()?;
    let value: serde_json::Value = serde_yaml_ng::from_str(&text).ok()?;
    let map = value.as_object()?;
    let routing = ["strategy", "targets", "provider", "virtual_key"]
        .iter()
        .any(|k| map.contains_key(*k));
    let gateway = ["listen", "pipeline", "providers", "configs", "upstream"]
        .iter()
        .any(|k| map.contains_key(*k));
    (routing && !gateway).then_some(value)
}

/// `GW_BOOTSTRAP_ADMIN_KEY`: read from the environment only, never from a flag (which other
/// users of the machine could see) or the file.
fn bootstrap_admin_key() -> Option<Secret> {
    std::env::var("GW_BOOTSTRAP_ADMIN_KEY")
        .ok()
        .filter(|k| !k.is_empty())
        .map(Secret)
}

/// `GW_SECRET_KEY`, the key of stored provider secrets: from the environment only.
fn secret_key() -> Option<Secret> {
    std::env::var(admin::crypto::SECRET_KEY_VAR)
        .ok()
        .filter(|k| !k.is_empty())
        .map(Secret)
}

/// Shows a generated admin key, the one time it exists outside the database: on stdout, never
/// in the log.
fn print_new_admin_key(key: &str) {
    println!(
        "The control plane's first start made an organisation, its owner, the workspace \"default\"\n\
         and an admin key. The key is shown this once and stored only as a hash:\n\n    {key}\n\n\
         Send it as the x-gw-api-key header: to the control plane (/v1/admin/workspaces, /v1/api-keys,\n\
         /v1/policies...) and on provider requests (/v1/chat/completions...), which the default\n\
         pipeline authenticates."
    );
}

fn bootstrap(args: BootstrapArgs) -> ExitCode {
    plugins::link();
    let overrides = Overrides {
        database_url: args.database_url,
        bootstrap_admin_key: bootstrap_admin_key(),
        ..Overrides::default()
    };
    let config = match GatewayConfig::load(&args.config, &overrides) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{}: invalid config:\n{errors}", args.config.display());
            return ExitCode::from(1);
        }
    };
    let options = admin::BootstrapOptions {
        admin_key: config.bootstrap_admin_key.map(|k| k.0),
        ..admin::BootstrapOptions::default()
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start a runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let outcome = runtime.block_on(async {
        let store = admin::Store::open(&config.database_url).await?;
        let outcome = store.bootstrap(&options).await;
        store.close().await;
        outcome
    });
    match outcome {
        Ok(admin::BootstrapOutcome::Created {
            generated_key: Some(key),
            ..
        }) => print_new_admin_key(&key),
        Ok(admin::BootstrapOutcome::Created { .. }) => println!(
            "Made the organisation, its owner, the workspace \"default\" and the admin key \
             from GW_BOOTSTRAP_ADMIN_KEY."
        ),
        Ok(admin::BootstrapOutcome::Existing { organisation_id }) => {
            println!("Already bootstrapped (organisation {organisation_id}): nothing was made.")
        }
        Err(e) => {
            eprintln!(
                "{}: {}",
                admin::db::redact_url(&config.database_url),
                e.message
            );
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}

fn serve(args: ServeArgs) -> ExitCode {
    let overrides = Overrides {
        listen: args.listen,
        admin_listen: args.admin_listen,
        database_url: args.database_url,
        bootstrap_admin_key: bootstrap_admin_key(),
        secret_key: secret_key(),
        redis_url: args.redis_url,
        log: args.log,
        trusted_custom_hosts: args.trusted_custom_hosts,
    };
    let config = match GatewayConfig::load(&args.config, &overrides) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{}: invalid config:\n{errors}", args.config.display());
            return ExitCode::from(1);
        }
    };
    let guard = match gateway::logging::init(&config.log) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    let listen = config.listen;
    let gw = match Gateway::new(config) {
        Ok(mut gw) => {
            if let Some(key) = gw.control_plane.take_generated_key() {
                print_new_admin_key(&key);
            }
            Arc::new(gw)
        }
        Err(errors) => {
            eprintln!("cannot start the gateway:\n{errors}");
            return ExitCode::from(1);
        }
    };
    tracing::info!(
        %listen,
        admin_listen = ?gw.control_plane.listen_addr(),
        control_plane_on_listen = gw.config.admin_on_main_listener,
        pipeline = ?gw.pipeline.kinds(),
        providers = gw.config.providers.len(),
        "gateway listening"
    );
    // The drain watcher exits the process; it flushes the log writer first.
    let guard = Arc::new(Mutex::new(Some(guard)));
    let flush = guard.clone();
    run_until_signal(gw, move || {
        if let Ok(mut g) = flush.lock() {
            g.take();
        }
    });
    ExitCode::SUCCESS
}
