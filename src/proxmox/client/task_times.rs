//! How long Proxmox tasks took lately: what the task wait times its polls by.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// How long tasks took lately, by (node, task type): a moving average, so a node that got slower
/// (or a storage that filled up) moves it within a few tasks.
#[derive(Debug, Default)]
pub struct TaskTimes(Mutex<HashMap<(String, String), Duration>>);

impl TaskTimes {
    pub(crate) fn expected(&self, kind: &(String, String)) -> Option<Duration> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(kind)
            .copied()
    }

    pub(crate) fn record(&self, kind: (String, String), took: Duration) {
        let mut times = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let average = match times.get(&kind) {
            Some(before) => before.mul_f64(0.7) + took.mul_f64(0.3),
            None => took,
        };
        times.insert(kind, average);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_times_follow_the_recent_durations_by_node_and_type() {
        let times = TaskTimes::default();
        let create = ("pve1".to_string(), "qmcreate".to_string());
        assert_eq!(times.expected(&create), None);
        times.record(create.clone(), Duration::from_secs(2));
        assert_eq!(times.expected(&create), Some(Duration::from_secs(2)));
        for _ in 0..10 {
            times.record(create.clone(), Duration::from_secs(1));
        }
        let now = times.expected(&create).unwrap();
        assert!(now < Duration::from_millis(1100), "{now:?}");
        assert_eq!(
            times.expected(&("pve2".to_string(), "qmcreate".to_string())),
            None,
            "another node's figure is its own"
        );
    }
}
