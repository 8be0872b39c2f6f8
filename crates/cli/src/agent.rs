//! `rootline agent [--config FILE]`: continuous profiling until SIGTERM or SIGINT, then a final
//! export and exit 0 (a second signal during the final export exits at once with status 130).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rootline_agent::logging::{self, LogFormat};
use rootline_agent::{Agent, AgentConfig, AgentError, SourceError};

use crate::exit::Exit;

/// Arguments of `rootline agent`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TOML configuration file (see the agent documentation); without it, defaults: the whole
    /// host at 99 Hz, OTLP to $OTEL_EXPORTER_OTLP_ENDPOINT.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log line format.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormatArg,
    /// Profile only these processes (comma-separated), instead of the configured targets.
    #[arg(short, long, value_delimiter = ',', value_name = "PID")]
    pub pid: Vec<u32>,
    /// Sampling frequency in Hz, instead of the configured one.
    #[arg(short = 'F', long, value_name = "HZ")]
    pub frequency: Option<u32>,
    /// Export interval in seconds, instead of the configured one.
    #[arg(long, value_name = "SECS")]
    pub export_interval: Option<f64>,
    /// Stop after this many seconds (default: run until SIGTERM/SIGINT).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// `--log-format` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormatArg {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Runs `rootline agent`.
pub fn run(args: Args) -> Result<()> {
    let mut config = match &args.config {
        Some(path) => AgentConfig::load(path)?,
        None => {
            // No file: export over OTLP as the OpenTelemetry environment variables say.
            let mut config = AgentConfig::default();
            config.exporters.otlp = Some(Default::default());
            config
        }
    };
    if !args.pid.is_empty() {
        config.targets = rootline_agent::TargetConfig {
            pids: args.pid.clone(),
            ..Default::default()
        };
    }
    if let Some(hz) = args.frequency {
        config.frequency_hz = hz;
    }
    if let Some(secs) = args.export_interval {
        config.export_interval = Duration::try_from_secs_f64(secs)
            .context("--export-interval must be a positive number of seconds")?;
    }
    config.validate()?;
    if args.print_config {
        print!(
            "{}",
            toml::to_string(&config).context("cannot print the configuration")?
        );
        return Ok(());
    }
    logging::init(match args.log_format {
        LogFormatArg::Text => LogFormat::Text,
        LogFormatArg::Json => LogFormat::Json,
    });

    let exporters = rootline_agent::build_exporters(&config, |k| std::env::var(k).ok())
        .context("cannot set up the exporters; check the [exporters] section of the config")?;
    if exporters.is_empty() {
        bail!(
            "no exporter configured; add [exporters.otlp], [exporters.pprof] or [exporters.rlp] \
             to the config file"
        );
    }
    let source = rootline_agent::default_source(&config).map_err(|e| match e {
        SourceError::Permission(message) => anyhow::Error::new(Exit {
            code: crate::exit::PERMISSION,
            message,
        }),
        e => anyhow::Error::new(e).context("cannot start sampling"),
    })?;

    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        // The first signal asks for a final export; a second one while it runs exits at once
        // (status 130, as for an interrupted program), giving up what was not exported.
        signal_hook::flag::register_conditional_shutdown(signal, 130, Arc::clone(&stop))
            .and_then(|_| signal_hook::flag::register(signal, Arc::clone(&stop)))
            .context("cannot install the SIGTERM/SIGINT handler")?;
    }
    if let Some(secs) = args.duration {
        let stop = Arc::clone(&stop);
        let limit = Duration::try_from_secs_f64(secs)
            .context("--duration must be a positive number of seconds")?;
        std::thread::spawn(move || {
            std::thread::sleep(limit);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }
    tracing::info!(
        frequency_hz = config.frequency_hz,
        export_interval_ms = config.export_interval.as_millis() as u64,
        exporters = exporters.len(),
        "rootline agent started"
    );
    let agent = Agent::start(&config, source, exporters)?;
    let stats = agent.run_until(&stop).map_err(|e| match e {
        AgentError::Source(SourceError::Permission(message)) => anyhow::Error::new(Exit {
            code: crate::exit::PERMISSION,
            message,
        }),
        e => anyhow::Error::new(e).context("the agent stopped after a final export"),
    })?;
    tracing::info!("rootline agent stopped: {}", stats.status_line());
    Ok(())
}
