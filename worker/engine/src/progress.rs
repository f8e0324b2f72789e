//! Progress reports: backups and restores call back with the bytes done so
//! far (the CLI draws a bar, the server publishes it to pollers).

use std::sync::Arc;

/// Called with the bytes processed so far.
pub type Progress = Arc<dyn Fn(u64) + Send + Sync>;
