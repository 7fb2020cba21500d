//! One module per subcommand; `main.rs` only parses flags and dispatches here.

pub mod cluster;
pub mod dev_omni;
pub mod omni_args;
pub mod orphans;
pub mod run;
pub mod validate;

/// What every subcommand returns; the error is printed with its whole source chain.
pub type CliResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// `outer: cause: root cause`, skipping causes whose text the outer message already contains.
pub fn render_error(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}
