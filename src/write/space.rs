//! Free space on the file systems a writer fills, asked before the first byte is written
//! (`synth` and `pack` both check it up front).

use std::path::Path;

/// Free bytes for an unprivileged user on the file system of `path` (or of its nearest
/// existing ancestor); `None` when it cannot be asked.
pub(crate) fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let dir = path.ancestors().find(|p| p.is_dir())?;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}
