//! Logging setup: human-readable text for terminals, JSON lines for log collectors.
//!
//! `RUST_LOG` wins over `--log-level` so a single module can be turned up without a flag change.

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("invalid log level {level:?}: {message}")]
    BadLevel { level: String, message: String },
}

/// Installs the global tracing subscriber (once; later calls are ignored, which keeps tests that
/// run several commands in one process working).
/// A bare level (`debug`) applies to the provider; libraries stay at `info` at most, so `debug` shows
/// what the provider does rather than every packet the OpenPGP or HTTP/2 crates handle. A full filter
/// (`info,h2=debug`) is used as given.
pub fn directives(level: &str) -> String {
    let level = level.trim();
    match level.to_ascii_lowercase().as_str() {
        "trace" | "debug" => format!("info,omni_infra_provider_proxmox={level}"),
        _ => level.to_owned(),
    }
}

pub fn init_logging(format: LogFormat, level: &str) -> Result<(), TelemetryError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(v),
        _ => EnvFilter::try_new(directives(level)),
    }
    .map_err(|e| TelemetryError::BadLevel {
        level: level.to_owned(),
        message: e.to_string(),
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_debug_is_for_the_provider_only() {
        assert_eq!(
            directives("debug"),
            "info,omni_infra_provider_proxmox=debug"
        );
        assert_eq!(directives("warn"), "warn");
        assert_eq!(directives("info,h2=debug"), "info,h2=debug");
    }
}
