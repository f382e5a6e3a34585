//! `decisio serve --task-store`: the flags of the task store replicas
//! share (`docs/design/task-store.md`), and the store they open.

use std::time::Duration;

use anyhow::Result;
use clap::Args;

use crate::settings::TaskStore as TaskStoreSettings;
use crate::tasks::shared::Shared;

/// Settings of `--task-store`.
#[derive(Args)]
pub(super) struct TaskStoreArgs {
    /// The task store this server shares with other replicas:
    /// s3://bucket/prefix (an S3-compatible service with AWS_ENDPOINT_URL),
    /// gs://bucket/prefix, az://container/prefix, file:///path (a folder
    /// that servers of one machine share) or memory://. Credentials come
    /// from the provider's usual environment. Without it, tasks are this
    /// server's own, in --state-dir.
    #[arg(long = "task-store")]
    pub(super) url: Option<String>,
    /// Seconds between two reads of the task store's manifest.
    #[arg(long, default_value_t = TaskStoreSettings::default().poll.as_secs_f64(), value_parser = seconds_in(TaskStoreSettings::POLL_SECONDS))]
    pub(super) task_store_poll: f64,
    /// Seconds a claim on a registration holds without renewal: a replica
    /// that dies while fitting leaves it to another after this long.
    #[arg(long, default_value_t = TaskStoreSettings::default().lease.as_secs_f64(), value_parser = seconds_in(TaskStoreSettings::LEASE_SECONDS))]
    pub(super) task_store_lease: f64,
    /// Hours a removed task's tombstone stays in the task store's manifest.
    #[arg(long, default_value_t = TaskStoreSettings::default().tombstone.as_secs() / 3600, value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..=24 * 365))]
    pub(super) task_store_tombstone_hours: u64,
}

/// A number of seconds within `(low, high)`.
fn seconds_in((low, high): (f64, f64)) -> impl Fn(&str) -> Result<f64, String> + Clone {
    move |v: &str| {
        let f: f64 = v.parse().map_err(|_| format!("`{v}` is not a number"))?;
        match (low..=high).contains(&f) {
            true => Ok(f),
            false => Err(format!("give {low} to {high} seconds")),
        }
    }
}

impl TaskStoreArgs {
    /// The store of `--task-store`, opened (`None` without the flag).
    pub(super) fn open(&self) -> Result<Option<Shared>> {
        let Some(url) = &self.url else {
            return Ok(None);
        };
        let settings = TaskStoreSettings {
            poll: Duration::from_secs_f64(self.task_store_poll),
            lease: Duration::from_secs_f64(self.task_store_lease),
            tombstone: Duration::from_secs(self.task_store_tombstone_hours * 3600),
        };
        Shared::open(settings, url)
            .map(Some)
            .map_err(anyhow::Error::msg)
    }
}
