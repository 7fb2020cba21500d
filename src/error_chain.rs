//! Turning an error and its causes into the one line a person reads.
//!
//! Every layer needs this (the Proxmox client words transport failures with it, the pipeline words
//! Image Factory failures, the CLI prints whatever a subcommand returns), so it lives below them all.

/// `outer: cause: root cause`, skipping causes whose text the outer message already contains.
pub fn render(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    for part in std::iter::successors(e.source(), |s| s.source()).map(ToString::to_string) {
        if !text.contains(&part) {
            text = format!("{text}: {part}");
        }
    }
    text
}
