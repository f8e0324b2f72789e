//! The process's allocator: mimalloc rather than glibc's malloc.
//!
//! Why: glibc hands a freed block of a few hundred KiB or more back to the
//! kernel (unmapped or trimmed off its heap), so the next one is faulted in
//! and zeroed page by page. The server allocates such blocks all the time
//! (hyper's receive buffers, which a push's body frames keep alive until the
//! engine has read them; a restore's decompression buffers), and the page
//! faults were a sixth of the server's receiving work. mimalloc keeps freed
//! memory for reuse instead; docs/service.md has what that changed. The price
//! is memory kept after a burst of work, which `revault serve` hands back
//! once it is idle ([`release_free`]).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Returns the free memory the allocator keeps for reuse to the kernel, for
/// the whole process (a forced purge of every arena), not only the calling
/// thread's. A few milliseconds after a burst of work; next to nothing when
/// there is nothing to return.
pub fn release_free() {
    // SAFETY: mi_collect only walks and purges the allocator's own state;
    // any thread may call it at any time.
    unsafe { libmimalloc_sys::mi_collect(true) }
}
