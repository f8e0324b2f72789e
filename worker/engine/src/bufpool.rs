//! Large byte buffers that come back to be filled again.
//!
//! A fresh 1 MiB buffer costs a page fault and a page clear per 4 KiB page,
//! and an unmap when it is freed: a large share of a backup's chunking
//! thread, and of a pushing client, in profiles. A buffer lent out from a
//! [`BufPool`] returns to it when its last user drops it.

use crossbeam_channel::{bounded, Receiver, Sender};

/// Buffers returned by their last users, up to a bound (beyond it they are
/// freed). Clones share the pool.
#[derive(Clone)]
pub struct BufPool {
    home: Sender<Vec<u8>>,
    free: Receiver<Vec<u8>>,
}

impl BufPool {
    /// A pool keeping at most `keep` returned buffers.
    pub fn new(keep: usize) -> Self {
        let (home, free) = bounded(keep);
        BufPool { home, free }
    }

    /// A returned buffer, if one is waiting, as its last user left it (its
    /// length and bytes are that user's).
    pub fn take(&self) -> Option<Vec<u8>> {
        self.free.try_recv().ok()
    }

    /// Lends `data` out; it comes back here when the handle is dropped.
    pub fn lend(&self, data: Vec<u8>) -> Lent {
        Lent {
            data,
            home: self.home.clone(),
        }
    }
}

/// A buffer lent out by a [`BufPool`].
pub struct Lent {
    data: Vec<u8>,
    home: Sender<Vec<u8>>,
}

impl Drop for Lent {
    fn drop(&mut self) {
        let _ = self.home.try_send(std::mem::take(&mut self.data));
    }
}

impl std::ops::Deref for Lent {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data
    }
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lent_buffer_comes_back_when_dropped_and_not_before() {
        let pool = BufPool::new(1);
        let lent = pool.lend(vec![7u8; 100]);
        assert!(pool.take().is_none());
        drop(lent);
        assert_eq!(pool.take().expect("back"), vec![7u8; 100]);
        // Beyond the bound, returned buffers are freed.
        drop((pool.lend(vec![1]), pool.lend(vec![2])));
        assert!(pool.take().is_some() && pool.take().is_none());
    }
}
