//! Heap buffers aligned for direct I/O.

use std::alloc::{alloc_zeroed, dealloc, Layout};

/// Capacity from which a buffer is its own anonymous mapping (`mmap`), given back to the
/// system when dropped. From the heap, glibc's malloc keeps freed multi-MiB aligned blocks
/// (its mmap threshold rises after each large free), so a server whose expert buffers come
/// and go (the cache taking and evicting, batches reading unions) grew its resident memory
/// far past `--ram-budget` (BENCHMARKS.md, "Continuous batching").
pub const MAP_MIN: usize = 1 << 20;

/// Alignment of every I/O buffer and of every direct read's offset and length, in bytes.
/// 4 KiB covers the logical block size of NVMe drives and of the loop devices drivelab makes.
pub const IO_ALIGN: usize = 4096;

/// A zero-initialised heap buffer of `capacity` bytes whose start is aligned to [`IO_ALIGN`],
/// suitable as the target of an `O_DIRECT` read. The capacity is rounded up to a multiple of
/// [`IO_ALIGN`].
pub struct AlignedBuf {
    ptr: *mut u8,
    cap: usize,
}

// SAFETY: the buffer is uniquely owned heap memory, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `capacity` bytes (rounded up to [`IO_ALIGN`]); panics only when the allocator
    /// fails, as `Vec` does.
    pub fn new(capacity: usize) -> Self {
        let cap = round_up(capacity.max(1), IO_ALIGN);
        #[cfg(unix)]
        if cap >= MAP_MIN {
            // SAFETY: an anonymous private mapping with no address hint; the result is
            // checked, and it is page-aligned (4 KiB or more) and zero-filled.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    cap,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                std::alloc::handle_alloc_error(
                    Layout::from_size_align(cap, IO_ALIGN).expect("buffer layout"),
                );
            }
            return Self {
                ptr: p as *mut u8,
                cap,
            };
        }
        let layout = Layout::from_size_align(cap, IO_ALIGN).expect("buffer layout");
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Self { ptr, cap }
    }

    /// Capacity in bytes (a multiple of [`IO_ALIGN`]).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// The whole buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap bytes, initialised at allocation.
        unsafe { std::slice::from_raw_parts(self.ptr, self.cap) }
    }

    /// The whole buffer, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for cap bytes and uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.cap) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        #[cfg(unix)]
        if self.cap >= MAP_MIN {
            // SAFETY: mapped in `new` with this length, unmapped once here.
            unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.cap) };
            return;
        }
        // SAFETY: allocated in `new` with this exact layout.
        unsafe {
            dealloc(
                self.ptr,
                Layout::from_size_align_unchecked(self.cap, IO_ALIGN),
            )
        }
    }
}

/// Rounds `n` up to a multiple of `align` (a power of two).
pub fn round_up(n: usize, align: usize) -> usize {
    (n + align - 1) & !(align - 1)
}

/// Rounds `n` down to a multiple of `align` (a power of two).
pub fn round_down(n: u64, align: u64) -> u64 {
    n & !(align - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_rounded() {
        let b = AlignedBuf::new(5000);
        assert_eq!(b.capacity(), 8192);
        assert_eq!(b.as_slice().as_ptr() as usize % IO_ALIGN, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        assert_eq!(round_up(4096, 4096), 4096);
        assert_eq!(round_up(4097, 4096), 8192);
        assert_eq!(round_down(8191, 4096), 4096);
    }

    #[test]
    fn a_large_buffer_is_its_own_mapping_and_zeroed() {
        let mut b = AlignedBuf::new(MAP_MIN + 1);
        assert_eq!(b.capacity(), MAP_MIN + IO_ALIGN);
        assert_eq!(b.as_slice().as_ptr() as usize % IO_ALIGN, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[MAP_MIN] = 7;
        assert_eq!(b.as_slice()[MAP_MIN], 7);
    }
}
