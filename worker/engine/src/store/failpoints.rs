//! Failpoints and pause points: names in the code where a test makes an operation fail
//! or stops it at a race window (engine/tests/races.rs) — inert unless a test arms them.

use crate::error::{Error, Result};
use crate::store::Store;

impl Store {
    /// Arms a failpoint (tests): when the engine reaches `name` it stops as if
    /// the process had been killed there: no cleanup, no further writes.
    /// Reopen the store to recover.
    #[doc(hidden)]
    pub fn arm_failpoint(&self, name: &str) {
        *self.failpoint.lock() = Some(name.to_string());
    }

    /// Runs `hook` (once) when the engine next reaches the pause point
    /// `name` (tests): forces an interleaving that threads would hit only by
    /// chance, e.g. a backup committing in the middle of a slide. The hook
    /// runs on the engine's thread, holding what the engine holds there.
    #[doc(hidden)]
    pub fn on_pause_point(&self, name: &str, hook: PauseHook) {
        self.pause_hooks.lock().push((name.to_string(), hook));
    }

    pub(crate) fn pause_point(&self, name: &str) {
        let hook = {
            let mut h = self.pause_hooks.lock();
            h.iter()
                .position(|(n, _)| n == name)
                .map(|i| h.swap_remove(i).1)
        };
        if let Some(hook) = hook {
            hook(self);
        }
    }

    pub(crate) fn failpoint(&self, name: &str) -> Result<()> {
        let mut f = self.failpoint.lock();
        if f.as_deref() == Some(name) {
            *f = None;
            self.crashed
                .store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(Error::Internal(format!(
                "simulated crash at failpoint {name}"
            )));
        }
        if self.crashed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Internal(
                "the store crashed at a failpoint; reopen it".into(),
            ));
        }
        Ok(())
    }
}

/// A test's code for a pause point (see [`Store::on_pause_point`]).
pub type PauseHook = Box<dyn FnOnce(&Store) + Send>;
