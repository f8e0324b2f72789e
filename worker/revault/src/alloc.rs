//! The process's allocator: mimalloc rather than glibc's malloc.
//!
//! Why: glibc hands a freed block of a few hundred KiB or more back to the
//! kernel (unmapped or trimmed off its heap), so the next one is faulted in
//! and zeroed page by page. The server allocates such blocks all the time
//! (hyper's receive buffers, which a push's body frames keep alive until the
//! engine has read them; a restore's decompression buffers), and the page
//! faults were a large part of its receiving work (profiles in the messages
//! of e58d447 and 2d528de). mimalloc keeps freed memory for reuse instead;
//! docs/service.md has what that changed.
//!
//! Two settings make that hold for a long-running server: freed memory is
//! returned to the kernel after 10 s unused rather than mimalloc's default
//! 10 ms ([`configure`]), and `revault serve` returns it at once when it has
//! gone idle ([`release_free`]).
//!
//! Transparent huge pages are off for the process ([`configure`]): mimalloc
//! asks for them on its arenas, and on a kernel that honours the request
//! (`enabled` and `defrag` set to `madvise`, Debian's default) every first
//! touch of 2 MiB zeroes all of it, after compacting memory to find it when
//! none is free. A restore from a bucket spent up to 0.62 s of system time on
//! that for 0.3 s of user time, varying with how fragmented memory was;
//! without huge pages 0.12–0.15 s (docs/remote.md, "Figures": the `remote`
//! step of `make bench` measures both). The buffers here are streamed
//! through once, so the TLB gains little from huge pages.
//!
//! `revault-bench` (worker/bench) includes this file as its own module, so
//! the benchmarks measure the engine under the same allocator and settings.

use libmimalloc_sys as mi;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc 3's option enum (the crate's
/// bindings still carry mimalloc 2's names); `bundled_mimalloc_is_3` checks
/// the version.
const PURGE_DELAY: mi::mi_option_t = 15;
/// Milliseconds freed memory stays mapped for reuse. With the default 10 ms
/// the server gave memory back between one buffer and the next and faulted
/// it in again, zeroing 2 MiB transparent huge pages each time. 10 s is also
/// how long tokio keeps an idle blocking thread.
const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

/// Applies the settings above, each unless the environment sets it
/// (`MIMALLOC_PURGE_DELAY`, `MIMALLOC_ALLOW_THP`: mimalloc has read them
/// already). Call first thing in `main`.
pub fn configure() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets an option value; mimalloc reads options atomically.
        unsafe { mi::mi_option_set(PURGE_DELAY, PURGE_DELAY_MS) }
    }
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // The allocator's first arena was mapped (and advised) before `main`;
        // the process-wide switch also covers it. A kernel without it refuses,
        // which changes nothing.
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    }
}

/// Returns the free memory the allocator keeps for reuse to the kernel, for
/// the whole process (a forced purge of every arena), not only the calling
/// thread's. A few milliseconds after a burst of work; next to nothing when
/// there is nothing to return.
pub fn release_free() {
    // SAFETY: mi_collect only walks and purges the allocator's own state;
    // any thread may call it at any time.
    unsafe { mi::mi_collect(true) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_mimalloc_is_3() {
        // SAFETY: reads a constant.
        let v = unsafe { mi::mi_version() };
        assert!(
            (30_000..40_000).contains(&v),
            "mimalloc {v}: PURGE_DELAY is option 15 in mimalloc 3 only"
        );
    }
}
