//! Logging setup: human-readable text for terminals, JSON lines for log collectors.
//!
//! `RUST_LOG` wins over `--log-level` so a single module can be turned up without a flag change.
//! Text is coloured only on a terminal and never with `NO_COLOR` set (<https://no-color.org>), so
//! a log file, `docker logs` or a collector gets plain text; JSON is never coloured.

use std::ffi::OsStr;
use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

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

/// Whether text logs get colour: only when they go to a terminal and `NO_COLOR` is unset or empty
/// (the convention says a non-empty value turns colour off, whatever it is).
pub fn colour(to_terminal: bool, no_color: Option<&OsStr>) -> bool {
    to_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// Installs the global tracing subscriber (once; later calls are ignored, which keeps tests that
/// run several commands in one process working). The error says when `--log-level` (or
/// `RUST_LOG`) is no filter.
pub fn init_logging(format: LogFormat, level: &str) -> Result<(), String> {
    let rust_log = std::env::var("RUST_LOG").ok().filter(|v| !v.is_empty());
    let filter = EnvFilter::try_new(rust_log.unwrap_or_else(|| directives(level)))
        .map_err(|e| format!("invalid log level {level:?}: {e}"))?;
    let no_color = std::env::var_os("NO_COLOR");
    let ansi = colour(std::io::stderr().is_terminal(), no_color.as_deref());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(ansi).try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
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

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
        assert!(!colour(false, Some(OsStr::new(""))));
    }
}
