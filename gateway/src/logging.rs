//! Log output, set by `GW_LOG` / `log:`: comma-separated filter directives (`info`,
//! `gateway::request=debug`...) plus the word `json` for one JSON object per line.
//! Lines go through a non-blocking writer, so a slow terminal never stalls a request.

use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Keep the guard alive: dropping it flushes pending lines.
pub fn init(spec: &str) -> Result<WorkerGuard, String> {
    let mut json = false;
    let mut directives = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.eq_ignore_ascii_case("json") {
            json = true;
        } else {
            directives.push(part);
        }
    }
    let directives = if directives.is_empty() {
        "info".to_owned()
    } else {
        directives.join(",")
    };
    let filter = EnvFilter::try_new(&directives)
        .map_err(|e| format!("invalid log filter {directives:?}: {e}"))?;
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .finish(std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    let result = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
    result.map_err(|e| format!("cannot install the logger: {e}"))?;
    Ok(guard)
}
